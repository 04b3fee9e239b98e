"""Concrete replay of the plan-wide state-consistency conditions and structural rules.

Input: a replay ``Context`` and a solver witness. Output: a re-checked
``Counterexample`` or None. Covers dropout seeds, the parameter re-gather after a sharded
optimizer step, gathers over replicated axes, offload fetches and axis bindings, each
simulated device by device in exact arithmetic (the global grad norm and the loss-scale
overflow decision: ``replay_norm``).
"""

from __future__ import annotations

from fractions import Fraction

from .replay import Context, _frac, coords_text
from .report import Counterexample


def replay_seed(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    sizes, axis = w["sizes"], w["axis"]
    vary = [a for a in step.axes if a in step.seed_vary]
    base = 1234

    def seed(dev: dict[str, int]) -> int:
        s, stride = base, 1
        for a in reversed(vary):
            s += dev[a] * stride
            stride *= sizes[a]
        return s

    d0 = {a: 0 for a in step.axes}
    d1 = dict(d0, **{axis: 1})
    s0, s1 = seed(d0), seed(d1)
    replicated = not step.sequence_parallel
    if replicated and s0 == s1 or not replicated and s0 != s1:
        return None
    if replicated:
        eq = (f"residual-region dropout seed on {coords_text(step.axes, d0.values())} = {s0} but on "
              f"{coords_text(step.axes, d1.values())} = {s1}: the replicated hidden states get different masks and diverge")
        diag = (f"dropout seeds vary over {axis}, where the residual region (dropout after the row-parallel "
                "all-reduce) is replicated; it must use the same seed on every rank of the axis",)
    else:
        eq = (f"sequence-parallel dropout seed on both {coords_text(step.axes, d0.values())} and "
              f"{coords_text(step.axes, d1.values())} = {s0}: two different sequence slices get the same mask")
        diag = (f"under sequence parallel the residual region is split over {axis}; each slice needs its own seed",)
    return Counterexample(ctx.sizes_tuple(sizes),
                          (("rank A", coords_text(step.axes, d0.values())), ("rank B", coords_text(step.axes, d1.values()))),
                          (("seed rule", f"seed = {base} + rank offset over ({', '.join(vary) or 'no axis'})"),),
                          eq, diag, ctx.command(sizes))


def replay_regather(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    sizes, axis = w["sizes"], w["axis"]
    n = sizes[axis]
    theta = [Fraction(1)] * n
    delta = Fraction(-1, 10)
    copies = []
    for rank in range(n):
        mine = list(theta)
        mine[rank] += delta  # the optimizer updates only the shard this rank owns
        copies.append(mine)
    if axis in step.regather_axes:
        owned = [copies[r][r] for r in range(n)]
        copies = [list(owned) for _ in range(n)]
    if copies[0] == copies[1]:
        return None
    eq = (f"after the step, params shard 1 on {axis}=0 is {_frac(copies[0][1])} but on {axis}=1 (its owner) is "
          f"{_frac(copies[1][1])}")
    return Counterexample(ctx.sizes_tuple(sizes), (("stale replica", f"({axis}=0)"), ("owner", f"({axis}=1)")),
                          (("params before", "1 per element"), ("update of shard 1", _frac(delta))),
                          eq, (f"params are replicated over {axis} but the optimizer state is sharded there; the "
                               f"updated shards are never all-gathered over {axis}",), ctx.command(sizes))


def replay_gather(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    sizes, axis = w["sizes"], w["axis"]
    modes = dict(step.param_modes)
    if modes[axis] in ("S", "S*", "O"):
        return None
    n = sizes[axis]
    eq = f"all-gather over {axis} of a params buffer replicated there yields {n} copies: {n}·|Θ| elements, expected |Θ|"
    return Counterexample(ctx.sizes_tuple(sizes), (("gathering device", f"({axis}=0)"),),
                          (("params mode on " + axis, modes[axis]), ("gathered size", f"{n}·|Θ|")),
                          eq, (f"params are {modes[axis]} over {axis}, so there is nothing to gather there",),
                          ctx.command(sizes))


def replay_fetch(ctx: Context, w: dict) -> Counterexample | None:
    step = ctx.step
    if not step.offloaded or step.fetch:
        return None
    sizes = w["sizes"]
    eq = "forward of the first layer on device 0 reads params from device memory, where none are resident"
    return Counterexample(ctx.sizes_tuple(sizes), (("device", "0"),),
                          (("params residency", "off-device"), ("fetch path", "none")),
                          eq, ("params are offloaded and never fetched or gathered back to the device before use",),
                          ctx.command(sizes))


def replay_axis_roles(ctx: Context, w: dict) -> Counterexample | None:
    bound = dict(ctx.step.axis_bindings)[w["axis"]]
    if len(bound) <= 1:
        return None
    sizes = w["sizes"]
    eq = f"axis {w['axis']} is bound to {len(bound)} strategies: {', '.join(bound)}"
    return Counterexample(ctx.sizes_tuple(sizes), (), (("strategies", ", ".join(bound)),), eq,
                          ("each strategy issues its own collectives over the same devices",), ctx.command(sizes))


def replay_tie(ctx: Context, w: dict) -> Counterexample | None:
    sizes = w["sizes"]
    g = ctx.step.group("embedding")
    tie = next(d for d in g.dims if d.tie)
    if sizes[tie.axis] < 2:
        return None
    a, b = Fraction(1), Fraction(2)
    held = a if tie.k == 0 else (a + b) * 2 ** (tie.k - 1)
    if held == a + b:
        return None
    eq = (f"tied embedding grad on the first {tie.axis} stage = {_frac(held)}; the parameter's gradient is "
          f"input-embedding part {a} + output-projection part {b} = {_frac(a + b)}")
    return Counterexample(ctx.sizes_tuple(sizes), (("first stage", f"({tie.axis}=0)"),
                                                   ("last stage", f"({tie.axis}={sizes[tie.axis] - 1})")),
                          (("input embedding grad", "1"), ("output projection grad", "2")), eq,
                          (f"the tied pair is all-reduced {tie.k} times over the first and last {tie.axis} stage; "
                           "it must be exactly once",), ctx.command(sizes))


def replay_usable(ctx: Context, w: dict) -> Counterexample | None:
    """Params sharded (``S``) or gathered other than once over a data axis: the forward runs with
    the wrong weights. A two-element weight row, input (1, 1), one output: y = w·x."""
    sizes, axis, times = w["sizes"], w["axis"], w.get("times", 0)
    n = sizes[axis]
    if n < 2 or times == 1:
        return None
    weights = [Fraction(i + 1) for i in range(n)]  # element i is held by rank i
    full = sum(weights, Fraction(0))
    held = [weights[0]] if times == 0 else weights * times  # rank 0's buffer before the forward
    used = sum(held, Fraction(0))
    if used == full:
        return None
    what = ("only its own shard" if times == 0 else f"every shard {times} times")
    eq = (f"forward output on ({axis}=0) with input 1 per element = {_frac(used)}, single device = {_frac(full)}")
    if times == 0:
        diag = (f"params are sharded over {axis} and never all-gathered over it: each {axis} rank runs the "
                f"forward with 1/{n} of the weights",)
    else:
        diag = (f"params are all-gathered over {axis} {times} times before use: the reconstructed unit holds "
                f"{times} copies of every shard",)
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", f"({axis}=0)"),),
                          (("params", ", ".join(f"element {i} = {_frac(x)} on {axis}={i}" for i, x in enumerate(weights))),
                           ("forward uses", what)), eq, diag, ctx.command(sizes))


def replay_optimizer(ctx: Context, w: dict) -> Counterexample | None:
    """Gradients sharded over an axis on which the optimizer state is replicated: every replica
    steps the whole parameter with a gradient buffer it holds only a shard of."""
    sizes, axis = w["sizes"], w["axis"]
    n = sizes[axis]
    if n < 2:
        return None
    lr = Fraction(1, 10)
    theta = [Fraction(1)] * n
    grad = [Fraction(i + 1) for i in range(n)]  # the fully reduced gradient, element by element
    expected = [t - lr * g for t, g in zip(theta, grad)]
    held = [grad[0]] + [Fraction(0)] * (n - 1)  # rank 0 holds the reduced shard 0 only
    got = [t - lr * g for t, g in zip(theta, held)]
    bad = next((i for i in range(n) if got[i] != expected[i]), None)
    if bad is None:
        return None
    eq = (f"after the step, params element {bad} on ({axis}=0) = {_frac(got[bad])}, single device = "
          f"{_frac(expected[bad])}")
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", f"({axis}=0)"),),
                          (("reduced gradient", ", ".join(_frac(g) for g in grad)),
                           (f"held on ({axis}=0)", f"shard 0 only ({_frac(grad[0])})"), ("learning rate", _frac(lr))),
                          eq, (f"gradients are sharded over {axis} but the optimizer state is replicated there: each "
                               f"replica steps every element with only its own shard of the gradient",),
                          ctx.command(sizes))
