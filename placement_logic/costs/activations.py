"""Activation memory per device (Korthikanti et al. 2022), exact in the spec's symbols.

Input: a ``Shape`` and the plan's parallel layout (tensor size t, context size c, pipeline
size p, chunks v, scheduling unit U, schedule kind, sequence parallel, recomputation, flash
attention). Output: ``Activations`` with the per-layer per-microbatch bytes, the number of
layer-microbatches alive on the first pipeline stage, the embedding and output-layer terms,
the persistent total and the recomputation working set (transient).

Per layer per microbatch, 16-bit activations (bytes scale with ``bytes.activations / 2``):
  no parallelism          s·b·h·(34 + 5·a·s/h)
  tensor parallel         s·b·h·(10 + 24/t + 5·a·s/(h·t))
  tensor + sequence par.  s·b·h·(34/t + 5·a·s/(h·t))
  selective recompute     the 5·a·s/h term is dropped (flash attention drops it too)
  full recompute          2·s·b·h (÷t with sequence parallel): only the layer input is kept
Context parallelism divides s by c.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from .. import ir
from .sizes import Shape


@dataclass(frozen=True)
class Layout:
    t: sympy.Expr  # tensor-parallel size (1 without a tensor axis)
    c: sympy.Expr  # context-parallel size
    p: sympy.Expr  # pipeline size
    v: sympy.Expr  # model chunks per stage
    U: sympy.Expr  # ZeroPP scheduling unit
    schedule: ir.ScheduleKind | None
    sp: bool
    recompute: ir.Recompute
    flash: bool
    expert_axes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Activations:
    per_layer: sympy.Expr  # kept bytes per layer per microbatch
    per_layer_full: sympy.Expr  # without any recomputation (the recompute working set)
    layer_microbatches: sympy.Expr  # layer-microbatches alive on the first stage
    microbatches_in_flight: sympy.Expr
    embedding: sympy.Expr
    output: sympy.Expr
    total: sympy.Expr
    transient: sympy.Expr


def per_layer(sh: Shape, lay: Layout, recompute: ir.Recompute, flash: bool) -> sympy.Expr:
    s = sh.s / lay.c
    b, h, a, t = sh.b, sh.h, sh.a, lay.t
    scale = sh.bytes[ir.State.ACTIVATIONS] / 2
    core = 0 if (flash or recompute is ir.Recompute.SELECTIVE) else 5 * a * s / (h * t)
    if recompute is ir.Recompute.FULL:
        per = 2 * s * b * h / (t if lay.sp else 1)
    elif lay.sp:
        per = s * b * h * (sympy.Rational(34) / t + core)
    else:
        per = s * b * h * (10 + sympy.Rational(24) / t + core)
    return per * scale


def in_flight(sh: Shape, lay: Layout) -> tuple[sympy.Expr, sympy.Expr]:
    """(layer-microbatches, microbatches) alive on the first stage at the peak."""
    L, p, v, U, m = sh.L, lay.p, lay.v, lay.U, sh.m
    k = lay.schedule
    if k is None or p == 1:
        return L, sympy.Integer(1)
    if k is ir.ScheduleKind.GPIPE:
        return L / p * m, m
    if k is ir.ScheduleKind.ONE_F_ONE_B:
        return L, p
    if k is ir.ScheduleKind.INTERLEAVED:
        f = 1 + (p - 1) / (p * v)
        return L * f, p * f
    # ZeroPP: Megatron's interleaved warm-up with the group of p microbatches replaced by U
    chunks = (v - 1) * U + 2 * p - 1
    return L / (p * v) * chunks, chunks / v


def activations(sh: Shape, lay: Layout) -> Activations:
    zero = sympy.Integer(0)
    if not sh.has_shape:
        return Activations(zero, zero, zero, zero, zero, zero, zero, zero)
    per = per_layer(sh, lay, lay.recompute, lay.flash)
    full = per_layer(sh, lay, ir.Recompute.NONE, lay.flash)
    lm, mb = in_flight(sh, lay)
    s = sh.s / lay.c
    tsp = lay.t if lay.sp else 1
    embedding = mb * s * sh.b * sh.h / tsp  # embedding dropout mask, 1 byte per element
    output = zero
    if lay.p == 1:  # the single stage also holds the output layer: 4·s·b·h/t·(1 + V/h)
        output = 4 * s * sh.b * sh.h / lay.t * (1 + sh.V / sh.h) * sh.bytes[ir.State.ACTIVATIONS] / 2
    total = lm * per + embedding + output
    transient = full if lay.recompute is ir.Recompute.FULL else zero
    return Activations(per, full, lm, mb, embedding, output, total, transient)
