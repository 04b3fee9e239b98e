"""Every example's ``placement cost`` output, to compare two versions of the tool byte for byte.

    python benchmarks/cost_outputs.py write DIR [--root CHECKOUT]   # DIR/<spec>.<format>, one process per spec
    python benchmarks/cost_outputs.py compare DIR_A DIR_B           # exit 1 and the differing files if any

``write`` runs ``placement cost SPEC --no-cache`` on every ``examples/**/*.place`` in each of
the formats text, markdown, json, latex and latex-fragment (and ``--symbolic`` LaTeX), with the
tool of ``CHECKOUT`` (default: this one; e.g. a ``git archive`` of another commit), each spec
in a fresh process, and stores standard output, standard error and the exit status. A change
meant to leave the reports alone (a faster way to the same formulas) writes the same files.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = (("text", []), ("markdown", []), ("json", []), ("latex", []), ("latex-fragment", []),
           ("symbolic.latex", ["--symbolic"]))

CHILD = """
import io, sys
from placement_logic.cli import main
spec, out_dir = sys.argv[1], sys.argv[2]
for name, fmt, extra in {formats!r}:
    out, err = io.StringIO(), io.StringIO()
    status = main(["cost", spec, "--no-cache", "--format", fmt, *extra], out=out, err=err)
    with open(f"{{out_dir}}.{{name}}", "w", encoding="utf-8") as fh:
        fh.write(f"exit {{status}}\\n--- stdout\\n{{out.getvalue()}}--- stderr\\n{{err.getvalue()}}")
"""


def write(target: Path, root: Path) -> int:
    formats = [(name, name.split(".")[-1], extra) for name, extra in FORMATS]
    code = CHILD.format(formats=formats)
    specs = sorted(p.relative_to(ROOT) for p in (ROOT / "examples").rglob("*.place"))
    for spec in specs:
        out = target / spec
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-P", "-c", code, str(spec), str(out)], cwd=ROOT, check=True,
                       env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "PLACEMENT_NO_CACHE": "1"})
    print(f"{len(specs)} specs, {len(specs) * len(FORMATS)} outputs in {target}")
    return 0


def compare(a: Path, b: Path) -> int:
    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()} |
                   {p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    differ = [n for n in names if not (a / n).is_file() or not (b / n).is_file()
              or (a / n).read_bytes() != (b / n).read_bytes()]
    for n in differ:
        print(f"differs: {n}")
    print(f"{len(names)} files compared, {len(differ)} differ")
    return 1 if differ or not names else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir", type=Path)
    w.add_argument("--root", type=Path, default=ROOT, help="the checkout whose tool runs (default: this one)")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.what == "write":
        return write(args.dir.resolve(), args.root.resolve())
    return compare(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
