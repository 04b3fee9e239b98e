"""Communication per step: each scheduled collective sized in bytes, ring and ZeRO volume.

Input: the plan's ``schedule.Collective`` records, its ``Shape`` and ``Layout``. Output:
``SizedCollective`` records (buffer bytes, ring bytes sent per device, ZeRO-convention
volume, all per step) and totals per axis group with its link class.

Ring cost for a buffer of full size m on a group of n devices: all-reduce 2(n−1)/n·m;
reduce-scatter, all-gather, all-to-all (n−1)/n·m; point-to-point and host transfers m.
Volume (the ZeRO paper's convention, the n → ∞ limit): all-reduce 2m, every other kind m.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy

from .. import ir
from ..ir import views
from ..ir.buffers import DENSE_BUFFERS, EXPERT_BUFFERS, grads_group
from ..ir.buffers import PayloadTensor as PT
from ..ir.collectives import Collective, Kind
from ..ir.ulysses_split import rules_of as ulysses_rules
from .activations import Layout
from .sizes import Shape, per_group
from .symbolic import symbol, to_sympy
from .ulysses_share import heads_share

_RING = {
    Kind.ALL_REDUCE: lambda n: 2 * (n - 1) / n,
    Kind.REDUCE_SCATTER: lambda n: (n - 1) / n,
    Kind.ALL_GATHER: lambda n: (n - 1) / n,
    Kind.ALL_TO_ALL: lambda n: (n - 1) / n,
    Kind.P2P: lambda n: sympy.Integer(1),
    Kind.HOST_TO_DEVICE: lambda n: sympy.Integer(1),
    Kind.DEVICE_TO_HOST: lambda n: sympy.Integer(1),
}
_VOLUME = {Kind.ALL_REDUCE: 2}
HOST_GROUP = "host"


@dataclass(frozen=True)
class SizedCollective:
    """A collective with its group size, count, buffer, ring bytes per device and volume."""

    collective: Collective
    group: sympy.Expr  # devices in the group
    count: sympy.Expr  # per step
    buffer: sympy.Expr  # full buffer size m, bytes
    bytes_per_device: sympy.Expr  # ring bytes sent per device per step (× count)
    volume: sympy.Expr  # ZeRO convention per step (× count)

    @property
    def group_name(self) -> str:
        return "×".join(self.collective.axes) if self.collective.axes else HOST_GROUP


def _divide(expr: sympy.Expr, axes: tuple[str, ...]) -> sympy.Expr:
    for a in axes:
        expr = expr / symbol(a)
    return expr


def _members(sh: Shape, c: Collective, counts: dict[str, sympy.Expr]) -> sympy.Expr:
    """The parameters of the groups whose buffer the collective moves (``ir.views``)."""
    return sum((n for name, n in counts.items() if views.carries(c.payload, name)), sympy.Integer(0))


def buffer_bytes(c: Collective, sh: Shape, lay: Layout) -> sympy.Expr:
    tensor = c.payload.tensor
    ba = sh.bytes[ir.State.ACTIVATIONS]
    s = sh.s / lay.c
    tsp = lay.t if lay.sp else 1
    if tensor in (PT.PARAMS, PT.PARAMS_SHARD):
        return sh.bytes[ir.State.PARAMS] * _members(sh, c, per_group(sh, c.payload.divided_over, lay.split))
    if tensor in (PT.GRADS, PT.GRADS_SHARD):
        return sh.bytes[ir.State.GRADS] * _members(sh, c, per_group(sh, c.payload.divided_over, lay.split))
    if tensor in DENSE_BUFFERS + EXPERT_BUFFERS:
        # one buffer of the non-expert parameters or of the experts, divided over the axes that divide it
        st = ir.State.GRADS if tensor in (PT.DENSE_GRADS, PT.EXPERT_GRADS) else ir.State.PARAMS
        split = replace(lay.split, dense_data=True)
        return sh.bytes[st] * _members(sh, c, per_group(sh, c.payload.divided_over, split,
                                                        experts_only=tensor in EXPERT_BUFFERS))
    group = grads_group(tensor)
    if group is not None:  # one group's own gradient (a whole weight that sees heads, K/V copies)
        return sh.bytes[ir.State.GRADS] * per_group(sh, c.payload.divided_over, lay.split)[group]
    if tensor == PT.ACTIVATION:
        return s * sh.b * sh.h * ba
    if tensor == PT.BOUNDARY:
        return s * sh.b * sh.h * ba / tsp
    if tensor == PT.BOUNDARY_CHUNK:  # split over the tensor axes the payload names (no sequence parallelism)
        return _divide(s * sh.b * sh.h * ba, c.payload.divided_over)
    if tensor == PT.TOKENS:
        return s * sh.b * sh.h * sh.top_k * sh.capacity * ba / tsp
    if tensor == PT.EXPERT_TOKENS:  # the routed tokens of the whole expert tensor group
        n = sympy.Mul(*(symbol(a) for a in c.payload.divided_over))
        return s * sh.b * sh.h * sh.top_k * sh.capacity * ba / tsp * n
    if tensor == PT.TOKEN_SCALARS:
        return s * sh.b * 4  # one fp32 value per token (the cross entropy's reductions)
    if tensor == PT.GATHERED_TOKEN_SCALARS:  # the per-token loss values of the sequence gathered over these axes
        return s * sh.b * 4 * sympy.Mul(*(symbol(a) for a in c.payload.divided_over))
    if tensor == PT.ROUTER_STATS:
        return sh.experts * 4  # E fp32 values: the per-expert counts (or probabilities) summed by the router
    if tensor == PT.KV:
        return 2 * s * sh.b * sh.h * sh.kv / sh.a * ba
    if tensor == PT.ULYSSES:  # the rank's heads (h/tp) of q, k, v and the attention output
        return s * sh.b * sh.h * (2 + 2 * sh.kv / sh.a) * ba / lay.t
    rules = ulysses_rules(tensor)
    if rules is not None:  # a stated head split: the largest rank's query and kv heads from each of the g − 1 others,
        # each twice (q and the output; k and v), of a head's width h/a: the ring factor (g − 1)/g takes g·share
        g = sympy.Mul(*(symbol(a) for a in c.axes)) if c.axes else sympy.Integer(1)
        return s * sh.b * (sh.h / sh.a) * 2 * ba * g * heads_share(*rules, sh.a, sh.kv, lay.t, g)
    raise ValueError(f"unknown payload tensor {tensor!r}")


def size(c: Collective, sh: Shape, lay: Layout) -> SizedCollective:
    n = sympy.Mul(*(symbol(a) for a in c.axes)) if c.axes else sympy.Integer(1)
    if c.size is not None:  # a part of the axes (each K/V head's copy group)
        n = to_sympy(c.size)
    if c.block is not None:  # a reduction run within blocks of the axes' ranks (ir.blocks)
        n = to_sympy(c.block)
    count = to_sympy(c.count)
    m = buffer_bytes(c, sh, lay)
    ring = _RING[c.kind](n) * m * count
    vol = _VOLUME.get(c.kind, 1) * m * count
    return SizedCollective(c, n, count, m, ring, vol)


@dataclass(frozen=True)
class Communication:
    """A plan's collectives per step, sized."""

    collectives: tuple[SizedCollective, ...]

    def network(self) -> tuple[SizedCollective, ...]:
        return tuple(x for x in self.collectives if x.collective.axes)

    @property
    def total_bytes(self) -> sympy.Expr:
        """Ring bytes sent per device per step over the network (host transfers excluded)."""
        return sympy.Add(*(x.bytes_per_device for x in self.network()))

    @property
    def total_volume(self) -> sympy.Expr:
        return sympy.Add(*(x.volume for x in self.network()))

    def per_group(self) -> dict[str, tuple[str | None, sympy.Expr, sympy.Expr]]:
        """group name -> (link, ring bytes per device, volume), host transfers as 'host'."""
        out: dict[str, tuple[str | None, sympy.Expr, sympy.Expr]] = {}
        for x in self.collectives:
            link, b, v = out.get(x.group_name, (x.collective.link, sympy.Integer(0), sympy.Integer(0)))
            out[x.group_name] = (link, b + x.bytes_per_device, v + x.volume)
        return out

    def on_axis(self, axis: str) -> tuple[sympy.Expr, sympy.Expr]:
        """Ring bytes and volume of the collectives whose group includes ``axis``."""
        sel = [x for x in self.collectives if axis in x.collective.axes or (axis == HOST_GROUP and not x.collective.axes)]
        return sympy.Add(*(x.bytes_per_device for x in sel)), sympy.Add(*(x.volume for x in sel))

    def per_link(self) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
        out: dict[str, tuple[sympy.Expr, sympy.Expr]] = {}
        for x in self.collectives:
            key = x.collective.link or "unspecified"
            b, v = out.get(key, (sympy.Integer(0), sympy.Integer(0)))
            out[key] = (b + x.bytes_per_device, v + x.volume)
        return out
