"""Nested accumulation (check.nested, check.nested_replay: ``accumulation: VERB by M``): the step's microbatches as
rounds of a pipeline schedule of M inside an outer gradient accumulation. The checker's verdicts
against the independent simulator and hand-derived answers, the replayed weights, input errors
and fmt."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import simulator
from irkit import const, ov, plan

from placement_logic.check.nested_replay import weights
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
PIPE = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}
BASE = (ov("loss", "per_microbatch_mean"), ov("tokens", "equal"))

# (verb, M, microbatches, hand-derived: is the gradient the global-batch one). Each microbatch's mean
# is weighted 1/m when right; outer_undivided gives 1/M (right iff one round, m = M), inner_undivided
# 1/(m/M) (right iff M = 1), rescaled_every_round 1/(A·M^(A-r+1)) for round r (right iff A = 1).
CASES = [
    ("outer_undivided", 2, 4, False), ("outer_undivided", 4, 4, True), ("outer_undivided", 1, 2, False),
    ("inner_undivided", 2, 4, False), ("inner_undivided", 2, 2, False),
    ("rescaled_every_round", 2, 4, False), ("rescaled_every_round", 4, 4, True),
    ("rescaled_every_round", 2, 2, True),
]


@pytest.mark.parametrize("verb,M,m,ok", CASES, ids=[f"{v}-{M}-{m}" for v, M, m, _ in CASES])
def test_pinned_sizes_agree_with_the_simulator_and_by_hand(verb, M, m, ok):
    spec, p = plan("p", PIPE, overrides=BASE + (ov("accumulation", verb, by=const(M)),))
    sizes = {"dp": 2, "pp": 2, "microbatches": m}
    report = check_plan(SESSION, spec, p, sizes)
    gi = next(o for o in report.obligations if o.name == "GI grads[dense]")
    assert gi.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (gi.verdict, gi.reason)
    found = any(("gi", "dense") in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(4))
    assert found is (not ok)


@pytest.mark.parametrize("verb,aspect", [("outer_undivided", "normalisation"), ("inner_undivided", "normalisation"),
                                         ("rescaled_every_round", "over microbatches")])
def test_refuted_for_all_sizes_at_its_root_cause(verb, aspect):
    spec, p = plan("p", PIPE, overrides=BASE + (ov("accumulation", verb, by=const(2)),))
    report = check_plan(SESSION, spec, p, {})
    ob = next(o for o in report.obligations if o.name == f"GI grads[dense] {aspect}")
    assert ob.verdict is Verdict.REFUTED, (ob.verdict, ob.reason)
    cex = ob.counterexample
    m = dict(cex.sizes)["microbatches"]
    assert m % 2 == 0  # a whole number of rounds
    assert any("override at line" in d for d in cex.diagnosis), cex.diagnosis
    other = [o for o in report.obligations if o.name.startswith("GI grads[dense] ") and o.name != ob.name]
    assert all(o.verdict is Verdict.PROVED for o in other), [(o.name, o.verdict) for o in other]


def test_rescaled_weights_by_hand():
    """Two rounds of two: round 1's losses / 2, then the buffer / 2 twice; round 2's / 2, buffer / 2."""
    assert weights(4, 2) == [Fraction(1, 8)] * 2 + [Fraction(1, 4)] * 2
    assert weights(6, 3) == [Fraction(1, 18)] * 3 + [Fraction(1, 6)] * 3
    assert weights(4, 4) == [Fraction(1, 4)] * 4


def _place(lines: str, mesh: str = "dp = 2\n  pp = 2", pp: str = "  pp: one_f_one_b\n", m: int = 8) -> str:
    return (f"from std.data import ddp\nfrom std.pipeline import one_f_one_b\nmodel {{\n  params = 1e9\n"
            f"  microbatches = {m}\n}}\nmesh {{\n  {mesh}\n}}\nplan p {{\n  dp: ddp\n{pp}{lines}}}\n")


BODY = "  override loss: per_microbatch_mean\n  override tokens: equal\n"


@pytest.mark.parametrize("text,code,words", [
    (_place(BODY + "  override accumulation: outer_undivided by 2\n", mesh="dp = 2", pp=""), "PL171",
     "no pipeline schedule"),
    (_place("  override accumulation: outer_undivided by 2\n"), "PL171", "per-microbatch mean"),
    (_place(BODY + "  override grads: divide by dp\n  override accumulation: outer_undivided by 2\n"), "PL171",
     "state it once"),
    (_place(BODY + "  override accumulation: inner_undivided by 3\n"), "PL171", "not a whole number of rounds"),
    (_place(BODY + "  override accumulation: rescaled_every_round by 1\n"), "PL506", "changes nothing"),
    (_place(BODY + "  override accumulation[dense]: outer_undivided by 2\n"), "PL171", "names no parameter group"),
])
def test_statements_the_step_cannot_read_are_located_errors(tmp_path, capsys, text, code, words):
    f = tmp_path / "n.place"
    f.write_text(text)
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "accumulation" in t)
    assert f"{f}:{line}:3: error:" in err and f"[{code}]" in err and words in err, err


def test_fmt_round_trips_the_accumulation_verbs():
    src = _place(BODY + "  override accumulation :rescaled_every_round  by 4\n")
    out = format_source(src, "n.place")
    assert format_source(out, "n.place") == out and "override accumulation: rescaled_every_round by 4" in out
    a, b = load_string(src, "n.place"), load_string(out, "n.place")
    assert [(o.target, o.verb, o.by) for o in a.plans[0].overrides] == \
        [(o.target, o.verb, o.by) for o in b.plans[0].overrides]


def test_a_shrunk_witness_keeps_equal_token_counts():
    """Cutting a size moves the other shards' share of a block sum onto one shard; a witness whose
    counts are equal on every shard (a plan stating tokens: equal) stays equal, one token per shard."""
    from placement_logic.check.witness import shrink

    seen = []

    def replay(w):
        seen.append(w)
        return "failed"  # every candidate fails: the shrink goes as far as it can

    w = {"sizes": {"dp": 4, "microbatches": 4},
         "counts": {frozenset(): 2, frozenset({"dp"}): 6, frozenset({"microbatches"}): 6,
                    frozenset({"dp", "microbatches"}): 18}}
    shrink(w, replay, {}, 10**6)
    for c in seen:
        own = c["counts"][frozenset()]
        for b, v in c["counts"].items():
            k = own
            for n in b:
                k *= c["sizes"][n] - 1
            assert v == k, (c["sizes"], c["counts"])
    unequal = {"sizes": {"dp": 4}, "counts": {frozenset(): 1, frozenset({"dp"}): 7}}
    seen.clear()
    shrink(unequal, replay, {}, 10**6)
    assert seen[1]["counts"][frozenset({"dp"})] == 7  # not equal to begin with: the block sum is kept
