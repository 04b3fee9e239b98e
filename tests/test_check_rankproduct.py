"""Two divisors on sets of one axis's ranks for one group (check.encode_rankproduct): each rank applies the
product of the divisors whose rank sets hold it, and ``SC update[g]`` is refuted exactly where two ranks'
products differ. The checker's verdicts at pinned sizes against the independent simulator
(tests/simulator_rankset.py, ``product_violations``) and the products by hand; the counterexample's ranks and
products; the for-all verdicts; divisors over different axes multiplied per device."""

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
# (verb, ranks for divide_on_ranks): the rank sets, by hand, at a size n
SETS = {
    "rank0": ("divide_rank0_only", None, lambda n: {0}),
    "except_last": ("divide_except_last", None, lambda n: set(range(n - 1))),
    "last": ("divide_last_only", None, lambda n: {n - 1}),
    "ranks01": ("divide_on_ranks", (0, 1), lambda n: {0, 1} & set(range(n))),
    "ranks2": ("divide_on_ranks", (2,), lambda n: {2} & set(range(n))),
}


def _ov(name: str, x: Fraction) -> ir.Override:
    verb, ranks, _ = SETS[name]
    return ov("grads", verb, None, ("pp",), ir.Const(x),
              ranks=tuple(ir.Const(Fraction(k)) for k in ranks) if ranks else None)


def _products(pairs, n: int) -> list[Fraction]:
    """By hand: each rank's product of the divisors whose sets hold it."""
    out = []
    for k in range(n):
        p = Fraction(1)
        for name, x in pairs:
            if k in SETS[name][2](n):
                p *= x
        out.append(p)
    return out


CASES = [(("except_last", Fraction(2)), ("last", Fraction(2))),  # every rank divides by 2: one product
         (("except_last", Fraction(2)), ("last", Fraction(4))),
         (("rank0", Fraction(2)), ("ranks01", Fraction(1, 2))),  # rank 0: 1, rank 1: 1/2
         (("rank0", Fraction(3)), ("ranks2", Fraction(3))),
         (("except_last", Fraction(4)), ("ranks01", Fraction(1, 4))),  # ranks 0, 1 cancel; the others do not
         (("last", Fraction(2)), ("ranks2", Fraction(2)))]


@pytest.mark.parametrize("pairs,n", list(product(CASES, (1, 2, 3, 4))))
def test_the_product_on_each_rank_agrees_with_the_simulator_and_by_hand(pairs, n):
    spec, p = plan("p", DP_PP, overrides=tuple(_ov(name, x) for name, x in pairs))
    sizes = {"dp": 2, "pp": n, "microbatches": 1}
    ob = next(o for o in check_plan(SESSION, spec, p, sizes).obligations if o.name == "SC update[dense]")
    prods = _products(pairs, n)
    # a rank whose product is not 1 divides beyond the step's normalisation: two ranks apart, or every rank alike
    bad = any(x != 1 for x in prods)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (pairs, n, ob.verdict)
    assert any(("update", "dense") in simulator.violations(p, sizes, random.Random(s), trials=2)
               for s in range(4)) is bad
    if bad and len(ob.counterexample.devices) == 1:  # a rank that divides again (alike on every rank, or not)
        ((label, dev),) = ob.counterexample.devices
        k = int(label.rsplit(" ", 1)[1])
        assert dev == f"(dp=0, pp={k})" and f"-{1 / prods[k]} per element" in ob.counterexample.equation
    elif bad:
        (l1, d1), (l2, d2) = ob.counterexample.devices
        k1, k2 = int(l1.rsplit(" ", 1)[1]), int(l2.rsplit(" ", 1)[1])
        assert d1 == f"(dp=0, pp={k1})" and prods[k1] != prods[k2], (l1, l2, prods)
        shown = dict(ob.counterexample.values)["divisor product"]
        assert shown.startswith(f"{prods[k1].numerator}" if prods[k1].denominator == 1 else f"{prods[k1]}"), shown


@pytest.mark.parametrize("pairs", [CASES[0], CASES[1], CASES[2], CASES[5]])
def test_for_all_verdicts(pairs):
    # every case has a size with a rank whose product is not 1; CASES[0] (every rank divides by 2) only alike
    spec, p = plan("p", DP_PP, overrides=tuple(_ov(name, x) for name, x in pairs))
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "SC update[dense]")
    assert ob.verdict is Verdict.REFUTED, ob
    n = dict(ob.counterexample.sizes)["pp"]
    prods = _products(pairs, n)
    assert any(x != 1 for x in prods)  # the witness size is one where some rank divides again
    if len(set(prods)) > 1:  # two ranks apart, or one rank that divides again: either witness is a violation
        assert any(w in ob.counterexample.diagnosis[0] for w in ("multiply to", "beyond the step's own normalisation"))
    else:
        assert "on every rank of pp" in ob.counterexample.diagnosis[0]


def test_divisors_over_different_axes_are_multiplied_per_device():
    """The last dp rank halves and pp rank 0 halves: refuted at free sizes (check.encode_rankproduct_axes; agreement
    with the simulator: tests/test_rank_divisor_axes.py)."""
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "divide_last_only", None, ("dp",), ir.Const(Fraction(2))),
                                          _ov("rank0", Fraction(2))))
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "SC update[dense]")
    assert ob.verdict is Verdict.REFUTED and "different axes" in ob.counterexample.diagnosis[0]
