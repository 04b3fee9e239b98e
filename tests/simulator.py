"""A concrete simulator of one training step, written from docs/semantics.md.

Independent of the checker's code (it imports nothing from ``placement_logic.check``):
given an ``ir.Plan`` and concrete sizes, it enumerates every device, draws random token
counts and exact ``Fraction`` gradient contributions, executes the plan's reductions
(an all-reduce really sums the buffers of the devices of an axis group; a second one sums
again), loss weights, accumulation and divisor, and compares every device's gradient with
the single-device reference Σ s / T. On a tensor axis whose ranks hold copies of a group's
elements and use them with their own query heads (the query/key norms, K kv heads on more
than K ranks) each rank's heads are a source of their own and a rank holds the element of
its copy group (``head_copies``). It also evaluates the placement conditions of the
update and the clip-norm and overflow reductions by concrete computation.

``violations(plan, sizes, rng, trials)`` returns the violated conditions as keys:
``("gi", group)``, ``("usable", axis)``, ``("gathered", axis)``, ``("optimizer", axis)``,
``("clip",)``, ``("overflow",)``, ``("regather",)``.

Parameter groups with modes of their own (a ``group`` block's ``params``, ``optimizer``,
``grads``): each group's states are read from the declaration here — the plan's mode on
every axis the group does not place itself — and its reductions, gathers and re-gathers are
the collectives of the schedule that move its buffer (a collective names the groups it
carries). A user group's gradient class is its ``like``.

The simulator's sections live in modules of their own, re-exported here: the reading of the plan and the
collectives on buffers (simulator_plan), gradient integrity (simulator_gi), the clip norm and overflow
(simulator_norm); the placement conditions of the update and the driver are here.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

from simulator_gi import (  # noqa: F401 (re-exported: the simulator's names as before)
    IGNORED_TERM,
    _accumulated,
    _clamped,
    _divisor,
    _draw_counts,
    _ignored,
    _ignored_terms,
    _reduced,
    _routed,
    gi_ok,
)
from simulator_norm import (  # noqa: F401 (re-exported: the simulator's names as before)
    _dedupe_axes,
    _exact_root,
    _norm_reduced,
    _stated_norm,
    _twice,
    grad_shard_axes,
    norm_violations,
)
from simulator_plan import (  # noqa: F401 (re-exported: the simulator's names as before)
    _BUILTIN_NAMES,
    BUILTIN_CLASSES,
    COMPLETE,
    DATA_LIKE,
    GRAD_SPLIT,
    HEADS,
    INVARIANT,
    MB,
    PARTIAL,
    SHARDED,
    SPLIT,
    SPLIT_PARAMS,
    TENSOR,
    TIE,
    _allmax,
    _allreduce,
    _allreduce_copies,
    _builtin_groups,
    _decl,
    _last_for,
    _overrides,
    _prod,
    _value,
    axis_type,
    carries,
    group_role,
    groups_of,
    head_copies,
    kind_of,
    mode,
    own_mode,
    reductions,
    sequence_parallel,
    tied,
    token_axes,
)

from placement_logic import ir
from placement_logic.ir import collectives

# --------------------------------------------------------------------------- parameters and the update


def _modes_on(plan: ir.Plan, group: str, axis: str, schedule) -> tuple[ir.Mode, ir.Mode, ir.Mode]:
    """(params, optimizer, grads) of a group on one axis. On an expert axis that splits the
    experts, a group the axis does not divide is a data-parallel replica: params and optimizer
    state as on the plan's data axes (R without one), its gradient sharded where the schedule
    reduce-scatters it."""
    states = (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS)
    out = [mode(plan, group, s, axis) for s in states]
    if plan.role(axis) is ir.Role.EXPERT and kind_of(plan, group) != "experts" and \
            out[0] in SPLIT_PARAMS:  # the axis splits the experts only
        data = [a for a in plan.mesh.names if plan.role(a) is ir.Role.DATA]
        for i, s in enumerate(states[:2]):
            if not own_mode(plan, group, s, axis):
                m = plan.placement(s).mode(data[0]) if data else ir.Mode.R
                out[i] = ir.Mode.R if m is ir.Mode.M else m
        if not own_mode(plan, group, ir.State.GRADS, axis):
            scattered = any(c.kind is collectives.Kind.REDUCE_SCATTER and axis in c.axes and carries(c, group)
                            and c.phase is collectives.Phase.GRAD_SYNC for c in schedule)
            out[2] = ir.Mode.S if scattered else ir.Mode.R
    return out[0], out[1], out[2]


def placement_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    """Usable params, gathers, the optimizer step, the re-gather after it: one weight row and
    one step of SGD, for every parameter group."""
    out = set()
    schedule = collectives.derive(plan)
    for g in groups_of(plan):
        gathers = Counter(a for c in schedule if c.kind is collectives.Kind.ALL_GATHER and c.state is ir.State.PARAMS
                          and c.phase is collectives.Phase.FORWARD and carries(c, g) for a in c.axes)
        refresh = Counter(a for c in schedule if c.kind is collectives.Kind.ALL_GATHER and carries(c, g)
                          and c.phase is collectives.Phase.REFRESH for a in c.axes)
        for a in plan.mesh.names:
            out |= _axis_violations(plan, g, a, sizes[a], _modes_on(plan, g, a, schedule), gathers[a], refresh[a])
    return out


def _axis_violations(plan: ir.Plan, group: str, a: str, n: int, modes, gathers: int, refresh: int) -> set:
    out = set()
    par, opt, grads = modes
    weights = [Fraction(i + 1) for i in range(n)]  # element i lives on rank i
    role = group_role(plan, group, a)
    if role in DATA_LIKE and par in SPLIT_PARAMS and sum(weights[:1]) != sum(weights):
        out.add(("usable", a))  # the forward of rank 0 runs on its piece only
    if par is ir.Mode.S_STAR and gathers != 1:
        used = weights[:1] if gathers == 0 else weights * gathers
        if sum(used) != sum(weights):
            out.add(("gathered", a))
    expert_split = role is ir.Role.EXPERT and kind_of(plan, group) == "experts" and par in SPLIT_PARAMS
    whole = role in DATA_LIKE or (role in TENSOR and par not in SPLIT_PARAMS) or (
        role is ir.Role.EXPERT and not expert_split)
    if whole and grads in GRAD_SPLIT and opt is ir.Mode.R and n >= 2:
        full = [Fraction(1) - Fraction(1, 10) * w for w in weights]
        held = [Fraction(1) - Fraction(1, 10) * (weights[0] if i == 0 else 0) for i in range(n)]
        if full != held:
            out.add(("optimizer", a))
    raw_par, raw_opt = (mode(plan, group, s, a) for s in (ir.State.PARAMS, ir.State.OPTIMIZER))
    if raw_par is ir.Mode.R and raw_opt.shards and n >= 2:
        # each rank steps its own shard; the others' updates reach it only by the re-gather
        copies = [[w - (Fraction(1, 10) if r == i else 0) for i, w in enumerate(weights)] for r in range(n)]
        if refresh:
            copies = [[copies[i][i] for i in range(n)] for _ in range(n)]
        if any(c != copies[0] for c in copies):
            out.add(("regather",))
    return out


# --------------------------------------------------------------------------- driver


def violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict | None = None,
               trials: int = 3) -> set:
    import simulator_losses  # the loss terms' section, which reads this module's helpers
    import simulator_perrank  # per-rank operations on the update and the loss scale
    import simulator_rankclips  # two or more clips on sets of ranks for one group
    import simulator_rankset  # a clip or a divisor on a set of one axis's ranks
    import simulator_subgroups  # blocks of an axis's ranks, divisors on the last rank or all but it

    bindings = bindings or {}
    out = placement_violations(plan, sizes)
    for _ in range(trials):
        for g in groups_of(plan):
            if ("gi", g) not in out and not gi_ok(plan, g, sizes, rng, bindings):
                out.add(("gi", g))
        out |= norm_violations(plan, sizes, rng, bindings)
        out |= simulator_losses.term_violations(plan, sizes, rng, bindings)
        out |= simulator_perrank.update_violations(plan, sizes, rng, bindings)
        out |= simulator_perrank.scale_violations(plan, sizes, rng)
        out |= simulator_subgroups.update_violations(plan, sizes, rng, bindings)
        out |= simulator_rankset.update_violations(plan, sizes, rng, bindings)
        out |= simulator_rankset.product_violations(plan, sizes, rng, bindings)
        out |= simulator_rankclips.clip_violations(plan, sizes, rng, bindings)
        out |= simulator_subgroups.grad_block_violations(plan, sizes, rng, bindings)
    return out
