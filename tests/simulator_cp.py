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
device's block). Ulysses (``activations[context]: all_to_all over (AXES)``, and the same for
``activation_grads``) replaces the exchange of its direction: every position holds ``heads`` heads (the
number of positions; head h adds 10·h to each of the position's numbers), the device's [1 × heads]
matrix goes through one all-to-all per pass (each member of the group receives its chunk of the heads
of every member, stacked along the sequence: [g·seq × heads/g]), the attention runs on each column it
holds over the rows it holds, and the inverse all-to-alls (the passes in reverse: each member receives
its chunk of rows of every member, side by side) bring the results back; the backward's gradients of
the blocks then go through the reduce-scatter only where one is stated. ``violations(plan, sizes)``: ``("act", "context")`` when some device's output
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

    fwd = _stated(plan, "activations", ("gather", "all_to_all"))
    fwd_ops = _per_pass("gather", fwd.axes or ()) if fwd else [("gather", ctx)]
    bwd = _stated(plan, "activation_grads", ("gather", "all_to_all"))
    bwd_ops = _per_pass("gather", bwd.axes or ()) if bwd else [("gather", ctx)]
    red = _stated(plan, "activation_grads", ("reduce", "no_reduce", "reduce_copy"))
    red_ops = ([] if red is None and bwd is not None and bwd.verb == "all_to_all" else
               [("sum_scatter", ctx)] if red is None else
               _per_pass("sum_scatter", red.axes or ()) if red.verb == "reduce" else [])
    found = set()
    keys = {mesh.key(d): coords(d) for d in mesh.devices}
    nh = npos
    head = lambda f, s, p, h: f(s, p) + 10 * h  # noqa: E731
    if fwd is not None and fwd.verb == "all_to_all":
        data = {key: [[(head(q, s, p, h), head(k, s, p, h), head(v, s, p, h)) for h in range(nh)]]
                for key, (s, p) in keys.items()}
        got = _ulysses(mesh, [a for _, a in _per_pass("a2a", fwd.axes or ())], data, lambda col: [
            qi * sum((kj * vj for _, kj, vj in col), Fraction(0)) for qi, _, _ in col])
        for key, (s, p) in keys.items():
            want = [[head(q, s, p, h) * sum((head(k, s, j, h) * head(v, s, j, h) for j in range(npos)), Fraction(0))
                     for h in range(nh)]]
            if got[key] != want:
                found.add(("act", "context"))
    else:
        got = run(fwd_ops, {key: [[k(s, p) * v(s, p)]] for key, (s, p) in keys.items()})
        for key, (s, p) in keys.items():
            want = q(s, p) * sum((k(s, j) * v(s, j) for j in range(npos)), Fraction(0))
            rows = got[key]
            if rows is None or q(s, p) * sum((r[0] for r in rows), Fraction(0)) != want:
                found.add(("act", "context"))
    if bwd is not None and bwd.verb == "all_to_all":
        g = lambda s, p, h: head(dy, s, p, h) * head(q, s, p, h)  # noqa: E731
        data = {key: [[(head(k, s, p, h), g(s, p, h)) for h in range(nh)]] for key, (s, p) in keys.items()}
        got = run(red_ops, _ulysses(mesh, [a for _, a in _per_pass("a2a", bwd.axes or ())], data, lambda col: [
            kj * sum((gi for _, gi in col), Fraction(0)) for kj, _ in col]))
        for key, (s, p) in keys.items():
            want = [[head(k, s, p, h) * sum((g(s, i, h) for i in range(npos)), Fraction(0)) for h in range(nh)]]
            if got[key] != want:
                found.add(("grad", "context"))
        return found
    held = run(bwd_ops, {key: [[k(s, p)]] for key, (s, p) in keys.items()})
    contrib = {key: None if rows is None else [[r[0] * dy(*keys[key]) * q(*keys[key])] for r in rows]
               for key, rows in held.items()}
    got = run(red_ops, contrib)
    for key, (s, p) in keys.items():
        want = [[k(s, p) * sum((dy(s, i) * q(s, i) for i in range(npos)), Fraction(0))]]
        if got[key] != want:
            found.add(("grad", "context"))
    return found


def _ulysses(mesh: Mesh, passes: list, data: dict, attend) -> dict:
    """Ulysses' all-to-alls over ``passes`` (each a tuple of axes), ``attend`` on every column of what each
    device holds, the inverse all-to-alls in reverse order. ``data``: device -> [seq × heads] matrix."""
    def a2a(vals: dict, axes, inverse: bool) -> dict:
        out = {}
        for d in mesh.devices:
            grp = mesh.group(d, axes)
            mine = grp.index(mesh.key(d))
            ms = [vals[key] for key in grp]
            n = len(grp)
            if any(m is None for m in ms) or any((len(m) if inverse else len(m[0])) % n for m in ms):
                out[mesh.key(d)] = None
            elif inverse:  # my chunk of every member's rows, side by side in member order
                k = len(ms[0]) // n
                out[mesh.key(d)] = [[x for m in ms for x in m[mine * k + i]] for i in range(k)]
            else:  # my chunk of every member's heads, stacked along the sequence in member order
                k = len(ms[0][0]) // n
                out[mesh.key(d)] = [row[mine * k:(mine + 1) * k] for m in ms for row in m]
        return out

    for axes in passes:
        data = a2a(data, axes, False)
    data = {key: None if m is None else [list(r) for r in zip(*[attend(list(col)) for col in zip(*m)])]
            for key, m in data.items()}
    for axes in reversed(passes):
        data = a2a(data, axes, True)
    return data


# --------------------------------------------------------------------------- the blocks' layout
# tests/simulator_cplayout.py (packs of documents of unequal lengths, padded or not)
from simulator_cplayout import layout_violations  # noqa: E402,F401
