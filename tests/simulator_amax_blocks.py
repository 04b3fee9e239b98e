"""The simulator's section for per-block and per-row fp8 scales under sharding (docs/semantics.md, "Per-rank
operations and partial values"), written from the semantics without the checker's code.

``override amax[g]: blockwise over (AXES) by B`` / ``rowwise over (AXES)``: each rank scales every block of B
elements (rowwise: a whole row) of its own local tensor by fp8_max / (the block's largest magnitude), and the
ranks that differ only on axes the statement does not name all-reduce (max) those block maxima. A concrete
tensor of random magnitudes is laid out along each dimension the mesh splits: a tensor axis where the group's
weights are split cuts the widths (dense: the MLP width, heads x head_dim, kv heads x head_dim, a kv head
copied where there are more ranks than kv heads; rowwise: the row-parallel widths, the MLP's and the query's);
blockwise, a sequence-parallel tensor axis (contiguous seq / t tokens) or a context axis (the load-balanced
layout: rank i holds chunks i and 2c - 1 - i of 2c) cuts the sequence. The element's scale on its rank is
compared, by brute force, with single-device training's (blocks of B over the whole dimension).
``violations``: ``("amax", g)`` where some element is scaled differently.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from simulator_norm import grad_shard_axes

from placement_logic import ir

FP8_MAX = 448


def _n(v) -> int | None:
    return int(v.value) if isinstance(v, ir.Const) and Fraction(v.value).denominator == 1 else None


def _widths(t, group: str, rowwise: bool) -> list[tuple[int, int, bool]]:
    """(count, unit, copied): ``count`` pieces of ``unit`` elements each."""
    hd = _n(t.head_dim) if t.head_dim is not None else _n(t.hidden) // _n(t.heads)
    if group == "dense":
        out = [(_n(t.ffn), 1, False), (_n(t.heads), hd, False)]
        if not rowwise and t.kv_heads is not t.heads:
            out.append((_n(t.kv_heads), hd, True))
        return out
    if group == "experts":
        return [(_n(t.expert_ffn if t.expert_ffn is not None else t.ffn), 1, False)]
    if group == "embedding" and not rowwise:
        vocab, mult = _n(t.vocab), _n(t.vocab_multiple)
        return [(-(-vocab // mult) * mult if mult else vocab, 1, False)]
    return []


def _layout(count: int, unit: int, copied: bool, shards: int, zigzag: bool) -> list[list[int]]:
    """Per shard, the global element indices it holds, in local order."""
    if copied and count % shards:
        per = shards // count  # ranks per kv head
        return [list(range((s // per) * unit, (s // per + 1) * unit)) for s in range(shards)]
    total = count * unit
    if zigzag:
        c = total // (2 * shards)
        return [list(range(i * c, (i + 1) * c)) + list(range((2 * shards - 1 - i) * c, (2 * shards - i) * c))
                for i in range(shards)]
    w = total // shards
    return [list(range(s * w, (s + 1) * w)) for s in range(shards)]


def _block_max(values: list[int], idx: list[int], b: int) -> list[int]:
    """The local tensor ``idx``'s block maxima (blocks of b elements)."""
    return [max(values[i] for i in idx[k:k + b]) for k in range(0, len(idx), b)]


def _differs(values, b, split, reduced, sizes, count, unit, copied, zigzag) -> bool:
    """Whether some element's scale on its rank differs from single-device training's. The ranks that differ
    only on ``reduced`` axes all-reduce their amax: together they scale the blocks of their gathered pieces."""
    shards = 1
    for a in split:
        shards *= sizes[a]
    if shards == 1:
        return False
    total = count * unit
    lay = _layout(count, unit, copied, shards, zigzag)
    devices = list(product(*[range(sizes[a]) for a in split]))  # row-major: the first axis the slowest
    held: dict = {}
    for i, d in enumerate(devices):
        key = tuple(c for c, a in zip(d, split) if a not in reduced)
        got = held.setdefault(key, [])
        if not (copied and lay[i][0] in got):  # a copied kv head is held once
            got.extend(lay[i])
    single = _block_max(values, list(range(total)), b)
    for idx in held.values():
        local = _block_max(values, idx, b)
        if any(Fraction(FP8_MAX, local[k // b]) != Fraction(FP8_MAX, single[x // b]) for k, x in enumerate(idx)):
            return True
    return False


def violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random) -> set:
    out = set()
    t = plan.model.transformer
    axes = list(plan.mesh.names)
    sp = plan.sequence_parallel or any(plan.role(a) is ir.Role.SEQUENCE for a in axes)
    stated = [o for o in plan.overrides if o.target == "amax" and o.verb in ("blockwise", "rowwise")]
    for g in ("dense", "experts", "embedding"):
        mine = [o for o in stated if o.group in (None, "all", g)]
        if not mine or t is None:
            continue
        o = mine[-1]
        rowwise = o.verb == "rowwise"
        named = set(o.axes or ())
        split = [a for a in axes if plan.role(a) is ir.Role.TENSOR and a in grad_shard_axes(plan, g)]
        dims = [(c, u, cp, split, False) for c, u, cp in _widths(t, g, rowwise)] if split else []
        seq = [a for a in axes if plan.role(a) in (ir.Role.SEQUENCE, ir.Role.CONTEXT)
               or (plan.role(a) is ir.Role.TENSOR and sp)]
        if not rowwise and g in ("dense", "experts") and seq:
            cp = any(plan.role(a) is ir.Role.CONTEXT for a in seq)
            dims.append((_n(plan.model.seq), 1, False, seq, cp))
        for count, unit, copied, on, zigzag in dims:
            total = count * unit
            b = total if rowwise else _n(o.by)
            values = [rng.randint(1, 10**9) for _ in range(total)]  # distinct maxima, almost surely
            if _differs(values, b, on, {a for a in on if a not in named}, sizes, count, unit, copied, zigzag):
                out.add(("amax", g))
    return out
