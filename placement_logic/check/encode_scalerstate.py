"""The obligation of ``check.scalerstate``: ``SC loss_scale_state`` beside ``override loss_scale:
growth_local over (AXES)``, every rank's loss scale equal to single-device training's after every
step, with its z3 negation and the concrete replay of a witness: a sequence of found-inf flags over
two steps after which two ranks' scales differ.

Input: the obligations so far, the step model, the replay context and the plan. Output: the
obligations with this one added (only where the plan states it).
"""

from __future__ import annotations

from . import rankupdate as ru
from . import scalerstate as ss
from .encode_amax import axis_negation, axis_ranks
from .report import Counterexample
from .rules import STATE_CONSISTENCY

NAME = "SC loss_scale_state"


def extend(obs: list, step, ctx, plan, obligation) -> list:
    o = ru.growth_override(plan) if plan is not None else None
    if o is None:
        return obs
    pend = ss.pending(plan, step.groups, o)
    reduced = ru.overflow_axes(plan, step.groups)
    obs.append(obligation(
        NAME, STATE_CONSISTENCY, o.span,
        "every rank holds the loss scale single-device training holds after every step: the scaler's growth tracker "
        "and hysteresis counter are updated from the found-inf flag reduced over every rank whose gradients differ",
        lambda env: _negation(env, pend),
        lambda w: replay(ctx, w, o, reduced)))
    return obs


def _negation(env, pend):
    """Two ranks of an axis (two or more ranks) that a group's gradient is sharded on and the flag the
    scaler reads is not reduced over: the shard of one overflows and the other's does not."""
    return axis_negation(env, pend, "loss_scale_state")


def _show(s: ss.Scaler) -> str:
    return f"scale {s.scale}, growth tracker {s.tracker}, hysteresis {s.hysteresis}"


def replay(ctx, w, o, reduced):
    """Two steps in which the group's shard at coordinate 0 of the axis overflows and every other shard is
    finite; the scaler of Megatron-LM's and DeepSpeed's defaults (hysteresis 2, growth interval 1000)."""
    got = axis_ranks(ctx, w)
    if got is None:
        return None
    sizes, g, a, r0, r1 = got
    a_runs, b_runs, single = ss.run([True, True]), ss.run([False, False]), ss.run([True, True])
    if a_runs[-1].scale == b_runs[-1].scale or a_runs[-1] != single[-1]:
        return None  # not reached: the scaler halves on the second overflow of a hysteresis of 2
    eq = (f"after step 2 the loss scale is {a_runs[-1].scale} on {r0} and {b_runs[-1].scale} on {r1}; single-device "
          f"training, which sees both overflows, holds {single[-1].scale}")
    read = [x for x in reduced if x not in (o.axes or ())]
    why = (f"each rank's scaler is updated from its own found-inf flag over ({', '.join(o.axes or ())}) (override "
           f"growth_local at line {o.span.line}), while the step's skip reads the reduced flag" if a in (o.axes or ())
           else f"the found-inf flag the scaler reads is reduced over ({', '.join(read)}) only, not over {a}")
    diag = (f"{why}: the {g} gradient is sharded over {a}, so after step 1 every rank skips the step and keeps scale "
            f"{ss.SCALE}, but {r0} counts the overflow ({_show(a_runs[0])}) and {r1} counts a clean step "
            f"({_show(b_runs[0])}); the second overflow of {r0}'s shard exhausts {r0}'s hysteresis alone",)
    once = ss.run([True] + [False] * (ss.INTERVAL - 1))[-1], ss.run([False] * ss.INTERVAL)[-1]
    note = (f"one overflow is enough, through the growth tracker: after it and {ss.INTERVAL - 1} clean steps {r1} has "
            f"counted {ss.INTERVAL} clean steps and doubles its scale to {once[1].scale}, while {r0} holds "
            f"{once[0].scale}; from then on gradients scaled with one rank's scale are unscaled with another's",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", r0), ("rank B", r1)),
                          (("scaler before step 1", _show(ss.start())),
                           ("found-inf", f"steps 1 and 2: the {g} shard of {r0} overflows; every other shard is finite"),
                           ("after step 1", f"{_show(a_runs[0])} on {r0}; {_show(b_runs[0])} on {r1}"),
                           ("after step 2", f"{_show(a_runs[1])} on {r0}; {_show(b_runs[1])} on {r1}")),
                          eq, diag, ctx.command(sizes), note)
