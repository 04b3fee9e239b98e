"""LaTeX rendering of a check report: the verdicts, their scopes and the replayed counterexamples for papers.

Input: the plain report data of ``check.report`` (the same ``CheckReport`` the text, Markdown and JSON
renderers read). Output: a complete LaTeX document (amsmath, booktabs, longtable, array) or, with
``fragment=True``, only the plans' sections, ready to ``\\input`` into a paper (a comment names the packages).

Per plan: its verdict, what the check assumed, a table of every obligation (name, condition, verdict, scope:
the sizes it covers), the findings (one per root cause, with the obligations each breaks) and, for every
obligation not proved, what it states and either why it is unknown or the counterexample re-checked by
concrete replay (sizes, devices, values, the failing equation, the diagnosis and the command that re-runs
it). Every character of user text (file, plan, axis and group names, values) is escaped; the characters
past ASCII the checker writes (Σ, ≠, ‖, ⌈ …) become their LaTeX commands, so the source is plain ASCII and
needs no input encoding. The longtable breaks across pages; names break after ``_ / . [ ] ,``.
"""

from __future__ import annotations

import unicodedata

from ..costreport.latex import wrap_source
from ..costreport.rows import tex_text
from ..outcome import Verdict
from .render import _condition_text, _loc, _summary
from .report import CheckReport, ObligationResult, PlanReport

PACKAGES = ("amsmath", "amssymb", "booktabs", "longtable", "array")

# characters past ASCII the checker's text uses, as LaTeX (math ones wrapped so they work in text mode)
_MATH = {"·": r"\cdot", "Σ": r"\Sigma", "−": "-", "ε": r"\varepsilon", "≥": r"\geq", "≤": r"\leq",
         "‖": r"\|", "×": r"\times", "²": "^{2}", "³": "^{3}", "⌈": r"\lceil", "⌉": r"\rceil", "⌊": r"\lfloor",
         "⌋": r"\rfloor", "≠": r"\neq", "∈": r"\in", "∇": r"\nabla", "←": r"\leftarrow", "→": r"\rightarrow",
         "ᵀ": r"^{\mathsf{T}}", "ℓ": r"\ell", "√": r"\surd", "∞": r"\infty", "≈": r"\approx", "∑": r"\sum",
         "±": r"\pm", "∧": r"\wedge", "∨": r"\vee", "¬": r"\neg", "⇒": r"\Rightarrow", "∀": r"\forall",
         "∃": r"\exists", "÷": r"\div", "⊆": r"\subseteq", "∅": r"\emptyset", "Ψ": r"\Psi", "Θ": r"\Theta"}
_TEXT = {"–": "--", "—": "---", "…": r"\ldots{}", "‘": "`", "’": "'", "“": "``", "”": "''", "é": r"\'e",
         "è": r"\`e", "ü": r'\"u', "ö": r'\"o', "ä": r'\"a', "\u00a0": "~", "\u2009": r"\,",
         "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}
_BREAK_AFTER = "_/.[],"  # a long name may break after these characters


def _greek(ch: str) -> str | None:
    """A Greek letter as its LaTeX command (``α`` -> ``\\alpha``), by its Unicode name."""
    try:
        name = unicodedata.name(ch)
    except ValueError:
        return None
    for case, head in (("SMALL", "GREEK SMALL LETTER "), ("CAPITAL", "GREEK CAPITAL LETTER ")):
        if name.startswith(head) and name[len(head):].isalpha():
            word = name[len(head):].lower()
            word = {"lamda": "lambda"}.get(word, word)
            if case == "CAPITAL":
                if word not in ("gamma", "delta", "theta", "lambda", "xi", "pi", "sigma", "upsilon", "phi", "psi",
                                "omega"):
                    return None  # a capital that looks like a Latin letter: no command of its own
                word = word.capitalize()
            return "\\" + word
    return None


def tex(text: str, breaks: bool = False) -> str:
    """Plain text made safe in LaTeX text mode, ASCII only: specials escaped, known characters as commands,
    any other character written as its code point (``[U+2A00]``), hyphens kept apart (no dash ligature); ``breaks`` allows a line break after
    ``_ / . [ ] ,`` (long obligation names and paths)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "-" and text[i + 1:i + 2] == "-":
            piece = "-{}"  # no en or em dash ligature: ``--set`` stays two hyphens
        elif ch in _MATH:
            piece = rf"\ensuremath{{{_MATH[ch]}}}"
        elif ch in _TEXT:
            piece = _TEXT[ch]
        elif ord(ch) > 126:
            greek = _greek(ch)
            piece = rf"\ensuremath{{{greek}}}" if greek else f"[U+{ord(ch):04X}]"
        else:
            piece = tex_text(ch)
        out.append(piece + (r"\allowbreak{}" if breaks and ch in _BREAK_AFTER else ""))
    return "".join(out)


def _tt(text: str) -> str:
    return rf"\texttt{{{tex(text, breaks=True)}}}"


_TABLE_HEAD = [r"\begin{longtable}{@{}>{\raggedright\arraybackslash}p{0.30\linewidth}"
               r">{\raggedright\arraybackslash}p{0.25\linewidth}l"
               r">{\raggedright\arraybackslash}p{0.22\linewidth}@{}}",
               r"\toprule", r"obligation & condition & verdict & scope \\", r"\midrule", r"\endhead",
               r"\bottomrule", r"\endfoot"]


def _verdict(v: Verdict) -> str:
    return rf"\textbf{{{v.word}}}" if v is not Verdict.PROVED else v.word


def _table(p: PlanReport) -> list[str]:
    rows = [f"{_tt(o.name)} & {tex(_condition_text(o), breaks=True)} & {_verdict(o.verdict)} & "
            rf"{tex(o.scope, breaks=True)} \\" for o in p.obligations]
    return _TABLE_HEAD + rows + [r"\end{longtable}"]


def _findings(p: PlanReport, file: str) -> list[str]:
    if not p.findings:
        return []
    n = len(p.findings)
    out = [rf"\paragraph{{Findings ({n} defect{'s' if n != 1 else ''}).}}", r"\begin{enumerate}"]
    for f in p.findings:
        out.append(rf"\item {_tt(_loc(f.location, file))}: {tex(f.cause)} (root cause: {_tt(f.root)}; breaks: "
                   + ", ".join(_tt(b) for b in f.breaks) + ")")
    return out + [r"\end{enumerate}"]


def _counterexample(o: ObligationResult) -> list[str]:
    cex = o.counterexample
    items = [r"\item[sizes] " + ", ".join(_tt(f"{k}={v}") for k, v in cex.sizes)]
    items += [rf"\item[{tex(label)}] {tex(value, breaks=True)}" for label, value in cex.devices + cex.values]
    items.append(rf"\item[fails] {tex(cex.equation, breaks=True)}")
    items += [rf"\item[because] {tex(d)}" for d in cex.diagnosis]
    items += [rf"\item[note] {tex(n)}" for n in cex.notes]
    if o.why:
        items.append(rf"\item[why it matters] {tex(o.why)}")
    if o.fix:
        items.append(rf"\item[suggested fix] {tex(o.fix)}")
    items.append(rf"\item[re-run] {_tt(cex.command)}")
    return [r"Counterexample, re-checked by concrete replay:", r"\begin{description}"] + items + [r"\end{description}"]


def _details(p: PlanReport, file: str) -> list[str]:
    out: list[str] = []
    for o in p.obligations:
        if o.verdict is Verdict.PROVED:
            continue
        out += [rf"\paragraph{{{o.verdict.word.capitalize()}: {_tt(o.name)}}} at {_tt(_loc(o.location, file))}.",
                rf"Checked: {tex(o.checked)}", ""]
        if o.verdict is Verdict.UNKNOWN:
            out += [rf"Unknown (not a pass): {tex(o.reason)}", ""]
            continue
        found = p.finding_of(o.name)
        if found is not None and found[1].root != o.name:
            out += [rf"Part of finding {found[0]} (root cause: {_tt(found[1].root)}); counterexample: "
                    rf"{tex(o.counterexample.equation, breaks=True)}", ""]
            continue
        out += _counterexample(o) + [""]
    return out


def _notes(p: PlanReport) -> list[str]:
    notes = [(o.name, n) for o in p.obligations if o.verdict is Verdict.PROVED for n in o.notes
             if not n.startswith("vacuous")]
    if not notes:
        return []
    return ([r"\paragraph{Notes.}", r"\begin{itemize}"] + [rf"\item {_tt(name)}: {tex(n)}" for name, n in notes]
            + [r"\end{itemize}"])


def _plan(p: PlanReport, file: str, fragment: bool) -> list[str]:
    title = rf"Plan {_tt(p.plan)}: {p.verdict.word}"
    out = [rf"\noindent\textbf{{{title}}}\par" if fragment else rf"\subsection*{{{title}}}"]
    out += [r"\noindent Assumed:", r"\begin{itemize}"] + [rf"\item {tex(a)}" for a in p.assumed] + [r"\end{itemize}"]
    return out + _table(p) + _findings(p, file) + _notes(p) + _details(p, file)


def _body(report: CheckReport, fragment: bool) -> list[str]:
    out = []
    if report.pinned:
        out.append(r"\noindent Pinned: " + ", ".join(_tt(f"{k}={v}") for k, v in report.pinned) + r".\par")
    for p in report.plans:
        out += _plan(p, report.file, fragment)
    out.append(rf"\noindent\textbf{{{tex(_summary(report))}: {report.verdict.word}}}\par")
    return out


def render(report: CheckReport, fragment: bool = False) -> str:
    """A complete document, or (``fragment``) the plans' sections alone for ``\\input``."""
    if fragment:
        head = [rf"% placement-logic check report of {tex(report.file)}, for \input",
                rf"% needs \usepackage{{{','.join(PACKAGES)}}}"]
        return wrap_source("\n".join(head + _body(report, True))) + "\n"
    out = [r"\documentclass{article}"] + [rf"\usepackage{{{p}}}" for p in PACKAGES]
    out += [r"\begin{document}", r"\section*{Safety check}",
            rf"{{\raggedright\noindent Spec: {_tt(report.file)} (time limit {report.timeout:g}\,s per query)\par}}"]
    out += _body(report, False)
    out.append(r"\end{document}")
    return wrap_source("\n".join(out)) + "\n"
