"""The concrete simulator of a step's initial state, optimizer identity and RNG state, written from
docs/semantics.md ("Initial state and identity", "RNG state") without the checker's code.

``state_violations(plan, sizes)`` enumerates every device of the mesh and returns the violated
conditions as keys: ``("init",)`` (two devices holding the same parameter element start from
different values), ``("stale",)`` (the optimizer steps a tensor the forward does not read),
``("rng_split",)`` (two devices holding different slices of a split dropout region draw the same
mask), ``("rng_replicated",)`` (two devices holding one replicated value draw different masks) and
``("rng_recompute",)`` (a recomputed mask differs from the forward's).

Generators here are ``random.Random`` streams keyed by (seed, offset): a device's state is where
its stream stands. Seeds follow Megatron-LM's ``model_parallel_cuda_manual_seed``: the default
generator takes the same seed on every device of a tensor group; the tracker adds 2718 and the
device's rank over the tensor and expert axes.
"""

from __future__ import annotations

import random
from itertools import product

import simulator as sim

from placement_logic import ir
from placement_logic.ir import collectives, optimizers

SEED = 42
MASK_BITS = 64


def _devices(plan: ir.Plan, sizes: dict[str, int]) -> list[dict[str, int]]:
    names = plan.mesh.names
    return [dict(zip(names, c)) for c in product(*[range(sizes[a]) for a in names])]


def _neighbours(plan, sizes, axis):
    """Pairs of devices that differ on ``axis`` only."""
    for d in _devices(plan, sizes):
        if d[axis] + 1 < sizes[axis]:
            yield d, dict(d, **{axis: d[axis] + 1})


def _holds_copy(plan: ir.Plan, group: str, axis: str) -> bool:
    """Whether every device along ``axis`` holds the whole of the group's elements (a copy)."""
    t = sim.axis_type(plan, group, axis)
    if t in (sim.INVARIANT, sim.SPLIT, sim.HEADS):
        return True
    if t == sim.PARTIAL:  # on an expert axis a group it does not split takes the data axes' modes
        return sim._modes_on(plan, group, axis, collectives.derive(plan))[0] is ir.Mode.R
    return False  # sharded, complete experts, pipeline stages


def _init_violation(plan: ir.Plan, sizes: dict[str, int]) -> bool:
    for g in sim.groups_of(plan):
        unb = set()
        for o in plan.overrides:
            if o.target == "params" and o.verb == "no_init_broadcast" and o.group in (None, "all", g):
                unb |= set(o.axes or ())
        copies = [a for a in plan.mesh.names if _holds_copy(plan, g, a)]

        def value(d, unb=unb, g=g):
            # each device draws its element from its own seed: the base, offset by its coordinates on the
            # axes it is not broadcast over (a broadcast makes every device take rank 0's draw)
            key = tuple(d[a] if a in unb else 0 for a in plan.mesh.names)
            return random.Random(hash((SEED, g) + key)).random()

        for a in copies:
            if any(value(x) != value(y) for x, y in _neighbours(plan, sizes, a)):
                return True
    return False


def _stale(plan: ir.Plan) -> bool:
    """One SGD step: the optimizer steps the tensor it holds; the next forward reads the model's."""
    for o in plan.overrides:
        if o.target == "optimizer" and o.verb == "stale_params":
            model_param = 1.0
            optimizer_param = model_param  # a copy, made before re-wrapping
            optimizer_param -= 0.1 * 0.5
            if model_param != optimizer_param:
                return True
    return False


def _axes_of(plan: ir.Plan, verbs: tuple[str, ...]) -> set[str]:
    return {a for o in plan.overrides if o.target == "rng" and o.verb in verbs for a in (o.axes or ())}


def _states(plan: ir.Plan, sizes: dict[str, int]) -> dict[tuple, dict[str, tuple[int, int]]]:
    """Every device's generator states after the start of the step: {"default": (seed, offset),
    "tracker": (seed, offset)}."""
    tensor = [a for a in plan.mesh.names if plan.role(a) in sim.TENSOR]
    expert = [a for a in plan.mesh.names if plan.role(a) is ir.Role.EXPERT]
    unforked = _axes_of(plan, ("same",))
    restored = _axes_of(plan, ("restored_from_one",))
    advanced = _axes_of(plan, ("advance",))

    def initial(d):
        fork = SEED + 2718
        for i, a in enumerate(tensor + expert):
            if a not in unforked:
                fork += (d[a] + 1) * 1000 ** (i + 1)
        return {"default": (SEED, 0), "tracker": (fork, 0)}

    out = {}
    for d in _devices(plan, sizes):
        # a resume restores the states saved by the device at coordinate 0 of every restored axis
        src = {a: (0 if a in restored else c) for a, c in d.items()}
        st = initial(src)
        extra = sum(d[a] for a in advanced)  # a device that ran `extra` more random ops this step
        st["default"] = (st["default"][0], st["default"][1] + extra)
        out[tuple(d.values())] = st
    return out


def _mask(state: tuple[int, int]) -> tuple[int, ...]:
    seed, offset = state
    r = random.Random(seed)
    for _ in range(offset):
        r.getrandbits(MASK_BITS)
    return tuple(int(b) for b in format(r.getrandbits(MASK_BITS), f"0{MASK_BITS}b"))


def _rng_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    out = set()
    st = _states(plan, sizes)
    sp = sim.sequence_parallel(plan)
    key = lambda d: tuple(d.values())  # noqa: E731
    for a in plan.mesh.names:
        role = plan.role(a)
        if role in sim.TENSOR or role is ir.Role.EXPERT:
            # the split region (heads, SP slices, experts): different slices, different masks
            if any(_mask(st[key(x)]["tracker"]) == _mask(st[key(y)]["tracker"]) for x, y in _neighbours(plan, sizes, a)):
                out.add(("rng_split",))
        if role in sim.TENSOR and not sp:
            # the residual region after the row-parallel all-reduce: one replicated value, one mask
            if any(_mask(st[key(x)]["default"]) != _mask(st[key(y)]["default"]) for x, y in _neighbours(plan, sizes, a)):
                out.add(("rng_replicated",))
    if plan.recompute is not ir.Recompute.NONE:
        preserved = not any(o.target == "rng" and o.verb == "not_preserved" for o in plan.overrides)
        forward_state = (SEED, 0)
        after_forward = (SEED, 1)  # the forward's dropout advanced the stream
        recompute_state = forward_state if preserved else after_forward
        if _mask(forward_state) != _mask(recompute_state):
            out.add(("rng_recompute",))
    return out


def _synced_once(plan: ir.Plan, group: str) -> list[str]:
    """The axes over which the once-per-step reduction sums the group's gradient, replicated there:
    the group's contributions are partial over the axis, the plan reduces them there, and the
    gradient is not sharded (reduce-scattered) over it."""
    schedule = collectives.derive(plan)
    red = sim.reductions(plan, group)
    return [a for a in plan.mesh.names if sim.axis_type(plan, group, a) == sim.PARTIAL and red[a] >= 1
            and sim._modes_on(plan, group, a, schedule)[2] is ir.Mode.R]


def early_sync_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random) -> set:
    """The sync armed on micro-step 1 of m: every rank of a synced axis ends the step with the reduced
    gradient of micro-step 1 plus its own gradient of micro-steps 2..m. Keys: ("gi", group),
    ("replica", group), ("clip",), ("overflow",)."""
    from fractions import Fraction

    out: set = set()
    m = sizes["microbatches"]
    for g in sim.groups_of(plan):
        for a in _synced_once(plan, g):
            n = sizes[a]
            s = {(r, mu): Fraction(rng.randint(1, 99)) for r in range(n) for mu in range(m)}
            tokens = {(r, mu): rng.randint(1, 5) for r in range(n) for mu in range(m)}
            total = sum(tokens.values())
            ref = sum(s.values()) / total
            synced = sum(s[(r, 0)] for r in range(n)) / total
            held = [synced + sum(s[(r, mu)] for mu in range(1, m)) / total for r in range(n)]
            if any(h != ref for h in held):
                out.add(("gi", g))
            if len(set(held)) > 1:
                out |= {("replica", g), ("clip",), ("overflow",)}
    return out


def state_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    out = set()
    if _init_violation(plan, sizes):
        out.add(("init",))
    if _stale(plan):
        out.add(("stale",))
    return out | _rng_violations(plan, sizes)


def stale_buffer_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, steps: int = 3) -> set:
    """Optimizer steps 1..T, each group's gradient buffer cleared after every update unless an
    ``override grads[g]: no_zero_grad`` names the group (or every group): backward then adds into
    what the buffer holds. Every device of the mesh keeps its own buffer; a step's reduced gradient
    is the same on every device (the global-batch mean of per-token contributions), so a buffer
    carried over is carried alike everywhere. Keys: ("gi", group) where an update reads anything
    but its own step's global-batch gradient, ("replica", group) where two devices read different
    values."""
    from fractions import Fraction

    names = plan.mesh.names
    devices = [tuple(c) for c in product(*[range(sizes[a]) for a in names])]
    m = sizes.get("microbatches", 1)
    out: set = set()
    for g in sim.groups_of(plan):
        kept = any(o.target == "grads" and o.verb == "no_zero_grad" and o.group in (None, "all", g)
                   for o in plan.overrides)
        buffers = {d: Fraction(0) for d in devices}
        for _ in range(steps):
            s = {(d, mu): Fraction(rng.randint(-9, 9)) for d in devices for mu in range(m)}
            tokens = {(d, mu): rng.randint(1, 5) for d in devices for mu in range(m)}
            mean = sum(s.values()) / sum(tokens.values())
            for d in devices:
                buffers[d] = (buffers[d] if kept else Fraction(0)) + mean
            if any(b != mean for b in buffers.values()):
                out.add(("gi", g))
            if len(set(buffers.values())) > 1:
                out.add(("replica", g))
    return out


def _update(algorithm: str, state: dict, theta: float, g: float, lr: float) -> float:
    """One optimizer update of one scalar parameter, in floating point, from the algorithms' published
    rules: SGD with momentum 0.9, Adam/AdamW (β 0.9, 0.999, ε 1e-8, bias-corrected), Lion (β 0.9, 0.99),
    Muon (Nesterov-free momentum 0.95, a 1×1 matrix orthogonalised to its sign)."""
    state["t"] = state.get("t", 0) + 1
    if algorithm == "sgd":
        state["v"] = 0.9 * state.get("v", 0.0) + g
        return theta - lr * state["v"]
    if algorithm == "lion":
        d = 0.9 * state.get("m", 0.0) + 0.1 * g
        state["m"] = 0.99 * state.get("m", 0.0) + 0.01 * g
        return theta - lr * ((d > 0) - (d < 0))
    if algorithm == "muon":
        state["m"] = 0.95 * state.get("m", 0.0) + g
        return theta - lr * ((state["m"] > 0) - (state["m"] < 0))
    state["m"] = 0.9 * state.get("m", 0.0) + 0.1 * g
    state["v"] = 0.999 * state.get("v", 0.0) + 0.001 * g * g
    t = state["t"]
    return theta - lr * (state["m"] / (1 - 0.9 ** t)) / ((state["v"] / (1 - 0.999 ** t)) ** 0.5 + 1e-8)


def microstep_update_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random) -> set:
    """One optimizer step of m micro-steps on every device of the mesh, each token of device d and
    micro-step k with the loss (θ - x)² / 2 for a random x, the step's mean loss over all its tokens.
    Single-device training takes one update from the mean gradient at θ₀; a group an ``override
    optimizer[g]: step_every_microbatch`` names (no group, ``all``: every one) takes one update after each
    micro-step from that micro-step's part of the mean (its tokens over every device, divided by the
    step's token count), at the parameters the earlier updates left. The algorithm is the plan's
    optimizer choice for the group (AdamW where none is given). Keys: ("update", group) where the final
    parameter differs from single-device training's."""
    names = plan.mesh.names
    devices = list(product(*[range(sizes[a]) for a in names]))
    m = sizes.get("microbatches", 1)
    xs = {(d, k): [rng.uniform(-2, 2) for _ in range(rng.randint(1, 3))] for d in devices for k in range(m)}
    total = sum(len(v) for v in xs.values())
    out: set = set()
    for g in sim.groups_of(plan):
        each = any(o.target == "optimizer" and o.verb == "step_every_microbatch" and o.group in (None, "all", g)
                   for o in plan.overrides)
        chosen = dict(plan.optimizers)
        algorithm = (chosen.get(g) or chosen.get("all") or optimizers.DEFAULT).algorithm
        theta0, lr = 0.5, 0.1
        ref = _update(algorithm, {}, theta0, sum(theta0 - x for v in xs.values() for x in v) / total, lr)
        theta, state = theta0, {}
        if each:
            for k in range(m):
                part = sum(theta - x for d in devices for x in xs[(d, k)]) / total
                theta = _update(algorithm, state, theta, part, lr)
        else:
            theta = ref
        if abs(theta - ref) > 1e-9:
            out.add(("update", g))
    return out


def mtp_copy_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random) -> set:
    """The copies of the embedding over a pipeline axis where ``override embedding: mtp_stage over (PP)`` puts the
    multi-token-prediction block on a middle stage (a random one of 1 … PP − 2; with fewer than 3 stages it stays on
    the last): the first stage, the MTP stage and, with tied embeddings, the last stage each hold a copy whose own
    gradient is a random nonzero integer. The embedding group sums the copies of its stages: every copy's stage
    (Megatron Core's group), or the first and last stage only under ``embedding: group_first_last``. Keys:
    ("gi",) where a copy holds other than the sum of every copy's gradient, ("replica",) where two copies differ."""
    stage = next((o for o in plan.overrides if o.target == "embedding" and o.verb == "mtp_stage"), None)
    if stage is None:
        return set()
    pp = sizes[stage.axes[0]]
    t = plan.model.transformer
    mtp = rng.randint(1, pp - 2) if pp >= 3 else pp - 1
    holders = {0, mtp} | ({pp - 1} if t is not None and t.tied_embeddings else set())
    own = {s: rng.choice([-3, -2, -1, 1, 2, 3]) for s in holders}
    first_last = any(o.target == "embedding" and o.verb == "group_first_last" for o in plan.overrides)
    group = holders & {0, pp - 1} if first_last else holders
    held = {s: (sum(own[x] for x in group) if s in group else own[s]) for s in holders}
    total = sum(own.values())
    out: set = set()
    if any(v != total for v in held.values()):
        out.add(("gi",))
    if len(set(held.values())) > 1:
        out.add(("replica",))
    return out


def rereduce_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, reduction: str = "sum") -> set:
    """One optimizer step of m micro-steps on every device of the mesh, each device and micro-step with random
    per-token contributions and token counts; the reference is the global-batch mean. Each device's local
    buffer adds its micro-step's part (backward accumulates). Derived step: the buffer reduced once, after the
    last micro-step. ``override grads: reduce_accumulated_every_microbatch``: after every micro-step the whole
    local buffer (not cleared) is reduced over the devices and the result added into a separate accumulator,
    which the update reads. ``grads: no_accumulation_buffer``: the buffer reduced into the accumulator after every
    micro-step and freed (the next backward writes a fresh part).
    ``grads: reduce_summed_every_microbatch``: after every micro-step the whole local buffer is replaced, on
    every device, by the sum of the buffers of the devices that share its coordinates on every axis but the
    data and context axes where the gradient is replicated (the all-reduce's group; no division), and the
    update reads the buffer (``reduction`` is then the sum).
    ``reduction``: "sum" (parts divided by the step's token count, summed) or "mean" (parts scaled by the
    device count, averaged). Keys: ("gi", group) where the update reads anything but the reference,
    ("replica", group) where two devices read different values."""
    from fractions import Fraction

    devices = [tuple(c) for c in product(*[range(sizes[a]) for a in plan.mesh.names])]
    n, m = len(devices), sizes.get("microbatches", 1)
    grads = [o.verb for o in plan.overrides if o.target == "grads" and o.group in (None, "all")]
    again, freed = "reduce_accumulated_every_microbatch" in grads, "no_accumulation_buffer" in grads
    if "reduce_summed_every_microbatch" in grads:
        return _summed_in_place(plan, sizes, devices, m, rng)
    out: set = set()
    for g in sim.groups_of(plan):
        s = {(d, k): Fraction(rng.randint(1, 99)) for d in devices for k in range(m)}
        tokens = sum(rng.randint(1, 5) for _ in range(n * m))
        ref = sum(s.values()) / tokens
        scale = Fraction(n) if reduction == "mean" else Fraction(1)

        def reduce(buf):  # every device receives the same reduced value
            total = sum(buf.values())
            return total / n if reduction == "mean" else total

        local = {d: Fraction(0) for d in devices}
        acc = Fraction(0)
        for k in range(m):
            for d in devices:
                local[d] += s[(d, k)] * scale / tokens
            if again or freed:
                acc += reduce(local)
            if freed:
                local = {d: Fraction(0) for d in devices}
        held = {d: (acc if again or freed else reduce(local)) for d in devices}
        if any(h != ref for h in held.values()):
            out.add(("gi", g))
        if len(set(held.values())) > 1:
            out.add(("replica", g))
    return out


def _summed_in_place(plan: ir.Plan, sizes: dict[str, int], devices: list, m: int, rng: random.Random) -> set:
    """``grads: reduce_summed_every_microbatch`` on every device: the buffer adds the device's micro-step part
    (per-token contributions over the step's token count) and is then overwritten by the sum over its group."""
    from fractions import Fraction

    roles = {a: r for b in plan.bindings for a, r in b.roles}
    modes = next(dict(p.modes) for p in plan.placements if p.state is ir.State.GRADS)
    summed = [i for i, a in enumerate(plan.mesh.names)
              if roles.get(a) in (ir.Role.DATA, ir.Role.CONTEXT) and modes.get(a) is ir.Mode.R]

    def key(d):  # the devices of one all-reduce group share every coordinate outside the summed axes
        return tuple(c for i, c in enumerate(d) if i not in summed)

    out: set = set()
    for g in sim.groups_of(plan):
        s = {(d, k): Fraction(rng.randint(1, 99)) for d in devices for k in range(m)}
        tokens = sum(rng.randint(1, 5) for _ in range(len(devices) * m))
        ref = {key(d): sum(v for (e, _), v in s.items() if key(e) == key(d)) / tokens for d in devices}
        buf = {d: Fraction(0) for d in devices}
        for k in range(m):
            for d in devices:
                buf[d] += s[(d, k)] / tokens
            total: dict = {}
            for d in devices:
                total[key(d)] = total.get(key(d), Fraction(0)) + buf[d]
            buf = {d: total[key(d)] for d in devices}
        if any(buf[d] != ref[key(d)] for d in devices):
            out.add(("gi", g))
        if len({buf[d] for d in devices if key(d) == key(devices[0])}) > 1:
            out.add(("replica", g))
    return out
