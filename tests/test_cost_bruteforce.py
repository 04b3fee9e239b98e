"""Memory and communication against a brute-force count on small meshes.

Every device of the mesh is enumerated; each holds the tensor pieces its placement gives it
(a contiguous split per sharded axis); collectives are simulated as rings, chunk by chunk,
and the bytes each device sends are added up. Nothing here uses the engine's formulas.
"""

from fractions import Fraction
from itertools import product

import pytest

from placement_logic import ir
from placement_logic.costreport import build
from placement_logic.frontend.loader import load_string

PSI = 96  # divisible by every mesh below


def spec_text(mesh: dict[str, int], plan_body: str, imports: str) -> str:
    axes = "\n".join(f"  {a} = {n}" for a, n in mesh.items())
    return f"""{imports}
model {{
  params = {PSI}
  bytes {{ params = 2  grads = 2  optimizer = 12 }}
}}
mesh {{
{axes}
}}
plan p {{
{plan_body}
}}
"""


def devices(mesh):
    names = list(mesh)
    return [dict(zip(names, c)) for c in product(*(range(mesh[a]) for a in names))]


def pieces(elements, coords, modes, mesh):
    """Elements a device holds: split contiguously over every sharded axis, in mesh order."""
    held = list(elements)
    for axis in mesh:
        if modes[axis] in (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O):
            n = mesh[axis]
            k = len(held) // n
            held = held[coords[axis] * k:(coords[axis] + 1) * k]
    return held


def groups(mesh, axes):
    """Device groups that differ only in ``axes``."""
    out = {}
    for d in devices(mesh):
        key = tuple(d[a] for a in mesh if a not in axes)
        out.setdefault(key, []).append(d)
    return list(out.values())


def ring_steps(buf_len, n):
    """Elements one device sends in the n-1 steps of a ring reduce-scatter or all-gather."""
    chunks = [buf_len // n + (1 if i < buf_len % n else 0) for i in range(n)]
    sent = 0
    for step in range(n - 1):
        sent += chunks[(0 - step) % n]  # device 0 sends chunk (rank - step) mod n
    return sent


class Ledger:
    def __init__(self, mesh):
        self.mesh = mesh
        self.sent = {tuple(d.values()): Fraction(0) for d in devices(mesh)}

    def collective(self, kind, axes, buffer_of, width):
        for grp in groups(self.mesh, axes):
            n = len(grp)
            for d in grp:
                m = len(buffer_of(d))
                steps = ring_steps(m, n) * (2 if kind == "all_reduce" else 1)
                self.sent[tuple(d.values())] += steps * width

    def one(self):
        vals = set(self.sent.values())
        assert len(vals) == 1, vals
        return vals.pop()


def placement_modes(plan, state):
    return dict(plan.placement(state).modes)


def check_memory(spec, mesh, widths):
    plan = spec.plans[0]
    report = build(spec).plans[0]
    for state, width in widths.items():
        modes = placement_modes(plan, state)
        counts = {len(pieces(range(PSI), d, modes, mesh)) * width for d in devices(mesh)}
        assert len(counts) == 1
        assert report.device[state.value].exact == counts.pop(), state


ZERO = [("ddp", 1), ("zero1", 1), ("zero2", 2), ("zero3", 3)]


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3"])
def test_zero_stages_single_axis(strategy, n):
    mesh = {"dp": n}
    spec = load_string(spec_text(mesh, f"  dp: {strategy}", f"from std.data import {strategy}"), "<bf>")
    plan = spec.plans[0]
    check_memory(spec, mesh, {ir.State.PARAMS: 2, ir.State.GRADS: 2, ir.State.OPTIMIZER: 12})
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    if strategy == "ddp":
        led.collective("all_reduce", ["dp"], full, 2)
    elif strategy in ("zero1", "zero2"):
        led.collective("reduce_scatter", ["dp"], full, 2)  # gradients to their optimizer shard
        led.collective("all_gather", ["dp"], full, 2)  # updated parameters
    else:
        led.collective("all_gather", ["dp"], full, 2)  # forward
        led.collective("all_gather", ["dp"], full, 2)  # backward
        led.collective("reduce_scatter", ["dp"], full, 2)
    assert build(spec).plans[0].comm_total.exact == led.one()
    assert plan.name == "p"


def test_3d_composition_grad_sync_on_data_axis():
    mesh = {"dp": 2, "tp": 2, "pp": 2}
    body = "  dp: zero1\n  tp: megatron_tp\n  pp: one_f_one_b"
    imports = "from std.data import zero1\nfrom std.tensor import megatron_tp\nfrom std.pipeline import one_f_one_b"
    spec = load_string(spec_text(mesh, body, imports), "<bf3d>")
    check_memory(spec, mesh, {ir.State.PARAMS: 2, ir.State.GRADS: 2, ir.State.OPTIMIZER: 12})
    plan = spec.plans[0]
    gmodes = placement_modes(plan, ir.State.GRADS)
    led = Ledger(mesh)
    local = lambda d: pieces(range(PSI), d, gmodes, mesh)
    led.collective("reduce_scatter", ["dp"], local, 2)
    led.collective("all_gather", ["dp"], local, 2)
    assert build(spec).plans[0].per_axis["dp"].bytes_per_device.exact == led.one()


def test_hybrid_shard_two_axes():
    mesh = {"node": 2, "gpu": 4}
    spec = load_string(spec_text(mesh, "  [node, gpu]: hybrid_shard", "from std.data import hybrid_shard"), "<bfh>")
    check_memory(spec, mesh, {ir.State.PARAMS: 2, ir.State.GRADS: 2, ir.State.OPTIMIZER: 12})
    gmodes = placement_modes(spec.plans[0], ir.State.GRADS)
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    led.collective("all_gather", ["gpu"], full, 2)
    led.collective("all_gather", ["gpu"], full, 2)
    led.collective("reduce_scatter", ["gpu"], full, 2)
    # then the shard each gpu owns is all-reduced across nodes
    led.collective("all_reduce", ["node"], lambda d: pieces(range(PSI), d, gmodes, mesh), 2)
    assert build(spec).plans[0].comm_total.exact == led.one()


def test_zero3_over_two_data_axes_equals_one_big_ring():
    """Hierarchical gathers over (a, b) cost the same as one ring over a×b devices."""
    mesh = {"a": 2, "b": 3}
    strategy = "strategy z3 over (a, b) {\n  role = {a: data, b: data}\n  params: S*\n  optimizer: S\n  grads: S\n  activations: R\n}"
    spec = load_string(spec_text(mesh, "  [a, b]: z3", strategy), "<bf2>")
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    for kind in ("all_gather", "all_gather", "reduce_scatter"):
        led.collective(kind, ["a", "b"], full, 2)
    assert build(spec).plans[0].comm_total.exact == led.one()


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2"])
def test_reduce_every_microbatch(strategy, m):
    """`override grads: reduce_every_microbatch`: the whole buffer is reduced after each of the m backward passes
    (DDP without no_sync); a gradient sharded on the axis is reduce-scattered after every microbatch anyway."""
    mesh = {"dp": 4}
    body = f"  dp: {strategy}" + ("\n  override grads: reduce_every_microbatch" if m > 1 and strategy != "zero2" else "")
    text = spec_text(mesh, body, f"from std.data import {strategy}").replace(
        f"params = {PSI}", f"params = {PSI}\n  microbatches = {m}")
    spec = load_string(text, "<bfm>")
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    for _ in range(m):
        led.collective("all_reduce" if strategy == "ddp" else "reduce_scatter", ["dp"], full, 2)
    if strategy != "ddp":
        led.collective("all_gather", ["dp"], full, 2)  # the updated parameters, once per step
    assert build(spec).plans[0].comm_total.exact == led.one()


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2"])
def test_reduce_accumulated_every_microbatch(strategy, m):
    """`override grads: reduce_accumulated_every_microbatch` (ZeRO before hpcaitech/ColossalAI#247's fix): the
    accumulated buffer reduced after each of the m backward passes, so m reductions of the whole buffer per
    step, whatever the strategy (a sharded gradient is reduce-scattered every microbatch anyway)."""
    mesh = {"dp": 4}
    body = f"  dp: {strategy}\n  override grads: reduce_accumulated_every_microbatch"
    text = spec_text(mesh, body, f"from std.data import {strategy}").replace(
        f"params = {PSI}", f"params = {PSI}\n  microbatches = {m}")
    spec = load_string(text, "<bfa>")
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    for _ in range(m):
        led.collective("all_reduce" if strategy == "ddp" else "reduce_scatter", ["dp"], full, 2)
    if strategy != "ddp":
        led.collective("all_gather", ["dp"], full, 2)  # the updated parameters, once per step
    assert build(spec).plans[0].comm_total.exact == led.one()


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_reduce_summed_every_microbatch(strategy, m):
    """`override grads: reduce_summed_every_microbatch` (a manual dist.all_reduce(p.grad) inside the accumulation
    loop): the accumulating buffer reduced after each of the m backward passes, m reductions of the whole buffer
    per step, the ledger's brute-force count of the same collectives as the once-per-step schedule times m."""
    mesh = {"dp": 4}
    body = f"  dp: {strategy}\n  override grads: reduce_summed_every_microbatch"
    text = spec_text(mesh, body, f"from std.data import {strategy}").replace(
        f"params = {PSI}", f"params = {PSI}\n  microbatches = {m}")
    spec = load_string(text, "<bfs>")
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    for _ in range(m):
        led.collective("all_reduce" if strategy == "ddp" else "reduce_scatter", ["dp"], full, 2)
    if strategy != "ddp":
        led.collective("all_gather", ["dp"], full, 2)  # the updated parameters, once per step
    assert build(spec).plans[0].comm_total.exact == led.one()


def _with_microbatches(text: str, m: int, group: str = "") -> str:
    return text.replace(f"params = {PSI}", f"params = {PSI}\n  microbatches = {m}" + group)


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_step_every_microbatch_reduces_before_every_update(strategy, m):
    """`override optimizer: step_every_microbatch` (optimizer.step() after every backward, DDP without no_sync):
    every replica takes m updates per step, each from that micro-step's averaged gradient, so the gradient is
    reduced m times and (ZeRO-1) the updated parameters written back m times."""
    mesh = {"dp": 4}
    body = f"  dp: {strategy}\n  override optimizer: step_every_microbatch"
    spec = load_string(_with_microbatches(spec_text(mesh, body, f"from std.data import {strategy}"), m), "<bfu>")
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    for _ in range(m):  # one reduction and (sharded optimizer) one write-back per update
        led.collective("all_reduce" if strategy == "ddp" else "reduce_scatter", ["dp"], full, 2)
        if strategy != "ddp":
            led.collective("all_gather", ["dp"], full, 2)
    assert build(spec).plans[0].comm_total.exact == led.one()


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("own", [False, True])
def test_step_every_microbatch_of_one_group_reduces_its_buffer_m_times(n, m, own):
    """`override optimizer[vision]: step_every_microbatch`: the buffer that holds the group's 24 elements is
    reduced before each of its m updates. Placed like the rest (DDP) the group shares the one buffer, all-reduced
    whole m times; with its own placement beside ZeRO-1 ({dp: R}: its optimizer replicated, nothing to write
    back) its buffer is its own, all-reduced m times, the other 72 (dense) reduce-scattered and gathered once."""
    mesh = {"dp": n}
    strategy = "zero1" if own else "ddp"
    body = f"  dp: {strategy}\n  override optimizer[vision]: step_every_microbatch"
    group = "\n  group vision { count = 24" + ("  placement = {dp: R}" if own else "") + " }"
    spec = load_string(_with_microbatches(spec_text(mesh, body, f"from std.data import {strategy}"), m, group), "<bfg>")
    led = Ledger(mesh)
    vision, dense = (lambda d: range(24)), (lambda d: range(24, PSI))
    for _ in range(m):
        led.collective("all_reduce", ["dp"], vision if own else (lambda d: range(PSI)), 2)
    if own:
        led.collective("reduce_scatter", ["dp"], dense, 2)
        led.collective("all_gather", ["dp"], dense, 2)
    assert build(spec).plans[0].comm_total.exact == led.one()


@pytest.mark.parametrize("m", [2, 3])
@pytest.mark.parametrize("n", [2, 4])
def test_step_every_microbatch_of_one_group_writes_its_shared_buffer_back_m_times(n, m):
    """`override optimizer[vision]: step_every_microbatch` beside ZeRO-1, the group placed like the rest: the one
    buffer that holds its 24 elements is reduce-scattered before, and its updated parameters all-gathered after,
    each of the group's m updates (a buffer moves whole, as the gradient reduction of
    test_step_every_microbatch_of_one_group_reduces_its_buffer_m_times)."""
    mesh = {"dp": n}
    body = "  dp: zero1\n  override optimizer[vision]: step_every_microbatch"
    group = "\n  group vision { count = 24 }"
    spec = load_string(_with_microbatches(spec_text(mesh, body, "from std.data import zero1"), m, group), "<bfw>")
    led = Ledger(mesh)
    full = lambda d: range(PSI)
    for _ in range(m):
        led.collective("reduce_scatter", ["dp"], full, 2)
        led.collective("all_gather", ["dp"], full, 2)
    assert build(spec).plans[0].comm_total.exact == led.one()


@pytest.mark.parametrize("mesh, body, imports", [
    ({"dp": 2}, "  dp: zero2", "from std.data import zero2"),
    ({"dp": 3}, "  dp: zero2", "from std.data import zero2"),
    ({"dp": 4}, "  dp: zero2", "from std.data import zero2"),
    ({"dp": 4, "tp": 2}, "  dp: zero2\n  tp: megatron_tp", "from std.data import zero2\nfrom std.tensor import megatron_tp"),
    ({"dp": 4}, "  dp: zero1", "from std.data import zero1"),
    ({"dp": 4}, "  dp: ddp", "from std.data import ddp")])
def test_reduce_accumulated_keeps_the_whole_buffer(mesh, body, imports):
    """`override grads: reduce_accumulated_every_microbatch`: the local buffer is never cleared within the step, so
    ZeRO-2 holds the whole local gradient (every element its non-data axes give it) beside the shard its
    reductions are added into; where the gradient is not sharded over the data axis (ZeRO-1, DDP) the buffer is the
    one the plan already holds."""
    text = _with_microbatches(spec_text(mesh, body + "\n  override grads: reduce_accumulated_every_microbatch",
                                        imports), 2)
    spec = load_string(text, "<bfk>")
    modes = placement_modes(spec.plans[0], ir.State.GRADS)
    whole_modes = {a: (ir.Mode.R if a == "dp" else md) for a, md in modes.items()}
    held = set()
    for d in devices(mesh):
        shard = pieces(range(PSI), d, modes, mesh)
        whole = pieces(range(PSI), d, whole_modes, mesh)
        held.add(2 * (len(whole) + (len(shard) if len(shard) != len(whole) else 0)))
    assert len(held) == 1
    assert build(spec).plans[0].device["grads"].exact == held.pop()
