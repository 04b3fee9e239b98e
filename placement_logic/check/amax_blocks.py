"""The granularity of fp8 scaling under sharding: ``override amax[g]: blockwise over (AXES) by B`` and
``override amax[g]: rowwise over (AXES)``.

Input: a plan, its ``let`` bindings and the step's ``GroupModel`` records. Output: the statements
(``stated``), the dimensions of g's fp8 tensors the named axes split (``dims``: a width of the model, or
the sequence) and the located errors of a statement the step cannot read (``check_override``: PL284, PL285,
PL506). No solver here; the obligation is ``check.encode_amax_blocks``.

Per-block scaling (DeepSeek-V3's 1 x 128 activation and 128 x 128 weight tiles, TransformerEngine's
``Float8BlockScaling``; MX formats' 1 x 32 blocks, ``MXFP8BlockScaling``) gives each block of B consecutive
elements along a dimension its own scale fp8_max / (the block's largest magnitude); rowwise scaling
(torchao's float8 rowwise) one scale per row, a block as long as the row. A rank computes the scales of the
blocks of its own shard. Along a dimension an axis splits into n contiguous shards of D / n elements, every
block lies inside one shard iff D / n is a multiple of B: then each rank's block maxima are single-device
training's. Otherwise a block straddles two ranks' shards, each rank takes the maximum of its part only,
and the derived step would all-reduce (a max) the block's amax over the ranks holding its parts; the
statement says it is not reduced over AXES. Rowwise blocks run along the GEMMs' reduction dimension, which
a row-parallel linear (the MLP's second matrix, attention's output projection) splits: any tensor rank
count of 2 or more cuts its rows.

Dimensions: over a tensor axis where g's weights are split, g's widths (``dense``: the MLP width and
the query and kv widths heads x head_dim; ``experts``: the expert width; ``embedding``: the padded
vocabulary); rowwise, the row-parallel reduction widths only (the MLP width, the query width, the expert
width). Blockwise, the sequence as well (the tokens' dimension of the activations' and gradients' B x 1
blocks) over a sequence axis, a sequence-parallel tensor axis (contiguous slices of seq / t) and a context
axis (the load-balanced layout's 2c chunks of seq / 2c). A data or expert axis gives each rank whole
sequences (the single-device step quantises each microbatch by itself), a pipeline axis whole layers: no
block crosses them, and naming one changes nothing (PL506).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from .values import fold, resolver

VERBS = (OverrideVerb.BLOCKWISE, OverrideVerb.ROWWISE)


@dataclass(frozen=True)
class Dim:
    """A dimension of ``value`` x ``unit`` elements (``value`` heads of ``unit`` = head_dim, or ``value``
    elements) split into ``scale`` x (the product of ``axes``' sizes) contiguous shards of whole units, the axes
    in mesh order (the first the slowest). ``copies``: a count fewer than the ranks is copied (kv heads): each
    rank holds one unit."""

    what: str
    value: int | None
    axes: tuple[str, ...]
    scale: int = 1
    unit: int = 1
    copies: bool = False

    def shard(self, n: int) -> int:
        """The elements of one shard at ``n`` shards (the dimension's ``scale`` included)."""
        if self.copies and self.value % n:
            return self.unit
        return self.value // n * self.unit


def stated(plan: ir.Plan) -> list[ir.Override]:
    """Per group (or None: every group, spelt ``amax`` or ``amax[all]``: one key, one obligation) the last
    granularity statement."""
    last: dict = {}
    for o in plan.overrides:
        if o.target == OverrideTarget.AMAX and o.verb in VERBS:
            last[None if o.group in (None, "all") else o.group] = o
    return list(last.values())


def replaced(plan: ir.Plan, o: ir.Override) -> list[ir.Override]:
    """The earlier granularity statements of o's key (``amax`` and ``amax[all]`` alike) that o replaces."""
    key = None if o.group in (None, "all") else o.group
    return [x for x in plan.overrides[:next(i for i, x in enumerate(plan.overrides) if x is o)] if x.target == OverrideTarget.AMAX
            and x.verb in VERBS and (None if x.group in (None, "all") else x.group) == key]


def _int(v, bindings: dict) -> int | None:
    if v is None:
        return None
    try:
        x = Fraction(fold(v, resolver(bindings, {})))
    except (DiagnosticError, TypeError, ValueError, ZeroDivisionError, AttributeError):  # a free symbol, or none
        return None
    return int(x) if x.denominator == 1 and x >= 1 else None


def block(o: ir.Override, bindings: dict) -> int | None:
    """B: the block's element count (rowwise: None, the whole row)."""
    return _int(o.by, bindings) if o.verb == OverrideVerb.BLOCKWISE else None


def _widths(t: ir.TransformerShape, group: str, rowwise: bool, tensor: tuple, bindings: dict) -> list[Dim]:
    heads, kv = _int(t.heads, bindings), _int(t.kv_heads, bindings)
    hidden = _int(t.hidden, bindings)
    hd = _int(t.head_dim, bindings) if t.head_dim is not None else (
        hidden // heads if heads and hidden and hidden % heads == 0 else None)
    q = Dim("the query width (heads x head_dim)", heads if hd else None, tensor, unit=hd or 1)
    if group == "dense":
        kvw = Dim("the kv width (kv heads x head_dim)", kv if hd else None, tensor, unit=hd or 1, copies=True)
        return [Dim("the MLP width", _int(t.ffn, bindings), tensor), q] + (
            [] if rowwise or t.kv_heads is t.heads else [kvw])
    if group == "experts":
        return [Dim("the expert width", _int(t.expert_ffn if t.expert_ffn is not None else t.ffn, bindings), tensor)]
    if group == "embedding" and not rowwise:
        vocab, mult = _int(t.vocab, bindings), _int(t.vocab_multiple, bindings)
        return [Dim("the padded vocabulary" if mult else "the vocabulary",
                    -(-vocab // mult) * mult if vocab and mult else vocab, tensor)]
    return []


def dims(plan: ir.Plan, o: ir.Override, g, sp: bool, bindings: dict) -> list[Dim]:
    """The dimensions of g's fp8 tensors that the mesh's axes split (None for a width that is not a number)."""
    t = plan.model.transformer
    rowwise = o.verb == OverrideVerb.ROWWISE
    tensor = tuple(a for a in plan.mesh.names if plan.role(a) is ir.Role.TENSOR and a in g.shard_axes)
    out = _widths(t, str(g.group), rowwise, tensor, bindings) if t and tensor else []
    if not rowwise and str(g.group) in ("dense", "experts"):
        seq = tuple(a for a in plan.mesh.names if plan.role(a) in (ir.Role.SEQUENCE, ir.Role.CONTEXT)
                    or (plan.role(a) is ir.Role.TENSOR and sp))
        cp = [a for a in seq if plan.role(a) is ir.Role.CONTEXT]
        if seq:
            out.append(Dim("the sequence", _int(plan.model.seq, bindings), seq, 2 if cp else 1))
    return out


def groups_of(o: ir.Override, groups) -> list:
    return [g for g in groups if o.group in (None, "all", g.group)]


def splits(plan: ir.Plan, o: ir.Override, groups, sp: bool, bindings: dict) -> list[tuple[str, Dim, str]]:
    """(group, dimension, named axis): the named axes that split a dimension of the group's fp8 tensors."""
    return [(str(g.group), d, a) for g in groups_of(o, groups) for d in dims(plan, o, g, sp, bindings)
            for a in dict.fromkeys(o.axes or ()) if a in d.axes]


def head(o: ir.Override) -> str:
    by = f" by {ir.show(o.by)}" if o.by is not None else ""
    return f"override amax{f'[{o.group}]' if o.group else ''}: {o.verb} over ({', '.join(o.axes or ())}){by}"


def check_override(plan: ir.Plan, groups, sp: bool, bindings: dict) -> None:
    """PL285 (a block size that is not a positive integer), PL284 (a width that is not a number), PL506 (a
    statement that changes nothing)."""
    for o in stated(plan):
        h = head(o)
        if o.verb == OverrideVerb.BLOCKWISE and block(o, bindings) is None:
            raise _err(Code.AMAX_BLOCK_SIZE, f"{h}: the block size is not a positive integer", o)
        if not o.axes:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{h} changes nothing: it names no axis", o)
        twice = next((a for a in o.axes if o.axes.count(a) > 1), None)
        if twice is not None:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"{h} changes nothing the second time it names {twice}", o)
        found = splits(plan, o, groups, sp, bindings)
        blank = next((d for _, d, _ in found if d.value is None), None)
        if blank is not None:
            raise _err(Code.AMAX_BLOCKS_NO_SHAPES, f"{h}: {blank.what} is not a number, so where the blocks fall "
                       "between the shards cannot be judged", o)
        for a in o.axes:
            if not any(x == a for _, _, x in found):
                if plan.model.transformer is None and plan.role(a) is ir.Role.TENSOR:
                    raise _err(Code.AMAX_BLOCKS_NO_SHAPES, f"{h}: the model states no transformer shapes, so the "
                               f"widths {a} splits are unknown", o)
                raise _err(Code.OVERRIDE_NO_EFFECT, f"{h} changes nothing over {a}: {a} splits no dimension the "
                           f"{'rows' if o.verb == OverrideVerb.ROWWISE else 'blocks'} lie along (each rank holds whole "
                           "ones), so each rank's own amax of a block is the reduced one", o)


def _err(code: Code, msg: str, o: ir.Override) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, o.span)])
