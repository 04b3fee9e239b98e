"""Benchmarks: ``python benchmarks/run.py``. Prints results and the machine they ran on.

Cost derivation: (1) derive every plan of the 3D example in a cold process, import cost
reported separately; (2) evaluate the closed forms over more than a million
configurations (mesh factorisation × ZeRO stage × recomputation × microbatches) compiled
once (``costs.compiled``: ``lambdify`` to numpy), beside the naive per-configuration ``subs`` rate.
"""

from __future__ import annotations

import itertools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine import cores, cpu_name

COLD = r"""
import time, json
t0 = time.perf_counter()
from placement_logic.frontend.loader import load_spec
from placement_logic import costs
from placement_logic.costreport import build
t1 = time.perf_counter()
spec = load_spec("examples/llama70b_3d.place")
t2 = time.perf_counter()
for p in spec.plans:
    costs.derive(p)
t3 = time.perf_counter()
build(spec)
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "derive_s": t3 - t2, "report_s": t4 - t3,
                  "plans": len(spec.plans)}))
"""

SWEEP_SPEC = """
from std.data import ddp, zero1, zero2, zero3
from std.tensor import megatron_sp
from std.pipeline import one_f_one_b
from std.recompute import selective_recompute, full_recompute
let m = 8
let b = 1
model {
  transformer { hidden = 8192 layers = 80 heads = 64 kv_heads = 8 ffn = 28672 vocab = 32000
                norm = rmsnorm gated_mlp bias = false }
  seq = 4096  microbatch = b  microbatches = m
}
mesh { dp = 8 @ inter_node  tp = 8 @ intra_node  pp = 4 @ inter_node }
"""


def machine() -> dict:
    import numpy
    import sympy

    cpu = cpu_name()
    return {"python": platform.python_version(), "sympy": sympy.__version__, "numpy": numpy.__version__,
            "cpu": cpu, "cores": cores(), "platform": platform.platform()}


def cold() -> dict:
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", COLD], cwd=ROOT, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    return min(runs, key=lambda r: r["import_s"] + r["derive_s"])


def sweep() -> dict:
    import numpy as np

    from placement_logic import costs
    from placement_logic.costs.compiled import compile_exprs
    from placement_logic.costs.symbolic import symbol
    from placement_logic.frontend.loader import load_string

    plans = []
    for stage, rc in itertools.product(("ddp", "zero1", "zero2", "zero3"), ("", "selective_recompute", "full_recompute")):
        use = f"  use {rc}\n" if rc else ""
        plans.append(f"plan {stage}_{rc or 'none'} {{\n  dp: {stage}\n  tp: megatron_sp\n  pp: one_f_one_b\n{use}}}\n")
    spec = load_string(SWEEP_SPEC + "".join(plans), "<sweep>")
    args = [symbol(n) for n in ("dp", "tp", "pp", "m", "b")]
    t0 = time.perf_counter()
    forms = []
    for p in spec.plans:
        pc = costs.derive(p)
        forms.append((pc.memory.device_total, pc.communication.total_bytes))
    t1 = time.perf_counter()
    fns = [compile_exprs({"memory": mem, "comm": comm}, args) for mem, comm in forms]
    t2 = time.perf_counter()
    dp, tp, pp, m, b = np.meshgrid(2.0 ** np.arange(11), 2.0 ** np.arange(4), 2.0 ** np.arange(5),
                                   np.arange(1, 129, dtype=float), 2.0 ** np.arange(4), indexing="ij")
    grid = [x.ravel() for x in (dp, tp, pp, m, b)]
    n_per_plan = grid[0].size
    t3 = time.perf_counter()
    best = None
    for f in fns:
        out = f.evaluate(**dict(zip(("dp", "tp", "pp", "m", "b"), grid)))["memory"]
        best = out if best is None else np.minimum(best, out)
    t4 = time.perf_counter()
    configs = n_per_plan * len(fns)
    # the naive way: substitute every configuration into the exact expressions
    sample = 200
    t5 = time.perf_counter()
    for i in range(sample):
        vals = dict(zip(args, (int(g[i]) for g in grid)))
        for mem, comm in forms[:1]:
            mem.subs(vals), comm.subs(vals)
    t6 = time.perf_counter()
    return {"configs": configs, "derive_s": t1 - t0, "lambdify_s": t2 - t1, "grid_s": t3 - t2,
            "eval_s": t4 - t3, "configs_per_s": configs / (t4 - t3),
            "naive_subs_configs_per_s": sample / (t6 - t5)}


def main() -> int:
    import argparse
    import os

    ap = argparse.ArgumentParser(description="every benchmark, one after the other")
    ap.add_argument("--llm-analysis", metavar="PYTHON", default=None,
                    help="the Python of a virtual environment with llm-analysis: the benchmarks that pair "
                         "their figures with it run it in the same run (else $LLM_ANALYSIS_PYTHON)")
    args = ap.parse_args()
    if args.llm_analysis:
        os.environ["LLM_ANALYSIS_PYTHON"] = args.llm_analysis
    info = machine()
    print("machine:", json.dumps(info))
    c = cold()
    print(f"[cost] cold process, llama70b_3d ({c['plans']} plans): import {c['import_s']*1e3:.0f} ms, "
          f"load {c['load_s']*1e3:.0f} ms, derive {c['derive_s']*1e3:.0f} ms, report {c['report_s']*1e3:.0f} ms")
    s = sweep()
    print(f"[cost] sweep: {s['configs']:,} configurations; derive {s['derive_s']:.2f} s, lambdify {s['lambdify_s']:.2f} s, "
          f"evaluate {s['eval_s']:.3f} s -> {s['configs_per_s']:,.0f} configs/s "
          f"(naive subs: {s['naive_subs_configs_per_s']:,.0f} configs/s)")
    here = Path(__file__).parent
    for extra in sorted(here.glob("bench_*.py")):
        subprocess.run([sys.executable, str(extra)], cwd=ROOT, check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
