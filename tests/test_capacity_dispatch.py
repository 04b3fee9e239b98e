"""The MoE dispatch's capacity step (check.encode_capacity): ``override capacity: counts_padding`` departs
from the objective (padding masked before the step, each expert keeping its top C real tokens by router
score) exactly where a capacity step drops, capacity_factor · k < E (by hand below). Verdicts are compared
with the concrete simulator (tests/simulator_capacity.py), and a refutation's kept tokens are recomputed by
the simulator on the router call the counterexample describes."""

from __future__ import annotations

import io
import random
import re
from fractions import Fraction

import pytest
import simulator_auxstats
import simulator_capacity as sim

from placement_logic.check import encode_auxcells
from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI capacity"


def text(experts=8, top_k=2, cf="1", verb="counts_padding", mesh="dp = 2\n  ep = 2") -> str:
    statement = f"  override capacity: {verb}\n" if verb else ""
    return ("from std.data import ddp\nfrom std.expert import expert_parallel\n\nmodel {\n  transformer {\n"
            f"    hidden = 1024\n    layers = 4\n    heads = 16\n    ffn = 1024\n    vocab = 32000\n"
            f"    experts = {experts}\n    top_k = {top_k}\n    capacity_factor = {cf}\n  }}\n  seq = 2048\n"
            f"  microbatch = 2\n  microbatches = 4\n}}\n\nmesh {{\n  {mesh}\n}}\n\nplan p {{\n  dp: ddp\n"
            f"  ep: expert_parallel\n{statement}}}\n")


def _ob(spec, name=NAME):
    report = check_spec(spec, timeout=20)
    found = [o for o in report.obligations if o.name == name]
    return found[0] if found else None


def test_padding_outscoring_a_real_token_takes_its_slot_by_hand():
    """E = 2, k = 1, capacity factor 1: a real token choosing expert 0 with probability 3/5, then a padded
    position choosing it with 4/5. Masked: N = 1, C = ⌈1/2⌉ = 1, the real token is kept. Counted: N = 2,
    C = ⌈2/2⌉ = 1, the padded position's higher score takes the slot. Kept first-come, the real token (first)
    would stay: the departure rests on the order by score."""
    call = [(False, (Fraction(3, 5), Fraction(2, 5)), (0,)), (True, (Fraction(4, 5), Fraction(1, 5)), (0,))]
    assert sim.dispatch(call, 2, 1, Fraction(1), False) == {(0, 0)}
    assert sim.dispatch(call, 2, 1, Fraction(1), True) == set()
    assert sim.dispatch(call, 2, 1, Fraction(1), True, order="position") == {(0, 0)}


def test_the_capacity_map_keeps_the_top_scores_by_hand():
    """One call of 4 tokens choosing expert 0 of E = 2 (k = 1) with probabilities 1/5, 4/5, 2/5, 4/5, capacity
    factor 1: C = 2, kept the two of 4/5 (tokens 1 and 3; a tie at 4/5 would go to the earlier). The checker's
    map (check.encode_auxcells.marked) and the aux simulator's (capacity_map) both give it."""
    ps = (Fraction(1, 5), Fraction(4, 5), Fraction(2, 5), Fraction(4, 5))
    toks = [(j, (0,), (p, 1 - p)) for j, p in enumerate(ps)]
    marks = encode_auxcells.marked({0: toks}, 2, 1, (encode_auxcells.DROP, Fraction(1)))
    assert [j for j in range(4) if marks[j]] == [1, 3]
    routed = [({"rank": {}, "mb": 0, "seq": 0, "pos": (0, j), "pad": False}, ((0,), (p, 1 - p))) for j, p in enumerate(ps)]
    assert [j for j, m in enumerate(simulator_auxstats.capacity_map(routed, 2, 1, ("drop", 1))) if m] == [1, 3]
    # three tokens at 4/5 and C = 2 (6 tokens): the two earlier ones
    ties = [(j, (0,), (Fraction(4, 5), Fraction(1, 5))) for j in range(3)] + [(3 + j, (1,), (Fraction(1, 5), Fraction(4, 5))) for j in range(3)]
    marks = encode_auxcells.marked({0: ties}, 2, 1, (encode_auxcells.DROP, Fraction(2, 3)))
    assert [j for j in range(6) if marks[j]] == [0, 1, 3, 4]


# (experts, top_k, capacity factor): refuted exactly where cf · k < E (by hand)
GRID = [(8, 2, "1"), (8, 2, "2"), (2, 1, "1"), (4, 2, "3/2"), (64, 4, "2"), (16, 2, "1"), (4, 4, "1/2"),
        (8, 2, "4"), (2, 1, "2"), (4, 2, "5/2")]


@pytest.mark.parametrize("e,k,cf", GRID)
def test_checker_and_simulator_agree(e, k, cf):
    drops = Fraction(cf) * k < e
    found = sim.differs(e, k, Fraction(cf))
    assert (found is not None) == drops
    if drops:
        ob = _ob(load_string(text(e, k, cf), "cap.place"))
        assert ob.verdict is Verdict.REFUTED
        _replayed_by_the_simulator(ob.counterexample, e, k, Fraction(cf))
    else:
        with pytest.raises(DiagnosticError) as exc:
            load_string(text(e, k, cf), "cap.place")
        assert exc.value.diagnostics[0].code == "PL274"


def _random_models(n):
    """Random (E, k, capacity factor): E of 2..16 (even, so that ep = 2 divides it), 1 <= k <= E, cf = a/b."""
    rng = random.Random(25)
    out = []
    for _ in range(n):
        e = rng.choice((2, 4, 6, 8, 16))
        k = rng.randint(1, min(e, 4))
        out.append((e, k, str(Fraction(rng.randint(1, 12), rng.randint(1, 4)))))
    return out


@pytest.mark.parametrize("e,k,cf", _random_models(12))
def test_random_models_agree_with_the_simulator(e, k, cf):
    """The checker's verdict (refuted, or PL274 where nothing drops) against the simulator's search of random
    router calls; a refutation's kept tokens recomputed by the simulator."""
    found = sim.differs(e, k, Fraction(cf), seed=e * 100 + k)
    try:
        ob = _ob(load_string(text(e, k, cf), "cap.place"))
    except DiagnosticError as exc:
        assert exc.diagnostics[0].code == "PL274" and found is None
        return
    assert ob.verdict is Verdict.REFUTED and found is not None
    _replayed_by_the_simulator(ob.counterexample, e, k, Fraction(cf))


def _replayed_by_the_simulator(cex, e, k, cf):
    """The counterexample's call rebuilt from its routing line; the simulator's kept pairs are the printed ones."""
    values = dict(cex.values)
    m = re.search(r"(\d+) real token\(s\) choosing experts ([\d, ]+) with probabilities \(([^)]*)\), then (\d+) padded "
                  r"position\(s\) choosing the same with probabilities \(([^)]*)\)", values["routing"])
    real, chosen, p_real, pads, p_pad = m.groups()
    chosen = tuple(int(x) for x in chosen.split(", "))
    probs = lambda s: tuple(Fraction(x) for x in s.split(", "))  # noqa: E731
    call = [(False, probs(p_real), chosen)] * int(real) + [(True, probs(p_pad), chosen)] * int(pads)
    shown = lambda pairs: ", ".join(f"token {j} on expert {i}" for j, i in sorted(pairs)) or "none"  # noqa: E731
    assert values["kept by the objective"] == shown(sim.dispatch(call, e, k, cf, False))
    assert values["kept by the path"] == shown(sim.dispatch(call, e, k, cf, True))
    assert sim.dispatch(call, e, k, cf, False) != sim.dispatch(call, e, k, cf, True)
    assert "counts the padded positions" in " ".join(cex.diagnosis)


def test_the_witness_rests_on_the_order_by_score():
    """E >= 2: under a first-come order the witness's real token (first in the call) keeps every slot."""
    ob = _ob(load_string(text(), "cap.place"))
    values = dict(ob.counterexample.values)
    assert "dropped by the path only: token 0 on expert 0" in ob.counterexample.equation
    p_real = tuple(Fraction(1, 8) for _ in range(8))
    p_pad = tuple(Fraction(2 if i == 0 else 1, 9) for i in range(8))
    pads = int(re.search(r"then (\d+) padded", values["routing"]).group(1))
    call = [(False, p_real, (0, 1))] + [(True, p_pad, (0, 1))] * pads
    assert sim.dispatch(call, 8, 2, Fraction(1), True, order="position") == sim.dispatch(call, 8, 2, Fraction(1), False)


def test_masking_the_padding_is_proved_and_no_statement_adds_no_obligation():
    assert _ob(load_string(text(verb="masks_padding"), "cap.place")).verdict is Verdict.PROVED
    assert _ob(load_string(text(verb=""), "cap.place")) is None


def test_a_free_capacity_factor_is_refuted_at_one_that_drops():
    src = text(cf="cf").replace("from std.expert import expert_parallel\n", "from std.expert import expert_parallel\n\nlet cf = 3\n", 1)
    assert _ob(load_string(src, "cap.place")).verdict is Verdict.REFUTED  # 3 · 2 < 8
    with pytest.raises(DiagnosticError) as exc:
        load_string(src.replace("let cf = 3", "let cf = 4"), "cap.place")
    assert exc.value.diagnostics[0].code == "PL274"


@pytest.mark.parametrize("src,code", [
    (text().replace("    experts = 8\n    top_k = 2\n", "").replace("  ep: expert_parallel\n", "")
     .replace("dp = 2\n  ep = 2", "dp = 2"), "PL273"),
    (text(verb="counts_padding over (dp)"), "PL122"),
    (text(verb="drops_padding"), "PL122"),
])
def test_refused_statements(src, code):
    with pytest.raises(DiagnosticError) as exc:
        load_string(src, "cap.place")
    assert exc.value.diagnostics[0].code == code


def test_fmt_round_trip():
    messy = text().replace("  override capacity: counts_padding", "  override   capacity:counts_padding")
    assert format_source(messy, "cap.place") == text()
    assert format_source(text(), "cap.place") == text()


def test_the_capacity_statement_moves_no_bytes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outs = []
    for verb in ("counts_padding", "masks_padding", ""):
        (tmp_path / "cap.place").write_text(text(verb=verb))
        out, err = io.StringIO(), io.StringIO()
        assert main(["cost", "cap.place"], out=out, err=err) == 0, err.getvalue()
        outs.append(out.getvalue())
    assert outs[0] == outs[1] == outs[2]
