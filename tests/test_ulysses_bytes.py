"""The exact bytes of Ulysses' all-to-alls under a stated head split with GQA (docs/costs.md), against a
brute force written here: enumerate the g ranks of the group, give each the query heads the rule gives
it (and the kv heads its query heads read, or the rule's run over the kv heads), count the bytes each
rank exchanges with the g − 1 others and take the largest. The closed form (costs.ulysses_share, with
its exceptional sizes as cases) is evaluated at each size, over a grid of heads, kv heads, tensor and
Ulysses sizes, for every rule and both kv rules; a few plans are derived whole and their all-to-alls'
bytes compared too. And the reports name that case analysis (costreport.pieces) and value it as the
JSON's whole formula does."""

import io
import json
import re
from fractions import Fraction

import pytest
import sympy

from placement_logic.cli import main
from placement_logic.costs import derive
from placement_logic.costs.symbolic import LINE_POINTS, tex_width
from placement_logic.costs.ulysses_share import heads_share
from placement_logic.frontend.loader import load_string
from tests.test_ulysses_heads import _src, _stmts

RULES = ("uneven", "chunk", "floor")
KV_RULES = ("repeat", "split")


def _runs(rule: str, n: int, g: int) -> list[range]:
    """The heads (of n) each of the g ranks holds under the rule."""
    out, start = [], 0
    for r in range(g):
        if rule == "uneven":  # the remainder on the first ranks
            size = n // g + (r < n % g)
        elif rule == "chunk":  # ceil(n/g) until none are left
            size = min(-(-n // g), n - start)
        else:
            size = n // g
        out.append(range(start, start + size))
        start += size
    return out


def brute_bytes(rule: str, kv_rule: str, h: int, k: int, g: int, positions: int, head_bytes: int) -> int:
    """The largest rank's bytes in one all-to-all of the pair: from each other rank (``positions`` each) the q, k, v
    of its heads come in and the output of its query heads goes back."""
    q = _runs(rule, h, g)
    if kv_rule == "repeat":
        kv = [{j // (h // k) for j in run} for run in q]
    else:
        kv = [set(run) for run in _runs(rule, k, g)]
    most = 0
    for r in range(g):
        total = 0
        for p in range(g):
            if p != r:
                total += positions * head_bytes * (len(q[r]) + 2 * len(kv[r]) + len(q[r]))
        most = max(most, total)
    return most


def _grid():
    for heads in (4, 6, 8, 12, 16, 20, 28, 32):
        for kv in (d for d in range(1, heads + 1) if heads % d == 0):
            yield heads, kv


G, T = sympy.Symbol("g", positive=True, integer=True), sympy.Symbol("t", positive=True, integer=True)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kv_rule", KV_RULES)
def test_closed_form_against_brute_force_over_the_grid(rule, kv_rule):
    """Every (heads, kv heads) of the grid, every tensor size dividing the heads (the kv heads of a tensor rank: kv/t,
    one copied where t does not divide kv), every Ulysses size from 2 to past the heads; the share's bytes
    (g − 1)/g of g·share heads at s/g positions, both ways, against the count; t a number and t a symbol."""
    s, hd = 4096, 64
    checked = 0
    for heads, kv in _grid():
        symbolic_t = heads_share(rule, kv_rule, sympy.Integer(heads), sympy.Integer(kv), T, G)
        for t in (d for d in range(1, heads + 1) if heads % d == 0):
            h, k = heads // t, (kv // t if kv % t == 0 else 1)
            numeric_t = heads_share(rule, kv_rule, sympy.Integer(heads), sympy.Integer(kv), sympy.Integer(t), G)
            for g in range(2, h + 3):
                want = brute_bytes(rule, kv_rule, h, k, g, s // g, hd)
                for form in (numeric_t.xreplace({G: g}), symbolic_t.xreplace({T: t, G: g})):
                    got = Fraction(g - 1, g) * (s // g) * hd * 2 * g * Fraction(str(form))
                    assert got == want, (heads, kv, t, g, form)
                checked += 1
    assert checked > 500


def _a2a_bytes(text: str) -> list:
    a2a = [x for x in derive(load_string(text, "x.place").plans[0]).communication.collectives
           if x.collective.kind == "all_to_all"]
    assert len(a2a) == 2
    return [x.bytes_per_device / x.count for x in a2a]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kv_rule", KV_RULES)
@pytest.mark.parametrize("heads,kv", [(12, 4), (28, 4), (20, 5)])
def test_derived_plans_against_brute_force(rule, kv_rule, heads, kv):
    """The whole derivation (payload, ring factor, bytes per element): each all-to-all's bytes per occurrence at every
    Ulysses size, 65536/cp positions of one sample, heads of 128, 2 bytes per element."""
    forms = _a2a_bytes(_src(heads, kv, _stmts(rule, rule, kv_rule)))
    for g in range(2, heads + 3):
        want = brute_bytes(rule, kv_rule, heads, kv, g, Fraction(65536, g), 128 * 2)
        for f in forms:
            assert f.xreplace({x: {"cp": g, "dp": 2}[x.name] for x in f.free_symbols}) == want, (g, f)


def _run(*argv) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    assert code in (0, 1, 3), err.getvalue()
    return out.getvalue()


def _pieces_of(formula: str) -> list[sympy.Piecewise]:
    e = sympy.sympify(formula, locals={n: sympy.Symbol(n) for n in ("cp", "dp", "tp")})
    return [x for x in sympy.preorder_traversal(e) if isinstance(x, sympy.Piecewise)]


@pytest.mark.parametrize("path", ["examples/safe/ulysses_kv_heads_split.place", "examples/bugs/ulysses_heads_floor.place"])
def test_named_case_analysis_valued_as_the_json_formula(path, tmp_path):
    """The JSON keeps the whole case analysis; the LaTeX prints no case block in its equations (every line within
    the width), names it, lists its cases and values it at the bindings as the JSON's formula gives; Markdown
    shows the name and its definition."""
    data = json.loads(_run("cost", path, "--format", "json"))
    tex = _run("cost", path, "--format", "latex")
    bindings = {sympy.Symbol(n): b["value"] for n, b in data["bindings"].items()}
    plan = data["plans"][0] if isinstance(data["plans"], list) else next(iter(data["plans"].values()))
    pieces = _pieces_of(plan["communication"]["total"]["formula"])
    assert pieces, "the exact share under GQA has exceptional sizes here"
    equations = tex[tex.index(r"\begin{align*}"):tex.index(r"\end{align*}")]
    assert r"\begin{cases}" not in equations and r"\mathcal{P}_{" in equations
    for line in re.sub(r"%\n", "", equations).splitlines()[1:]:
        assert tex_width(line.split("&=", 1)[-1].replace(r"&\qquad", "").strip().removesuffix("\\\\")) <= LINE_POINTS
    items = dict(re.findall(r"\\item\[\$(\\mathcal\{P\}_\{\d+\})\$\] (.*)", re.sub(r"%\n", "", tex)))
    stated = {re.search(r"at the bindings above, \$.* = (\d+)\$", v).group(1) for v in items.values()}
    valued = {str(p.xreplace(bindings)) for p in pieces}
    assert stated == valued
    for p in pieces:  # every case's value and size is listed
        for value, cond in p.args[:-1]:
            for n in re.findall(r"\d+", str(value) + str(cond)):
                assert any(n in v for v in items.values()), (n, cond)
    md = _run("cost", path, "--format", "markdown")
    assert "Piecewise" not in md.split("P1:")[0] and re.search(r"P1: \d+ cases", md)


def test_cases_kept_as_written_in_the_report():
    """With the tensor size a symbol the share has a case per exceptional (t, g); the report keeps each as written
    (a pair of sizes) rather than sympy's merged conditions (a conjunction of disjunctions thousands of
    characters long, seconds to build): every listed case names one tensor and one Ulysses size."""
    from placement_logic.costreport import latex
    from placement_logic.costreport.build import build
    from placement_logic.costreport.pieces import of_plan

    r = build(load_string(_src(28, 4, _stmts("uneven", "uneven", "repeat"), tp=2), "x.place"))
    pieces = of_plan(r.plans[0])
    assert pieces and all(len(p.cases) >= 2 for p in pieces)
    for p in pieces:
        for _, cond in p.text_cases:
            assert re.fullmatch(r"Eq\(cp, \d+\) & Eq\(tp, \d+\)", cond), cond
    assert len(latex.render(r)) < 20000
