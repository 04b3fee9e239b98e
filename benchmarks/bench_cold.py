"""Cold command lines, CPU time: ``python benchmarks/bench_cold.py [--repeat N] [--llm-analysis PYTHON]``.

Each run is a fresh process; its CPU time is user + system of the child
(``resource.getrusage(RUSAGE_CHILDREN)`` before and after), which shared machines disturb
less than wall time. ``placement cost`` runs with its result cache off (``--no-cache``): a
first run. Each command runs once first, and ``PYTHONDONTWRITEBYTECODE`` is dropped from the
children's environment, so every run reads compiled files, as after install (with it set,
each run compiled this tool's modules again: about 0.03-0.07 s more). With the Python of a virtual environment holding llm-analysis (``pip install
llm-analysis``; found at ``--llm-analysis``, ``$LLM_ANALYSIS_PYTHON`` or
``/work/llmvenv/bin/python``), its command line on a comparable configuration runs too,
alternating with ``placement cost`` (paired), and the ratio of the medians is printed.
Prints JSON: the machine, the versions and per command the median CPU and wall time and every
run's CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine import cores, cpu_name  # noqa: E402

SPEC = "examples/llama70b_3d.place"
PLACEMENT = {
    "placement --version": ["--version"],
    f"placement fmt {SPEC}": ["fmt", SPEC],
    f"placement inspect {SPEC}": ["inspect", SPEC],
    f"placement cost {SPEC} --no-cache": ["cost", SPEC, "--no-cache"],
}
COST = f"placement cost {SPEC} --no-cache"
LLM_ANALYSIS = ["-m", "llm_analysis.analysis", "train", "--model_name", "upstage_Llama-2-70b-instruct-v2",
                "--gpu_name", "a100-sxm-80gb", "--tp_size", "8", "--pp_size", "4", "--sp_size", "8", "--dp_size", "4",
                "--batch_size_per_gpu", "1", "--seq_len", "4096", "--total_num_tokens", "1000000"]
LLM_NAME = "llm-analysis train (Llama-2-70B, TP 8, PP 4, DP 4)"


def cpu(cmd: list[str], env: dict | None = None) -> float:
    """User + system CPU seconds of one fresh process."""
    return timed(cmd, env)[0]


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """(user + system CPU seconds, wall seconds) of one fresh process."""
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - t0
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def llm_python(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("LLM_ANALYSIS_PYTHON"), "/work/llmvenv/bin/python"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def version(python: str, package: str) -> str | None:
    out = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({package!r}))"],
                         capture_output=True, text=True)
    return out.stdout.strip() or None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--llm-analysis", metavar="PYTHON", default=None,
                    help="the Python of a virtual environment with llm-analysis installed")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout, whatever is installed
    env.pop("PLACEMENT_NO_CACHE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled files written and read, as after install
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for argv in PLACEMENT.values():  # compiled files and the parser's cache, as after install
        subprocess.run([sys.executable, "-m", "placement_logic", *argv], cwd=ROOT, env=env,
                       stdout=subprocess.DEVNULL, check=True)
    other = llm_python(args.llm_analysis)
    runs: dict[str, list[float]] = {name: [] for name in PLACEMENT}
    walls: dict[str, list[float]] = {name: [] for name in PLACEMENT}
    if other:
        runs[LLM_NAME], walls[LLM_NAME] = [], []
        subprocess.run([other, *LLM_ANALYSIS], cwd=ROOT, env=clean, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(args.repeat):
        for name, argv in PLACEMENT.items():
            c, w = timed([sys.executable, "-m", "placement_logic", *argv], env)
            runs[name].append(c)
            walls[name].append(w)
            if other and name == COST:  # paired: each cost run next to one llm-analysis run
                c, w = timed([other, *LLM_ANALYSIS], clean)
                runs[LLM_NAME].append(c)
                walls[LLM_NAME].append(w)
    medians = {name: statistics.median(xs) for name, xs in runs.items()}
    import sympy

    result = {
        "machine": {"cpu": cpu_name(), "cores": cores(), "platform": platform.platform(),
                    "python": platform.python_version(), "sympy": sympy.__version__,
                    "llm_analysis": version(other, "llm-analysis") if other else None},
        "repeat": args.repeat,
        "load_average": round(os.getloadavg()[0], 1),
        "median_cpu_s": {k: round(v, 3) for k, v in medians.items()},
        "median_wall_s": {k: round(statistics.median(v), 3) for k, v in walls.items()},
        "runs_cpu_s": {k: [round(x, 3) for x in xs] for k, xs in runs.items()},
    }
    if other:
        result["ratio_cost_to_llm_analysis"] = round(medians[COST] / medians[LLM_NAME], 2)
        result["ratio_cost_to_llm_analysis_wall"] = round(statistics.median(walls[COST]) /
                                                          statistics.median(walls[LLM_NAME]), 2)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
