"""Sweeps and plots for ``placement cost`` and ``placement compare``.

Input: the parsed arguments of either command (``--set`` lists and ranges, ``--exact``,
``--plot FILE``, ``--format``). Output: the sweep's rows in the chosen format
(``costreport.sweepout``) and, with ``--plot``, a figure (``costreport.plot``). A command
takes this path when some ``--set`` gives a list or a range or ``--format csv`` is asked
(without a sweep the rows are the one configuration the spec gives); ``--plot`` beside an
ordinary report draws that configuration.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TextIO

from ..diagnostics import Code, Diagnostic, DiagnosticError
from .options import command_line_span

PLOT_TYPES = (".png", ".svg", ".pdf")


def add_options(p) -> None:
    p.add_argument("--exact", action="store_true",
                   help="with a sweep: derive every configuration in exact rationals instead of evaluating the "
                   "compiled closed forms")
    p.add_argument("--plot", metavar="FILE", default=None,
                   help="draw memory per state, per pipeline stage and communication per link to FILE "
                   "(.png, .svg or .pdf; needs the plot extra: pip install '.[plot]' in a clone of placement-logic)")


def wanted(args, sweeps) -> bool:
    """Whether the command prints sweep rows (a list or range in --set, or --format csv)."""
    return bool(sweeps) or args.format == "csv"


def check_options(args, sweeps) -> None:
    """Options a sweep cannot honour, and the plot's file type and library, before any work."""
    if args.format == "latex" and sweeps:
        raise DiagnosticError([Diagnostic(Code.SWEEP_OPTION, "--format latex prints formulas; a sweep prints rows: "
                                          "use text, markdown, json or csv", command_line_span("--format latex"))])
    if getattr(args, "groups", False) and wanted(args, sweeps):
        raise DiagnosticError([Diagnostic(Code.SWEEP_OPTION, "--groups adds the parameter-group table to a report; a sweep "
                                          "prints rows (drop --groups, or give single values)",
                                          command_line_span("--groups"))])
    if getattr(args, "exact", False) and not wanted(args, sweeps):
        raise DiagnosticError([Diagnostic(Code.SWEEP_OPTION, "--exact applies to a sweep (a list or range in --set, or "
                                          "--format csv); one configuration is always derived exactly",
                                          command_line_span("--exact"))])
    plot = getattr(args, "plot", None)
    if plot is None:
        return
    span = command_line_span(f"--plot {plot}")
    if Path(plot).suffix.lower() not in PLOT_TYPES:
        raise DiagnosticError([Diagnostic(Code.BAD_PLOT, f"--plot {plot}: the file name must end in "
                                          f"{', '.join(PLOT_TYPES)}", span)])
    if len(sweeps) > 1:
        raise DiagnosticError([Diagnostic(Code.BAD_PLOT, f"--plot draws a sweep over one name, not {len(sweeps)} "
                                          f"({', '.join(sweeps)}): sweep one and --set the others", span)])
    from ..costreport.plot import require_matplotlib

    require_matplotlib()


def run(args, spec, sets, sweeps, command: str, out: TextIO, width: int, color: bool) -> int:
    """The sweep's rows written to ``out`` as they are produced (``costreport.sweeptext.write``),
    in memory that does not grow with them; with ``--plot`` every row is kept for the figure."""
    from ..costreport.sweep import plan_sweep
    from ..costreport.sweeptext import write
    from ..outcome import Exit

    report = plan_sweep(spec, plans=getattr(args, "plans", None) or (), sets=sets, sweeps=sweeps, command=command,
                        baseline=getattr(args, "baseline", None), exact=getattr(args, "exact", False))
    if getattr(args, "plot", None) is not None:
        report = report.materialised()
    buf = io.StringIO() if report.source is None else None  # kept rows: written whole after the figure, as before
    tally = write(report, args.format, buf or out, width, color)
    if getattr(args, "plot", None) is not None:
        from ..costreport.plot import sweep_plot

        sweep_plot(report, args.plot)
    if buf is not None:
        out.write(buf.getvalue())
    return int(Exit(tally.exit_status))


def plot_only(args, spec, sets, command: str) -> None:
    """``--plot`` beside a report of one configuration: the figure of that configuration."""
    from ..costreport.plot import sweep_plot
    from ..costreport.sweep import build_sweep

    sweep_plot(build_sweep(spec, plans=getattr(args, "plans", None) or (), sets=sets, command=command,
                           baseline=getattr(args, "baseline", None)), args.plot)
