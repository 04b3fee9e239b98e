"""Time within a step: the micro-step on which the gradient synchronisation is armed.

Input: the obligations of a plan, its step model and replay context. Output: the obligations that
read a reduced gradient wrapped so that an early sync refutes them, with a concrete replay of the
accumulation (the affected axes: ``microsteps.early_axes``).

The derived step arms the reduction on the last micro-step: the first m - 1 backwards run under
``no_sync`` and the last one reduces the whole accumulated gradient. ``override grads:
sync_before_last`` states that the reduction runs on an earlier micro-step (``no_sync`` around the
later ones instead of the first ones): it sums the gradient accumulated so far, and the later
micro-steps' gradients stay local. Each rank then ends the step with the global gradient of the
first micro-steps plus its own of the rest: not the global-batch gradient, and different on every
rank of a reduced axis, whenever there are two or more micro-steps and such an axis has two or
more ranks. A gradient sharded over the axis (reduce-scattered after every micro-step) and a buffer
reduced after every micro-step are not affected.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from . import steps
from .encode_time import early_sync
from .microsteps import early_axes, early_override
from .replay import Context, _frac, coords_text
from .report import Counterexample


def wrap(obs: list, step: steps.StepModel, ctx: Context, plan: ir.Plan | None) -> list:
    """Add the early-sync violation to every obligation that reads a reduced gradient."""
    o = early_override(plan) if plan is not None else None
    if o is None:
        return obs
    affected = {g.group: early_axes(plan, g) for g in step.groups if early_axes(plan, g)}
    every = tuple(dict.fromkeys(a for axes in affected.values() for a in axes))
    for ob in obs:
        g = ob.whole or (ob.aspect_of if ob.name.endswith("over microbatches") else None) or (
            ob.name[len("SC grads["):-1] if ob.name.startswith("SC grads[") else None)
        if g in affected:
            axes, kind = affected[g], "gi" if not ob.name.startswith("SC") else "replica"
        elif ob.name in ("SC clip_norm", "SC overflow"):
            axes, kind = every, "norm" if ob.name == "SC clip_norm" else "overflow"
        else:
            continue
        ob.encode = early_sync(ob.encode, axes, ob.name)
        ob.replay = _replay(ob.replay, ctx, axes, kind, o.span.line, g)
        ob.span = o.span
    return obs



def _replay(orig, ctx: Context, axes, kind, line: int, group):
    def replay(w):
        if w.get("kind") != "early_sync":
            return orig(w)
        return replay_early(ctx, w["sizes"], axes, kind, line, group)
    return replay


def replay_early(ctx: Context, sizes: dict[str, int], axes, kind: str, line: int, group) -> Counterexample | None:
    """Two ranks of a reduced axis, m micro-steps of one token each, the sync armed on micro-step 1:
    each rank ends with the reduced gradient of micro-step 1 plus its own of the rest."""
    m = sizes.get(steps.MICROBATCHES, 1)
    axis = next((a for a in axes if sizes.get(a, 1) >= 2), None)
    if m < 2 or axis is None:
        return None
    n = sizes[axis]
    s = {(r, mu): Fraction(r * m + mu + 1) for r in range(n) for mu in range(m)}  # per-token contributions
    total = Fraction(n * m)  # one token per rank and micro-step on the axis
    ref = sum(s.values()) / total
    first = sum(s[(r, 0)] for r in range(n)) / total
    held = [first + sum(s[(r, mu)] for mu in range(1, m)) / total for r in range(n)]
    if held[0] == ref and held[0] == held[1]:
        return None
    step = ctx.step
    d0 = {a: 0 for a in step.axes}
    d1 = dict(d0, **{axis: 1})
    c0, c1 = coords_text(step.axes, d0.values()), coords_text(step.axes, d1.values())
    what = {"gi": f"the {group} gradient on {c0} = {_frac(held[0])}; the global-batch mean = {_frac(ref)}",
            "replica": f"the {group} gradient on {c0} = {_frac(held[0])} but on {c1} = {_frac(held[1])}: replicas "
                       "of one element step with different gradients",
            "norm": f"the grad norm on {c0} is taken of {_frac(held[0])}, on {c1} of {_frac(held[1])}: the ranks "
                    "clip with different coefficients, none the global one",
            "overflow": f"an overflow in micro-step 2 on {c1} stays in {c1}'s gradient: {c0} holds {_frac(held[0])} "
                        f"and {c1} {_frac(held[1])}, and they decide apart"}[kind]
    diag = (f"the gradient reduction over {axis} is armed on micro-step 1 of {m} (override at line {line}: no_sync "
            "around the later micro-steps instead of the first ones): it sums the gradient accumulated so far, and "
            "the later micro-steps' gradients are never reduced",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", c0), ("rank B", c1)),
                          (("per-token gradient s[rank][micro-step]", ", ".join(
                              f"s[{r}][{mu + 1}]={_frac(v)}" for (r, mu), v in sorted(s.items()) if r < 2)),
                           ("token count", f"{n}·{m} = {_frac(total)} (one per rank and micro-step)")),
                          what, diag, ctx.command(sizes))
