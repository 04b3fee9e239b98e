"""A concrete simulator of the keys a checkpoint's shards are saved and looked up under, written
from docs/semantics.md ("Checkpoints: save, load and reshard", the layouts in blocks).

Independent of the checker's code (it imports nothing from ``placement_logic.check``): given an
``ir.Plan`` with ``override checkpoint: ...`` statements and a size n of a resharded axis, it
builds every rank's shard as the list of the labels of the elements it holds, in its local order:

- a fused tensor over a tensor axis (``checkpoint[g]: fused over (tp) by C``): C components
  (Q, K, V; gate, up), a column-parallel layer giving rank r the slice r of every component,
  concatenated: its shard is ``[c0_r | c1_r | ...]``;
- the layers over the pipeline axis under an interleaved schedule of v chunks: stage s holds the
  virtual stages s, s + n, ..., s + (v - 1)·n, each L / (v·n) consecutive layers;
- any other sharded state: rank r holds the r-th contiguous slice.

Each rank writes every element under its key: its label (the global id) as derived, or
``rank·len(shard) + position`` in one flat array where ``checkpoint[g]: flat_offset`` names the
axis; a new size n' looks every element of every new rank up the same way. ``violated(plan, sizes)``
says whether some rank, for some n' from 1 to n + 2, reads back an element other than its own.
"""

from __future__ import annotations

from checkpoint_sim import layout
from simulator import groups_of

from placement_logic import ir
from placement_logic.ir import collectives


def _statements(plan: ir.Plan, verb: str) -> list[ir.Override]:
    return [o for o in plan.overrides if o.target == "checkpoint" and o.verb == verb]


def _names(o: ir.Override, group: str) -> bool:
    return o.group in (None, "all", group)


def shard(kind: str, count: int, n: int, r: int, per: int) -> list[tuple]:
    """Rank r of n's elements, labelled, in its local order; ``per`` elements per rank per block."""
    if kind == "fused":  # (component, column)
        return [(c, r * per + i) for c in range(count) for i in range(per)]
    if kind == "virtual":  # (layer,): virtual stage k·n + r holds ``per`` layers
        return [((k * n + r) * per + i,) for k in range(count) for i in range(per)]
    return [(r * per + i,) for i in range(per)]  # contiguous


def reload_ok(kind: str, count: int, n: int, new: int, flat: bool) -> bool:
    """Save on n ranks, load on ``new``: every new rank reads back exactly its own elements."""
    total = n * new * 2  # elements per block, divisible by both sizes
    files: dict = {}
    for r in range(n):
        mine = shard(kind, count, n, r, total // n)
        for p, label in enumerate(mine):
            files[r * len(mine) + p if flat else label] = label
    for r in range(new):
        mine = shard(kind, count, new, r, total // new)
        got = [files.get(r * len(mine) + p if flat else label) for p, label in enumerate(mine)]
        if got != mine:
            return False
    return True


def _blocks(plan: ir.Plan, group: str, axis: str) -> tuple[str, int]:
    sched = plan.schedule
    if sched is not None and sched.axis == axis and isinstance(sched.chunks, ir.Const) and sched.chunks.value > 1:
        return "virtual", int(sched.chunks.value)
    fused = [o for o in _statements(plan, "fused") if _names(o, group) and axis in (o.axes or ())]
    if fused:
        return "fused", int(fused[-1].by.value)
    return "contiguous", 1


def violated(plan: ir.Plan, sizes: dict[str, int]) -> bool:
    if not _statements(plan, "reshard"):
        return False
    axes = [a for o in _statements(plan, "reshard") for a in o.axes or ()]
    lay = layout(plan, collectives.derive(plan))
    for g in groups_of(plan):
        for state in ("params", "optimizer"):
            for a in axes:
                if not lay[(g, state)][a]:
                    continue
                flat = any(_names(o, g) and a in (o.axes or ()) for o in _statements(plan, "flat_offset"))
                kind, count = _blocks(plan, g, a)
                n = sizes[a]
                if any(not reload_ok(kind, count, n, new, flat) for new in range(1, n + 3) if new != n):
                    return True
    return False
