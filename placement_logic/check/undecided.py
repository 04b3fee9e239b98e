"""The obligations a plan's step model cannot decide: a group it cannot represent, K/V copy layouts read at
sizes other than the declared ones, a norm over some axes of crossing copy groups; each left *unknown* with
the missing fact named, never proved, never refuted (called by ``check.obligations``)."""

from __future__ import annotations

from . import kvjoint, kvproduct, steps
from .obligation import Obligation


def apply(obs: list[Obligation], step: steps.StepModel, pinned: dict[str, int]) -> list[Obligation]:
    """A group the step model cannot represent (``GroupModel.undecided``) leaves its gradient
    obligations, the typing rule and the grad norm unknown: never proved, never refuted. Their
    negation is left satisfiable, so no theorem built from them holds. K/V heads copied over one
    tensor axis are dimensions of the model (a head part and a copy part), for axis sizes that are
    multiples of K (said in the notes); a pinned size that is not one stays unknown, and so does a grad
    norm reduced over some of the axes of copy groups that cross them (check.kvjoint). A norm reduced in
    blocks of a copy axis's ranks is decided by ``encode_subgroups``: blocks smaller than the axis refuted,
    blocks that hold it the whole-axis norm (check.kvnorm: each copied head counted once, or every copy)."""
    missing = {g.group: g.undecided for g in step.groups if g.undecided}
    clip = ""
    for g in step.groups:
        clip = clip or kvjoint.norm_undecided(g)
        for d in g.dims:
            off = [(a, s) for a, s in d.joint if a in pinned and pinned[a] != s] if d.part == steps.HEAD_PART else []
            if off:  # check.kvjoint: the runs of the joint index are other sets at other sizes
                missing[g.group] = (f"{off[0][0]} = {pinned[off[0][0]]}, where the plan declares {off[0][1]}: the kv "
                                    f"heads' copy groups over {kvjoint.text(d)} are read at the declared sizes; the "
                                    "missing fact is how the heads are laid out at the pinned sizes")
            if d.joint:
                if d.part == steps.HEAD_PART:
                    _note(obs, g, kvjoint.note(d))
                continue
            if d.pin and d.axis in pinned and pinned[d.axis] != d.pin:  # check.kvproduct: another layout there
                missing[g.group] = (f"{d.axis} = {pinned[d.axis]}, where the plan declares {d.pin}: the kv heads' copy "
                                    "groups over several tensor axes are read at the declared size of an axis of whole "
                                    "heads; the missing fact is how the heads are laid out at the pinned sizes")
            if d.part != steps.COPY_PART:
                continue
            if d.axis in pinned and pinned[d.axis] % d.heads:
                missing[g.group] = (f"{d.axis} = {pinned[d.axis]} is not a multiple of the {d.heads} kv heads, which "
                                    f"the plan copies over {d.axis}: the missing fact is how the heads are laid out")
            note = kvproduct.note(g) if kvproduct.several(g) else (
                f"{d.axis}: multiples of {d.heads} (the kv heads, each copied on {d.axis}/{d.heads} ranks, "
                "summed over its copy group)")
            _note(obs, g, note)
    if not missing and not clip:
        return obs
    anyone = next(iter(missing.values()), "")
    for ob in obs:
        owner = ob.whole or ob.aspect_of or next((g for g in missing if ob.name == f"SC grads[{g}]"), None)
        reason = missing.get(owner) if owner in missing else (
            anyone if ob.condition == "CR02" else (anyone or clip) if ob.name == "SC clip_norm" else "")
        if reason:
            ob.unknown = reason
            ob.encode = lambda env: ([env.sess.true()], lambda model: {})
    return obs


def _note(obs: list[Obligation], g: steps.GroupModel, note: str) -> None:
    """Add the group's layout note to its gradient obligations and the typing rule."""
    for ob in obs:
        if (ob.whole == g.group or ob.aspect_of == g.group or ob.name == f"SC grads[{g.group}]"
                or ob.condition == "CR02") and note not in ob.notes:
            ob.notes = ob.notes + (note,)
