"""The passes of a lift that turn what each gradient went through into the plan's lines (no torch).

``gradients_pass``: each parameter's class (split, partial, whole on the tensor axis) and gradient program, with
the gradients reduced across pipeline stages, the ties between stages and ranks that disagree reported;
``loss_pass``: the loss convention and multiplier, accumulation; ``groups_pass``: the parameter groups (the
largest split one is ``dense``); ``overrides_pass``: the binding lines and every override where the step departs
from the strategies' derivation. The earlier passes and the typed input (``Step``, ``Axes``, ``Strategies``) are
in ``lift``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..ir.overrides import OverrideTarget
from .lift_blocks import outside_first
from .lift_layout import Unliftable, _express, _frames, _group_name, _placement_axes
from .lift_pipeline import Tie, _tied_across_stages, tied_pairs
from .lift_programs import Programs
from .lift_render import _loss, _unobserved_loss
from .lift_rereduce import rereduce_lines
from .lift_step import Axes, Step, Strategies


@dataclass
class Grads:
    """(parameter, class, reductions, constant scale, frames, elements) per parameter; the stacks of the
    reductions made on every accumulated micro-step (``reduce_every_microbatch``) by parameter name."""
    info: list[tuple]
    every_of: dict[str, list]
    tie: Tie | None = None  # a weight tied across the first and last stage, lifted
    again_of: dict | None = None  # an accumulating buffer reduced again (lift_rereduce): kind -> parameter -> call


@dataclass
class Loss:
    kind: str
    w: Fraction  # the loss multiplier, relative to the whole optimizer step
    frames: list[dict]
    tokens_axes: tuple | None
    tokens_equal: bool
    accum: int  # backward passes (microbatches) per optimizer step
    default_div: Fraction


def gradients_pass(st: Step, ax: Axes, params: list[dict]) -> Grads:
    layout, pipe, pp, tp = st.layout, ax.pipe, ax.pp, ax.tp
    programs = Programs(st.step, st.by_seq, st.micro, layout, tuple(ax.data_axes), st.observer)
    program = programs.of
    grads_of = {r: {p["name"]: p for p in st.step[r].get("optimizer", {}).get("params", [])} for r in st.ranks}
    info = []
    disagree: dict[tuple, list[str]] = {}
    across: dict[int, list] = {}  # stage -> gradients reduced across the pipeline stages
    ties = tied_pairs(ax.stage_ranks, st.initial) if pipe else []
    tied = {(s, n) for s0, n0, s1, n1 in ties for s, n in ((s0, n0), (s1, n1))}
    summed: dict[tuple, tuple] = {}  # tied (stage, name) -> (the stacks of its reductions across the stages, how many)
    tied_names: set[str] = set()
    for p in params:
        if p.get("grad") is None:
            st.notes.append(f"{p['name']}: no gradient at the optimizer step; counted in its layout's group")
        me, own = p["rank"], p["own"]
        reds, const, frames = program(p, me)
        numel = 1
        for d in p["shape"]:
            numel *= d
        is_tied = bool(pipe) and (pipe.stage_of(layout, me), own) in tied
        if is_tied:
            summed[(pipe.stage_of(layout, me), own)] = (frames if pp in reds else [], reds.count(pp))
            tied_names.add(p["name"])
            reds = tuple(a for a in reds if a != pp)  # the tie's reduction is stated by the tie (Tie)
        elif pipe and pp in reds:
            across.setdefault(pipe.stage_of(layout, me), []).append((own, me, frames))
        cls = "split"
        if tp:
            other = layout.neighbour(me, tp)
            mine_plain = not p.get("placements")
            # the values before the first update: replicas start equal, local shards differ
            first_mine = st.initial.get(me, {}).get(own, {})
            first_theirs = st.initial.get(other, {}).get(own, {})
            if mine_plain and first_theirs and first_theirs.get("checksum") != first_mine.get("checksum"):
                numel *= layout.size((tp,))  # a plain local shard (DDP over tensor-parallel shards)
            elif tp not in _placement_axes(p, layout):
                theirs = grads_of.get(other, {}).get(own, {}).get("grad") or {}
                differs = (theirs.get("checksum") != (p.get("grad") or {}).get("checksum"))
                # a gradient that differs only because a lifted activation override makes it wrong is whole
                cls = "partial" if (tp in reds or (differs and not st.activation_lines)) else "whole"
        info.append((p, cls, reds, const, frames, numel))
        # every rank must run the same program on this parameter's gradient
        for r in sorted(st.ranks):
            theirs = grads_of.get(r, {}).get(own)
            if r == me or theirs is None or theirs.get("grad") is None or p.get("grad") is None:
                continue
            if pipe and pipe.stage_of(layout, r) != pipe.stage_of(layout, me):
                continue  # another stage: other parameters
            r_reds, r_const, _ = program(theirs, r)
            if is_tied:
                r_reds = tuple(a for a in r_reds if a != pp)
            # a rank outside a group of the first K ranks keeps its own value (``reduce_first``)
            if (r_reds, r_const) != (reds, const) and (r_reds, r_const) != (outside_first(st, p, r, reds), const):
                disagree.setdefault((r_reds, r_const, r), []).append(p["name"])

    for s, grads in sorted(across.items()):
        own, me, frames = grads[0]
        st.items.append(Unliftable((me,), -1, f"the gradient of {own}" + (
            f" and {len(grads) - 1} more" if len(grads) > 1 else "") + f" on stage {s}",
            f"reduced across the pipeline stages over {pp} (weights shared by stages, such as a tied embedding): "
            "not lifted", tuple(frames[0] if frames else ())))
    tie = None
    if pipe:
        tie, items = _tied_across_stages(pp, ax.stage_ranks, ties, summed, st.step, st.script)
        st.items.extend(items)
        if tie is not None:
            tie.names = tied_names
    for (r_reds, r_const, r), names in sorted(disagree.items(), key=lambda kv: kv[0][2]):
        mine = next(e for e in info if e[0]["name"] == names[0])
        st.items.append(Unliftable(
            (r,), -1, f"the gradient program of {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1
                                                               else ""),
            f"rank {r} reduces it over ({', '.join(r_reds)}) and scales it by {r_const}, rank {mine[0]['rank']} over "
            f"({', '.join(mine[2])}) by {mine[3]}: ranks that disagree are not one plan",
            tuple(st.step[r]["optimizer"].get("stack", []))))
    return Grads(info, programs.every_of, tie, programs.again_of)


def loss_pass(st: Step, ax: Axes, grads: Grads) -> Loss:
    """The loss convention. Gradient accumulation: k backward passes accumulate into one optimizer step; the loss
    multiplier is taken relative to the whole step (every micro-batch's tokens). With a pipeline: on the last
    stage, which computes the loss; its backward passes are the microbatches."""
    loss_rank = ax.loss_rank
    accum = st.window or max(1, len(st.step[loss_rank].get("losses", [])))
    loss_colls = [c for c in st.ranks[loss_rank]["collectives"] if c["step"] == st.step_no]
    kind, w, frames, tokens_axes, tokens_equal = _loss(st.step, st.layout, ax.data_axes, loss_rank, loss_colls,
                                                       ax.tp, st.notes, st.script, accum)
    st.items.extend(_unobserved_loss(st.step[loss_rank], loss_rank))
    if ax.pipe:
        accum = ax.pipe.microbatches
    elif accum > 1 and not st.window:
        st.notes.append(f"{accum} backward passes accumulate into each optimizer step: lifted as microbatches = "
                        f"{accum}")
    if accum > 1:
        repeated = [e for e in grads.info if len(e[2]) != len(set(e[2]))]
        if repeated:
            # synchronised on more than one micro-step, not as one average each (averages are lifted as
            # reduce_every_microbatch): the later reductions also carry the earlier micro-steps' already
            # reduced part, which one program per gradient cannot state
            first = repeated[0]
            st.items.append(Unliftable(
                (st.observer,), -1, "backward", f"{len(repeated)} gradients reduced on more than one of the {accum} "
                "accumulated backward passes (no no_sync), not each an average over its group: the earlier "
                "micro-steps' reduced part is reduced again, and the accumulated reductions are not lifted",
                tuple(first[4][0] if first[4] else ())))
    default_div = Fraction(st.layout.size(ax.data_axes)) if kind == "per_device_mean" else Fraction(1)
    return Loss(kind, w, frames, tokens_axes, tokens_equal, accum, default_div)


def groups_pass(st: Step, grads: Grads) -> list[tuple[str, tuple, list]]:
    """Groups by class, then by program; the largest split group is ``dense``."""
    groups: dict[tuple, list] = {}
    for entry in grads.info:
        _, cls, reds, const, _, _ = entry
        groups.setdefault((cls, reds, const), []).append(entry)
    split_keys = sorted((k for k in groups if k[0] == "split"), key=lambda k: -sum(e[5] for e in groups[k]))
    taken: set[str] = set(st.layout.names)
    named: list[tuple[str, tuple, list]] = []
    for k in sorted(groups, key=lambda k: (k != (split_keys[0] if split_keys else None), k[0], -len(groups[k]))):
        members = groups[k]
        if split_keys and k == split_keys[0]:
            named.append(("dense", k, members))
        else:
            named.append((_group_name([e[0]["name"] for e in members], taken), k, members))
    return named


def _binding_lines(st: Step, ax: Axes, strategies: Strategies) -> list[tuple[str, list[dict]]]:
    lines = []
    bindings, frames = strategies.bindings, strategies.frames
    # replicate x shard over two data axes is HYBRID_SHARD: the library's two-axis strategy
    hybrid = None
    if len(ax.data_axes) == 2 and [bindings[a] for a in ax.data_axes] == ["ddp", "zero3"]:
        hybrid = tuple(ax.data_axes)
    for a in st.layout.names:
        if hybrid and a == hybrid[0]:
            lines.append((f"  [{hybrid[0]}, {hybrid[1]}]: hybrid_shard",
                          _frames([[f] for x in hybrid for f in frames.get(x, [])], st.script)))
        elif not (hybrid and a == hybrid[1]):
            lines.append((f"  {a}: {bindings[a]}", frames.get(a, [])))
    return lines


def _loss_lines(ax: Axes, loss: Loss) -> list[tuple[str, list[dict]]]:
    lines = []
    if loss.kind in ("per_device_mean", "sum"):
        lines.append((f"  override loss: {loss.kind}", loss.frames))
    # under a loss on a gathered sequence the count's axes are always stated: the derived count is not reduced
    # over the gathered axes (lift_gathered)
    stated = loss.tokens_axes is not None and loss.kind != "sum" and (
        sorted(loss.tokens_axes[0]) != sorted(ax.data_axes) or bool(ax.gathered))
    if loss.tokens_equal and loss.kind != "sum" and not (stated and ax.gathered):
        lines.append(("  override tokens: equal  # observed: every rank held the same number of tokens, no padding",
                      loss.frames))
    elif stated:
        lines.append((f"  override tokens: reduce over ({', '.join(loss.tokens_axes[0])})", loss.tokens_axes[1]))
    return lines


def _group_lines(st: Step, ax: Axes, strategies: Strategies, loss: Loss, named: list) -> list[tuple[str, list]]:
    """Each group's reductions and divisor where they depart from the derivation."""
    lines = []
    layout, data_axes, tp = st.layout, ax.data_axes, ax.tp
    hidden = {h for u in st.items for h in u.hides}
    if hidden:
        st.notes.append(f"the gradients' {' and '.join(sorted(hidden))} are left to the strategies' derivation: what "
                        "the trace shows of them is made unreliable by a fact not lifted (named as unobserved)")
    for gname, (cls, reds, const), members in named:
        expected = sorted(data_axes + ([tp] if (tp and cls == "partial" and strategies.sp) else []))
        target = OverrideTarget.GRADS if len(named) == 1 else f"{OverrideTarget.GRADS}[{gname}]"
        frames = _frames((s for e in members for s in e[4]), st.script)
        opt_frames = _frames([st.step[st.observer]["optimizer"].get("stack", [])], st.script)
        if sorted(reds) != expected and "reductions" not in hidden:
            lines.append((f"  override {target}: reduce over ({', '.join(reds)})", frames or opt_frames))
        q = (1 / const) / loss.w
        if q == loss.default_div or "divisor" in hidden:
            continue
        prefer = [tuple(sorted(set(reds)))] + [tuple(data_axes)]
        expr = _express(q, layout, prefer)
        if loss.accum > 1 and loss.w != 1:
            # the micro-steps' loss multiplier departs from 1 / k: stated over k, at the loss line
            whole = _express(q * loss.accum, layout, prefer)
            if whole not in (None, "1"):
                expr = f"{whole} / {loss.accum}"
            elif whole and ax.pipe:
                expr = f"1 / {loss.accum}"  # with a pipeline: the microbatches' (its schedule scales them), no axis
            frames = loss.frames or frames
        if expr is None:
            expr = str(q)
            st.notes.append(f"grads[{gname}]: divided by {q}, which is no product of mesh sizes: lifted as a "
                            "constant, so the proof holds at these sizes only")
        lines.append((f"  override {target}: divide by {expr}", frames or opt_frames))
    return lines


def overrides_pass(st: Step, ax: Axes, params: list[dict], strategies: Strategies, grads: Grads, loss: Loss,
                   named: list) -> list[tuple[str, list[dict]]]:
    """The plan's lines, each with the script lines behind it."""
    lines = _binding_lines(st, ax, strategies) + _loss_lines(ax, loss)
    if grads.every_of:
        # averaged on every accumulated micro-step (DDP without no_sync): one reduction per gradient,
        # made once per microbatch
        reduced = [e for e in grads.info if e[2]]
        stacks = [grads.every_of[e[0]["name"]] for e in reduced if e[0]["name"] in grads.every_of]
        if len(stacks) == len(reduced):
            lines.append(("  override grads: reduce_every_microbatch  # observed: the gradients all-reduced after "
                          f"each of the {loss.accum} backward passes", _frames(stacks[:1], st.script)))
        else:
            st.items.append(Unliftable((st.observer,), -1, "backward",
                                       f"{len(stacks)} of {len(reduced)} reduced gradients are all-reduced after "
                                       "every accumulated backward pass, the others once per step: one plan reduces "
                                       "its gradient buffer one way", tuple(stacks[0])))
    if grads.again_of:
        lines.extend(rereduce_lines(st, grads.info, grads.again_of, loss.accum))
    recomputed = st.step[st.observer].get("recomputed") or []
    if recomputed:
        kinds = sorted({x["module"] for x in recomputed})
        lines.append((f"  use full_recompute  # observed: layers with weights ({', '.join(kinds[:4])}) ran their "
                      "forward again during backward",
                      _frames([x.get("stack", []) for x in recomputed[:1]], st.script)))
        st.notes.append("layers ran their forward again during backward (activation checkpointing): lifted as "
                        "full_recompute; a checkpointed function of no layer (selective recomputation of the "
                        "attention scores) is not seen, which changes activations only")
    for _axis, frames in strategies.no_regather[:1]:
        lines.append(("  override params: no_regather  # the updated optimizer shards are never sent back", frames))
    return lines + _group_lines(st, ax, strategies, loss, named)


def tie_pass(st: Step, grads: Grads, named: list) -> str | None:
    """The lifted tie's model comment (``tied_embeddings = true``), its override line appended to ``lines`` by the
    caller; None where no tie was lifted. The tie states the embedding class's program: its copies must share the
    one gradient program of every other weight (the plan's ``grads`` lines reach them), and a clipping norm's count
    of the two copies is not read (the derivation counts the tied weight once): else it is named, not lifted."""
    tie = grads.tie
    if tie is None:
        return None
    dense = {e[0]["name"] for g, _, members in named if g == "dense" for e in members}
    clipped = any((e[0].get("grad") or {}).get("dynamic_scales") for e in grads.info)
    why = ("its copies' gradients go through another program than the other weights'" if len(named) != 1
           or not tie.names <= dense else
           "the gradients are clipped, and whether the norm counts the tied weight once or twice is not read"
           if clipped else None)
    if why is None:
        return tie.comment
    stack = tuple(st.step[st.observer].get("optimizer", {}).get("stack", []))
    st.items.append(Unliftable((st.observer,), -1, "a weight tied across the pipeline stages",
                               f"{tie.comment[len('observed: '):]}; {why}: not lifted", stack))
    grads.tie = None
    return None
