"""``placement prove``: the framework's theorems and the claims of specs, machine-checked.

Input: optional .place files (their ``claim`` statements), ``--format``, ``--timeout``,
``--only`` (theorem groups) and ``--export DIR``. Output: the report on stdout, solver
disagreements on stderr, the SMT-LIB 2 file of every obligation under DIR when asked;
exit status 0 all as expected, 1 refuted or solvers disagree, 2 input error, 3 unknown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..diagnostics import Code, Diagnostic, DiagnosticError
from .options import add_timeout, parse_timeout

# the built-in theorem groups (``prove.GROUPS``), named here so --help costs no solver import
GROUPS = ("memory", "comm", "correctness", "composition", "claims")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "prove", help="machine-check the framework's theorems and the claims of specs (z3 + cvc5)",
        description="Decide every built-in theorem (memory and communication derivations, correctness, "
        "composition, published claims) and the claims of the given specs with z3, and re-decide each "
        "from its SMT-LIB 2 text with cvc5.")
    p.add_argument("files", nargs="*", metavar="FILE", help="specs whose claim statements become obligations")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text", help="output format (default: text)")
    add_timeout(p)
    p.add_argument("--only", action="append", choices=GROUPS + ("none",), metavar="GROUP",
                   help=f"run only these built-in groups ({', '.join(GROUPS)}, or none); repeatable")
    p.add_argument("--export", metavar="DIR", help="write every obligation as DIR/<group>/<name>.smt2")
    p.set_defaults(run=run)


def run(args, out, err) -> int:
    from ..frontend.loader import load_spec

    specs = [load_spec(f) for f in args.files]
    from ..prove import prove, render

    only = tuple(g for g in (args.only or GROUPS) if g != "none")
    timeout = parse_timeout(args.timeout)
    import importlib.util

    second = importlib.util.find_spec("cvc5") is not None
    if not second:
        err.write("note: cvc5 is not installed, so every obligation is decided by z3 alone (the second, "
                  "independent solver is skipped); install it with: pip install '.[proofs]' in a clone of placement-logic\n")
    from .progress import Progress

    with Progress(err, "prove", quiet=getattr(args, "quiet", False)) as bar:
        report, texts = prove(specs, timeout=timeout, only=only, second_solver=second, progress=bar.tick)
    if args.export:
        root = Path(args.export)
        for key, text in texts.items():
            path = root / f"{re.sub(r'[^A-Za-z0-9._/-]', '_', key)}.smt2"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            except OSError as exc:
                raise DiagnosticError([Diagnostic(Code.EXPORT_FAILED, f"cannot write {path}: {exc.strerror or exc}")]) from None
    if args.format == "json":
        json.dump(render.to_json(report), out, indent=2, ensure_ascii=False)
        out.write("\n")
    elif args.format == "markdown":
        out.write(render.markdown(report))
    else:
        out.write(render.text(report))
    for r in report.errors:
        err.write(f"error: {r.key}: {r.error}\n")
    return report.exit_status
