"""A concrete simulator of context parallelism's attention exchange, written from docs/semantics.md
("Activations and their gradients", the context row) without the checker's code (it imports nothing
from ``placement_logic.check`` or ``placement_logic.ir.actflow``).

Every device of the mesh holds one position of one sample: its sample is given by its coordinates on
the axes that are not context-parallel (on a tensor axis: other heads, so other values as well), its
position by its coordinates on the context axes (mesh order). Each position has its own query q, key
k, value v and output gradient dy (distinct exact fractions). The single-device attention is linear:
y_i = q_i · Σ_j k_j v_j over the positions of the sample, so dv_j = k_j · Σ_i dy_i q_i.

Forward: the device's block [k v] goes through the key/value exchange (derived: an all-gather over
the context axes; ``activations[context]: gather over (AXES)``, one all-gather per pass), and the
device's output is q times the sum of what it holds. Backward: its block [k] goes through the
exchange again (``activation_grads[context]: gather``), the device computes one value-gradient
contribution k_j · dy q per block it holds, and the contributions go through the reduce-scatter
(derived: over the context axes; ``activation_grads[context]: reduce over (AXES)`` one per pass,
``no_reduce`` and ``reduce_copy`` none on the value). Collectives run over the real device groups
(simulator_act.collective: an all-gather stacks the rows, a reduce-scatter sums them and keeps the
device's block). ``violations(plan, sizes)``: ``("act", "context")`` when some device's output
differs from the single-device one, ``("grad", "context")`` when some device's dv does.
"""

from __future__ import annotations

from fractions import Fraction

from simulator_act import Mesh, _per_pass, collective

from placement_logic import ir


def _stated(plan: ir.Plan, target: str, verbs: tuple[str, ...]):
    found = None
    for o in plan.overrides:
        if o.target == target and o.group == "context" and o.verb in verbs:
            found = o
    return found


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    names = plan.mesh.names
    ctx = tuple(a for a in names if plan.role(a) is ir.Role.CONTEXT)
    if not ctx:
        return set()
    mesh = Mesh(plan, sizes)

    def coords(d: dict) -> tuple[int, int]:
        s = p = 0
        for a in names:
            if a in ctx:
                p = p * sizes[a] + d[a]
            else:
                s = s * sizes[a] + d[a]
        return s, p

    npos = 1
    for a in ctx:
        npos *= sizes[a]
    q = lambda s, p: Fraction(7 * s + p + 2)  # noqa: E731
    k = lambda s, p: Fraction(5 * s + 2 * p + 1)  # noqa: E731
    v = lambda s, p: Fraction(3 * s + 3 * p + 2)  # noqa: E731
    dy = lambda s, p: Fraction(11 * s + p + 1, 2)  # noqa: E731

    def run(ops, vals):
        for kind, axes in ops:
            vals = collective(mesh, kind, axes, vals)
        return vals

    fwd = _stated(plan, "activations", ("gather",))
    fwd_ops = _per_pass("gather", fwd.axes or ()) if fwd else [("gather", ctx)]
    bwd = _stated(plan, "activation_grads", ("gather",))
    bwd_ops = _per_pass("gather", bwd.axes or ()) if bwd else [("gather", ctx)]
    red = _stated(plan, "activation_grads", ("reduce", "no_reduce", "reduce_copy"))
    red_ops = ([("sum_scatter", ctx)] if red is None else
               _per_pass("sum_scatter", red.axes or ()) if red.verb == "reduce" else [])
    found = set()
    keys = {mesh.key(d): coords(d) for d in mesh.devices}
    got = run(fwd_ops, {key: [[k(s, p) * v(s, p)]] for key, (s, p) in keys.items()})
    for key, (s, p) in keys.items():
        want = q(s, p) * sum((k(s, j) * v(s, j) for j in range(npos)), Fraction(0))
        rows = got[key]
        if rows is None or q(s, p) * sum((r[0] for r in rows), Fraction(0)) != want:
            found.add(("act", "context"))
    held = run(bwd_ops, {key: [[k(s, p)]] for key, (s, p) in keys.items()})
    contrib = {key: None if rows is None else [[r[0] * dy(*keys[key]) * q(*keys[key])] for r in rows]
               for key, rows in held.items()}
    got = run(red_ops, contrib)
    for key, (s, p) in keys.items():
        want = [[k(s, p) * sum((dy(s, i) * q(s, i) for i in range(npos)), Fraction(0))]]
        if got[key] != want:
            found.add(("grad", "context"))
    return found
