"""Sweep benchmark: ``python benchmarks/bench_sweep.py``. Prints results and the machine.

(1) The compiled closed forms (``placement_logic.costs.compiled``) of 12 plans (ZeRO stage
0-3 × recomputation none/selective/full, Megatron SP, 1F1B) over more than a million
configurations (dp × tp × pp × microbatches × microbatch size), every quantity of
``cost_exprs`` (27-odd per plan), numpy and the math fallback, beside the naive
per-configuration ``subs``; (2) ``placement cost --set dp=1..4096`` in process, compiled
and ``--exact``, per configuration.
"""

from __future__ import annotations

import io
import itertools
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine import cores, cpu_name  # noqa: E402
from run import SWEEP_SPEC  # noqa: E402


def machine() -> dict:
    import numpy
    import sympy

    return {"python": platform.python_version(), "sympy": sympy.__version__, "numpy": numpy.__version__,
            "cpu": cpu_name(), "cores": cores(), "platform": platform.platform()}


def compiled_grid() -> dict:
    import numpy as np

    from placement_logic import costs
    from placement_logic.costs.compiled import compile_costs
    from placement_logic.frontend.loader import load_string

    plans = []
    for stage, rc in itertools.product(("ddp", "zero1", "zero2", "zero3"), ("", "selective_recompute", "full_recompute")):
        use = f"  use {rc}\n" if rc else ""
        plans.append(f"plan {stage}_{rc or 'none'} {{\n  dp: {stage}\n  tp: megatron_sp\n  pp: one_f_one_b\n{use}}}\n")
    spec = load_string(SWEEP_SPEC + "".join(plans), "<sweep>")
    names = ("dp", "tp", "pp", "m", "b")
    t0 = time.perf_counter()
    pcs = [costs.derive(p) for p in spec.plans]
    t1 = time.perf_counter()
    compiled = [compile_costs(pc, names) for pc in pcs]
    t2 = time.perf_counter()
    dp, tp, pp, m, b = np.meshgrid(2.0 ** np.arange(11), 2.0 ** np.arange(4), 2.0 ** np.arange(5),
                                   np.arange(1, 129, dtype=float), 2.0 ** np.arange(4), indexing="ij")
    grid = dict(zip(names, (x.ravel() for x in (dp, tp, pp, m, b))))
    t3 = time.perf_counter()
    best = None
    for c in compiled:
        out = c.evaluate(**grid)
        best = out["memory.total"] if best is None else np.minimum(best, out["memory.total"])
    t4 = time.perf_counter()
    n = grid["dp"].size
    configs = n * len(compiled)
    # the fallback without numpy, on a sample
    slow = [compile_costs(pc, names, backend="math") for pc in pcs[:1]]
    sample = 2000
    t5 = time.perf_counter()
    slow[0].evaluate(**{k: list(v[:sample]) for k, v in grid.items()})
    t6 = time.perf_counter()
    # the naive way: exact subs of every quantity, one configuration at a time
    naive = 20
    t7 = time.perf_counter()
    for i in range(naive):
        compiled[0].exact(**{k: int(v[i]) for k, v in grid.items()})
    t8 = time.perf_counter()
    # exactness: the exact values of a few configurations against the compiled floats
    mismatches = 0
    for i in range(0, n, n // 7):
        out = compiled[0].evaluate(**{k: v[i:i + 1] for k, v in grid.items()})
        mismatches += len(compiled[0].check(0, out, **{k: int(v[i]) for k, v in grid.items()}))
    return {"configs": configs, "quantities": len(compiled[0].names), "derive_s": t1 - t0, "compile_s": t2 - t1,
            "eval_s": t4 - t3, "configs_per_s": configs / (t4 - t3),
            "math_configs_per_s": sample / (t6 - t5), "naive_configs_per_s": naive / (t8 - t7),
            "mismatches": mismatches}


def command_line() -> dict:
    from placement_logic.cli import main

    out = {}
    for label, extra, values in (("compiled", [], "1..4096"), ("exact", ["--exact"], "1..64")):
        t0 = time.perf_counter()
        buf = io.StringIO()
        main(["cost", "examples/llama70b_3d.place", "--set", f"dp={values}", "--format", "csv", "--no-cache",
              *extra], buf, io.StringIO())
        t1 = time.perf_counter()
        rows = len(buf.getvalue().splitlines()) - 1
        out[label] = {"rows": rows, "s": t1 - t0, "ms_per_row": (t1 - t0) / rows * 1e3}
    return out


def main() -> int:
    print("machine:", json.dumps(machine()))
    g = compiled_grid()
    print(f"[sweep] compiled: {g['configs']:,} configurations × {g['quantities']} quantities; derive {g['derive_s']:.2f} s, "
          f"compile {g['compile_s']:.2f} s, evaluate {g['eval_s']:.2f} s -> {g['configs_per_s']:,.0f} configs/s "
          f"(math fallback {g['math_configs_per_s']:,.0f} configs/s; naive exact subs {g['naive_configs_per_s']:,.1f} "
          f"configs/s; {g['mismatches']} disagreements on a sample)")
    c = command_line()
    for label, v in c.items():
        print(f"[sweep] placement cost llama70b_3d --set dp=… --format csv ({label}): {v['rows']} rows in {v['s']:.2f} s, "
              f"{v['ms_per_row']:.2f} ms per row")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
