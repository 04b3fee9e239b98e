"""FLOPs per step and the step-time model: exact closed forms, like memory.

Input: a ``PlanCost`` (shape, layout, sized collectives) and the mesh's ``ir.Hardware``.
Output: ``StepTime``, every figure a sympy expression in the spec's symbols (seconds, FLOPs,
tokens), numbers once the sizes are bound. The model, with its assumptions (docs/time.md):

- **FLOPs** from the transformer shape, per token, forward: 2 FLOPs per weight of every
  matrix a token passes through (attention projections, the MLP, or the top-k routed experts,
  the shared experts and the router of a MoE layer, the output layer; the embedding is a
  lookup), and the attention core, 2·s·a·d for QKᵀ and 2·s·a·d_v for the weighted sum,
  halved with causal masking (``causal``, default true: kernels skip the masked blocks).
  Backward is twice forward. Recompute adds, per microbatch, the forward of the layers
  (full) or of the attention core (selective). Biases, norms, softmax and the loss are
  left out (O(s·h) per token against O(h²)).
- **Model FLOPs** (the numerator of MFU) are 3× forward over the step's tokens, without
  recompute. With ``causal = false``, an MHA, ungated, f = 4h shape and full recompute this
  is Narayanan et al. (2021)'s 96·B·s·l·h²·(1 + s/6h + V/16lh) exactly.
- **Compute time** of one microbatch on the busiest pipeline stage (the layers spread
  evenly, the last stage adding the output layer): its FLOPs per device (tokens split by the
  context ranks, matrices by the tensor ranks) over peak × MFU. A pipeline of p stages with v
  chunks and m microbatches takes (m + (p − 1)/v) microbatch times (the bubble is
  (p − 1)/(v·m) of the work); without one, m.
- **Communication time** of each collective: α–β over its group's slowest link, count ×
  ring steps × latency + ring bytes per device / bandwidth; ring steps 2(n − 1) for an
  all-reduce, n − 1 for reduce-scatter, all-gather and all-to-all, 1 point to point. Under the
  kernel model an all-reduce, reduce-scatter or all-gather over catalogue links is timed as NCCL
  runs it (costs/nccl.py): the fastest of ring and tree (all-reduce) with the LL, LL128 and
  Simple protocols by NCCL's own tuning model, the group's ranks inside a node and across nodes
  apart, and no faster than the link's published bus-bandwidth curve by message size; the other
  kinds pay NCCL's ring latency (per call plus per step) and the sustained bus bandwidth:
  count × (call + steps × step) + bytes / (bandwidth × efficiency).
- **Overlap** (``overlap = true``, the default): the data-parallel traffic of parameters and
  gradients in the forward, backward and gradient-sync phases (FSDP/ZeRO-3 prefetched
  gathers, gradient reduce-scatter or all-reduce with backward) hides behind compute, so
  the step takes max(compute, that traffic) + the rest; the rest (tensor and sequence
  parallel collectives, pipeline sends, all-to-all, context exchanges, the parameter refresh
  after the optimizer step, host transfers) is on the critical path. With
  ``overlap = false`` everything adds up. ``conventions { tensor_backward = overlapped }``
  (Megatron-LM's asynchronous backward, costs/tpbackward.py): a column-parallel product's
  backward collective is exposed only for max(0, one call − the product it runs during).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction

import sympy

from .. import hardware as hw
from .. import ir
from ..ir import Role, views
from ..ir import collectives as schedule
from ..ir.buffers import link_of
from ..ir.collectives import Kind, Phase
from ..ir.groups import padded_vocab
from . import kernels, nccl, tpbackward
from . import window as attention_window
from .comm import SizedCollective
from .extrema import extremum
from .symbolic import symbol, to_sympy

ZERO = sympy.Integer(0)
ONE = sympy.Integer(1)

# The largest error of each compute model against the published measured runs of
# docs/validation_time.md (6.9 % and 40.9 %), rounded up: the band within which ``search``
# calls two predicted step times a tie (tests/test_validation_time.py holds the kernel model to it).
MODEL_ERROR = {"kernels": Fraction(7, 100), "mfu": Fraction(45, 100)}


@dataclass(frozen=True)
class Flops:
    """FLOPs per token, forward, of the parts of a transformer."""

    layer: sympy.Expr  # the matrices of the layers, summed over all layers
    attention: sympy.Expr  # the attention core, summed over all layers (causal halving applied)
    head: sympy.Expr  # the output layer (and the MTP modules' own matrices)

    @property
    def forward(self) -> sympy.Expr:
        return self.layer + self.attention + self.head


def _v(x: ir.Value | None, default: sympy.Expr | None = None) -> sympy.Expr:
    return default if x is None else to_sympy(x)


def flops_per_token(t: ir.TransformerShape, s: sympy.Expr, causal: bool = True, window=None) -> Flops:
    """Forward FLOPs per token of a transformer shape (an independent count from its fields); with causal masking
    the attention core's share of the scores is costs.window.causal_share (the model's sliding window, if any)."""
    h, L, a, kv, f, E, k = (to_sympy(x) for x in (t.hidden, t.layers, t.heads, t.kv_heads, t.ffn, t.experts, t.top_k))
    V = to_sympy(padded_vocab(t))
    mats = 3 if t.gated_mlp else 2
    if t.mla:
        nope, rope, vd = _v(t.qk_nope_dim), _v(t.qk_rope_dim), _v(t.v_head_dim)
        kvr = _v(t.kv_lora_rank)
        qk = nope + rope
        if t.q_lora_rank is not None:
            r = to_sympy(t.q_lora_rank)
            q = h * r + r * a * qk  # the down- and the up-projection of the query
        else:
            q = h * a * qk
        attn_w = q + h * (kvr + rope) + kvr * a * (nope + vd) + a * vd * h
        d_qk, d_v = qk, vd
    else:
        dh = _v(t.head_dim, h / a)
        attn_w = 2 * h * a * dh + 2 * h * kv * dh
        d_qk = d_v = dh
    core = 2 * s * a * d_qk + 2 * s * a * d_v
    if causal:
        core = core * attention_window.causal_share(s, window)
    moe = E != 1
    if moe:
        fe = _v(t.expert_ffn, f)
        n_dense = _v(t.dense_layers, ZERO)
        shared = _v(t.shared_experts, ZERO)
        fs = _v(t.shared_expert_ffn, fe)
        moe_w = k * mats * h * fe + shared * mats * h * fs + h * E + (h if t.shared_expert_gate else ZERO)
        mlp_total = n_dense * mats * h * f + (L - n_dense) * moe_w
        last_mlp = moe_w
    else:
        mlp_total = L * mats * h * f
        last_mlp = mats * h * f
    layer = 2 * (L * attn_w + mlp_total)
    head = 2 * V * h
    mtp = _v(t.mtp_layers, ZERO)
    if mtp != 0:  # each module: a 2h -> h projection, one layer (of the last kind) and the shared output layer
        head = head + mtp * (2 * (2 * h * h + attn_w + last_mlp) + core + 2 * V * h)
    return Flops(sympy.expand(layer), sympy.expand(L * core), sympy.expand(head))


@dataclass(frozen=True)
class CollectiveTime:
    sized: SizedCollective
    seconds: sympy.Expr
    link: str
    overlapped: bool


@dataclass(frozen=True)
class StepTime:
    tokens: sympy.Expr  # tokens per step, all devices
    model_flops: sympy.Expr  # per step, all devices, without recompute (MFU's numerator)
    device_flops: sympy.Expr  # executed per device per step on the busiest stage (recompute included)
    compute: sympy.Expr  # seconds, the bubble included
    bubble: sympy.Expr  # seconds of it the pipeline idles
    overlapped: sympy.Expr  # seconds of communication that may hide behind compute
    exposed: sympy.Expr  # seconds of communication on the critical path
    step: sympy.Expr  # seconds
    optimizer: sympy.Expr  # seconds of the optimizer step (kernel model; 0 under the MFU convention)
    tokens_per_second: sympy.Expr
    mfu: sympy.Expr  # model FLOPs / (step × devices × peak)
    devices: sympy.Expr
    peak: sympy.Expr
    collectives: tuple[CollectiveTime, ...]
    assumptions: tuple[str, ...]

    def per_link(self) -> dict[str, sympy.Expr]:
        out: dict[str, sympy.Expr] = {}
        for c in self.collectives:
            out[c.link] = out.get(c.link, ZERO) + c.seconds
        return out


_STEPS = {
    Kind.ALL_REDUCE: lambda n: 2 * (n - 1),
    Kind.REDUCE_SCATTER: lambda n: n - 1,
    Kind.ALL_GATHER: lambda n: n - 1,
    Kind.ALL_TO_ALL: lambda n: n - 1,
    Kind.P2P: lambda n: ONE,
    Kind.HOST_TO_DEVICE: lambda n: ONE,
    Kind.DEVICE_TO_HOST: lambda n: ONE,
}
_HOST_LINKS = {"a100_40gb": "pcie4", "a100_80gb": "pcie4", "l40s": "pcie4"}


def _product(axes) -> sympy.Expr:
    return sympy.Mul(*(symbol(a) for a in axes)) if axes else ONE


def _links(plan: ir.Plan, axes: tuple[str, ...], block: str | None) -> list[str]:
    """The link classes a group's traffic crosses: its axes' (an axis with none taken as crossing
    nodes), or ``block``, the link of a block of the axes' ranks (``ir.blocks``)."""
    return [block] if block is not None else [plan.mesh.axis(a).link or "inter_node" for a in axes]


def _block_link(hwr: ir.Hardware, plan: ir.Plan, col) -> str | None:
    """The link of a reduction run within blocks of its axes' ranks where that differs from the axes'."""
    if col.block is None or col.link is None or col.link == link_of(plan, col.axes) or hwr.link(col.link) is None:
        return None
    return col.link


def _slowest(hwr: ir.Hardware, plan: ir.Plan, axes: tuple[str, ...],
             achieved: bool = False, block: str | None = None) -> tuple[str, sympy.Expr, sympy.Expr, sympy.Expr]:
    """(link name, bandwidth, latency per ring step, latency per call) of a group: its slowest
    axis link (an axis with no link class is taken as crossing nodes); ``achieved`` (the kernel
    model): the bandwidth times the link's bus-bandwidth efficiency, and NCCL's latencies."""
    best = None
    for name in _links(plan, axes, block):
        k = hwr.link(name)
        if k is None:
            continue
        bw, lat, call = to_sympy(k.bandwidth), to_sympy(k.latency), ZERO
        if achieved:
            bw = bw * to_sympy(k.efficiency)
            lat = lat if k.step_latency is None else to_sympy(k.step_latency)
            call = to_sympy(k.call_latency)
        if best is None or (bw.is_number and best[1].is_number and bw < best[1]):
            best = (name, bw, lat, call)
    if best is None:
        k = hw.link("ib_ndr")
        if achieved:
            return "inter_node", sympy.Rational(k.bandwidth * k.efficiency), sympy.Rational(k.step_latency), \
                sympy.Rational(k.call_latency)
        return "inter_node", sympy.Rational(k.bandwidth), sympy.Rational(k.latency), ZERO
    return best


def _nccl_group(hwr: ir.Hardware, plan: ir.Plan, c: SizedCollective, bw: sympy.Expr,
                name: str) -> nccl.Group | None:
    """The group of an all-reduce, reduce-scatter or all-gather as NCCL's tuning model sees it
    (ranks inside a node and across nodes, the node link's class, the slowest link's bus
    bandwidth and curve); None where a link is not an NCCL link of the catalogue (a latency of
    one's own) or the group is a part of its axes."""
    col = c.collective
    if col.kind not in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER) or col.size is not None \
            or col.block is not None:
        return None
    intra, net, classes = [], [], set()
    for a in col.axes:
        k = hwr.link(plan.mesh.axis(a).link or "inter_node")
        if k is None or k.nccl is None:
            return None
        (net if k.nccl == "net" else intra).append(a)
        classes.add(k.nccl)
    if intra:
        cls = "pci" if "pci" in classes else "nvlink"
    else:
        own = hwr.link("intra_node")
        cls = own.nccl if own is not None and own.nccl in ("nvlink", "pci") else "pci"
    slowest = hwr.link(name)
    return nccl.Group(c.group, _product(net), cls, bool(net), not intra, bw,
                      slowest.bus_curve if slowest is not None else ())


def _host(hwr: ir.Hardware) -> tuple[str, sympy.Expr, sympy.Expr, sympy.Expr]:
    k = hw.link(_HOST_LINKS.get(hwr.device, "pcie5"))
    return "host", sympy.Rational(k.bandwidth), sympy.Rational(k.latency), ZERO


def _overlappable(c: SizedCollective, plan: ir.Plan) -> bool:
    col = c.collective
    if col.state not in (ir.State.PARAMS, ir.State.GRADS) or not col.axes:
        return False
    if col.phase not in (Phase.FORWARD, Phase.BACKWARD, Phase.GRAD_SYNC):
        return False
    return all(views.view(plan).role(a) in (Role.DATA, Role.EXPERT) for a in col.axes)


def step_time(pc, hwr: ir.Hardware, causal: bool | None = None) -> StepTime | None:
    """The step-time model of a derived plan on its hardware; None without a transformer shape
    (FLOPs need one)."""
    plan, sh, lay = pc.plan, pc.shape, pc.layout
    t = plan.model.transformer
    if t is None:
        return None
    hwr = matmul_precision(pc, hwr)
    fl = flops_per_token(t, sh.s, causal if causal is not None else plan.model.attention_flops == "causal",
                         attention_window.of(plan))
    data = _product(views.view(plan).axes_with_role(Role.DATA) + views.view(plan).axes_with_role(Role.EXPERT))
    devices = _product(plan.mesh.names)
    mb_tokens = sh.b * sh.s
    tokens = mb_tokens * sh.m * data
    model_flops = 3 * fl.forward * tokens
    extra = ZERO
    if lay.recompute is ir.Recompute.FULL:
        extra = fl.layer + fl.attention
    elif lay.recompute is ir.Recompute.SELECTIVE:
        extra = fl.attention
    p, v = lay.p, lay.v
    # one microbatch on the last stage, per device
    stage = (3 * (fl.layer + fl.attention) + extra) / p + 3 * fl.head
    mb_flops = mb_tokens / lay.c * stage / lay.t
    peak = to_sympy(hwr.flops)
    mfu = to_sympy(hwr.mfu)
    mode = compute_mode(plan, hwr)
    if mode == "kernels":
        t_mb, t_opt = _kernel_times(pc, hwr, plan.model.attention_flops == "causal" and causal is not False)
    else:
        t_mb, t_opt = mb_flops / (peak * mfu), ZERO
    update = ZERO
    if plan.optimizers:  # matrix-wise updates (Newton–Schulz) run at the compute rate (costs.optimizer)
        from .optimizer import update_flops

        update = update_flops(plan, sh, lay.split) / (peak * mfu)
        t_opt = t_opt + update
    pipelined = schedule.pipeline_axis(plan) is not None
    slots = sh.m + (p - 1) / v if pipelined else sh.m
    compute = slots * t_mb
    bubble = compute - sh.m * t_mb
    times, during = [], None
    for c in pc.communication.collectives:
        col = c.collective
        if col.axes:
            name, bw, lat, call = _slowest(hwr, plan, col.axes, mode == "kernels", _block_link(hwr, plan, col))
        else:
            name, bw, lat, call = _host(hwr)
        group = _nccl_group(hwr, plan, c, bw, name) if mode == "kernels" else None
        if group is not None:  # NCCL's own choice of ring or tree and protocol (costs/nccl.py)
            secs = nccl.seconds(col.kind, group, c.buffer, c.count)
        else:
            steps = _STEPS[col.kind](c.group)
            # a group of one device runs no collective: no call to pay for (min(1, steps) is 0 there, else 1)
            secs = c.count * ((call * extremum(sympy.Min, ONE, steps) if call != ZERO else ZERO) + steps * lat) \
                + c.bytes_per_device / bw
        if col.behind and plan.model.tensor_backward == "overlapped":  # Megatron-LM's asynchronous backward
            if during is None:
                during = tpbackward.products(pc, hwr, mode)
            secs = tpbackward.exposed(secs, c.count, to_sympy(col.behind_count), during[col.behind])
        times.append(CollectiveTime(c, secs, name, hwr.overlap and _overlappable(c, plan)))
    over = sympy.Add(*(x.seconds for x in times if x.overlapped))
    exposed = sympy.Add(*(x.seconds for x in times if not x.overlapped))
    step = (sympy.Max(compute, over, evaluate=False) if hwr.overlap and times else compute + over) + exposed + t_opt
    assumptions = (
        f"{hwr.title}: {_peak_words(hwr)}, MFU {sympy.nsimplify(mfu)} of it" if mode == "mfu" else
        f"{hwr.title}: {_peak_words(hwr)}; each matrix product timed from its shape (roofline × the "
        "device's efficiency table), the memory-bound kernels and the optimizer step from bytes over HBM",
        attention_window.words(plan)
        if plan.model.attention_flops == "causal" and causal is not False
        else "attention FLOPs counted in full",
        "data-parallel parameter and gradient traffic overlaps with compute" if hwr.overlap
        else "no communication overlaps with compute",
    ) + (("the optimizer's matrix updates (Newton–Schulz, preconditioners) at the MFU rate: their FLOPs / "
          "(peak × MFU)",) if update != 0 else ())
    return StepTime(tokens, model_flops, mb_flops * sh.m, compute, bubble, over, exposed, step, t_opt,
                    tokens / step, model_flops / (step * devices * peak), devices, peak, tuple(times), assumptions)


def compute_mode(plan: ir.Plan, hwr: ir.Hardware) -> str:
    """``kernels`` or ``mfu``: the model's ``compute_time`` convention; unstated, ``mfu`` where the
    mesh states its mfu or the device has no HBM bandwidth or efficiency tables, else ``kernels``."""
    has_tables = hwr.hbm is not None and hwr.efficiency is not None
    stated = plan.model.compute_time
    if stated == "kernels" and has_tables:
        return "kernels"
    if stated is None and has_tables and not hwr.mfu_stated:
        return "kernels"
    return "mfu"


def _kernel_times(pc, hwr: ir.Hardware, causal: bool) -> tuple[sympy.Expr, sympy.Expr]:
    """(seconds of one microbatch on the busiest stage, seconds of the optimizer step) under the
    kernel model (costs/kernels.py)."""
    plan, sh, lay = pc.plan, pc.shape, pc.layout
    t = plan.model.transformer
    dev = kernels.Device(to_sympy(hwr.flops), to_sympy(hwr.hbm), hwr.efficiency, sh.bytes[ir.State.ACTIVATIONS])
    L = sh.L
    moe = to_sympy(t.experts) != 1
    ep = _product(lay.expert_axes)
    if moe:
        dense = _v(t.dense_layers, ZERO)
        one = kernels.layer_time(dev, t, sh, lay, causal, True, ep, attention_window.of(plan))
        plain = kernels.layer_time(dev, t, sh, lay, causal, False, ep, attention_window.of(plan)) if dense != 0 else one
        core = (dense * plain.core + (L - dense) * one.core) / L
        rest = (dense * plain.rest + (L - dense) * one.rest) / L
    else:
        one = kernels.layer_time(dev, t, sh, lay, causal, False, ep, attention_window.of(plan))
        core, rest = one.core, one.rest
    extra = ZERO
    if lay.recompute is ir.Recompute.FULL:
        extra = core + rest
    elif lay.recompute is ir.Recompute.SELECTIVE:
        extra = core
    layers = (3 * (core + rest) + extra) * L / lay.p
    head = 3 * kernels.head_time(dev, sh, lay)
    mtp = _v(t.mtp_layers, ZERO)
    if mtp != 0:
        head = head + mtp * (3 * (core + rest) + 3 * kernels.head_time(dev, sh, lay))
    states = sum((pc.memory.device.get(st, ZERO) for st in (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS)),
                 ZERO)
    from .eager import EAGER_COUNTS, optimizer_bytes

    moved = optimizer_bytes(sh, pc.memory.device) if sh.activation_count in EAGER_COUNTS else None
    return layers + head, kernels.optimizer_time(dev, states, moved)


def catalogue_hardware(plan: ir.Plan, name: str, base: ir.Hardware | None = None) -> ir.Hardware | None:
    """The hardware of a catalogue device for ``plan``'s mesh (``--device NAME``): the link
    classes the spec defines stay; every other one is the device's node link (``intra_node``
    its NVLink or PCIe, any other name its network link). None when ``name`` is not in the
    catalogue."""
    d = hw.device(name)
    if d is None:
        return None
    own = {k.name: k for k in base.links} if base is not None else {}
    links = []
    names = {a.link for a in plan.mesh.axes if a.link} | set(hw.NODE_LINKS)
    for ln in sorted(names):
        if ln in own and hw.link(own[ln].title.split(":")[0]) is None:
            links.append(own[ln])  # the user's own figures
            continue
        k = hw.link(ln) or hw.link(d.intra_link if ln == "intra_node" else d.inter_link)
        links.append(ir.LinkClass(ln, k.title if k.name == ln else f"{k.name}: {k.title}", ir.const(k.bandwidth),
                                  ir.const(k.latency), efficiency=ir.const(k.efficiency),
                                  call_latency=ir.const(k.call_latency),
                                  step_latency=None if k.step_latency is None else ir.const(k.step_latency),
                                  nccl=k.nccl, bus_curve=k.bus_curve))
    precision = base.precision if base is not None and base.precision in d.flops else "bf16"
    return ir.Hardware(d.name, d.title, ir.const(d.memory), ir.const(d.flops[precision]), precision,
                       base.mfu if base is not None else ir.Const(Fraction(1, 2)),
                       tuple(links), base.overlap if base is not None else True, hbm=ir.const(d.hbm_bandwidth),
                       efficiency=d.efficiency, mfu_stated=base.mfu_stated if base is not None else False,
                       precision_stated=base.precision_stated if base is not None else False)


def _peak_words(hwr: ir.Hardware) -> str:
    if hwr.precision == "fp32" and not hwr.precision_stated:
        return "fp32 peak (4-byte activations: PyTorch's default fp32 matrix products, TF32 off)"
    return f"{hwr.precision} peak"


def matmul_precision(pc, hwr: ir.Hardware) -> ir.Hardware:
    """The hardware at the precision the matrix products run in: the stated one, else the 16-bit
    peak, except for 4-byte activations on a catalogue device, whose products PyTorch runs in fp32
    by default (TF32 off: ``torch.backends.cuda.matmul.allow_tf32``), at the fp32 peak (measured
    on an H100: docs/validation.md, "One device at full size")."""
    if hwr.precision_stated or hwr.precision != "bf16":
        return hwr
    d = hw.device(hwr.device)
    width = pc.shape.bytes[ir.State.ACTIVATIONS]
    if d is None or "fp32" not in d.flops or not (width.is_number and width == 4):
        return hwr
    return dataclasses.replace(hwr, flops=ir.const(d.flops["fp32"]), precision="fp32")
