"""Impossible shapes: sizes a plan's strategies cannot split evenly (PL130).

Input: a finished ``ir.Plan`` and the value table (let bindings, mesh sizes). Output:
nothing, or a located PL130 for each size a strategy would have to split into fractions:
attention heads or kv heads over the tensor ranks, the MLP width or the vocabulary over
them, layers over pipeline stages × virtual chunks, experts over the expert ranks, the
sequence over the context ranks (and the tensor ranks under sequence parallelism). Only
sizes known as numbers are judged; a symbolic size stays a formula.
"""

from __future__ import annotations

from fractions import Fraction
from functools import partial
from typing import Callable

from .. import ir
from ..diagnostics import Code, Span
from ..ir.overrides import OverrideTarget, OverrideVerb
from ..ir.walker import fold
from .values import Values


def number(value: ir.Value | None, vals: Values) -> Fraction | None:
    """The value as an exact number when every symbol in it is bound to one, else None."""
    return fold(value, vals.values)


def _size(plan: ir.Plan, axes: tuple[str, ...], vals: Values) -> int | None:
    total = 1
    for a in axes:
        n = number(plan.mesh.axis(a).size, vals)
        if n is None or n.denominator != 1:
            return None
        total *= int(n)
    return total


def _padded(vocab: Fraction | None, t: int) -> str:
    if vocab is None:
        return "?"
    unit = 128 * t
    return str(-(-int(vocab) // unit) * unit)


def _show(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else str(x)


def check_sizes(mesh: ir.Mesh, vals: Values) -> None:
    """Axis sizes given through a `let` are held to what a literal size is: a positive integer."""
    for axis in mesh.axes:
        if isinstance(axis.size, ir.Const):
            continue  # judged where it was written (PL107)
        n = number(axis.size, vals)
        if n is not None and (n.denominator != 1 or n < 1):
            shown = str(n.numerator) if n.denominator == 1 else str(n)
            vals.cx.error(Code.BAD_AXIS_SIZE, f"the size of axis '{axis.name}' must be a positive integer, not {shown} "
                          f"(the value of {ir.show(axis.size)})", axis.span)


def _where(plan: ir.Plan, axes: tuple[str, ...]) -> Span:
    """The binding of the first of these axes (else the plan)."""
    for b in plan.bindings:
        if set(axes) & set(b.axes):
            return b.span
    return plan.span


def _need(plan: ir.Plan, vals: Values, error: Callable[..., None], value: ir.Value | None, what: str,
          axes: tuple[str, ...], n: int | None, why: str, copies_ok: bool = False, over: str | None = None,
          hint: str | None = None) -> None:
    """PL130 when the size ``value`` does not split evenly over ``n`` ranks (``copies_ok``: or divides them)."""
    v = number(value, vals)
    if v is None or n is None or n <= 1:
        return
    if v.denominator == 1 and int(v) % n == 0:
        return
    if copies_ok and v.denominator == 1 and v >= 1 and n % int(v) == 0:
        return  # fewer kv heads than ranks: each head copied on n/kv ranks
    notes = [f"{what}: given at line {value.span.line}" if value.span.line else
             f"{what}: derived from the transformer shape"]
    if hint:
        notes.append(hint)
    error(Code.IMPOSSIBLE_SHAPE, f"{what} ({_show(v)}) cannot be split evenly over {over or '×'.join(axes)} ({n}): {why}",
          _where(plan, axes), tuple(notes))


def check_shapes(plan: ir.Plan, vals: Values, error: Callable[..., None]) -> None:
    t = plan.model.transformer
    if t is None:
        return
    par = plan.placement(ir.State.PARAMS)
    need = partial(_need, plan, vals, error)
    tensor = tuple(a for a in plan.axes_with_role(ir.Role.TENSOR, ir.Role.SEQUENCE)
                   if par.mode(a) in (ir.Mode.S, ir.Mode.O))
    if tensor:
        _tensor_shapes(plan, vals, t, tensor, need)
    _ulysses_heads(plan, vals, tensor, error)
    pipe = plan.axes_with_role(ir.Role.PIPELINE)
    if pipe:
        n = _size(plan, pipe, vals)
        v = number(plan.schedule.chunks, vals) if plan.schedule is not None else Fraction(1)
        if n is not None and v is not None and v.denominator == 1:
            over = f"{'×'.join(pipe)} × {int(v)} chunks" if v != 1 else None
            need(t.layers, "the layer count", pipe, n * int(v),
                 "every stage holds whole layers" if v == 1 else "every virtual chunk holds whole layers", over=over)
    folded = next((d for d in plan.model.groups if d.name == "experts" and d.roles), None)
    own = dict(folded.roles) if folded is not None else {}
    for d in plan.model.groups:
        for a, r in d.roles:
            if plan.role(a) is ir.Role.PIPELINE or r is ir.Role.PIPELINE:
                error(Code.IMPOSSIBLE_FOLD, f"group {d.name} gives the pipeline axis {a} the role {r.value}: every group's "
                      "layers are split over the same pipeline stages", d.span,
                      ("parallel foldeding regroups the data, context, tensor and expert devices of one stage",))
    _expert_shapes(plan, vals, t, folded, own, need, error)
    context = plan.axes_with_role(ir.Role.CONTEXT)
    seq_axes = context + (tensor if plan.sequence_parallel else ())
    if seq_axes:
        need(plan.model.seq, "the sequence length", seq_axes, _size(plan, seq_axes, vals),
             "context parallelism (and sequence parallelism) gives each rank an equal slice of the sequence")


def _tensor_shapes(plan: ir.Plan, vals: Values, t: ir.TransformerShape, tensor: tuple[str, ...], need) -> None:
    """The heads, kv heads, MLP width and (padded) vocabulary over the tensor ranks."""
    n = _size(plan, tensor, vals)
    need(t.heads, "the attention heads", tensor, n, "tensor parallelism gives each rank whole heads")
    if t.kv_heads is not t.heads:  # kv heads default to the heads: judged once
        need(t.kv_heads, "the kv heads", tensor, n, "each tensor rank needs whole kv heads (or one head copied "
             "on a whole number of ranks)", copies_ok=True)
    need(t.ffn, "the MLP width", tensor, n, "the MLP's columns are split over the tensor ranks")
    vocab, multiple = number(t.vocab, vals), number(t.vocab_multiple, vals)
    if multiple is not None and vocab is not None and multiple.denominator == 1 and multiple >= 1 \
            and vocab.denominator == 1:
        padded = -(-int(vocab) // int(multiple)) * int(multiple)  # what is split: the padded vocabulary
        need(ir.Const(Fraction(padded), t.vocab_multiple.span), f"the vocabulary padded to a multiple of {int(multiple)}",
             tensor, n, "the embedding and the output layer are vocabulary-parallel")
    else:
        need(t.vocab, "the vocabulary", tensor, n, "the embedding and the output layer are vocabulary-parallel",
             hint=f"Megatron-LM pads the vocabulary to a multiple of 128·t; give the padded size "
                  f"({_padded(vocab, n)} for t = {n})" if n else None)


def _expert_shapes(plan: ir.Plan, vals: Values, t: ir.TransformerShape, folded, own: dict, need,
                   error: Callable[..., None]) -> None:
    """The experts over the expert ranks, and under an expert group (parallel folding) their width over
    its tensor axes and the sequence parallelism it needs."""
    experts = tuple(a.name for a in plan.mesh.axes if own.get(a.name, plan.role(a.name)) is ir.Role.EXPERT)
    if experts and number(t.experts, vals) not in (None, Fraction(1)):
        n = _size(plan, experts, vals)
        if folded is None:
            need(t.experts, "the expert count", experts, n, "every expert rank holds whole experts")
        elif n not in (None, 1):
            v = number(t.experts, vals)
            if v is not None and (v.denominator != 1 or int(v) % n):
                error(Code.IMPOSSIBLE_FOLD, f"the expert count ({_show(v)}) cannot be split evenly over the expert group's "
                      f"expert axes {'×'.join(experts)} ({n}): every expert rank holds whole experts", folded.span)
    if folded is None:
        return
    # the expert tensor axes split each expert's width
    etp = tuple(a.name for a in plan.mesh.axes if own.get(a.name, plan.role(a.name)) in
                (ir.Role.TENSOR, ir.Role.SEQUENCE))
    n = _size(plan, etp, vals) if etp else None
    width = t.expert_ffn if t.expert_ffn is not None else t.ffn
    v = number(width, vals)
    if n not in (None, 1) and v is not None and (v.denominator != 1 or int(v) % n):
        error(Code.IMPOSSIBLE_FOLD, f"the expert width ({_show(v)}) cannot be split evenly over the expert group's tensor "
              f"axes {'×'.join(etp)} ({n}): each expert's columns are split over its tensor ranks", folded.span)
    _folding_needs_sp(plan, own, vals, folded.span, partial(_where, plan), error)


def _folding_needs_sp(plan: ir.Plan, own: dict, vals: Values, group: Span, where: Callable[..., Span],
                      error: Callable[..., None]) -> None:
    """PL133: an expert group that gives a dense tensor axis of more than one device another role
    (expert or data) in a plan without sequence parallelism. Without it every tensor rank holds
    the whole sequence, so every token would reach the experts once per tensor rank; Megatron-LM
    refuses MoE with tensor parallelism > 1 without sequence parallelism."""
    if plan.sequence_parallel:
        return
    moved = tuple(a for a in plan.axes_with_role(ir.Role.TENSOR)
                  if own.get(a, ir.Role.TENSOR) not in (ir.Role.TENSOR, ir.Role.SEQUENCE))
    n = _size(plan, moved, vals) if moved else None
    if n is None or n <= 1:
        return
    roles = ", ".join(f"{a}: {own[a].value}" for a in moved)
    error(Code.FOLD_NEEDS_SEQUENCE_PARALLEL, f"the expert group folds the tensor axis {'×'.join(moved)} ({n}) into other roles ({roles}) "
          "without sequence parallelism: every tensor rank holds the whole sequence, so each token would reach "
          "the experts once per tensor rank", where(moved),
          (f"the expert group's roles: line {group.line}" if group.line else "the expert group's roles",
           "bind a strategy with sequence parallelism (e.g. megatron_sp); Megatron-LM refuses MoE with tensor "
           "parallelism > 1 without it (\"When using expert parallelism and tensor parallelism, sequence "
           "parallelism must be used\")"))


def _ulysses_heads(plan: ir.Plan, vals: Values, tensor: tuple[str, ...], error: Callable[..., None]) -> None:
    """PL197: Ulysses' all-to-all gives each rank of its group g whole heads of the tensor rank's h/t over the
    whole sequence, so g must divide h/t; the kv heads k/t too, or g be a multiple of them (each kv head
    repeated on g/(k/t) ranks, as verl and Megatron-LM's a2a do), unless the plan states the uneven split
    (override heads[...], DeepSpeed's uneven all-to-all), which the checker judges."""
    t = plan.model.transformer
    stated = [o for o in plan.overrides if o.group == "context" and o.verb == OverrideVerb.ALL_TO_ALL and o.axes]
    if t is None or not stated or any(o.target == OverrideTarget.HEADS for o in plan.overrides):
        return  # a stated head split (override heads[...]) splits unevenly: check.encode_ulysses_heads judges it
    tp = _size(plan, tensor, vals) if tensor else 1
    heads, kv = number(t.heads, vals), number(t.kv_heads, vals)
    if tp is None or heads is None or heads.denominator != 1 or int(heads) % tp:
        return  # PL130 judges the heads over the tensor ranks
    for o in stated:
        axes = tuple(a for a in plan.mesh.names if a in o.axes)
        if any(a in tensor for a in axes):
            continue  # an all-to-all over a tensor axis is a wrong group, which the checker refutes (GI activations[context])
        n = _size(plan, axes, vals)
        if n is None or n <= 1:
            continue
        local = int(heads) // tp
        kv_local = int(kv) // tp if kv is not None and kv.denominator == 1 and int(kv) % tp == 0 else 1
        bad = ("attention heads", local) if local % n else ("kv heads", kv_local) if kv_local % n and n % kv_local else None
        if bad is None:
            continue
        per = f" of each tensor rank ({bad[1]} = {int(heads) if bad[0] == 'attention heads' else int(kv)} / {tp})" if tp > 1 else ""
        error(Code.ULYSSES_HEADS, f"override {o.target}[context]: all_to_all over ({', '.join(o.axes)}): the {bad[1]} {bad[0]}"
              f"{per} cannot be split evenly over the Ulysses group {'×'.join(axes)} ({n}): each rank of it attends "
              "whole heads over the whole sequence", o.span,
              ("Megatron-LM and Transformer Engine's a2a context parallelism and verl's Ulysses require the group to "
               "divide the heads (verl-project/verl#1226; kv heads: divisible, or the group a multiple of them, each "
               "kv head repeated)",
               "DeepSpeed's uneven head split (deepspeedai/DeepSpeed#6392) gives ranks different head counts: state it "
               "with override heads: uneven, or choose a group size that divides the heads"))
        return
