"""LaTeX rendering of a cost report: equations for papers and a booktabs comparison table.

Input: a ``CostReport``. Output: a complete LaTeX document (amsmath, booktabs) with, per
plan, an ``align*`` of every memory term and the communication totals (formulas from
sympy's printer with display names, each followed by its value; with a pipeline the
first and the last stage's activations and totals too), then a table comparing the plans. ``render_equations`` gives the equations alone (used by ``_repr_latex_``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from . import units
from .rows import DEVICE_ROWS, tex_text

if TYPE_CHECKING:  # the report model imports this renderer for _repr_latex_
    from .model import CostReport, PlanReport, Quantity


def _value(q: Quantity) -> str:
    if q.exact is None:
        return ""
    if q.exact == 0:
        return ""
    return rf" && = \text{{{tex_text(units.gb(q.exact))}}}"


def _gb(x: Fraction | None) -> str:
    return "--" if x is None else units.decimal_string(x / 10**9)


def _lines(p: PlanReport) -> list[str]:
    rows = []
    for k in DEVICE_ROWS:
        q = p.device[k]
        rows.append(rf"M_{{\mathrm{{{k}}}}} &= {q.latex}{_value(q)}")
    for st in p.stages:
        for k in ("activations", "total"):
            q = st.device[k]
            rows.append(rf"M^{{\mathrm{{{st.stage}}}}}_{{\mathrm{{{k}}}}} &= {q.latex}{_value(q)}")
    if p.host["total"].formula != "0":
        rows.append(rf"M_{{\mathrm{{host}}}} &= {p.host['total'].latex}{_value(p.host['total'])}")
    rows.append(rf"C_{{\mathrm{{ring}}}} &= {p.comm_total.latex}{_value(p.comm_total)}")
    rows.append(rf"V_{{\mathrm{{ZeRO}}}} &= {p.volume_total.latex}{_value(p.volume_total)}")
    return rows


def render_equations(r: CostReport) -> str:
    """Every plan's equations in one ``aligned`` block, for Jupyter's ``_repr_latex_``."""
    rows = []
    for p in r.plans:
        rows.append(rf"&\textbf{{{tex_text(p.name)}}}")
        rows += ["&" + line.replace("&=", "=", 1).replace("&&", r"\quad") for line in _lines(p)]
    return "$$\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}$$"


def _table(r: CostReport) -> list[str]:
    cols = "l" + "r" * len(r.plans)
    out = [r"\begin{table}[ht]", r"\centering", rf"\begin{{tabular}}{{{cols}}}", r"\toprule",
           " & ".join(["per device"] + [rf"\texttt{{{tex_text(p.name)}}}" for p in r.plans]) + r" \\",
           r"\midrule"]
    for k in DEVICE_ROWS:
        out.append(" & ".join([f"{k} (GB)"] + [_gb(p.device[k].exact) for p in r.plans]) + r" \\")
    out.append(" & ".join(["host (GB)"] + [_gb(p.host["total"].exact) for p in r.plans]) + r" \\")
    if any(p.stages for p in r.plans):
        out.append(" & ".join(["peak stage"] + [p.peak_stage or ("--" if not p.stages else "?") for p in r.plans])
                   + r" \\")
    out.append(r"\midrule")
    for a, _ in r.axes:
        out.append(" & ".join([rf"comm.\ {tex_text(a)} (GB)"]
                              + [_gb(p.per_axis[a].bytes_per_device.exact) for p in r.plans]) + r" \\")
    out.append(" & ".join(["comm.\\ total (GB)"] + [_gb(p.comm_total.exact) for p in r.plans]) + r" \\")
    out.append(" & ".join(["ZeRO volume (GB)"] + [_gb(p.volume_total.exact) for p in r.plans]) + r" \\")
    if r.baseline:
        out.append(r"\midrule")
        out.append(" & ".join([rf"total memory / \texttt{{{tex_text(r.baseline)}}}"]
                              + [_ratio(r, p.name, "memory.total") for p in r.plans]) + r" \\")
        out.append(" & ".join([rf"comm.\ / \texttt{{{tex_text(r.baseline)}}}"]
                              + [_ratio(r, p.name, "comm.total") for p in r.plans]) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}",
            rf"\caption{{Per-device memory and per-step communication ({tex_text(r.file)}); "
            r"1 GB = $10^9$ bytes; communication is ring bytes sent per device.}",
            r"\end{table}"]
    return out


def _ratio(r: CostReport, plan: str, key: str) -> str:
    q = r.ratios.get(plan, {}).get(key)
    if q is None:
        return "--"
    return f"${q.latex}$"


def render(r: CostReport) -> str:
    out = [r"\documentclass{article}", r"\usepackage{amsmath}", r"\usepackage{booktabs}",
           r"\begin{document}", rf"\section*{{Cost report: \texttt{{{tex_text(r.file)}}}}}"]
    names = ", ".join(tex_text(b.name) + " = " + (units.number(b.exact) if b.exact is not None else "?")
                      for b in r.bindings)
    if names:
        out.append(rf"Bindings: {names}.")
    for p in r.plans:
        out += [rf"\subsection*{{Plan \texttt{{{tex_text(p.name)}}}}}", r"\begin{align*}",
                " \\\\\n".join(_lines(p)), r"\end{align*}"]
    out += _table(r)
    out.append(r"\end{document}")
    return "\n".join(out) + "\n"
