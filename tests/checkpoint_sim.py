"""A concrete simulator of a checkpoint's save and load, written from docs/semantics.md
("Checkpoints: save, load and reshard").

Independent of the checker's code (it imports nothing from ``placement_logic.check``): given
an ``ir.Plan`` with ``override checkpoint: ...`` statements and concrete sizes, it lays out
every group's params and optimizer state over every device of the mesh (an element per shard
coordinate of the axes it is sharded on), lets each device write what the statements say it
writes, counts the writes of every element, loads the checkpoint back (re-gathering or not,
on the same mesh or on a new size of a resharded axis, remapping or reading by rank index)
and compares every device's state, and its RNG state, with the values before the save.

``violations(plan, sizes)`` returns the violated conditions as keys: ``("ckpt_save",)``,
``("ckpt_regather",)``, ``("ckpt_reshard",)``, ``("ckpt_rng",)``.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from itertools import product

from simulator import SHARDED, _modes_on, axis_type, groups_of, sequence_parallel

from placement_logic import ir
from placement_logic.ir import collectives

TENSOR = (ir.Role.TENSOR, ir.Role.SEQUENCE)
SPLIT = (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O)


def _ck(plan: ir.Plan, verb: str) -> list[ir.Override]:
    return [o for o in plan.overrides if o.target == "checkpoint" and o.verb == verb]


def _for(o: ir.Override, group: str) -> bool:
    return o.group in (None, "all", group)


def _split(plan: ir.Plan, group: str, axis: str, m: ir.Mode) -> bool:
    """Each rank of ``axis`` holds its own part of the state (a tensor axis splits only what
    the step's table calls sharded there)."""
    if plan.role(axis) in TENSOR:
        return axis_type(plan, group, axis) == SHARDED
    return m in SPLIT


def layout(plan: ir.Plan, schedule) -> dict[tuple[str, str], dict[str, bool]]:
    """(group, state) -> axis -> split there."""
    out = {}
    for g in groups_of(plan):
        per = {a: _modes_on(plan, g, a, schedule) for a in plan.mesh.names}
        out[(g, "params")] = {a: _split(plan, g, a, per[a][0]) for a in plan.mesh.names}
        out[(g, "optimizer")] = {a: _split(plan, g, a, per[a][1]) for a in plan.mesh.names}
    return out


def _writes(plan: ir.Plan, group: str, axis: str, split: bool) -> bool:
    """Whether every rank of ``axis`` writes (else rank 0 only): the last statement naming the axis."""
    found = None
    for o in plan.overrides:
        if o.target == "checkpoint" and o.verb in ("save_from", "save_rank0") and _for(o, group) \
                and axis in (o.axes or ()):
            found = o.verb == "save_from"
    return split if found is None else found


def save_violated(plan: ir.Plan, sizes: dict[str, int], lay) -> bool:
    names = plan.mesh.names
    devices = list(product(*[range(sizes[a]) for a in names]))
    skipped = {g for g in groups_of(plan) for o in _ck(plan, "skip_optimizer") if _for(o, g)}
    for (g, state), split in lay.items():
        shard_axes = [a for a in names if split[a]]
        writes: Counter = Counter()
        for dev in devices:
            if state == "optimizer" and g in skipped:
                continue
            coord = dict(zip(names, dev))
            if all(coord[a] == 0 or _writes(plan, g, a, split[a]) for a in names):
                writes[tuple(coord[a] for a in shard_axes)] += 1
        elements = product(*[range(sizes[a]) for a in shard_axes])
        if any(writes[e] != 1 for e in elements):
            return True
    return False


def regather_violated(plan: ir.Plan, sizes: dict[str, int], schedule) -> bool:
    """Each rank loads its master (optimizer) shard and copies it into its params; replicated
    params are all-gathered over the axis unless the plan says not."""
    if not _ck(plan, "no_regather_after_load"):
        return False
    for g in groups_of(plan):
        for a in plan.mesh.names:
            par, opt, _ = _modes_on(plan, g, a, schedule)
            if plan.role(a) in TENSOR or par in SPLIT or opt not in SPLIT:
                continue
            n = sizes[a]
            saved = [Fraction(i + 2) for i in range(n)]
            params = [[saved[i] if i == r else Fraction(0) for i in range(n)] for r in range(n)]
            if any(params[r] != saved for r in range(n)):
                return True
    return False


def _reload(n: int, new: int, by_rank: bool) -> bool:
    """Whether loading n shards on ``new`` ranks gives every new rank exactly its elements."""
    total = n * new
    values = list(range(total))
    files = [values[r * total // n:(r + 1) * total // n] for r in range(n)]
    for r in range(new):
        want = values[r * total // new:(r + 1) * total // new]
        if by_rank:
            got = files[r] if r < n else []
        else:
            got = [v for f in files for v in f if r * total // new <= v < (r + 1) * total // new]
        if got != want:
            return False
    return True


def reshard_violated(plan: ir.Plan, sizes: dict[str, int], lay) -> bool:
    axes = [a for o in _ck(plan, "reshard") for a in o.axes or ()]
    for (g, _state), split in lay.items():
        for a in axes:
            if not split[a]:
                continue
            by_rank = any(_for(o, g) and a in (o.axes or ()) for o in _ck(plan, "load_by_rank"))
            n = sizes[a]
            if any(not _reload(n, new, by_rank) for new in range(1, n + 3) if new != n):
                return True
    return False


def seed_axes(plan: ir.Plan) -> list[str]:
    """The axes the dropout seed varies over (docs/semantics.md, "Dropout seeds")."""
    seeds = [o for o in plan.overrides if o.target == "dropout_seed"]
    if seeds:
        return [] if seeds[-1].verb == "same" else list(seeds[-1].axes or ())
    return [a for a in plan.mesh.names if plan.role(a) in TENSOR] if sequence_parallel(plan) else []


STEPS_BEFORE_SAVE, MASKS_PER_STEP = 4, 2


def _draw(stream: tuple, offset: int) -> tuple:
    """The dropout mask a generator (seed, offset) draws: a function of both (a counter-based RNG)."""
    return (*stream, offset)


def rng_violated(plan: ir.Plan, sizes: dict[str, int]) -> bool:
    """Each device's generator is (its seed, an offset); the run draws MASKS_PER_STEP masks a step.
    The uninterrupted run's next step draws at offset STEPS_BEFORE_SAVE·MASKS_PER_STEP from its own
    seed; the resumed run from the state it loaded (a fresh process: its seed at offset 0)."""
    names = plan.mesh.names
    vary = seed_axes(plan)
    devices = list(product(*[range(sizes[a]) for a in names]))
    seed = {d: tuple(c for a, c in zip(names, d) if a in vary) for d in devices}
    saved = {d: (seed[d], STEPS_BEFORE_SAVE * MASKS_PER_STEP) for d in devices}
    if _ck(plan, "rng_not_restored"):
        loaded = {d: (seed[d], 0) for d in devices}
    elif _ck(plan, "rng_by_coordinates"):
        return by_coordinates_violated(plan, sizes, vary)
    elif _ck(plan, "rng_shared"):
        loaded = {d: saved[devices[0]] for d in devices}
    else:
        loaded = dict(saved)
    next_masks = {d: [_draw(s, o + k) for k in range(MASKS_PER_STEP)] for d, (s, o) in saved.items()}
    resumed = {d: [_draw(s, o + k) for k in range(MASKS_PER_STEP)] for d, (s, o) in loaded.items()}
    return resumed != next_masks


def by_coordinates_violated(plan: ir.Plan, sizes: dict[str, int], vary: list[str]) -> bool:
    """Every device saves its stream under its coordinates on the seed's axes; on each new size
    (1 .. n + 2) of each resharded axis, every new device reads the stream saved under its own
    coordinates. Violated when one finds none, or two devices whose seeds differ read one stream."""
    names = plan.mesh.names
    key = lambda dev: tuple(c for a, c in zip(names, dev) if a in vary)  # noqa: E731
    saved = {key(d): (key(d), STEPS_BEFORE_SAVE * MASKS_PER_STEP) for d in product(*[range(sizes[a]) for a in names])}
    for a in [a for o in _ck(plan, "reshard") for a in o.axes or ()]:
        for new in range(1, sizes[a] + 3):
            shape = {**sizes, a: new}
            devices = list(product(*[range(shape[b]) for b in names]))
            got = {d: saved.get(key(d)) for d in devices}
            if any(s is None for s in got.values()):
                return True
            if any(key(d) != key(e) and got[d] == got[e] for d in devices for e in devices):
                return True
    return False


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    if not any(o.target == "checkpoint" for o in plan.overrides):
        return set()
    schedule = collectives.derive(plan)
    lay = layout(plan, schedule)
    out = set()
    if save_violated(plan, sizes, lay):
        out.add(("ckpt_save",))
    if regather_violated(plan, sizes, schedule):
        out.add(("ckpt_regather",))
    if reshard_violated(plan, sizes, lay):
        out.add(("ckpt_reshard",))
    if rng_violated(plan, sizes):
        out.add(("ckpt_rng",))
    return out
