"""Real runs on one data axis of size 4 (slow: 4 processes): DDP, ZeRO-1, ZeRO-2 and ZeRO-3.

At N = 2 a ZeRO shard is half of everything, so a formula that divides by 2 where it
should divide by N cannot be told apart from a right one. Here every expected byte count
is written from the ZeRO paper for N = 4 (fp32: 4 bytes per parameter and gradient, 8 for
Adam's two moments), with Ψ counted independently from the torch model's own tensors.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from placement_logic.frontend.loader import load_spec
from placement_logic.measure.session import measure_many

pytestmark = [pytest.mark.torch, pytest.mark.slow]

N = 4
PLANS = [("examples/library/ddp.place", "ddp"), ("examples/library/zero1.place", "zero1"),
         ("examples/library/zero2.place", "zero2"), ("examples/library/zero3.place", "zero3")]


@pytest.fixture(scope="module")
def reports():
    reps = measure_many([(load_spec(f), p) for f, p in PLANS], devices=N, steps=2, with_checker=False)
    return {rep.plan: rep for rep in reps}


def _psi(rep) -> int:
    from placement_logic.measure.ranks import model as tiny
    from placement_logic.measure.shape import TinyShape

    return sum(p.numel() for p in tiny.build(TinyShape(**dict(rep.shape)), 0).parameters())


def _row(rep, quantity):
    rows = [r for r in rep.rows if r.quantity.startswith(quantity)]
    assert len(rows) == 1, [r.quantity for r in rep.rows]
    return rows[0]


# bytes per parameter on one rank, times N: DP holds 4 + 4 + 8 whole; ZeRO-1 shards the optimizer,
# ZeRO-2 the gradients too, ZeRO-3 the parameters too
@pytest.mark.parametrize("plan,params,grads,opt", [
    ("ddp", 4 * N, 4 * N, 8 * N), ("zero1", 4 * N, 4 * N, 8), ("zero2", 4 * N, 4, 8), ("zero3", 4, 4, 8),
])
def test_held_bytes_on_four_ranks(reports, plan, params, grads, opt):
    rep = reports[plan]
    psi = _psi(rep)
    assert dict(rep.mesh) == {"dp": N}
    assert _row(rep, "parameter count").measured == psi
    assert _row(rep, "params held").measured * N == params * psi
    assert _row(rep, "grads held").measured * N == grads * psi
    row = _row(rep, "optimizer held")
    assert sum(row.per_rank or (row.measured,) * N) == opt * psi


# buffer bytes per step (the gathered or reduced buffer, whatever N is), two microbatches per step
@pytest.mark.parametrize("plan,expected", [
    ("ddp", {"all_reduce": 4}),
    ("zero1", {"reduce_scatter": 4, "all_gather": 4}),
    ("zero2", {"reduce_scatter": 8, "all_gather": 4}),
    ("zero3", {"all_gather": 16, "reduce_scatter": 8}),
])
def test_collectives_on_four_ranks(reports, plan, expected):
    rep = reports[plan]
    psi = _psi(rep)
    measured = {m.group(1): r.measured for r in rep.rows if (m := re.match(r"(\w+) over dp,", r.quantity))}
    assert measured == {k: v * psi for k, v in expected.items()}


@pytest.mark.parametrize("plan", [p for _, p in PLANS])
def test_four_ranks_match_and_stay_equivalent(reports, plan):
    rep = reports[plan]
    assert rep.outcome == "matched", [(r.quantity, r.status) for r in rep.rows]
    assert {r.status for r in rep.rows} <= {"match", "explained", "reported"}
    assert rep.equivalence.within and rep.equivalence.replicas_agree
