"""``placement check --format latex``: the verdicts for papers, read back independently.

The LaTeX is checked without TeX (none is installed where the suite runs): plain ASCII, braces and
environments balanced, no special character of user text left unescaped, and every obligation of the
JSON report of the same run found in the obligations table, its name, condition, verdict and scope
read back by a de-TeX written here (not the renderer's escaping run backwards); every refutation's
failing equation and re-run command and every unknown's reason present. A file name full of TeX's
special characters cannot break the document. The quick tier renders three examples (refuted,
proved, one with sizes an obligation fixes); the slow tier every example.
"""

import io
import json
import re
import shutil
from pathlib import Path

import pytest

from placement_logic.check.render import render
from placement_logic.check.render_latex import render as latex
from placement_logic.check.rules import RULES
from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec
from tests.test_cost_cli import check_balanced

EXAMPLES = sorted(str(p) for p in Path("examples").rglob("*.place") if "# expect:" in p.read_text())
QUICK = ["examples/bugs/dp_mean_of_means.place", "examples/safe/kv_copies_joint_summed.place",
         "examples/bugs/apex_label_smoothing_saved_vocab.place"]

# LaTeX commands the report may write for characters past ASCII, and what they stand for
COMMANDS = {r"\cdot": "·", r"\Sigma": "Σ", r"\varepsilon": "ε", r"\geq": "≥", r"\leq": "≤", r"\|": "‖",
            r"\times": "×", "^{2}": "²", "^{3}": "³", r"\lceil": "⌈", r"\rceil": "⌉", r"\lfloor": "⌊",
            r"\rfloor": "⌋", r"\neq": "≠", r"\in": "∈", r"\nabla": "∇", r"\leftarrow": "←", r"\rightarrow": "→",
            r"^{\mathsf{T}}": "ᵀ", r"\ell": "ℓ", r"\alpha": "α", r"\beta": "β", r"\pi": "π", r"\Theta": "Θ",
            r"\Psi": "Ψ", r"\infty": "∞", r"\approx": "≈", r"\sum": "∑", r"\pm": "±", r"\lambda": "λ",
            r"\mu": "μ", r"\sigma": "σ", r"\gamma": "γ", r"\delta": "δ", r"\tau": "τ", r"\rho": "ρ", "-": "−"}
ESCAPES = {r"\textbackslash{}": "\\", r"\_": "_", r"\%": "%", r"\&": "&", r"\#": "#", r"\$": "$", r"\{": "{",
           r"\}": "}", r"\^{}": "^", r"\~{}": "~", r"\textless{}": "<", r"\textgreater{}": ">",
           r"\textbar{}": "|", r"\ldots{}": "…", "-{}": "-", "---": "—", "--": "–", r"\,": " "}


def joined(tex: str) -> str:
    """The source with its wrapped lines joined (a line ending in % continues on the next)."""
    return re.sub(r"%\n", "", tex)


def detex(cell: str) -> str:
    """Text as a reader of the typeset page sees it: commands and escapes back to characters."""
    cell = cell.replace(r"\allowbreak{}", "").strip()
    cell = re.sub(r"\\ensuremath\{((?:[^{}]|\{[^{}]*\}|\{[^{}]*\{[^{}]*\}[^{}]*\})*)\}",
                  lambda m: COMMANDS.get(m.group(1), "?" + m.group(1)), cell)
    for _ in range(3):
        cell = re.sub(r"\\(?:texttt|textbf)\{((?:\\[{}]|[^{}]|\{\})*)\}", r"\1", cell)
    out, i = [], 0
    keys = sorted(ESCAPES, key=len, reverse=True)
    while i < len(cell):
        for k in keys:
            if cell.startswith(k, i):
                out.append(ESCAPES[k])
                i += len(k)
                break
        else:
            out.append(cell[i])
            i += 1
    return "".join(out)


def plain(text: str) -> str:
    """The page's form of a report string: dashes as TeX sets them, thin spaces as spaces."""
    return text.replace("−", "-").replace("\u2009", " ")


def rows(tex: str) -> list[list[str]]:
    """The obligations tables' rows, cells read back."""
    out = []
    for table in re.findall(r"\\endfoot\n(.*?)\\end\{longtable\}", joined(tex), re.S):
        for line in table.strip().splitlines():
            assert line.endswith(r" \\"), line
            cells = re.split(r"(?<!\\)&", line[:-3])
            assert len(cells) == 4, line
            out.append([detex(c) for c in cells])
    return out


def check_document(tex: str) -> None:
    assert tex.isascii()
    check_balanced(tex)
    body = joined(tex)
    body = "\n".join(line for line in body.splitlines() if not line.startswith("% "))  # the fragment's head
    body = re.sub(r"\\ensuremath\{(?:[^{}]|\{[^{}]*\}|\{[^{}]*\{[^{}]*\}[^{}]*\})*\}", "", body)
    for ch in "#$_%^~":
        assert not re.search(r"(?<!\\)" + re.escape(ch), body.replace(r"\^{}", "").replace(r"\~{}", "")), ch
    outside = re.sub(r"\\begin\{longtable\}.*?\\end\{longtable\}", "", body, flags=re.S)
    assert not re.search(r"(?<!\\)&", outside)  # alignment tabs only in the tables (their rows: ``rows``)


def condition_text(condition: str) -> str:
    return f"rule {condition}" if condition in RULES else condition.replace("_", " ")


def agree_with_json(tex: str, data: dict) -> None:
    """Every obligation of the JSON report is a row of the LaTeX tables, in order, read back alike."""
    expected = [[o["name"], condition_text(o["condition"]), o["verdict"], plain(o["scope"])]
                for p in data["plans"] for o in p["obligations"]]
    assert [[plain(c) for c in r] for r in rows(tex)] == [[plain(c) for c in e] for e in expected]
    page = plain(detex(joined(tex)))
    for p in data["plans"]:
        assert f"Plan {p['plan']}: {p['verdict']}" in page
        for o in p["obligations"]:
            if o["verdict"] == "unknown":
                assert plain(o["reason"]) in page
            if o["counterexample"]:
                assert plain(o["counterexample"]["equation"]) in page
        for f in p["findings"]:
            assert plain(f["cause"]) in page
    refuted = [o for p in data["plans"] for o in p["obligations"] if o["verdict"] == "refuted"]
    roots = {f["root"] for p in data["plans"] for f in p["findings"]}
    for o in refuted:
        if o["name"] in roots:
            assert plain(o["counterexample"]["command"]) in page


def both(path: str) -> tuple[str, str, dict]:
    report = check_spec(load_spec(path), timeout=20)
    return latex(report), latex(report, fragment=True), json.loads(render(report, "json"))


def _assert_example(path: str) -> None:
    doc, fragment, data = both(path)
    for tex in (doc, fragment):
        check_document(tex)
        agree_with_json(tex, data)
    assert doc.startswith(r"\documentclass") and doc.rstrip().endswith(r"\end{document}")
    assert r"\documentclass" not in fragment and fragment.startswith("% placement-logic check report")


@pytest.mark.parametrize("path", QUICK)
def test_quick_examples_read_back_as_the_json_reports(path):
    _assert_example(path)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES)
def test_every_example_reads_back_as_its_json_report(path):
    _assert_example(path)


def test_the_scope_an_obligation_fixes_is_printed():
    doc, _, _ = both("examples/safe/kv_copies_joint_summed.place")
    scopes = {r[3] for r in rows(doc)}
    assert "all sizes with tp=3, tl=4" in scopes and "all mesh sizes" in scopes


def test_a_file_name_of_special_characters_cannot_break_the_document(tmp_path):
    name = "a&b_%#$~^{x}\\y.place"
    spec = tmp_path / name
    shutil.copy("examples/bugs/dp_mean_of_means.place", spec)
    out, err = io.StringIO(), io.StringIO()
    code = main(["check", str(spec), "--format", "latex"], out, err)
    assert code == 1, err.getvalue()
    tex = out.getvalue()
    check_document(tex)
    spec_line = re.search(r"Spec: (.*?) \(time limit", joined(tex)).group(1)
    assert detex(spec_line) == str(spec)


def test_latex_fragment_flag_and_output_file(tmp_path):
    target = tmp_path / "verdicts.tex"
    out, err = io.StringIO(), io.StringIO()
    code = main(["check", "examples/safe/kv_copies_joint_summed.place", "--latex-fragment", "-o", str(target)],
                out, err)
    assert code == 0, err.getvalue()
    tex = target.read_text()
    check_document(tex)
    assert "needs \\usepackage{amsmath,amssymb,booktabs,longtable,array}" in tex
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.parametrize("text, page", [("‖g‖² ≠ Σ ε·x", "‖g‖² ≠ Σ ε·x"), ("a_b & 50% #1 $x {y} ~ ^ \\", None),
                                        ("α ≤ β, ⌈n/2⌉ ≥ ⌊n/2⌋", None), ("x < y > z | w", None), ("--set a --- b – c", None)])
def test_text_reads_back_as_written(text, page):
    from placement_logic.check.render_latex import tex

    written = tex(text, breaks=True)
    assert written.isascii()
    check_balanced(written)
    assert detex(written) == (page or text)


def test_a_character_with_no_command_is_named_by_its_code_point():
    from placement_logic.check.render_latex import tex

    assert tex("⨀") == "[U+2A00]"
