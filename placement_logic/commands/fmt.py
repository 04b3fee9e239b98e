"""``placement fmt FILE...``: print the canonical formatting, or check it (--check)."""

from __future__ import annotations

import difflib

from ..diagnostics import DiagnosticError
from ..frontend.canonical import format_source
from ..frontend.files import read_source
from .output import write_output


def add_parser(sub) -> None:
    p = sub.add_parser("fmt", help="print the canonical formatting of a spec",
                       description="Print the canonical formatting of each FILE. With --check, print "
                       "nothing for formatted files and a diff for the others, and exit 1 if any "
                       "file is not formatted. With --write, rewrite files in place.")
    p.add_argument("files", nargs="+", metavar="FILE")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if a file is not formatted")
    mode.add_argument("--write", action="store_true", help="rewrite files in place")
    p.set_defaults(run=run)


def run(args, out, err) -> int:
    unformatted = 0
    errors: list = []
    sources: dict[str, str] = {}
    for path in args.files:
        try:
            text = read_source(path)
            sources[path] = text
            canonical = format_source(text, path)
        except DiagnosticError as exc:
            errors.extend(exc.diagnostics)
            sources.update(exc.sources)
            continue
        if args.check:
            if canonical != text:
                unformatted += 1
                diff = difflib.unified_diff(text.splitlines(True), canonical.splitlines(True),
                                            f"{path} (as written)", f"{path} (formatted)")
                out.writelines(diff)
                err.write(f"{path}: not formatted\n")
        elif args.write:
            if canonical != text:
                write_output(path, canonical, option="--write")
                err.write(f"formatted {path}\n")
        else:
            out.write(canonical)
    if errors:
        raise DiagnosticError(errors, sources)
    return 1 if unformatted else 0
