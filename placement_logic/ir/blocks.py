"""Gradient reductions run within blocks of an axis's ranks, as the schedule prices them.

Input: a plan and its derived collectives. Output: the same collectives, each gradient reduction
(all-reduce or reduce-scatter in the grad-sync phase) that an ``override grads[g]: reduce_blocks
over (AXES) by B`` cuts into blocks run on a group of its block instead of the whole axes
(docs/costs.md, "Reductions over blocks of an axis"):

* group size: each blocked axis a of the collective contributes min(B, N_a) devices (B ranks,
  the whole axis where B holds it), every other axis its size; ``Collective.block`` carries it, so
  the ring bytes are 2(b−1)/b·m (all-reduce) and (b−1)/b·m (reduce-scatter) and the α–β time
  counts 2(b−1) or b−1 steps on a group of b devices;
* link class: a blocked axis on ``inter_node`` whose block of B consecutive ranks, times the
  sizes of the axes inside it (the last axis innermost), divides the devices per node of the
  mesh's catalogue device lies inside a node (``intra_node``), as ``interop``'s ``node_links``
  decides an axis's link; where B, a size inside it or the device is not known as a number the
  axis keeps its link;
* a block statement of one group (``grads[g]``) splits a buffer carrying several groups into the
  part of the groups it names and the rest (each priced on its own group).

The last block of an axis B does not divide is shorter; the figures are those of a full block
(the largest, which the step waits for).

The other groups over part of an axis (``check.subgroups``) are priced the same way on their own
group: ``reduce_strided ... by S`` on ⌈N_a / S⌉ devices (the largest strided group, N_a/S where S
divides N_a) and the axis's own link (a group of stride S spans the axis's ranks from r to
r + N_a − S, so it lies inside a node only where the whole axis does, when the axis is declared
``intra_node``); ``reduce_first ... by K`` on min(K, N_a) devices (the ranks past K run no
collective; the step waits for the group) and the link of a block of K consecutive ranks. The grad norm's all-reduce (``clip_norm: reduce_blocks``)
is not a priced collective (one scalar), so that statement changes no cost.

Consecutive groups of unequal sizes (``reduce_groups ... by (S1, S2, ...)``) are priced per group:
each group runs its own ring at the same time, so the per-device figure (bytes and α–β time) is
that of the largest group, max(S1, S2, ...) devices, which the step waits for; a smaller group
moves 2(S−1)/S·m per device. The link is ``intra_node`` where the axis is declared so, or where it
is ``inter_node`` and every group, its consecutive ranks times the sizes of the axes inside it,
lies inside one node of the catalogue device (a per-node group on nodes of unequal GPU counts).

The process groups of a list of rank sets (``reduce_sets ... ranks ([0, 2, 3], [1, 4])``) are priced the
same way on the largest set: each set runs its own ring at the same time, max |set| devices. A set of
non-consecutive ranks is priced as a ring over its members in the order NCCL builds it, each hop on the
link class the set's members share: ``intra_node`` where every set's ranks (times the sizes of the axes
inside the axis) lie inside one node of the catalogue device, else the axis's own. The price assumes
every hop of that ring runs at the class's bandwidth and latency, as for consecutive ranks: a ring whose
members skip GPUs within a node (0, 2, 3) is priced as one on adjacent GPUs (NVLink is all-to-all on the
catalogue's nodes), and one across nodes as every hop crossing the network.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from itertools import product

from .. import hardware as hw
from .. import ir
from . import groups as pg
from . import ranksets, views
from .buffers import Collective, Kind, Phase, grads_group, link_of
from .nodes import Const, Op, State, Sym, Value
from .overrides import OverrideTarget, OverrideVerb

INTRA, INTER = "intra_node", "inter_node"


GROUPS = OverrideVerb.REDUCE_GROUPS
SETS = OverrideVerb.REDUCE_SETS
PARTITION_VERBS = (OverrideVerb.REDUCE_BLOCKS, OverrideVerb.REDUCE_STRIDED, OverrideVerb.REDUCE_FIRST, GROUPS, SETS)
WHAT = {OverrideVerb.REDUCE_BLOCKS: "within blocks of {} ranks", OverrideVerb.REDUCE_STRIDED: "within strided "
        "groups of stride {}", OverrideVerb.REDUCE_FIRST: "within the first {} ranks only",
        GROUPS: "within consecutive groups of {} ranks (the largest priced)",
        SETS: "within the process groups of the rank sets {} (the largest priced)"}


def statements(plan: ir.Plan) -> tuple[ir.Override, ...]:
    return tuple(o for o in plan.overrides_for(OverrideTarget.GRADS) if o.verb in PARTITION_VERBS)


def statement_for(plan: ir.Plan, group: str | None) -> tuple[ir.Override, ...] | None:
    """The block statements of a checker group's gradient: its own, else the plan's (``all``, then none);
    statements over different axes combine (each axis cut by the last statement naming it)."""
    for who in (group, "all", None):
        found = [o for o in statements(plan) if o.group == who]
        if found:
            return tuple(o for i, o in enumerate(found)
                         if not any(set(x.axes or ()) & set(o.axes or ()) for x in found[i + 1:]))
    return None


def _member_of(g: pg.ParamGroup) -> str:
    """The name a ``grads[NAME]`` statement gives the parameter group by: a user group's own, else its class."""
    return g.name if g.user else str(g.checks_as)


def _block_size(b: Value, axis: ir.Axis, verb: str = OverrideVerb.REDUCE_BLOCKS) -> Value:
    """Devices in the largest group ``verb`` cuts ``axis`` into: min(B, N) (a block, the first K), ⌈N/S⌉."""
    if verb == OverrideVerb.REDUCE_STRIDED:
        if isinstance(b, Const) and isinstance(axis.size, Const):
            return ir.const(-(-axis.size.value // b.value))
        return Op("ceil", (Op("/", (Sym(axis.name), b)),))
    if isinstance(b, Const) and isinstance(axis.size, Const):
        return ir.const(min(b.value, axis.size.value))
    return Op("min", (b, Sym(axis.name)))


def block_link(plan: ir.Plan, axis: str, b: Value) -> str | None:
    """The link class of a block of ``b`` consecutive ranks of ``axis`` (module docstring)."""
    own = plan.mesh.axis(axis).link
    if own != INTER:
        return own
    h = plan.mesh.hardware
    dev = hw.device(h.device) if h is not None else None
    if dev is None or not isinstance(b, Const):
        return own
    span = b.value
    for a in plan.mesh.names[plan.mesh.names.index(axis) + 1:]:
        size = plan.mesh.axis(a).size
        if not isinstance(size, Const):
            return own
        span *= size.value
    return INTRA if span.denominator == 1 and dev.per_node % int(span) == 0 else own


def _sizes(o: ir.Override) -> tuple[int, ...]:
    return tuple(int(s.value) for s in o.sizes or ())


def _sets(o: ir.Override) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(r.value) for r in s) for s in o.sets or ())


def groups_link(plan: ir.Plan, axis: str, sizes: tuple[int, ...],
                sets: tuple[tuple[int, ...], ...] | None = None) -> str | None:
    """The link class of consecutive groups of ``sizes`` ranks of ``axis`` (or of the rank ``sets``): intra-node
    where every group lies inside one node (module docstring), else the axis's own."""
    own = plan.mesh.axis(axis).link
    h = plan.mesh.hardware
    dev = hw.device(h.device) if h is not None else None
    if own != INTER or dev is None:
        return own
    span = Fraction(1)
    for a in plan.mesh.names[plan.mesh.names.index(axis) + 1:]:
        size = plan.mesh.axis(a).size
        if not isinstance(size, Const):
            return own
        span *= Fraction(size.value)
    if span.denominator != 1:
        return own
    per, at = dev.per_node, 0
    if sets is not None:  # each set's members, spread by the axes inside, on one node
        inside = all(len({(r * int(span) + k) // per for r in s for k in range(int(span))}) == 1 for s in sets)
        return INTRA if inside else own
    for s in sizes:
        first, last = at * int(span), (at + s) * int(span) - 1
        if first // per != last // per:
            return own
        at += s
    return INTRA


def _cut_axis(plan: ir.Plan, a: str, o: ir.Override | None,
              along: tuple[str, ...] = ()) -> tuple[Value, str | None]:
    """The ranks of axis ``a`` in its group under ``o`` (the largest group, which the step waits for), and the
    link it crosses; the whole axis where no statement cuts it. Rank sets over several axes: the largest set on
    the first of their axes in ``along`` (the collective's), 1 on the others."""
    if o is None:
        return Sym(a), plan.mesh.axis(a).link
    if o.verb == SETS and len(o.axes or ()) > 1:
        first = next(x for x in along if x in o.axes)
        return ir.const(max(map(len, _sets(o))) if a == first else 1), sets_link(plan, o)
    if o.verb == GROUPS:
        return ir.const(max(_sizes(o))), groups_link(plan, a, _sizes(o))
    if o.verb == SETS:
        return ir.const(max(map(len, _sets(o)))), groups_link(plan, a, (), _sets(o))
    link = block_link(plan, a, o.by) if o.verb != OverrideVerb.REDUCE_STRIDED else plan.mesh.axis(a).link
    return _block_size(o.by, plan.mesh.axis(a), o.verb), link


def sets_link(plan: ir.Plan, o: ir.Override) -> str | None:
    """The link class of rank sets over several axes (flattened row-major): ``intra_node`` where, for every
    coordinate of the other axes, each set's devices lie inside one node of the catalogue device; else the most
    remote link of the axes some set spans (its members differ there)."""
    axes, sets = tuple(o.axes or ()), _sets(o)
    sizes = {a: plan.mesh.axis(a).size for a in plan.mesh.names}
    if not all(isinstance(sizes[a], Const) for a in axes):  # refused by check.subgroups (PL269)
        links = {plan.mesh.axis(a).link for a in axes} - {None}
        return INTER if INTER in links else next(iter(sorted(links)), None)
    own = tuple(int(sizes[a].value) for a in axes)
    spans = [a for k, a in enumerate(axes) if any(len({ranksets.coords(r, own)[k] for r in s}) > 1 for s in sets)]
    links = {plan.mesh.axis(a).link for a in spans} - {None}
    far = INTER if INTER in links else next(iter(sorted(links)), None)
    h = plan.mesh.hardware
    dev = hw.device(h.device) if h is not None else None
    if far != INTER or dev is None or not all(isinstance(n, Const) for n in sizes.values()):
        return far
    shape = [int(n.value) for n in sizes.values()]
    others = [a for a in plan.mesh.names if a not in axes]
    if ranksets.prod(sizes[a].value for a in others) > 4096:
        return far
    for rest in product(*[range(int(sizes[a].value)) for a in others]):
        at = dict(zip(others, rest))
        for s in sets:
            nodes = set()
            for r in s:
                at.update(zip(axes, ranksets.coords(r, own)))
                flat = 0
                for a, n in zip(plan.mesh.names, shape):
                    flat = flat * n + at[a]
                nodes.add(flat // dev.per_node)
            if len(nodes) > 1:
                return far
    return INTRA


def _blocked(plan: ir.Plan, c: Collective, stated: tuple[ir.Override, ...]) -> Collective:
    """``c`` run within the groups the statements cut the axes they name into (each axis by its own); rank sets
    over several axes priced once, on the first of their axes the collective runs over, by the largest set."""
    by_axis = {a: o for o in stated for a in o.axes or () if a in c.axes}
    if not by_axis:
        return c
    cuts = [_cut_axis(plan, a, by_axis.get(a), c.axes) for a in c.axes]
    factors: list[Value] = [f for f, _ in cuts]
    links = [x for _, x in cuts]
    size = factors[0] if len(factors) == 1 else Op("*", tuple(factors))
    known = [x for x in links if x]
    link = None if not known else known[0] if len(set(known)) == 1 else \
        INTER if INTER in known else "+".join(sorted(set(known)))
    rule = c.rule
    for o in stated:
        cut = [a for a in c.axes if by_axis.get(a) is o]
        if not cut:
            continue
        e = ", ".join(map(str, _sizes(o))) if o.verb == GROUPS else \
            ", ".join("[" + ", ".join(map(str, s)) + "]" for s in _sets(o)) if o.verb == SETS else ir.show(o.by)
        rule += f"; {WHAT[o.verb].format(e)} of ({', '.join(cut)}) (override grads: {o.verb})"
    return replace(c, block=size, link=link if known else link_of(plan, c.axes), rule=rule)


def apply(plan: ir.Plan, colls: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """The schedule with each gradient reduction a block statement names run within its blocks."""
    if not statements(plan):
        return colls
    members = pg.param_groups(plan.model)
    out: list[Collective] = []
    for c in colls:
        if c.state is not State.GRADS or c.phase is not Phase.GRAD_SYNC or c.size is not None \
                or c.block is not None or c.kind not in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER):
            out.append(c)
            continue
        own = grads_group(c.payload.tensor)
        names = [own] if own is not None else [g.name for g in members if views.carries(c.payload, g.name)]
        by_name = {g.name: g for g in members}
        parts: dict[tuple, tuple[tuple[ir.Override, ...] | None, list[str]]] = {}
        for n in names:
            g = by_name.get(n)
            o = statement_for(plan, _member_of(g) if g is not None else n)
            parts.setdefault(tuple(map(id, o or ())), (o, []))[1].append(n)
        if len(parts) <= 1:
            o = next(iter(parts.values()))[0] if parts else statement_for(plan, None)
            out.append(c if o is None else _blocked(plan, c, o))
            continue
        plain = statement_for(plan, None)
        named = [n for o, ns in parts.values() if o != plain for n in ns]
        for o, ns in parts.values():
            if o == plain and c.payload.groups is None:  # the rest of the buffer: every group but the named ones
                pay = replace(c.payload, without=c.payload.without + tuple(named))
            else:
                pay = replace(c.payload, groups=tuple(ns), description=c.payload.description + f" (group {', '.join(ns)})")
            part = replace(c, payload=pay)
            out.append(part if o is None else _blocked(plan, part, o))
    return tuple(out)

