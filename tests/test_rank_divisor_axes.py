"""Divisors on sets of ranks of different axes for one group (check.encode_rankproduct_axes): each device applies
the product of the divisors whose rank sets hold it, read from its coordinate along each statement's axes, and
``SC update[g]`` is refuted exactly where two devices' products differ or some device divides at all. Verdicts
at pinned sizes against the independent simulator (tests/simulator_rankset.py, ``product_violations``) and the
products computed here by hand; the counterexample's devices and products. One statement per verb for a group (a
later one of the same verb replaces it), so each case names two verbs."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
AXES = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}


def _d(verb, axes, x, ranks=None):
    return ov("grads", verb, None, axes, ir.Const(Fraction(x)),
              ranks=tuple(ir.Const(Fraction(k)) for k in ranks) if ranks is not None else None)


def holds(o, c: dict, sizes: dict) -> bool:
    """By hand: rank 0 of every axis, the last of every axis, every device but that one, or the named ranks of
    the group over the axes (first axis most significant)."""
    coords = [c[a] for a in o.axes]
    ns = [sizes[a] for a in o.axes]
    if o.verb == "divide_rank0_only":
        return all(x == 0 for x in coords)
    last = all(x == n - 1 for x, n in zip(coords, ns))
    if o.verb == "divide_last_only":
        return last
    if o.verb == "divide_except_last":
        return not last
    k = 0
    for x, n in zip(coords, ns):
        k = k * n + x
    return k in {int(r.value) for r in o.ranks}


def right(ops, sizes) -> bool:
    """Every device's product 1 (no division beyond the step's normalisation), by hand."""
    names = sorted({a for o in ops for a in o.axes})
    for d in product(*[range(sizes[a]) for a in names]):
        c = dict(zip(names, d))
        p = Fraction(1)
        for o in ops:
            if holds(o, c, sizes):
                p *= o.by.value
        if p != 1:
            return False
    return True


CASES = [
    [_d("divide_last_only", ("dp",), 2), _d("divide_on_ranks", ("pp",), 2, (0,))],
    [_d("divide_except_last", ("pp",), 4), _d("divide_last_only", ("dp",), Fraction(1, 4))],
    [_d("divide_rank0_only", ("dp",), 2), _d("divide_on_ranks", ("pp",), Fraction(1, 2), (0,))],
    [_d("divide_on_ranks", ("dp", "pp"), 2, (0,)), _d("divide_rank0_only", ("dp", "pp"), Fraction(1, 2))],
    [_d("divide_on_ranks", ("dp", "pp"), 2, (1, 2)), _d("divide_except_last", ("pp",), Fraction(1, 2))],
    [_d("divide_last_only", ("dp", "pp"), 3), _d("divide_except_last", ("pp",), 3)],
]


@pytest.mark.parametrize("i", range(len(CASES)))
@pytest.mark.parametrize("dp,pp", [(1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (2, 3)])
def test_products_over_different_axes_agree_with_the_simulator_and_by_hand(i, dp, pp):
    ops = CASES[i]
    spec, p = plan("p", AXES, overrides=tuple(ops))
    sizes = {"dp": dp, "pp": pp, "m": 1}
    ob = next(o for o in check_plan(SESSION, spec, p, sizes).obligations if o.name == "SC update[dense]")
    ok = right(ops, sizes)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (ob.verdict, ob.counterexample)
    found = set()
    for s in range(4):
        found |= _sim(p, sizes, s)
    assert (("update", "dense") in found) == (not ok), found
    if not ok:  # the replayed devices' products, recomputed here
        cex = ob.counterexample
        prods = dict(cex.values)["divisor product"]
        for _label, dev in cex.devices:
            c = {k: int(v) for k, v in (x.split("=") for x in dev.strip("()").split(", "))}
            q = Fraction(1)
            for o in ops:
                if holds(o, c, sizes):
                    q *= o.by.value
            assert f"{q.numerator}{'' if q.denominator == 1 else '/' + str(q.denominator)} on {dev}" in prods, prods


def _sim(p, sizes, seed):
    import simulator_rankset

    return simulator_rankset.product_violations(p, sizes, random.Random(seed), {})


@pytest.mark.parametrize("i", range(len(CASES)))
def test_unpinned_a_refutation_replays_in_the_simulator(i):
    ops = CASES[i]
    spec, p = plan("p", AXES, overrides=tuple(ops))
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "SC update[dense]")
    ok = all(right(ops, {"dp": a, "pp": b}) for a in range(1, 5) for b in range(1, 5))
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), ob
    if not ok:
        sizes = dict(ob.counterexample.sizes)
        assert not right(ops, sizes)
        assert any(("update", "dense") in _sim(p, {"dp": sizes["dp"], "pp": sizes["pp"], "m": 1}, s) for s in range(4))
