"""Every mode 4-tuple on a single axis of every role, against the documented table.

docs/semantics.md ("Mode tuples on one axis") states which (params, optimizer, grads,
activations) tuples are well formed on an axis of each role and which safety conditions
each breaks. ``table`` below is that table, written out independently of the checker; the
checker's verdicts (and diagnostics) must match it for all 5 × 625 tuples."""

from __future__ import annotations

from itertools import product

import pytest
from irkit import plan

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.solver.session import Session

MODES = ("R", "S", "S*", "M", "O")
ROLES = ("data", "context", "tensor", "pipeline", "expert")
SPLIT = {"S", "O"}  # params split by the axis's own rule (tensor, expert) or left in pieces (data)
GRAD_SPLIT = {"S", "S*", "M", "O"}  # gradients reduce-scattered or streamed out over the axis


def table(role: str, params: str, optimizer: str, grads: str) -> str | frozenset[str]:
    """The documented verdict: a diagnostic code for an ill-formed tuple, else the set of
    violated conditions (empty: safe). Activations never change the verdict."""
    if params == "M" or optimizer == "M":
        return "PL505"  # persistent state placed transient
    if role == "tensor" and params in SPLIT and grads == "R":
        return "PL136"  # a replicated gradient of weights the axis splits
    if role == "pipeline" and params in ("R", "S*"):
        return "PL137"  # every stage holding every stage's layers
    bad = set()
    batch_split = role in ("data", "context")
    if batch_split and params in SPLIT:
        bad.add("usable")  # the forward would run on a piece of the weights
    whole_update = batch_split or (role in ("tensor", "expert") and params not in SPLIT)
    if whole_update and grads in GRAD_SPLIT and optimizer == "R":
        bad.add("optimizer")  # whole params stepped with a shard of the gradient
    if role == "expert" and params in SPLIT and grads == "R":
        bad.add("gi")  # expert gradients (different experts per rank) all-reduced: mixed
        if optimizer in ("S", "S*", "O"):
            # the whole buffer reduce-scattered to the optimizer's shards, the non-expert params
            # among it (replicas on the axis, their optimizer state whole) stepped with a shard
            bad.add("optimizer")
    return frozenset(bad)


def observed(report) -> frozenset[str]:
    out = set()
    for o in report.obligations:
        if o.verdict.name == "PROVED":
            continue
        if o.name.startswith("SC params usable"):
            out.add("usable")
        elif o.name.startswith("SC optimizer step"):
            out.add("optimizer")
        elif o.name.startswith("GI grads[experts]") or o.name.startswith("CR07"):
            out.add("gi")
        elif o.name.startswith("CR02") or o.name.startswith("SC grads[experts]"):
            out.add("gi")
        else:
            out.add(o.name)
    return frozenset(out)


SESSION = Session(timeout=10)


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
def test_every_mode_tuple_matches_the_table(role):
    disagreements = []
    for params, optimizer, grads, acts in product(MODES, repeat=4):
        if acts != "R" and (params, optimizer) != ("R", "R") and role != "data":
            continue  # activations never matter: all 625 on the data axis, the rest with A = R or Θ = Ω = R
        want = table(role, params, optimizer, grads)
        spec, p = plan("p", {"x": (role, f"{params},{optimizer},{grads},{acts}")})
        try:
            got = observed(check_plan(SESSION, spec, p, {}))
        except DiagnosticError as exc:
            got = exc.diagnostics[0].code
        if got != want:
            disagreements.append(((params, optimizer, grads, acts), want, got))
    assert not disagreements, disagreements[:10]


def test_the_table_has_every_kind_of_entry():
    entries = {table(r, *t) for r in ROLES for t in product(MODES, repeat=3)}
    assert {"PL505", "PL136", "PL137"} <= entries and frozenset() in entries
    assert {frozenset({"usable"}), frozenset({"optimizer"}), frozenset({"gi"})} <= entries
