"""LaTeX rendering of a cost report: equations for papers and a booktabs comparison table.

Input: a ``CostReport``. Output: a complete LaTeX document (amsmath, booktabs, and rotating
when a table turns sideways) or, with ``fragment=True``, only the equations, their "where"
list and the table, ready to ``\\input`` into a paper (a comment names the packages it needs).

Per plan an ``align*`` gives every memory term and the communication totals (formulas from
sympy's printer with display names, each followed by its value; with a pipeline the first
and the last stage's activations and totals too). Integers are printed whole with thin-space
groups (``67\\,108\\,864``); an equation too long for one line is broken between the terms
of a sum, one argument of a maximum a line (``costs.symbolic.latex_lines``). A "where" list
defines every symbol the formulas and the table use. The table compares the plans: plans
as columns up to three, past three transposed (plans as rows) on a landscape page.
``render_equations`` gives the equations alone (used by ``_repr_latex_``).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import TYPE_CHECKING

from . import units
from .pieces import latex_items, of_report
from .rows import DEVICE_ROWS, tex_text

if TYPE_CHECKING:  # the report model imports this renderer for _repr_latex_
    from .model import CostReport, PlanReport, Quantity

SHORT = {"optimizer": "optim.", "activations": "activ.", "transient": "trans.", "ZeRO volume": "ZeRO vol.",
         "peak stage": "peak"}  # column heads of the landscape table
SOURCE_WIDTH = 200  # the longest line of LaTeX source printed (wrap_source)
MAX_COLUMNS = 3  # plans side by side in a portrait table; past this the table is transposed, landscape

# What a symbol a report can leave free stands for (the model's shape, docs/costs.md).
SHAPE_SYMBOLS = {
    "psi": "the model's parameter count",
    "h": "the hidden size",
    "f": "the MLP width",
    "a": "attention heads",
    "L": "transformer layers",
    "V": "the vocabulary size",
    "s": "the sequence length (tokens per sample)",
    "b": "the microbatch size (samples)",
}


def _thin(x: Fraction) -> str:
    """An exact number for math mode: integers whole with thin-space groups, fractions as fractions."""
    from ..costs.symbolic import grouped

    if x.denominator == 1:
        return grouped(x.numerator)
    sign = "-" if x < 0 else ""
    return rf"{sign}\tfrac{{{grouped(abs(x.numerator))}}}{{{grouped(x.denominator)}}}"


def _value(q: Quantity, show=None) -> str:
    if q.exact is None or q.exact == 0:
        return ""
    return rf"\text{{{tex_text((show or units.gb)(q.exact))}}}"


def _gb(x: Fraction | None) -> str:
    return "--" if x is None else units.decimal_string(x / 10**9)


def _equation(lhs: str, q: Quantity, show=None) -> str:
    """One ``align*`` row, continued on further rows when the formula was broken; its value
    follows the formula (``\\quad = 4.34 GB``) or, when that line has no room, has a row of
    its own aligned on the ``=``."""
    from ..costs.symbolic import LINE_POINTS, tex_width

    lines = list(q.latex_lines or (q.latex,))
    value = _value(q, show)
    tail = ""
    if value:
        if tex_width(lines[-1] + rf" \quad = {value}") <= LINE_POINTS:
            lines[-1] += rf" \quad = {value}"
        else:
            tail = f" \\\\\n  &= {value}"
    body = " \\\\\n  &\\qquad ".join(lines)
    return rf"{lhs} &= {body}{tail}"


def _rows(p: PlanReport) -> list[tuple[str, Quantity]]:
    rows = [(rf"M_{{\mathrm{{{k}}}}}", p.device[k]) for k in DEVICE_ROWS]
    for st in p.stages:
        rows += [(rf"M^{{\mathrm{{{st.stage}}}}}_{{\mathrm{{{k}}}}}", st.device[k]) for k in ("activations", "total")]
    if p.host["total"].formula != "0":
        rows.append((r"M_{\mathrm{host}}", p.host["total"]))
    rows.append((r"C_{\mathrm{ring}}", p.comm_total))
    rows.append((r"V_{\mathrm{ZeRO}}", p.volume_total))
    return rows


def _time_rows(p: PlanReport) -> list[tuple[str, Quantity, object]]:
    """The step-time model's named terms (docs/time.md), each with its own formula, with a device."""
    if p.time is None:
        return []
    t = p.time
    rows = [(T_COMPUTE, t.compute, units.seconds), (T_BUBBLE, t.bubble, units.seconds),
            (T_OVERLAP, t.overlapped, units.seconds), (T_EXPOSED, t.exposed, units.seconds)]
    if t.optimizer is not None:
        rows.append((T_OPT, t.optimizer, units.seconds))
    return rows + [(F_MODEL, t.model_flops, _flops)]


T_STEP, T_COMPUTE, T_BUBBLE = r"T_{\mathrm{step}}", r"T_{\mathrm{compute}}", r"T_{\mathrm{bubble}}"
T_OVERLAP, T_EXPOSED, T_OPT = r"T_{\mathrm{comm}}^{\mathrm{overlap}}", r"T_{\mathrm{comm}}^{\mathrm{exposed}}", \
    r"T_{\mathrm{opt}}"
F_MODEL = r"F_{\mathrm{model}}"


def _flops(x: Fraction | None) -> str:
    return "--" if x is None else f"{float(x):.4g} FLOP"


def _named(lhs: str, terms: str, q: Quantity, show) -> str:
    """A row defined by named terms (their formulas on rows of their own), and its value."""
    value = _value(q, show)
    return rf"{lhs} &= {terms}" + (rf" \quad = {value}" if value else "")


def _step_lines(p: PlanReport) -> list[str]:
    """T_step and MFU from the named terms, then each term's formula (a formula too wide for a
    line, such as the kernel model's efficiency cases, is named and valued, not printed)."""
    if p.time is None:
        return []
    from ..costs.symbolic import LINE_POINTS, tex_width

    t = p.time
    # communication overlaps compute only where the mesh lets it (else it is all exposed, the overlap 0)
    head = T_COMPUTE if t.overlapped.formula == "0" else rf"\max\bigl({T_COMPUTE},\ {T_OVERLAP}\bigr)"
    terms = head + rf" + {T_EXPOSED}" + (rf" + {T_OPT}" if t.optimizer is not None else "")
    lines = [_named(T_STEP, terms, t.step, units.seconds),
             _named(r"\mathrm{MFU}", rf"\frac{{{F_MODEL}}}{{N \cdot P_{{\mathrm{{peak}}}} \cdot {T_STEP}}}", t.mfu,
                    units.percent)]
    for lhs, q, show in _time_rows(p):
        if not q.pieces and all(tex_width(x) <= 1.5 * LINE_POINTS for x in (q.latex_lines or (q.latex,))):
            lines.append(_equation(lhs, q, show))
        else:
            lines.append(_named(lhs, r"\text{the kernel model (docs/time.md)}", q, show))
    return lines


def _lines(p: PlanReport) -> list[str]:
    return [_equation(lhs, q) for lhs, q in _rows(p)] + _step_lines(p)


def wrap_source(text: str, width: int = SOURCE_WIDTH) -> str:
    """Every source line cut to at most ``width`` characters where TeX sees no difference: after a
    space or before a control word, the cut line ending in ``%`` (TeX drops the newline and the
    next line's leading spaces); a comment's continuation is a comment. ``unwrap_source`` undoes it."""
    out = []
    for line in text.split("\n"):
        lead = "% " if line.startswith("%") else ""
        mark = "" if lead else "%"
        while len(line) > width:
            cut = line.rfind(" ", len(lead) + 1, width - 1)
            if cut > len(lead):
                out.append(line[:cut + 1] + mark)
                line = lead + line[cut + 1:]
                continue
            cut = next((i for i in range(width - 1, len(lead), -1) if line[i] == "\\" and line[i - 1] != "\\"
                        and line[i + 1:i + 2].isalpha()), None)
            if cut is None:
                break
            out.append(line[:cut] + mark)
            line = lead + line[cut:]
        out.append(line)
    return "\n".join(out)


def unwrap_source(text: str) -> str:
    """The lines ``wrap_source`` cut, joined again (comments aside)."""
    return re.sub(r"(?<!\\)%\n", "", text)


def render_equations(r: CostReport) -> str:
    """Every plan's equations in one ``aligned`` block, for Jupyter's ``_repr_latex_``."""
    rows = []
    for p in r.plans:
        rows.append(rf"&\textbf{{{tex_text(p.name)}}}")
        rows += [rf"&{lhs} = {q.latex}" + (rf"\quad = \text{{{tex_text(units.gb(q.exact))}}}" if q.exact else "")
                 for lhs, q in _rows(p)]
    return "$$\\begin{aligned}\n" + " \\\\\n".join(rows) + "\n\\end{aligned}$$"


# --------------------------------------------------------------------------- the "where" list


def _symbols(r: CostReport) -> list[str]:
    """Every symbol the equations and the table's ratios use, in order of first use."""
    seen: dict[str, None] = {}
    for p in r.plans:
        for _, q in _rows(p):
            seen.update(dict.fromkeys(q.symbols))
    for plan in r.ratios.values():
        for key in ("memory.total", "comm.total"):  # the table's ratio columns
            q = plan.get(key)
            if q is not None and q.exact is None:  # shown as a formula
                seen.update(dict.fromkeys(q.symbols))
    return list(seen)


def _where(r: CostReport) -> list[str]:
    """A description list with one item per symbol: what it stands for and its value."""
    from ..costs.symbolic import display_name

    names = _symbols(r)
    named = of_report(q for p in r.plans for _, q in _rows(p))  # a time row with a case analysis is not printed
    if not names and not named:
        return []
    axes = dict(r.axes)
    values = {b.name: b for b in r.bindings}
    out = [r"\noindent where", r"\begin{description}"]
    for n in names:
        if n in axes:
            text = rf"processes along the mesh axis \texttt{{{tex_text(n)}}}"
            if axes[n]:
                text += rf" (link \texttt{{{tex_text(axes[n])}}})"
        elif n in values and n not in SHAPE_SYMBOLS:
            text = rf"the spec's \texttt{{{tex_text(n)}}}"
        else:
            text = SHAPE_SYMBOLS.get(n, rf"the spec's \texttt{{{tex_text(n)}}}")
            if n in values or n in SHAPE_SYMBOLS:
                text += rf" (\texttt{{{tex_text(n)}}})"
        b = values.get(n)
        if b is not None and b.exact is not None:
            text += rf", ${_thin(b.exact)}$" + (r" (set on the command line)" if b.overridden else "")
        else:
            text += ", unbound (give it in the spec or with \\texttt{-{}-set})"
        out.append(rf"  \item[${display_name(n, axes)}$] {text}")
    out += latex_items(named, _thin)
    if any(p.time is not None for p in r.plans):
        out += [r"  \item[$N$] the devices, $P_{\mathrm{peak}}$ the device's peak FLOP/s, $F_{\mathrm{model}}$ the "
                r"model FLOPs of a step (three times the forward, without recompute); the $T$ terms are defined "
                r"above, each by its own formula (docs/time.md)"]
    out.append(r"\end{description}")
    return out


# --------------------------------------------------------------------------- the comparison table


def _ratio(r: CostReport, plan: str, key: str) -> str:
    """A ratio's value (exact when its denominator is small), its formula while symbols are unbound."""
    q = r.ratios.get(plan, {}).get(key)
    if q is None:
        return "--"
    if q.exact is None:
        return f"${q.latex}$"
    if q.exact.denominator <= 100:
        return f"${_thin(q.exact)}$"
    return units.decimal_string(q.exact, 4)


def _columns(r: CostReport) -> list[tuple[str, str, list[str]]]:
    """The table's quantities: (group, short label, one cell per plan)."""
    cols = [("memory per device (GB)", k, [_gb(p.device[k].exact) for p in r.plans]) for k in DEVICE_ROWS]
    cols.append(("memory per device (GB)", "host", [_gb(p.host["total"].exact) for p in r.plans]))
    if any(p.stages for p in r.plans):
        cols.append(("memory per device (GB)", "peak stage",
                     [p.peak_stage or ("--" if not p.stages else "?") for p in r.plans]))
    for a, _ in r.axes:
        cols.append(("communication per device (GB)", rf"\texttt{{{tex_text(a)}}}",
                     [_gb(p.per_axis[a].bytes_per_device.exact) for p in r.plans]))
    cols.append(("communication per device (GB)", "total", [_gb(p.comm_total.exact) for p in r.plans]))
    cols.append(("communication per device (GB)", "ZeRO volume", [_gb(p.volume_total.exact) for p in r.plans]))
    if r.baseline:
        base = rf"\texttt{{{tex_text(r.baseline)}}}"
        cols.append((rf"ratio to {base}", "memory", [_ratio(r, p.name, "memory.total") for p in r.plans]))
        cols.append((rf"ratio to {base}", "comm.", [_ratio(r, p.name, "comm.total") for p in r.plans]))
    return cols


def _path(text: str) -> str:
    """A file name for text mode that may break after a '/', '_' or '.' (a long path fits the line)."""
    return "".join(tex_text(ch) + (r"\allowbreak{}" if ch in "/_." else "") for ch in text)


def _fit(tabular: list[str]) -> list[str]:
    """A tabular scaled down to the line width when it is wider (graphicx), never scaled up."""
    return [r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%"] + tabular + ["}"]


def _caption(r: CostReport) -> str:
    return (r"\caption{Per-device memory and per-step communication; "
            r"1 GB = $10^9$ bytes; communication is ring bytes sent per device; "
            r"the ZeRO volume counts each collective's data once.}")


def _portrait(r: CostReport) -> list[str]:
    cols = _columns(r)
    tab = [rf"\begin{{tabular}}{{l{'r' * len(r.plans)}}}", r"\toprule",
           " & ".join(["per device"] + [rf"\texttt{{{tex_text(p.name)}}}" for p in r.plans]) + r" \\"]
    group = None
    for g, label, cells in cols:
        if g != group:
            tab.append(r"\midrule")
            tab.append(rf"\multicolumn{{{len(r.plans) + 1}}}{{l}}{{\emph{{{g}}}}} \\")
            group = g
        tab.append(" & ".join([rf"\quad {label}"] + cells) + r" \\")
    tab += [r"\bottomrule", r"\end{tabular}"]
    return [r"\begin{table}[ht]", r"\centering"] + _fit(tab) + [_caption(r), r"\end{table}"]


def _landscape(r: CostReport) -> list[str]:
    """Plans as rows (any number fits down the page), quantities as columns, turned sideways."""
    cols = _columns(r)
    groups: list[tuple[str, int]] = []
    for g, _, _ in cols:
        if groups and groups[-1][0] == g:
            groups[-1] = (g, groups[-1][1] + 1)
        else:
            groups.append((g, 1))
    head = ["plan"] + [rf"\multicolumn{{{n}}}{{c}}{{{g}}}" for g, n in groups]
    rules, start = [], 2
    for _, n in groups:
        rules.append(rf"\cmidrule(lr){{{start}-{start + n - 1}}}")
        start += n
    tab = [rf"\begin{{tabular}}{{l{'r' * len(cols)}}}", r"\toprule", " & ".join(head) + r" \\", "".join(rules),
           " & ".join([""] + [SHORT.get(label, label) for _, label, _ in cols]) + r" \\", r"\midrule"]
    for i, p in enumerate(r.plans):
        tab.append(" & ".join([rf"\texttt{{{tex_text(p.name)}}}"] + [cells[i] for _, _, cells in cols]) + r" \\")
    tab += [r"\bottomrule", r"\end{tabular}"]
    return [r"\begin{sidewaystable}", r"\centering", r"\small"] + _fit(tab) + [_caption(r), r"\end{sidewaystable}"]


def _table(r: CostReport) -> list[str]:
    return _landscape(r) if len(r.plans) > MAX_COLUMNS else _portrait(r)


# --------------------------------------------------------------------------- documents


def packages(r: CostReport) -> list[str]:
    """The packages the report's LaTeX needs."""
    return ["amsmath", "booktabs", "graphicx"] + (["rotating"] if len(r.plans) > MAX_COLUMNS else [])


def _body(r: CostReport, fragment: bool) -> list[str]:
    out: list[str] = []
    for p in r.plans:
        if fragment:
            out.append(rf"\noindent Plan \texttt{{{tex_text(p.name)}}}:")
        else:
            out.append(rf"\subsection*{{Plan \texttt{{{tex_text(p.name)}}}}}")
        # a plan's equations may run past a page: breaks between them allowed, in this group only
        out += [r"\begingroup\allowdisplaybreaks", r"\begin{align*}", " \\\\\n".join(_lines(p)), r"\end{align*}",
                r"\endgroup"]
    out += _where(r)
    out += _table(r)
    return out


def render(r: CostReport, fragment: bool = False) -> str:
    """A complete document, or (``fragment``) the equations, the "where" list and the table alone."""
    if fragment:
        head = [rf"% placement-logic cost report of {tex_text(r.file)}: equations and table, for \input",
                rf"% needs \usepackage{{{','.join(packages(r))}}}"]
        return wrap_source("\n".join(head + _body(r, True))) + "\n"
    out = [r"\documentclass{article}"] + [rf"\usepackage{{{p}}}" for p in packages(r)]
    out += [r"\begin{document}", r"\section*{Cost report}", rf"{{\raggedright\noindent Spec: \texttt{{{_path(r.file)}}}\par}}"]
    names = ", ".join(rf"\texttt{{{tex_text(b.name)}}} = ${_thin(b.exact)}$" if b.exact is not None
                      else rf"\texttt{{{tex_text(b.name)}}} unbound" for b in r.bindings)
    if names:
        out.append(rf"Bindings: {names}.")
    out += _body(r, False)
    out.append(r"\end{document}")
    return wrap_source("\n".join(out)) + "\n"
