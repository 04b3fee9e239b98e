"""LaTeX for papers: whole integers with thin-space groups, broken long equations, a "where" list
defining every symbol, tables that fit the page, and ``--latex-fragment`` for ``\\input``.

pdflatex compiles every example's document and fragment when it is installed (skipped
otherwise, as in tests/test_cost_cli.py) and no box may come out wider than the page; the
structural checks below run everywhere, with the width estimate that breaks equations
(``costs.symbolic.tex_width``) held to TeX's own widths where TeX is at hand."""

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import sympy

from placement_logic.cli import main
from placement_logic.costreport.latex import unwrap_source, wrap_source
from placement_logic.costs.symbolic import LINE_POINTS, PlacementLatexPrinter, display_name, grouped, tex_width
from tests.test_cost_cli import check_balanced

EXAMPLES = sorted(str(p) for p in Path("examples").rglob("*.place"))


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("n, text", [(0, "0"), (7, "7"), (1024, "1024"), (10000, r"10\,000"),
                                     (67108864, r"67\,108\,864"), (-7500000000, r"-7\,500\,000\,000"),
                                     (123456789012, r"123\,456\,789\,012")])
def test_grouped_integers(n, text):
    assert grouped(n) == text
    assert int(text.replace(r"\,", "")) == n


def test_printer_keeps_integers_and_fractions_whole():
    p = PlacementLatexPrinter()
    assert p.doprint(sympy.Integer(67108864)) == r"67\,108\,864"
    assert p.doprint(sympy.Rational(-100000, 3)) == r"- \frac{100\,000}{3}"
    x = sympy.Symbol("x", positive=True)
    assert "10^" not in p.doprint(7500000000 * x + 33554432)


def _formulas(data):
    """Every formula string of a cost JSON document (an independent path to the symbols)."""
    if isinstance(data, dict):
        for k, v in data.items():
            if k == "formula" and isinstance(v, str):
                yield v
            else:
                yield from _formulas(v)
    elif isinstance(data, list):
        for v in data:
            yield from _formulas(v)


def _where_items(tex):
    block = tex[tex.index(r"\begin{description}"):tex.index(r"\end{description}")]
    return set(re.findall(r"\\item\[\$(.*?)\$\]", block))


def _equation_lines(tex):
    inside = False
    for line in unwrap_source(tex).splitlines():
        if line.startswith(r"\begin{align*}"):
            inside = True
        elif line.startswith(r"\end{align*}"):
            inside = False
        elif inside:
            yield line.split("&=", 1)[-1].replace(r"&\qquad", "").strip().removesuffix("\\\\").strip()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_every_example_for_papers(path):
    code, full, err = run("compare", path, "--format", "latex")
    assert code in (0, 1, 3), err
    code, frag, err = run("compare", path, "--latex-fragment")
    assert code in (0, 1, 3), err
    _, data, _ = run("compare", path, "--format", "json")
    data = json.loads(data)
    for tex in (full, frag):
        check_balanced(tex)
        assert "10^{" not in tex.replace("$10^9$", ""), "an integer folded into a power of ten"
        assert "·10^" not in tex and "e+" not in tex
        for number in re.findall(r"\d+(?:\\,\d+)+", tex):
            groups = number.split(r"\,")
            assert 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:]), number
        for line in _equation_lines(tex):
            assert tex_width(line) <= LINE_POINTS, line
    # every number of the plain formulas appears whole in the LaTeX
    shown = [f for _, plan in _plans(data) for f in _formulas(plan["memory"]["device"])]
    shown += [f for _, plan in _plans(data) for f in (plan["communication"]["total"]["formula"],
                                                       plan["communication"]["total"]["volume_formula"])]
    plain = {int(n) for f in shown for n in re.findall(r"(?<![\w.])\d+(?![\w.])", f)}
    digits = set(re.findall(r"\d+", frag.replace(r"\,", "")))
    assert {str(n) for n in plain} <= digits
    # every symbol of the equations is defined in the "where" list
    axes = [a["axis"] for a in data["mesh"]]
    used = set()
    for _name, plan in _plans(data):
        for row in list(plan["memory"]["device"].values()) + [plan["communication"]["total"]]:
            used |= set(re.findall(r"[A-Za-z_]\w*", row["formula"])) - {"Max", "Min", "ceiling", "floor",
                                                                              "Piecewise", "Eq", "Ne", "And", "Or", "True"}
    if used:
        assert {display_name(n, axes) for n in used} <= _where_items(frag)
    # fragments are for \input: no preamble, no document environment
    assert r"\documentclass" not in frag and r"\begin{document}" not in frag and r"\usepackage" not in \
        frag.replace(r"% needs \usepackage", "")
    assert frag.count(r"\begin{tabular}") == 1 and frag.count(r"\begin{align*}") == len(data["plans"])


def _plans(data):
    plans = data["plans"]
    return [(p["plan"], p) for p in plans] if isinstance(plans, list) else list(plans.items())


def test_wide_comparisons_turn_sideways_with_plans_as_rows():
    _, tex, _ = run("compare", "examples/zero_paper.place", "--format", "latex")
    assert r"\usepackage{rotating}" in tex and r"\begin{sidewaystable}" in tex
    body = tex[tex.index(r"\midrule", tex.index(r"\begin{sidewaystable}")):tex.index(r"\bottomrule")]
    rows = [line.split(" & ")[0] for line in body.splitlines() if line.endswith(r"\\")]
    assert rows == [rf"\texttt{{{p}}}" for p in ("dp", "zero1", "zero2", "zero3")]
    _, tex, _ = run("compare", "examples/llama70b_3d.place", "--format", "latex")  # two plans: portrait
    assert r"\begin{sidewaystable}" not in tex and r"\usepackage{rotating}" not in tex
    assert re.search(r"\\begin\{tabular\}\{lrr\}", tex)


def test_long_maximum_is_broken_one_argument_a_line():
    _, tex, _ = run("cost", "examples/llama70b_3d.place", "--plan", "megatron_3d", "--latex-fragment")
    total = tex[tex.index(r"M_{\mathrm{total}}"):tex.index(r"M^{\mathrm{first}}")]
    assert total.startswith(r"M_{\mathrm{total}} &= \max\Bigl\{") and r"\Bigr\}" in total
    assert total.count(r"&\qquad") >= 2
    check_balanced(total.replace(r"\Bigl\{", "").replace(r"\Bigr\}", "").replace(r"\Bigl(", "(").replace(
        r"\Bigr)", ")"))


def test_fragment_flag_is_the_fragment_format_on_cost_and_compare():
    for cmd in ("cost", "compare"):
        _, a, _ = run(cmd, "examples/zero_paper.place", "--latex-fragment")
        _, b, _ = run(cmd, "examples/zero_paper.place", "--format", "latex-fragment")
        assert a == b and a.startswith("% placement-logic cost report")


def test_ratios_in_the_table_are_values_when_bound():
    _, tex, _ = run("compare", "examples/zero_paper.place", "--format", "latex")
    row = next(line for line in tex.splitlines() if line.startswith(r"\texttt{zero3} &"))
    assert row.endswith(r"& $\tfrac{1}{64}$ & $\tfrac{3}{2}$ \\")


def test_file_names_cannot_break_the_document(tmp_path):
    from placement_logic.costreport.rows import tex_text

    assert "\n" not in tex_text("a\nb\r\nc") and tex_text("50%_x") == r"50\%\_x"


# pdflatex takes about a second a document: the quick tier compiles the 3D example's document
# and fragment, the full tier every example's
QUICK_COMPILE = "llama70b_3d"


@pytest.mark.parametrize("path", [pytest.param(p, marks=() if Path(p).stem == QUICK_COMPILE else pytest.mark.slow)
                                  for p in EXAMPLES if "/library/" not in p or p.endswith("zero3.place")],
                         ids=lambda p: Path(p).stem)
def test_documents_and_fragments_compile_when_pdflatex_present(tmp_path, path):
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed")
    _, full, _ = run("compare", path, "--format", "latex")
    _, frag, _ = run("compare", path, "--latex-fragment")
    (tmp_path / "full.tex").write_text(full)
    needs = re.search(r"% needs \\usepackage\{(.*)\}", frag).group(1)
    (tmp_path / "frag.tex").write_text(frag)
    (tmp_path / "paper.tex").write_text(rf"\documentclass{{article}}\usepackage{{{needs}}}"
                                        "\n\\begin{document}\n\\input{frag}\n\\end{document}\n")
    for doc in ("full.tex", "paper.tex"):
        res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc], cwd=tmp_path,
                             capture_output=True, timeout=120)
        assert res.returncode == 0, res.stdout[-2000:]
        log = (tmp_path / doc.replace(".tex", ".log")).read_text(errors="replace")
        over = re.findall(r"Overfull \\[hv]box \((\d+(?:\.\d+)?)pt too (?:wide|high)\)", log)
        assert not over, f"an equation, table or title wider (or a display longer) than the page: {over}"


def test_width_estimate_against_tex_when_pdflatex_present(tmp_path):
    """Every formula line the examples print, set by TeX: the estimate is never below TeX's width."""
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed")
    pieces = set()
    for path in EXAMPLES:
        _, frag, _ = run("compare", path, "--latex-fragment")
        for line in _equation_lines(frag):
            body = line.strip().rstrip("\\").strip().rstrip(",")
            for big, plain in ((r"\Bigl\{", r"\{"), (r"\Bigr\}", r"\}"), (r"\Bigl(", "("), (r"\Bigr)", ")")):
                body = body.replace(big, plain)
            pieces.add(body)
    pieces = sorted(pieces)
    doc = [r"\documentclass{article}", r"\usepackage{amsmath}", r"\begin{document}"]
    doc += [rf"\setbox0\hbox{{$\displaystyle {p}$}}\typeout{{W=\the\wd0}}" for p in pieces]
    (tmp_path / "w.tex").write_text("\n".join(doc + [r"\end{document}"]) + "\n")
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "w.tex"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    widths = [float(w) for w in re.findall(r"W=([\d.]+)pt", res.stdout)]
    assert len(widths) == len(pieces)
    under = [(w, tex_width(p), p) for w, p in zip(widths, pieces) if tex_width(p) < w]
    assert not under, under[:3]


def test_source_lines_wrapped_without_changing_the_tex():
    long = "x &= " + " + ".join(rf"\frac{{{k}}}{{N_{{\mathrm{{dp}}}}}}" for k in range(200)) + r" \\"
    glued = r"\frac{1}{2}" * 60  # no space anywhere: cut before a control word
    comment = "% " + "word " * 80
    text = "\n".join([long, glued, comment, "short"])
    wrapped = wrap_source(text, 120)
    assert max(map(len, wrapped.splitlines())) <= 120
    lines = unwrap_source(wrapped).splitlines()
    assert lines[:2] == [long, glued] and lines[-1] == "short"  # TeX reads the same tokens
    comments = lines[2:-1]
    assert all(line.startswith("% ") for line in comments)  # the comment stays a comment
    assert " ".join(c[2:].strip() for c in comments).split() == comment[2:].split()


@pytest.mark.parametrize("plans", [("--plan", "megatron_3d"), pytest.param((), marks=pytest.mark.slow)],
                         ids=["one plan", "every plan"])
def test_step_time_and_mfu_as_named_terms_every_line_short(plans):
    _, tex, _ = run("cost", "examples/llama70b_3d.place", *plans, "--device", "h100_sxm", "--format", "latex")
    assert max(map(len, tex.splitlines())) <= 200
    body = unwrap_source(tex)
    step = next(line for line in body.splitlines() if line.startswith(r"T_{\mathrm{step}} &="))
    assert step.startswith(r"T_{\mathrm{step}} &= \max\bigl(T_{\mathrm{compute}},\ T_{\mathrm{comm}}^{\mathrm{overlap}}"
                           r"\bigr) + T_{\mathrm{comm}}^{\mathrm{exposed}} + T_{\mathrm{opt}} \quad = \text{")
    mfu = next(line for line in body.splitlines() if line.startswith(r"\mathrm{MFU} &="))
    assert r"\frac{F_{\mathrm{model}}}{N \cdot P_{\mathrm{peak}} \cdot T_{\mathrm{step}}}" in mfu and len(mfu) < 200
    for term in (r"T_{\mathrm{compute}} &=", r"T_{\mathrm{bubble}} &=", r"T_{\mathrm{comm}}^{\mathrm{overlap}} &=",
                 r"T_{\mathrm{comm}}^{\mathrm{exposed}} &=", r"T_{\mathrm{opt}} &=", r"F_{\mathrm{model}} &="):
        assert any(line.startswith(term) for line in body.splitlines()), term  # each defined on its own
    assert r"\item[$N$] the devices, $P_{\mathrm{peak}}$" in body


def test_symbolic_keeps_the_shape_symbols(tmp_path):
    status, tex, err = run("cost", "examples/llama70b_3d.place", "--symbolic", "--format", "latex")
    assert status == 0, err
    body = unwrap_source(tex)
    params = next(line for line in body.splitlines() if line.startswith(r"M_{\mathrm{params}} &="))
    assert " L " in params.replace("\\cdot", " ") and " h " in params.replace("\\cdot", " ") and "8192" not in params
    for sym, value in (("h", r"8192"), ("L", "80"), ("a", "64"), ("f", r"28\,672"), ("V", r"32\,000"), ("s", "4096")):
        assert rf"\item[${sym}$]" in body and rf"(\texttt{{{sym}}}), ${value}$" in body
    # the same numbers either way: every value of the JSON report agrees
    _, plain, _ = run("cost", "examples/llama70b_3d.place", "--format", "json")
    _, symbolic, _ = run("cost", "examples/llama70b_3d.place", "--format", "json", "--symbolic")
    a, b = json.loads(plain)["plans"], json.loads(symbolic)["plans"]
    assert [p["memory"]["device"]["total"]["exact"] for p in a] == [p["memory"]["device"]["total"]["exact"] for p in b]
    # a stated parameter count is Ψ: 2 bytes of weights over dp, by hand
    f = tmp_path / "p.place"
    f.write_text("from std.data import zero3\nmodel { params = 1000 }\nmesh { dp = 8 }\nplan p { dp: zero3 }\n")
    _, tex, _ = run("cost", str(f), "--symbolic", "--format", "latex")
    params = next(line for line in unwrap_source(tex).splitlines() if line.startswith(r"M_{\mathrm{params}} &="))
    assert params.startswith(r"M_{\mathrm{params}} &= \frac{2 \cdot \Psi}{N_{\mathrm{dp}}}")
    assert r"\item[$\Psi$] the model's parameter count (\texttt{psi}), $1000$" in tex
