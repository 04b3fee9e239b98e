"""Two or more clips on sets of ranks for one group (check.encode_rankclips): every statement counts, and a
device applies the clip coefficient once per statement whose rank set holds it. The checker's verdicts at
pinned sizes against the independent simulator (tests/simulator_rankclips.py) and the hand-derived answer
(right iff every device of the mesh is named by exactly one statement), the replayed counterexample naming
the device and its count, the for-all verdict, and fmt."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DP_PP = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}
LAST = ir.Op("-", (ir.Sym("pp"), ir.Const(Fraction(1))))


def _c(*ks):
    return tuple(ir.Const(Fraction(k)) for k in ks)


def _ob(report, name):
    return next(o for o in report.obligations if o.name == name)


def _sim(p, sizes, key, seeds=6) -> bool:
    return any(key in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(seeds))


def _counts(sets: list[tuple[str, tuple[str, ...], tuple[int, ...]]], sizes: dict) -> dict:
    """By hand: for every device (dp, pp), how many statements name it. A statement is (verb, axes, ranks):
    rank0 names the device whose coordinates on its axes are all 0; on-ranks names the device whose rank in
    the group over its axes (first axis most significant) is listed."""
    out = {}
    for d in product(range(sizes["dp"]), range(sizes["pp"])):
        c = dict(zip(("dp", "pp"), d))
        k = 0
        for verb, axes, ranks in sets:
            if verb == "clip_rank0_only":
                k += all(c[a] == 0 for a in axes)
            else:
                idx = 0
                for a in axes:
                    idx = idx * sizes[a] + c[a]
                k += idx in ranks
        out[d] = k
    return out


STATEMENTS = [
    [("clip_rank0_only", ("pp",), ()), ("clip_on_ranks", ("pp",), (1,))],          # a partition at pp = 2
    [("clip_rank0_only", ("pp",), ()), ("clip_on_ranks", ("pp",), (0, 1))],        # pp rank 0 clipped twice
    [("clip_on_ranks", ("pp",), (0,)), ("clip_on_ranks", ("pp",), (1, 2))],        # a partition at pp <= 3
    [("clip_on_ranks", ("pp",), (0, 1)), ("clip_on_ranks", ("pp",), (1,))],        # pp rank 1 twice
    [("clip_on_ranks", ("dp", "pp"), (0, 1)), ("clip_on_ranks", ("dp", "pp"), (2, 3))],  # by group rank
    [("clip_rank0_only", ("dp",), ()), ("clip_on_ranks", ("pp",), (1,))],          # different axes
    [("clip_on_ranks", ("pp",), (0,)), ("clip_on_ranks", ("pp",), (0,))],          # the same clip twice
]


def _plan(sets, group=None):
    ovs = tuple(ov("grads", verb, group, axes, ranks=_c(*ranks) if verb == "clip_on_ranks" else None)
                for verb, axes, ranks in sets)
    return plan("p", DP_PP, overrides=ovs)


@pytest.mark.parametrize("sets,dp,pp", [(s, dp, pp) for s in STATEMENTS for dp, pp in ((1, 2), (2, 2), (1, 3))])
def test_combined_clips_agree_with_the_simulator_and_by_hand(sets, dp, pp):
    spec, p = _plan(sets)
    sizes = {"dp": dp, "pp": pp, "microbatches": 1}
    ob = _ob(check_plan(SESSION, spec, p, sizes), "SC update[dense]")
    counts = _counts(sets, sizes)
    bad = any(k != 1 for k in counts.values())
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (sets, sizes, ob.verdict)
    assert _sim(p, sizes, ("update", "dense")) is bad
    if bad:  # the replay names a device whose count, by hand, is not 1, and its coefficient (1/2)^count
        cex = ob.counterexample
        (label, dev), = cex.devices
        text = dev.strip("()")
        coords = {k: int(v) for k, v in (x.split("=") for x in text.split(", "))}
        k = counts[(coords["dp"], coords["pp"])]
        assert k != 1 and label == f"device ({k} clip{'s' if k != 1 else ''})", (label, counts)
        assert f"{Fraction(1, 2) ** k} on {dev}, 1/2 by single-device training" in dict(cex.values)[
            "coefficient applied"]


def test_a_clip_stated_twice_is_applied_twice_at_every_size():
    """The same clip stated twice (rank 0 of pp), at all sizes: rank 0 clips twice (every other rank none)."""
    spec, p = _plan([("clip_on_ranks", ("pp",), (0,)), ("clip_on_ranks", ("pp",), (0,))])
    ob = _ob(check_plan(SESSION, spec, p, {}), "SC update[dense]")
    assert ob.verdict is Verdict.REFUTED
    assert "clips the dense gradient 2 times" in ob.counterexample.diagnosis[0], ob.counterexample.diagnosis


def test_the_first_and_the_last_stage_partition_pp_2_only():
    """rank 0 and pp - 1: one clip each at pp = 2, twice at pp = 1, none on a middle stage at pp >= 3."""
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "clip_rank0_only", None, ("pp",)),
                                         ov("grads", "clip_on_ranks", None, ("pp",), ranks=(LAST,))))
    for n, bad in ((1, True), (2, False), (3, True), (4, True)):
        sizes = {"dp": 2, "pp": n, "microbatches": 1}
        ob = _ob(check_plan(SESSION, spec, p, sizes), "SC update[dense]")
        assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (n, ob.verdict)
        assert _sim(p, sizes, ("update", "dense")) is bad
    assert _ob(check_plan(SESSION, spec, p, {}), "SC update[dense]").verdict is Verdict.REFUTED


def test_a_group_statement_replaces_the_plans_of_its_verb_only():
    """grads[dense]'s own clip_on_ranks replaces the plan's clip_on_ranks for dense (not its clip_rank0_only):
    rank 0 of pp by the plan's rank-0 clip and rank 1 by dense's own: a partition at pp = 2; the plan's
    ranks (0, 1) statement no longer counts for dense (it does for norms: rank 0 twice)."""
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "clip_rank0_only", None, ("pp",)),
                                         ov("grads", "clip_on_ranks", None, ("pp",), ranks=_c(0, 1)),
                                         ov("grads", "clip_on_ranks", "dense", ("pp",), ranks=_c(1))))
    sizes = {"dp": 1, "pp": 2, "microbatches": 1}
    rep = check_plan(SESSION, spec, p, sizes)
    assert _ob(rep, "SC update[dense]").verdict is Verdict.PROVED
    assert _ob(rep, "SC update[norms]").verdict is Verdict.REFUTED
    assert not _sim(p, sizes, ("update", "dense")) and _sim(p, sizes, ("update", "norms"))


def test_two_clips_round_trip_through_fmt():
    src = ("from std.data import ddp\nfrom std.pipeline import one_f_one_b\n\nmodel {\n  params = 1e9\n  microbatches = 2\n}\n\nmesh {\n  dp = 2\n  pp = 2\n}\n\nplan p {\n  pp: one_f_one_b\n  dp: ddp\n  override grads :clip_rank0_only over (pp)\n"
           "  override grads: clip_on_ranks over ( pp ) ranks (1)\n}\n")
    out = format_source(src, "x.place")
    assert "  override grads: clip_rank0_only over (pp)\n  override grads: clip_on_ranks over (pp) ranks (1)\n" in out
    assert format_source(out, "x.place") == out
    a, b = (load_string(t, "x.place").plans[0].overrides for t in (src, out))
    assert [(o.verb, o.axes, o.ranks) for o in a] == [(o.verb, o.axes, o.ranks) for o in b] and len(a) == 2


@pytest.mark.parametrize("second,n,bad", [(Fraction(1, 2), 2, False), (Fraction(1, 2), 3, False),
                                          (Fraction(2), 2, True), (Fraction(1, 3), 1, True)])
def test_two_divisors_of_one_verb_both_divide(second, n, bad):
    """`divide_on_ranks over (pp) ranks (0) by 2` and a second statement of the same verb on rank 0 by X: rank 0
    divides by 2·X (by hand), every other rank by 1; right iff 2·X = 1 (the second undoes the first)."""
    spec, p = plan("p", DP_PP, overrides=(
        ov("grads", "divide_on_ranks", None, ("pp",), ir.Const(Fraction(2)), ranks=_c(0)),
        ov("grads", "divide_on_ranks", None, ("pp",), ir.Const(second), ranks=_c(0))))
    assert (2 * second != 1) is bad
    sizes = {"dp": 1, "pp": n, "microbatches": 1}
    ob = _ob(check_plan(SESSION, spec, p, sizes), "SC update[dense]")
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), ob.verdict
    assert _sim(p, sizes, ("update", "dense")) is bad
    if bad:
        assert f"{2 * second} on" in dict(ob.counterexample.values)["divisor product"], ob.counterexample.values
