"""What the capacity step's dropped (token, expert) pairs add to the MoE combine (check.encode_capdrop,
``GI capacity dropped``): nothing, and no gradient to their gate weights, in the objective; the kept
experts' weights renormalised over the kept ones exactly where the model states ``drop_renormalise``.
Verdicts are compared with the concrete simulator (tests/simulator_capdrop.py: sympy gradients of the layer
on its own dispatch), and a refutation's outputs are recomputed by the simulator on the counterexample's
call."""

from __future__ import annotations

import io
import random
import re
from fractions import Fraction
from itertools import islice

import pytest
import simulator_capdrop as sim

from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI capacity dropped"
SLOT = {"drops_zeroed": "zero", "dropped_uninitialised": "stale", "dropped_weighted": "hidden", None: "zero"}
WEIGHTS = {"renormalise_kept": "kept", "renormalise_dropped": "chosen"}


def text(experts=8, top_k=2, cf="1", verbs=("dropped_weighted",), renormalise=False) -> str:
    said = "".join(f"  override capacity: {v}\n" for v in verbs)
    flag = "    drop_renormalise\n" if renormalise else ""
    return ("from std.data import ddp\nfrom std.expert import expert_parallel\n\nmodel {\n  transformer {\n"
            f"    hidden = 1024\n    layers = 4\n    heads = 16\n    ffn = 1024\n    vocab = 32000\n"
            f"    experts = {experts}\n    top_k = {top_k}\n    capacity_factor = {cf}\n{flag}  }}\n  seq = 2048\n"
            f"  microbatch = 2\n  microbatches = 4\n}}\n\nmesh {{\n  dp = 2\n  ep = 2\n}}\n\nplan p {{\n  dp: ddp\n"
            f"  ep: expert_parallel\n{said}}}\n")


def _ob(src, name=NAME):
    report = check_spec(load_string(src, "drop.place"), timeout=20)
    found = [o for o in report.obligations if o.name == name]
    return found[0] if found else None


def _path(verbs, renormalise):
    out = next((v for v in verbs if v in SLOT), None)
    weights = next((WEIGHTS[v] for v in verbs if v in WEIGHTS), "kept" if renormalise else "none")
    return SLOT[out], weights


def test_a_dropped_token_by_hand():
    """E = 8, k = 2, capacity factor 1, two tokens choosing experts 0 and 1: C = ⌈2·2/8⌉ = 1. Token 0 scores
    (2/3, 1/3), token 1 (1/2, 1/2): expert 0 keeps token 0 (2/3 > 1/2), expert 1 token 1 (1/2 > 1/3). Token 0
    (x = 1) keeps expert 0, whose output is 2·1: renormalised y = 1 + 1·2 = 3; the weight kept as it is,
    1 + (2/3)·2 = 7/3. Dropped pair (0, 1) through a buffer cloned from the hidden state adds (1/3)·1, its gate
    gradient 1; a stale value s adds s/3, gradient s. The logits' gradient, g = softmax(l):
    ∂L/∂l_j = g_j (∂L/∂g_j − Σ_i g_i ∂L/∂g_i); kept as is, ∂L/∂g = (2, 0): (2/3)(2 − 4/3) = 4/9 and
    (1/3)(0 − 4/3) = −4/9; renormalised, y does not depend on the logits at all (one kept expert): 0."""
    call = [(False, (Fraction(2, 3), Fraction(1, 3)) + (Fraction(0),) * 6, (0, 1)),
            (False, (Fraction(1, 2), Fraction(1, 2)) + (Fraction(0),) * 6, (0, 1))]
    f = Fraction
    assert sim.objective(call, 8, 2, f(1), True)[0] == (f(3), {1: f(0)}, {0: f(0), 1: f(0)})
    assert sim.objective(call, 8, 2, f(1), False)[0] == (f(7, 3), {1: f(0)}, {0: f(4, 9), 1: f(-4, 9)})
    # hidden: ∂L/∂g = (2, 1): Σ g ∂ = 4/3 + 1/3 = 5/3; (2/3)(2 − 5/3) = 2/9, (1/3)(1 − 5/3) = −2/9
    assert sim.layer(call, 8, 2, f(1), "hidden", "none")[0] == (f(8, 3), {1: f(1)}, {0: f(2, 9), 1: f(-2, 9)})
    assert sim.layer(call, 8, 2, f(1), "stale", "none")[0][:2] == (f(7, 3) + f(sim.STALE, 3), {1: f(sim.STALE)})
    # over every chosen expert: g0/(g0+g1)·2 is the same function of the logits as g0·2 (the weights sum to 1),
    # though the dropped gate weight itself gets −2·(2/3) = −4/3 through the denominator
    chosen = sim.layer(call, 8, 2, f(1), "zero", "chosen")[0]
    assert chosen == (f(7, 3), {1: f(-4, 3)}, {0: f(4, 9), 1: f(-4, 9)})
    assert chosen[0] != sim.objective(call, 8, 2, f(1), True)[0][0]


# (E, k, cf, statements, drop_renormalise)
GRID = [
    (8, 2, "1", ("dropped_weighted",), False), (8, 1, "1", ("dropped_weighted",), False),
    (8, 2, "1", ("dropped_uninitialised",), True), (4, 4, "1/2", ("dropped_uninitialised",), False),
    (8, 2, "1", ("drops_zeroed",), True), (8, 2, "1", ("drops_zeroed",), False),
    (8, 2, "1", ("renormalise_kept",), True), (8, 2, "1", ("renormalise_kept",), False),
    (8, 2, "3/2", ("renormalise_dropped",), True), (4, 2, "1", ("renormalise_dropped",), True),
    (8, 2, "1", ("drops_zeroed", "renormalise_dropped"), True), (16, 4, "2", ("dropped_weighted", "renormalise_kept"), True),
]


@pytest.mark.parametrize("e,k,cf,verbs,renorm", GRID)
def test_checker_and_simulator_agree(e, k, cf, verbs, renorm):
    slot, weights = _path(verbs, renorm)
    found = sim.differs(e, k, Fraction(cf), slot, weights, renorm, seed=e + k)
    ob = _ob(text(e, k, cf, verbs, renorm))
    assert (ob.verdict is Verdict.REFUTED) == (found is not None)
    if found is not None:
        _replayed_by_the_simulator(ob.counterexample, e, k, Fraction(cf), slot, weights, renorm)


def _random_cases(n):
    """Random (E, k, cf, statements, drop_renormalise): E even (ep = 2 divides it), 1 <= k <= min(E, 4)."""
    rng = random.Random(2510)
    out = []
    for _ in range(n):
        e = rng.choice((2, 4, 6, 8))
        k = rng.randint(1, min(e, 4))
        verbs = tuple(v for v in (rng.choice(("drops_zeroed", "dropped_uninitialised", "dropped_weighted", None)),
                                  rng.choice(("renormalise_kept", "renormalise_dropped", None))) if v)
        out.append((e, k, str(Fraction(rng.randint(1, 8), rng.randint(1, 4))), verbs or ("dropped_weighted",),
                    rng.random() < 0.5))
    return out


@pytest.mark.parametrize("e,k,cf,verbs,renorm", _random_cases(10))
def test_random_models_agree_with_the_simulator(e, k, cf, verbs, renorm):
    """The checker's verdict (refuted, proved, or PL506 / PL275 where the statement changes nothing) against
    the simulator's search of random router calls; a refutation's outputs recomputed by the simulator."""
    slot, weights = _path(verbs, renorm)
    found = sim.differs(e, k, Fraction(cf), slot, weights, renorm, seed=7 * e + k)
    try:
        ob = _ob(text(e, k, cf, verbs, renorm))
    except DiagnosticError as exc:
        code = exc.diagnostics[0].code
        if code == "PL506":  # nothing dropped: no statement changes anything
            assert found is None
        else:  # PL275 / PL290: the renormalisation changes nothing (the other statement may still depart)
            assert (code == "PL275" and k == 1) or (code == "PL290" and weights == "chosen" and not renorm)
            plain = "kept" if renorm else "none"
            for call in islice(sim.calls(e, k, seed=e), 12):
                for a, b in zip(sim.layer(call, e, k, Fraction(cf), slot, weights),
                                sim.layer(call, e, k, Fraction(cf), slot, plain)):
                    assert (a[0], a[2]) == (b[0], b[2])
        return
    assert (ob.verdict is Verdict.REFUTED) == (found is not None)
    if found is not None:
        _replayed_by_the_simulator(ob.counterexample, e, k, Fraction(cf), slot, weights, renorm)


def _replayed_by_the_simulator(cex, e, k, cf, slot, weights, renorm):
    """The counterexample's call rebuilt from its description (N tokens choosing 0..k-1, token j scoring
    (2N-j, N+j, N, ...)/((k+1)N)); the printed outputs are the simulator's."""
    values = dict(cex.values)
    n = int(re.search(r"one router call of (\d+) tokens", values["routing"]).group(1))
    j = int(re.search(r"token (\d+)'s gate weights", values["routing"]).group(1))
    call = []
    for t in range(n):
        raw = [2 * n - t, n + t] + [n] * (k - 2) if k >= 2 else [1]
        call.append((False, tuple(Fraction(raw[i], sum(raw)) if i < k else Fraction(0) for i in range(e)),
                     tuple(range(k))))
    stale = re.search(r"stale buffer value (\d+)", values["path"])  # the value the path's buffer holds
    got = sim.layer(call, e, k, cf, slot, weights, int(stale.group(1)) if stale else sim.STALE)[j]
    want = sim.objective(call, e, k, cf, renorm)[j]
    assert want != got
    assert values[f"objective's token {j}"].startswith(f"y = {_f(want[0])};")
    assert values[f"path's token {j}"].startswith(f"y = {_f(got[0])};")
    for i, g in got[1].items():
        assert f"∂L/∂g[{j},{i}] = {_f(g)}" in values[f"path's token {j}"]
    for side, grads in (("path", got[2]), ("objective", want[2])):
        for i, g in grads.items():
            assert f"∂L/∂l[{j},{i}] = {_f(g)}" in values[f"{side}'s token {j}"]
    assert any(w in " ".join(cex.diagnosis) for w in ("uninitialised", "hidden states", "renormalised"))


def _f(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def test_no_statement_adds_no_obligation_and_the_padding_statement_stays_apart():
    assert _ob(text(verbs=())) is None
    both = text(verbs=("counts_padding", "dropped_weighted"))
    assert _ob(both).verdict is Verdict.REFUTED
    assert _ob(both, "GI capacity").verdict is Verdict.REFUTED
    assert _ob(text(verbs=("masks_padding", "drops_zeroed")), "GI capacity").verdict is Verdict.PROVED


@pytest.mark.parametrize("src,code", [
    (text(cf="4"), "PL506"),  # 4 · 2 >= 8: nothing dropped
    (text(cf="4", verbs=("renormalise_kept",)), "PL506"),
    (text(top_k=1, verbs=("renormalise_kept",)), "PL275"),
    (text(verbs=("renormalise_dropped",)), "PL290"),
    (text().replace("    experts = 8\n    top_k = 2\n", "").replace("  ep: expert_parallel\n", "")
     .replace("dp = 2\n  ep = 2", "dp = 2"), "PL273"),
    (text(verbs=("dropped_weighted over (dp)",)), "PL122"),
])
def test_refused_statements(src, code):
    with pytest.raises(DiagnosticError) as exc:
        load_string(src, "drop.place")
    assert exc.value.diagnostics[0].code == code
    if code in ("PL506", "PL275"):  # the simulator agrees that nothing changes there
        e, k, cf = (8, 1, "1") if code == "PL275" else (8, 2, "4")
        for slot, weights, renorm in (("stale", "none", False), ("zero", "chosen", True), ("zero", "kept", False)):
            if code == "PL506" or slot == "zero":
                assert sim.differs(e, k, Fraction(cf), slot, weights, renorm) is None
    if code == "PL290":
        assert sim.differs(8, 2, Fraction(1), "zero", "chosen", False) is None


def test_drops_zeroed_at_a_factor_that_drops_nothing_is_accepted():
    assert _ob(text(cf="4", verbs=("drops_zeroed",))).verdict is Verdict.PROVED


def test_fmt_round_trip():
    src = text(verbs=("dropped_uninitialised", "renormalise_kept"), renormalise=True)
    messy = src.replace("  override capacity: renormalise_kept", "  override   capacity:renormalise_kept")
    assert format_source(messy, "drop.place") == src
    assert format_source(src, "drop.place") == src


def test_the_statements_move_no_bytes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outs = []
    for verbs in (("dropped_weighted",), ("renormalise_kept",), ()):
        (tmp_path / "drop.place").write_text(text(verbs=verbs, renormalise=True))
        out, err = io.StringIO(), io.StringIO()
        assert main(["cost", "drop.place"], out=out, err=err) == 0, err.getvalue()
        outs.append(out.getvalue())
    assert outs[0] == outs[1] == outs[2]
