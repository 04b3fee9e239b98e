"""A clip coefficient or a divisor on a set of ranks of the process group over several axes (check.rankset:
``grads[g]: clip_on_ranks / divide_on_ranks over (A, B) ranks (R1, ...)``). A device's rank in the group is
its coordinates on A, B read as one number, A the most significant. The checker's verdicts at pinned sizes
against the independent simulator (tests/simulator_rankset.py) and by hand (the named ranks that exist at
n = |A|·|B| split the group iff they are neither none nor all of 0 .. n-1; a clip named on no rank clips
nowhere), the counterexample's devices against the numbering, the for-all verdicts and the file errors."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DP_PP = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}
BY = {"divide_on_ranks": ir.Const(Fraction(4)), "clip_on_ranks": None}


def _c(*ks):
    return tuple(ir.Const(Fraction(k)) for k in ks)


def _update(report):
    return next(o for o in report.obligations if o.name == "SC update[dense]")


def _sim(p, sizes) -> bool:
    return any(("update", "dense") in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(4))


def _wrong(verb: str, ranks: tuple[int, ...], n: int) -> bool:
    """By hand: a clip skipped on some rank; a divisor applied on some rank (beyond the step's normalisation,
    on every rank of the group alike too)."""
    on = {r for r in ranks if r < n}
    return len(on) < n if verb == "clip_on_ranks" else bool(on)


def _rank(order: tuple[str, ...], coords: dict[str, int], sizes: dict[str, int]) -> int:
    """By hand: the group rank of a device, the first named axis the most significant digit."""
    first, second = order
    return coords[first] * sizes[second] + coords[second]


@pytest.mark.parametrize("verb,order,ranks,dp,pp", [
    (v, o, r, dp, pp) for v, o, r, (dp, pp) in product(
        ("divide_on_ranks", "clip_on_ranks"), (("dp", "pp"), ("pp", "dp")), [(0,), (1,), (0, 1), (1, 2, 3), (5,)],
        [(1, 2), (2, 1), (2, 2), (2, 3)])])
def test_rank_set_over_two_axes_agrees_with_the_simulator_and_by_hand(verb, order, ranks, dp, pp):
    spec, p = plan("p", DP_PP, overrides=(ov("grads", verb, None, order, BY[verb], ranks=_c(*ranks)),))
    sizes = {"dp": dp, "pp": pp, "microbatches": 1}
    ob = _update(check_plan(SESSION, spec, p, sizes))
    bad = _wrong(verb, ranks, dp * pp)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (verb, order, ranks, dp, pp, ob.verdict)
    assert _sim(p, sizes) is bad
    named = [(label, text) for label, text in ob.counterexample.devices if "(named)" in label] if bad else []
    for label, text in named:  # "(dp=0, pp=1)": the device the witness names is rank k of the group, k named
        coords = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in text.strip("()").split(", ")}
        k = _rank(order, coords, sizes)
        assert label == f"rank {k} of ({', '.join(order)}) (named)" and k in ranks, (label, text)


@pytest.mark.parametrize("order,device", [(("dp", "pp"), "(dp=0, pp=1)"), (("pp", "dp"), "(dp=1, pp=0)")])
def test_the_first_axis_is_the_most_significant(order, device):
    """Rank 1 of the group over (dp, pp) at dp = pp = 2 is (dp 0, pp 1); over (pp, dp) it is (dp 1, pp 0)."""
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "divide_on_ranks", None, order, ir.Const(Fraction(4)),
                                             ranks=_c(1)),))
    ob = _update(check_plan(SESSION, spec, p, {"dp": 2, "pp": 2, "microbatches": 1}))
    assert dict(ob.counterexample.devices)[f"rank 1 of ({', '.join(order)}) (named)"] == device


@pytest.mark.parametrize("ranks,verb,ok", [
    ((ir.Op("-", (ir.Op("*", (ir.Sym("dp"), ir.Sym("pp"))), ir.Const(Fraction(1)))),), "divide_on_ranks", False),
    (_c(0), "divide_on_ranks", False),
    ((ir.Op("*", (ir.Sym("dp"), ir.Sym("pp"))),), "divide_on_ranks", True),  # names no rank at any size: no division
    ((ir.Op("*", (ir.Sym("dp"), ir.Sym("pp"))),), "clip_on_ranks", False),  # ... and so no clip
])
def test_for_all_verdicts(ranks, verb, ok):
    spec, p = plan("p", DP_PP, overrides=(ov("grads", verb, None, ("dp", "pp"), BY[verb], ranks=ranks),))
    ob = _update(check_plan(SESSION, spec, p, {}))
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), ob
    if not ok:
        sizes = dict(ob.counterexample.sizes)
        assert _sim(p, {"dp": sizes["dp"], "pp": sizes["pp"], "microbatches": 1})
