"""`placement search` at scale, paired with llm-analysis: Llama-3-70B on 1,024 GPUs, 2.2 M
candidate configurations.

Usage: python benchmarks/bench_search.py [--top K] [--llm-analysis PYTHON]

Figures, each a CPU time (user + system of a fresh process, or ``time.process_time`` inside
one), which a shared machine disturbs less than wall time:

- the whole search in a fresh process (imports, enumeration, derivation and compilation of
  every structure, evaluation, exact re-derivation of the top rows), first with an empty
  structure cache (a first run) and then with the structures cached by that run (every later
  run of the same structures, by the same tool), both on one process (``jobs=1``); then a first
  run again with the structures derived on one process per core (the default), its CPU time
  that of every process and its wall time beside it;
- grid rows per CPU second: the candidates over the whole search's CPU time, and over the
  evaluation step alone;
- the exact per-configuration path: one configuration written as a spec with literal sizes
  and derived on its own in exact arithmetic (what the search does for each winner);
- with llm-analysis (``--llm-analysis``, ``$LLM_ANALYSIS_PYTHON`` or ``/work/llmvenv/bin/python``):
  its API (``LLMAnalysis.training``) on the 18 configurations of
  benchmarks/llm_analysis_reference.py, per configuration, measured in the same run; each figure
  above is printed as a ratio to it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_cold import llm_python, version  # noqa: E402
from machine import cores, cpu_name  # noqa: E402

MODEL = ROOT / "examples" / "models" / "llama3_70b.place"
SPACE = dict(devices=1024, global_batch=2048, seq=8192, device="h100_sxm", tp=(1, 2, 4, 8),
             pp=(1, 2, 4, 5, 8, 10, 16, 20), cp=(1, 2, 4, 8), microbatch=tuple(range(1, 65)),
             chunks=tuple(range(1, 17)))

_CHILD = """
import sys, time, json, types
t0 = time.perf_counter()
sys.path.insert(0, {root!r})
from placement_logic import search
search.time = types.SimpleNamespace(perf_counter=time.process_time)  # its step timings in CPU seconds
space = search.Space(**{space!r})
r = search.run({model!r}, space, top={top}, check=False, jobs={jobs})
wall = time.perf_counter() - t0
print(json.dumps({{"wall": wall, "candidates": r.candidates, "valid": r.valid, "fitting": r.fitting,
                  "structures": r.structures, "timings": r.timings,
                  "agree": all(c.agrees for c in r.ranked)}}))
"""

_LLM_CHILD = """
import logging, sys, time
sys.path.insert(0, {bench!r})
import llm_analysis_reference as ref
logging.getLogger("llm_analysis").setLevel(logging.ERROR)
logging.disable(logging.WARNING)
for row in ref.GRID:
    ref.run(*row)
n, t0 = 0, time.process_time()
while time.process_time() - t0 < 2.0:
    for row in ref.GRID:
        ref.run(*row)
        n += 1
print((time.process_time() - t0) / n)
"""


def child_cpu(cmd: list[str], env: dict) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def exact_per_configuration() -> dict:
    """CPU seconds of one configuration's exact figures (the search's winners; median of 7), with
    the structure cache in a fresh folder that the search fills first:

    - from its structure's compiled exact figures, the structure met before in the process (what
      every winner of a search costs: the search derived or read its structures);
    - the same, the first of its structure in the process (every in-process table emptied: the
      structure's spec loaded and its compiled figures read from the structure cache);
    - the configuration written as a spec with literal sizes and derived on its own
      (``search.derive_exact``, the path every winner took before, kept for rows outside their
      structure), as the first of its structure in the process (every in-process table of
      derived pieces emptied) and with those tables kept."""
    from placement_logic import search
    from placement_logic.costs import _derive, kernels, symbolic

    space = search.Space(**SPACE)
    old = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "PLACEMENT_NO_CACHE")}
    with tempfile.TemporaryDirectory() as cache:
        os.environ.update(XDG_CACHE_HOME=cache, PLACEMENT_NO_CACHE="0")
        try:
            res = search.run(str(MODEL), search.Space(**{**SPACE, "microbatch": (1,), "chunks": (2,)}), top=1,
                             check=False)
            c = res.ranked[0]

            def timed(prepare, fn) -> float:
                times = []
                for _ in range(7):
                    search._EXACT.clear()  # the figures computed again, as for a configuration met for the first time
                    prepare()
                    t0 = time.process_time()
                    fn()
                    times.append(time.process_time() - t0)
                return sorted(times)[3]

            def forget_structures() -> None:
                search._EXACT_FNS.clear()
                search._EXACT_FORMS.clear()
                search._DERIVED.clear()
                search._structure_spec.cache_clear()

            def forget_derivations(tables: bool) -> None:
                _derive.cache_clear()
                if tables:
                    for table in (kernels._tabulated, kernels.gemm, kernels.memory_bound, symbolic.at_least):
                        table.cache_clear()

            run = lambda: search.exact(c, res.block, space, check=False)  # noqa: E731
            own = lambda: search.derive_exact(c, res.block, space)  # noqa: E731
            out = {"compiled, structure met before": timed(lambda: None, run),
                   "compiled, first of its structure (from the structure cache)": timed(forget_structures, run),
                   "derived on its own, first of its structure": timed(lambda: forget_derivations(True), own),
                   "derived on its own, structure met before": timed(lambda: forget_derivations(False), own)}
            fast = search._structure_figures(c, res.block, space)
            assert fast is not None and fast == search.derive_exact(c, res.block, space)
            return out
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--llm-analysis", metavar="PYTHON", default=None)
    args = ap.parse_args(argv)
    load_start = os.getloadavg()[0]
    code = _CHILD.format(root=str(ROOT), space=SPACE, model=str(MODEL), top=args.top, jobs=1)
    env = {k: v for k, v in os.environ.items() if k != "PLACEMENT_NO_CACHE"}
    with tempfile.TemporaryDirectory() as cache:
        env["XDG_CACHE_HOME"] = cache  # an empty cache, then the one the first run filled
        first_cpu, out = child_cpu([sys.executable, "-c", code], env)
        first = json.loads(out.strip().splitlines()[-1])
        cached_cpu, out = child_cpu([sys.executable, "-c", code], env)
        cached = json.loads(out.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as cache:  # a first run again, its structures derived on every core
        env["XDG_CACHE_HOME"] = cache
        many = _CHILD.format(root=str(ROOT), space=SPACE, model=str(MODEL), top=args.top, jobs=None)
        par_cpu, out = child_cpu([sys.executable, "-c", many], env)
        par = json.loads(out.strip().splitlines()[-1])
    per_config = exact_per_configuration()
    other = llm_python(args.llm_analysis)
    llm = None
    if other:
        clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        llm = float(subprocess.run([other, "-c", _LLM_CHILD.format(bench=str(ROOT / "benchmarks"))], cwd=ROOT,
                                   env=clean, capture_output=True, text=True, check=True).stdout.split()[-1])
    n = cached["candidates"]
    rows = {
        "search, fresh process, empty structure cache (CPU s)": first_cpu,
        f"the same, structures derived on {cores()} processes (`--jobs` default) (CPU s)": par_cpu,
        "search, fresh process, structures cached (CPU s)": cached_cpu,
        "grid rows per CPU second, whole cached search": n / cached_cpu,
        "grid rows per CPU second, evaluation step": n / cached["timings"]["evaluate"],
        **{f"exact per configuration, {k} (CPU s)": v for k, v in per_config.items()},
    }
    print(f"machine: {cpu_name()}, {cores()} cores, load average {os.getloadavg()[0]:.1f} at the end "
          f"({load_start:.1f} at the start), "
          f"Python {sys.version.split()[0]}" + (f", llm-analysis {version(other, 'llm-analysis')}" if other else ""))
    print(f"space: {n:,} candidates, {cached['valid']:,} valid, {cached['fitting']:,} fit, "
          f"{cached['structures']} structures; winners agree to the byte: {first['agree'] and cached['agree']}")
    print(f"wall (in the child, imports included): first run {first['wall']:.2f} s, cached run {cached['wall']:.2f} s, "
          f"first run on {cores()} processes {par['wall']:.2f} s; its figures the one-process run's: "
          f"{(par['valid'], par['fitting']) == (first['valid'], first['fitting'])}")
    print("steps of the cached run (CPU s): " + ", ".join(f"{k} {v:.2f}" for k, v in cached["timings"].items()))
    print("steps of the first run (CPU s): " + ", ".join(f"{k} {v:.2f}" for k, v in first["timings"].items()))
    if llm:
        print(f"llm-analysis LLMAnalysis.training: {llm * 1e3:.2f} ms CPU per configuration "
              f"({1 / llm:,.0f} configurations per CPU second)")
    print("| figure | value | against llm-analysis (same run) |")
    print("|---|---:|---:|")
    for name, v in rows.items():
        if "per CPU second" in name:
            ratio = f"{v * llm:,.0f}× its configurations per CPU second" if llm else ""
            print(f"| {name} | {v:,.0f} | {ratio} |")
        elif name.startswith("exact"):
            print(f"| {name} | {v * 1e3:.2f} ms | {v / llm:,.1f}× its time per configuration |" if llm else
                  f"| {name} | {v * 1e3:.2f} ms | |")
        else:
            print(f"| {name} | {v:.2f} | {v / llm:,.0f} configurations of its API |" if llm else
                  f"| {name} | {v:.2f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
