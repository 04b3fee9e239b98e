"""The ``placement`` command line: argv in, exit status out; the only module that prints.

Each subcommand lives in ``placement_logic.commands.<name>`` and provides
``add_parser(subparsers)`` and ``run(args, out, err) -> int``. Input errors raise
``DiagnosticError``; they are rendered here (one line, source snippet and caret) and
give exit status 2. Exit statuses follow mypy: 0 clean, 1 refuted or failed, 2 input
or usage error, 3 unknown with nothing refuted, 4 unrealised (measure), 70 internal
error (never a verdict).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
from pathlib import Path
from typing import Sequence, TextIO

from . import __version__
from .diagnostics import DiagnosticError
from .outcome import Exit
from .snippets import render

EXIT_OK = int(Exit.OK)
EXIT_FAILED = int(Exit.FAILED)
EXIT_INPUT = int(Exit.INPUT)
EXIT_UNKNOWN = int(Exit.UNKNOWN)
EXIT_UNREALISED = int(Exit.UNREALISED)
EXIT_INTERNAL = int(Exit.INTERNAL)

# Subcommands, in the order --help lists them.
COMMANDS: tuple[str, ...] = ("fmt", "inspect", "cost", "compare", "check", "prove", "measure", "search", "trace", "lift", "convert",
                              "export", "calibrate")

EPILOG = """\
examples:
  placement fmt examples/zero_paper.place            print the canonical formatting
  placement fmt --check examples/*.place             exit 1 if a file is not formatted
  placement inspect examples/llama70b_3d.place       the resolved plans, axis by axis
  placement cost examples/zero_paper.place           memory and communication per plan
  placement check examples/library/zero3.place       prove or refute training equivalence
  placement prove                                    the framework's theorems, z3 and cvc5
  placement search examples/models/llama3_70b.place --device h100_sxm --devices 256 --global-batch 1024 --seq 8192
                                                     the configurations that fit, fastest first
  placement measure examples/library/zero3.place --plan zero3 --devices 2
                                                     predicted against measured on PyTorch
  placement trace --nproc 2 --check -- python examples/traced/ddp.py
                                                     trace your own script, lift it, prove it
  placement lift TRACE.json                          the plan a traced script really ran
  placement calibrate --device h100_sxm -o h100.mesh  this machine's GEMM, memory and all-reduce sweeps

exit status: 0 ok, 1 refuted / not formatted / failed, 2 input or usage error,
3 unknown (a solver gave up) with nothing refuted, 4 (measure) plan not realisable,
70 internal error (a bug in the tool; a crash report file is written).
"""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors through the CLI's exit status 2."""

    def error(self, message: str) -> None:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_INPUT) from None


def _load_commands(names: Sequence[str] = COMMANDS) -> dict[str, object]:
    mods = {}
    for name in names:
        try:
            mods[name] = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as exc:
            # A subcommand whose module (or optional dependency) is absent is not offered.
            if exc.name and (exc.name.endswith(f"commands.{name}") or not exc.name.startswith("placement_logic")):
                continue
            raise
    return mods


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command`` (a subcommand's name) only that subcommand
    is added, which parses that subcommand's arguments as the whole parser does."""
    mods = _load_commands((command,)) if command in COMMANDS else {}
    if not mods:
        mods = _load_commands()
    parser = _Parser(
        prog="placement",
        description="Exact memory/communication formulas and machine-checked safety verdicts "
        "for distributed-training placement specs (.place files).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"placement-logic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in mods.values():
        mod.add_parser(sub)
    for command in sub.choices.values():  # options every command shares
        command.add_argument("-o", "--output", metavar="FILE", default=None,
                             help="write the report to FILE instead of standard output")
        command.add_argument("-q", "--quiet", action="store_true",
                             help="print nothing on standard output; the exit status tells the result")
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    words = list(sys.argv[1:] if argv is None else argv)
    if words == ["--version"]:
        # what argparse's version action prints, without importing every subcommand first
        out.write(f"placement-logic {__version__}\n")
        return EXIT_OK
    # a command line naming its subcommand first loads that subcommand's module only
    parser = build_parser(words[0] if words else None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not args.command:
        parser.print_help(out)
        return EXIT_INPUT
    if getattr(args, "quiet", False):
        out = _Nowhere()
    target = getattr(args, "output", None)
    if target and not getattr(args, "quiet", False):
        return _run_to_file(args, target, err)
    return _run(args, out, err)


class _Nowhere(io.TextIOBase):
    """Standard output under --quiet: what is written is dropped (never kept: a sweep's rows can be many)."""

    def write(self, s: str) -> int:
        return len(s)


def _run_to_file(args, target: str, err: TextIO) -> int:
    """Run with the report going to ``target``: refused when it names an input (except for
    ``fmt``), written atomically, and not written at all when the run ends in an input error
    or an internal error (the target keeps what it had)."""
    from .commands.output import check_writable, input_paths, refuse_inputs, streamed_output

    try:
        if args.command != "fmt":
            refuse_inputs(target, input_paths(args))
        check_writable(target)
    except DiagnosticError as exc:
        return _diagnostics(exc, args, io.StringIO(), err)
    from .atomic import Discard

    status = EXIT_INTERNAL
    try:
        with streamed_output(target) as fh:  # the report streams into a temporary file, renamed when whole
            status = _run(args, fh, err)
            if status in (EXIT_INPUT, EXIT_INTERNAL):
                raise Discard
    except DiagnosticError as exc:
        sources: dict = dict(getattr(exc, "sources", {}))
        for diag in exc.diagnostics:
            err.write(render(diag, _source_of(diag.span.file, sources)) + "\n")
        n = len(exc.diagnostics)
        err.write(f"found {n} error{'s' if n != 1 else ''}\n")
        return EXIT_INPUT
    return status


def _run(args, out: TextIO, err: TextIO) -> int:
    try:
        plot = getattr(args, "plot", None)
        if isinstance(plot, str) and plot:  # a figure file: judged before the work, like -o
            from .commands.output import check_writable, input_paths, refuse_inputs

            refuse_inputs(plot, input_paths(args), "--plot")
            check_writable(plot, "--plot")
        return int(args.run(args, out, err))
    except DiagnosticError as exc:
        return _diagnostics(exc, args, out, err)
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        raise
    except (Exception, RecursionError, MemoryError) as exc:  # noqa: BLE001 - an internal error, reported as one
        return _internal_error(args, exc, err)


def _source_of(path: str | None, sources: dict) -> str | None:
    """The text a diagnostic points into: the loader's copy, else (an error found after loading, by the
    checker or a command) the spec file itself when it is one. Other files (a framework config that did
    not parse) are never echoed: they may hold anything."""
    if not path or path in sources or not path.endswith(".place"):
        return sources.get(path) if path else None
    try:
        p = Path(path)
        sources[path] = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None
    except (OSError, ValueError):
        sources[path] = None
    return sources[path]


def _diagnostics(exc: DiagnosticError, args, out: TextIO, err: TextIO) -> int:
    """Render an input error (JSON on ``out`` under --format json, the located lines on
    ``err``) and give its exit status."""
    if getattr(args, "format", None) == "json":
        from .outcome import envelope

        json.dump(envelope(args.command, EXIT_INPUT, diagnostics=[d.to_json() for d in exc.diagnostics]),
                  out, indent=2)
        out.write("\n")
    sources = dict(getattr(exc, "sources", {}))
    for diag in exc.diagnostics:
        err.write(render(diag, _source_of(diag.span.file, sources)) + "\n")
    n = len(exc.diagnostics)
    err.write(f"found {n} error{'s' if n != 1 else ''}\n")
    return EXIT_INPUT


def _internal_error(args, exc: BaseException, err: TextIO) -> int:
    """An exception no diagnostic describes: a bug of the tool, not a verdict. One line on
    standard error, the traceback in a crash report file, and its own exit status."""
    import tempfile
    import traceback

    report = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    where = None
    try:
        fd, where = tempfile.mkstemp(prefix="placement-crash-", suffix=".txt")
        with open(fd, "w", encoding="utf-8") as fh:
            fh.write(f"placement-logic {__version__}\ncommand: placement {' '.join(sys.argv[1:])}\n\n{report}")
    except OSError:
        where = None
    kind = type(exc).__name__
    name = args.command if isinstance(args.command, str) else "trace"
    err.write(f"placement {name}: internal error ({kind}): this is a bug in placement-logic, not a "
              f"verdict on the input" + (f"; crash report: {where}" if where else "") + "\n")
    return EXIT_INTERNAL


def console() -> None:
    """The ``placement`` program: ``main`` on the process's argv, then exit with its status.

    A cost report leaves tens of thousands of sympy objects and sympy's caches behind;
    tearing them down one by one at interpreter shutdown took about 0.07 s CPU of a cold
    ``placement cost`` (mypy skips the same teardown, ``mypy.util.hard_exit``). So once the
    output is flushed and the exit handlers (``atexit``) have run, the process ends at once.
    Where something may still be running or watching (another thread, a profiler, a tracer
    such as coverage) or flushing fails, it ends the ordinary way.

    Python's cyclic garbage collector, at its default thresholds, walked sympy's objects
    again and again while they were being made (0.02-0.04 s CPU of the same run); the
    program collects less often (every 200,000 allocations, not every 700). Garbage is still
    collected; only ``main``, what library code calls, leaves the thresholds alone."""
    import gc

    gc.set_threshold(200_000, 30, 30)
    status = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(status) from None
    import threading

    if threading.active_count() > 1 or sys.getprofile() is not None or sys.gettrace() is not None:
        raise SystemExit(status)
    import atexit
    import os

    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    console()
