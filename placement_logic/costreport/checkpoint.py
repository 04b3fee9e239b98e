"""The checkpoint's cost: bytes a rank writes, and what a load on a new mesh reads.

Input: a plan's costs (``costs.PlanCost``) and the report's quantity maker. Output: notes for
the plan's cost report, only where the plan states a checkpoint (``override checkpoint: ...``;
docs/semantics.md, "Checkpoints: save, load and reshard"). A rank writes the params and
optimizer state it holds (its shard where a state is sharded; rank 0 of an axis where it is
replicated writes the whole copy), one file per writing rank, so the bytes rank 0 writes are
its persistent params and optimizer bytes, less any optimizer state the plan leaves out. A
load on new sizes reads, on every rank, the same formula at the new sizes, remapped from the
files by offset: storage reads, no collective. A state laid out in C blocks over a resharded axis
(``checkpoint[g]: fused over (AXES) by C``; the layers under an interleaved schedule of v chunks)
is remapped block by block: the same bytes, read in C runs per rank instead of one.
"""

from __future__ import annotations

import sympy

from .. import costs, ir
from ..ir import State
from ..ir.overrides import OverrideTarget, OverrideVerb


def _skipped(plan: ir.Plan, name: str, checks_as: str) -> bool:
    return any(o.target == OverrideTarget.CHECKPOINT and o.verb == OverrideVerb.SKIP_OPTIMIZER and o.group in (None, "all", name, checks_as)
               for o in plan.overrides)


def written_per_rank(pc: costs.PlanCost) -> sympy.Expr:
    """Bytes rank 0 writes: every group's params and (unless skipped) optimizer state it holds."""
    total = sympy.Integer(0)
    kinds = {g.name: g.group.checks_as for g in pc.shape.groups}
    for name, per in pc.memory.groups.items():
        total += per.get(State.PARAMS, sympy.Integer(0))
        if not _skipped(pc.plan, name, kinds.get(name, name)):
            total += per.get(State.OPTIMIZER, sympy.Integer(0))
    return total


def notes(pc: costs.PlanCost, q) -> list[str]:
    ovs = [o for o in pc.plan.overrides if o.target == OverrideTarget.CHECKPOINT]
    if not ovs:
        return []
    w = q(written_per_rank(pc))
    shown = f"{int(w.exact):,} B" if w.exact is not None and w.exact.denominator == 1 else w.value
    out = [f"checkpoint: bytes written per rank (rank 0, one file per writing rank) = {shown} = {w.formula}"]
    reshard = [a for o in ovs if o.verb == OverrideVerb.RESHARD for a in o.axes or ()]
    if reshard:
        out.append(f"checkpoint: loaded on new sizes of ({', '.join(dict.fromkeys(reshard))}), every rank reads "
                   f"{w.formula} at the new sizes from the files, remapped by offset (storage reads, no collective)")
        out += _blocks(pc.plan, ovs, reshard)
    return out


def _blocks(plan: ir.Plan, ovs, reshard: list[str]) -> list[str]:
    """The states laid out in blocks over a resharded axis: remapped block by block, the same bytes."""
    found = [(o.group or "all", a, o.by) for o in ovs if o.verb == OverrideVerb.FUSED for a in o.axes or ()
             if a in reshard]
    sched = plan.schedule
    if sched is not None and sched.axis in reshard and not (isinstance(sched.chunks, ir.Const) and sched.chunks.value == 1):
        found.append(("the layers", sched.axis, sched.chunks))
    return [f"checkpoint: {g} in {ir.show(c)} blocks over {a}, remapped block by block: the same bytes per rank, "
            f"read in {ir.show(c)} runs instead of one" for g, a, c in found]
