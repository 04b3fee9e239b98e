"""Two or more clips on sets of ranks for one group: each device applies the clip coefficient once per
statement whose rank set holds it (docs/semantics.md, "Per-rank operations and partial values").

Input: the query's ``Env`` (or a replay ``Context`` and a witness) and the group's clip statements
(``clip_rank0_only over (AXES)``: rank 0 of every named axis; ``clip_on_ranks over (AXES) ranks (R1, ...)``:
the named ranks of the process group over AXES, the first axis the most significant), of any axes. Output:
the z3 condition that some device applies the coefficient a number of times other than once (``count_arm``:
a device a coordinate per axis the statements name, each in [0, n); the count a sum of 0/1 terms), and the
concrete replay of a witness (``replay_clips``), which recounts by hand at the witness's sizes.

Single-device training clips every element once by c = max_norm / ‖grad‖ (a norm above max_norm: c < 1).
A device named by no statement steps unclipped (coefficient 1), one named by two clips twice (c², the
double clipping of a gradient clipped in two code paths): either way its update is not single-device
training's. A device named exactly once everywhere is the derived clip, the statements a partition of
the ranks (rank 0 by one statement, the others by another).
"""

from __future__ import annotations

from fractions import Fraction

import z3

from ..ir.overrides import OverrideVerb
from ..solver.session import value_of
from . import rankset
from .replay import _frac, coords_text
from .report import Counterexample
from .values import resolver

CLIPS = (OverrideVerb.CLIP_RANK0_ONLY, OverrideVerb.CLIP_ON_RANKS)


def combined(stated: list) -> list:
    """The clip statements of a group, where there are two or more (else none: one statement's own arm)."""
    clips = [o for o in stated if o.verb in CLIPS]
    return clips if len(clips) >= 2 else []


def axes_of(clips: list) -> tuple[str, ...]:
    return tuple(dict.fromkeys(a for o in clips for a in o.axes or ()))


def _member(env, o, c: dict):
    if o.verb == OverrideVerb.CLIP_RANK0_ONLY:
        return z3.And([c[a] == 0 for a in o.axes])
    k = c[o.axes[0]]
    for a in o.axes[1:]:
        k = k * env.size(a) + c[a]
    rs = [env.value(r) for r in o.ranks or ()]
    return z3.Or([z3.ToReal(k) == (r if z3.is_expr(r) else z3.RealVal(str(r), env.sess.ctx)) for r in rs])


def count_arm(env, clips: list, key: str):
    """z3: some device's count of the statements naming it is not 1, with a norm above max_norm (the step a
    clip changes). Returns the arm, its side conditions and a reader of the device's coordinates."""
    c = {a: env.sess.int(f"rc_{key}_{a}") for a in axes_of(clips)}
    one, zero = z3.IntVal(1, env.sess.ctx), z3.IntVal(0, env.sess.ctx)
    count = z3.Sum([z3.If(_member(env, o, c), one, zero) for o in clips])
    norm, cap = env.sess.real(f"rc_norm_{key}"), env.sess.real(f"rc_max_{key}")
    inside = [z3.And(x >= 0, x < env.size(a)) for a, x in c.items()]
    arm = z3.And(*inside, count != 1, norm > cap)
    return arm, [cap > 0], lambda model: {a: value_of(model, x) for a, x in c.items()}


def naming(o, c: dict, sizes: dict, leaf) -> bool:
    """Whether the statement's rank set holds the device of coordinates ``c`` (counted by hand)."""
    if o.verb == OverrideVerb.CLIP_RANK0_ONLY:
        return all(c[a] == 0 for a in o.axes)
    return rankset.index_of(o, c, sizes) in rankset.applied(o, rankset.group_size(o, sizes), leaf)


def _where(o) -> str:
    return rankset.where(o) if o.verb == OverrideVerb.CLIP_ON_RANKS else f"rank 0 of ({', '.join(o.axes)})"


def replay_clips(ctx, w, g, clips):
    """The witness's device (every axis the statements do not name at 0), per-element gradient 1, learning
    rate 1, global norm 2 against max_norm 1 (c = 1/2): it applies c once per statement naming it;
    single-device training applies c once."""
    sizes, c = w["sizes"], w["rank"]
    if not all(0 <= v < sizes[a] for a, v in c.items()):
        return None
    leaf = resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})
    on = [o for o in clips if naming(o, c, sizes, leaf)]
    if len(on) == 1:
        return None
    names = ctx.step.axes
    dev = coords_text(names, [c.get(a, 0) for a in names])
    coef = Fraction(1, 2) ** len(on)
    stated = "; ".join(f"{o.verb} on {_where(o)} at line {o.span.line}" for o in clips)
    at = ", ".join(f"{a} = {sizes[a]}" for a in axes_of(clips))
    if on:
        what = (f"{dev} is named by {len(on)} of them ({', '.join(f'line {o.span.line}' for o in on)}), so it clips "
                f"the {g.group} gradient {len(on)} times: a coefficient of (1/2)^{len(on)} = {_frac(coef)} where "
                "single-device training clips once (a gradient clipped in two code paths)")
    else:
        what = (f"{dev} is named by none of them, so it steps with the unclipped {g.group} gradient where "
                "single-device training clips")
    eq = (f"the {g.group} update on {dev} is -{_frac(coef)} per element; single-device training clips every element "
          "once, by -1/2")
    diag = (f"the clips on sets of ranks for {g.group} ({stated}) are each applied on the ranks they name, and "
            f"a device applies the coefficient once per statement naming it; at {at}, {what}",)
    return Counterexample(ctx.sizes_tuple(sizes), ((f"device ({len(on)} clip{'s' if len(on) != 1 else ''})", dev),),
                          (("per-element gradient", "1 on every rank (after the reductions)"), ("learning rate", "1"),
                           ("clip coefficient", "max_norm / ‖grad‖ = 1 / 2 (global norm 2, max_norm 1)"),
                           ("coefficient applied", f"{_frac(coef)} on {dev}, 1/2 by single-device training")),
                          eq, diag, ctx.command(sizes))
