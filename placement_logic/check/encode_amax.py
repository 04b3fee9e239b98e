"""The obligation of ``check.amax``: ``SC amax[g]`` beside ``override amax[g]: local over (AXES)``, every
rank casting g's fp8 tensors with the scale single-device training uses (fp8_max / the global amax), with
its z3 negation and the concrete replay of a witness: two ranks' amax values and the scales they give.

Input: the obligations so far, the step model, the replay context and the plan. Output: the obligations
with these added (only where the plan states them).
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..ir.overrides import OverrideVerb
from ..solver.session import value_of
from . import amax
from .replay import _frac, coords_text
from .report import Counterexample
from .rules import STATE_CONSISTENCY


def extend(obs: list, step, ctx, plan, obligation) -> list:
    if plan is None:
        return obs
    for o in amax.stated(plan):
        pend = amax.differ_axes(plan, o, step.groups, step.sequence_parallel)
        name = f"SC amax[{o.group}]" if o.group not in (None, "all") else "SC amax"
        obs.append(obligation(
            name, STATE_CONSISTENCY, o.span,
            "every rank casts the group's fp8 tensors with the scale single-device training uses: fp8_max over the "
            "amax all-reduced (a max) over every rank holding a different piece of the tensor",
            lambda env, pend=pend: _negation(env, pend),
            lambda w, o=o: replay(ctx, w, o, plan), _together(plan, o)))
    return obs


def _together(plan, o) -> tuple[str, ...]:
    """A note naming every statement of o's key where there are several (``amax`` and ``amax[all]`` both
    state every group's reduction): the one obligation judges them together."""
    same = amax.same_key(plan, o)
    if len(same) < 2:
        return ()
    return ("one obligation for the statements of this key, judged together: "
            + "; ".join(f"{amax.head(x)} (line {x.span.line})" for x in same),)


def _negation(env, pend):
    return axis_negation(env, pend, "amax")


def axis_negation(env, pend, kind: str):
    """Some pending (group, axis) whose axis has two ranks or more (check.encode_scalerstate too); the witness
    (``kind``) names the sizes, the group and the axis."""
    arms = [((g, a), env.size(a) >= 2) for g, a in pend]
    cons = [z3.Or([c for _, c in arms])] if arms else [z3.BoolVal(False, env.sess.ctx)]

    def extract(model):
        g, a = next(k for k, c in arms if value_of(model, c))
        return {"kind": kind, "sizes": env.size_values(model), "group": g, "axis": a}

    return cons, extract


def axis_ranks(ctx, w) -> tuple | None:
    """(sizes, group, axis, rank A, rank B) of a witness of ``axis_negation``: ranks A and B at coordinates 0 and 1 of
    the axis (0 elsewhere), written out; None where the axis has fewer than two ranks."""
    sizes, g, a = w["sizes"], w["group"], w["axis"]
    if sizes.get(a, 1) < 2:
        return None
    names = ctx.step.axes
    return (sizes, g, a, coords_text(names, [0] * len(names)),
            coords_text(names, [1 if x == a else 0 for x in names]))


def replay(ctx, w, o, plan=None):
    """Rank A (coordinate 0 of the axis) holds the piece whose largest magnitude is 2, rank B (coordinate 1) a
    piece whose largest is 1; the global amax is 2. E4M3's fp8_max is 448. The diagnosis names the statement
    that leaves the axis out (``amax.cause``: the ``local`` naming it, else the ``reduce``)."""
    got = axis_ranks(ctx, w)
    if got is None:
        return None
    sizes, g, a, r0, r1 = got
    amax_a, amax_b = Fraction(2), Fraction(1)
    s_a, s_b, s_one = amax.FP8_MAX / amax_a, amax.FP8_MAX / amax_b, amax.FP8_MAX / max(amax_a, amax_b)
    read = Fraction(1) * s_b / s_a  # B's element 1 cast with B's scale, read back with A's inverse scale
    eq = (f"the fp8 scale of the {g} tensors is {_frac(s_a)} on {r0} and {_frac(s_b)} on {r1}; single-device "
          f"training, whose amax is the global {_frac(max(amax_a, amax_b))}, uses {_frac(s_one)} on every piece")
    group = next((x for x in ctx.step.groups if x.group == g), None)
    why = ("its ranks hold different tokens" if dict(ctx.step.roles).get(a) != "tensor" else
           "its weights are split there" if group is not None and a in group.shard_axes else
           "its activations are sequence-parallel there")
    o = (amax.cause(plan, g, a) if plan is not None else None) or o
    stmt = (f"override amax: local at line {o.span.line}" if o.verb == OverrideVerb.LOCAL else
            f"its reduction, override amax: reduce over ({', '.join(o.axes or ())}) at line {o.span.line}, leaves {a} out")
    diag = (f"the fp8 amax of the {g} layers is not all-reduced over {a} ({stmt}): {why}, so each rank scales its "
            "casts from its own maximum",)
    note = (f"where the fp8 pieces are gathered (sequence parallelism's all-gather after the cast), {r1}'s element 1, "
            f"cast with {_frac(s_b)} and read with {r0}'s inverse scale 1/{_frac(s_a)}, becomes {_frac(read)}; "
            "over a data axis the replicas of a weight are cast with different scales and their passes differ",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0), ("rank B", r1)),
                          (("amax", f"{_frac(amax_a)} on {r0}, {_frac(amax_b)} on {r1} (the {g} pieces each holds)"),
                           ("fp8_max", f"{amax.FP8_MAX} (E4M3)")),
                          eq, diag, ctx.command(sizes), note)
