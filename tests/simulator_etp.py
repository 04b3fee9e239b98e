"""A concrete simulator of the expert tensor group's collectives (MoE parallel folding with an expert
tensor axis of its own), written from docs/semantics.md ("Activations and their gradients", the
expert tensor rows) without the checker's code (it imports nothing from ``placement_logic.check``
or ``placement_logic.ir.actflow``).

The expert tensor axes are those the model's ``group experts { role = {AXIS: tensor} }`` names and
the plan does not bind to tensor parallelism. Every device holds one routed token of its own (a
distinct number, already at its expert: the all-to-alls are simulated by simulator_act) and, as
expert tensor rank j of n (its coordinates on those axes, mesh order), column j of the expert's
first weight a and row j of its second b; the single-device expert computes y = x · Σ_j a_j b_j and
dx = dy · Σ_j a_j b_j. Forward: the token goes through the gathers before the expert MLPs (derived:
one all-gather over the expert tensor axes; ``activations[experts]: gather over (AXES)``), is
multiplied by a_j then b_j, and goes through the reductions after them (derived: a reduce-scatter
over the expert tensor axes; ``activations[experts]: reduce over (AXES)`` one per pass). Backward
the same with the output gradient, ``activation_grads[experts]: gather`` before the weights and
``reduce`` (``no_reduce``, ``reduce_copy``: nothing on the value) after them; an ``assert_*`` verb
after them redistributes from the asserted type to the rank's own tokens (DTensor: Partial ->
reduce-scatter, Replicate -> the rank's slice, Shard -> nothing); an ``assert_output_*`` verb in
place of the backward's gather declares the output gradient (the rank's own tokens) and
redistributes it to the whole (Shard -> gather, Partial -> sum, Replicate -> nothing). Collectives run over
the real device groups (simulator_act.collective). ``violations(plan, sizes)`` returns
``("act", "expert_tensor")`` and ``("grad", "expert_tensor")`` for a device whose result differs.
"""

from __future__ import annotations

from fractions import Fraction

from simulator_act import OUTPUT_DECLARED, Mesh, _per_pass, _redistribute, collective

from placement_logic import ir


def _stated(plan: ir.Plan, target: str, verbs: tuple[str, ...]):
    found = None
    for o in plan.overrides:
        if o.target == target and o.group == "experts" and o.verb in verbs:
            found = o
    return found


def etp_axes(plan: ir.Plan) -> tuple[str, ...]:
    roles = next((dict(g.roles) for g in plan.model.groups if g.name == "experts" and g.roles), {})
    return tuple(a for a in plan.mesh.names if roles.get(a) is ir.Role.TENSOR
                 and plan.role(a) not in (ir.Role.TENSOR, ir.Role.SEQUENCE))


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    t = etp_axes(plan)
    if not t:
        return set()
    mesh = Mesh(plan, sizes)
    n = 1
    for a in t:
        n *= sizes[a]

    def rank(d: dict) -> int:
        r = 0
        for a in t:
            r = r * sizes[a] + d[a]
        return r

    a = [Fraction(j + 2) for j in range(n)]
    b = [Fraction(3 * j + 1, 2) for j in range(n)]
    w = sum((x * y for x, y in zip(a, b)), Fraction(0))

    def ops(target, verb_gather, verbs_reduce, default_first, default_last):
        g = _stated(plan, target, (verb_gather,) + (tuple(OUTPUT_DECLARED) if target == "activation_grads" else ()))
        first = (default_first if g is None else _redistribute(g.verb, "R", g.axes) if g.verb in OUTPUT_DECLARED
                 else _per_pass("gather", g.axes or ()))
        r = _stated(plan, target, verbs_reduce)
        last = (default_last if r is None else _per_pass("sum_scatter", r.axes or ()) if r.verb == "reduce" else
                _redistribute(r.verb, "S", r.axes) if r.verb.startswith("assert_") else [])
        return first, last

    found = set()
    devices = {mesh.key(d): (i, rank(d)) for i, d in enumerate(mesh.devices)}
    asserts = ("assert_replicate", "assert_partial", "assert_shard")
    for tag, target, reduce_verbs in (("act", "activations", ("reduce",) + asserts),
                                      ("grad", "activation_grads", ("reduce", "no_reduce", "reduce_copy") + asserts)):
        first, last = ops(target, "gather", reduce_verbs, [("gather", t)], [("sum_scatter", t)])
        vals = {k: [[Fraction(10 * i + 3)]] for k, (i, _) in devices.items()}
        for kind, axes in first:
            vals = collective(mesh, kind, axes, vals)
        vals = {k: None if v is None else [[row[0] * a[devices[k][1]] * b[devices[k][1]]] for row in v]
                for k, v in vals.items()}
        for kind, axes in last:
            vals = collective(mesh, kind, axes, vals)
        if any(vals[k] != [[Fraction(10 * i + 3) * w]] for k, (i, _) in devices.items()):
            found.add((tag, "expert_tensor"))
    return found
