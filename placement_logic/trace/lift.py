"""Lift a trace into a ``.place`` spec: what the script really did, as a plan (no torch).

Input: a trace (``schema``). Output: a ``Lifted``: the spec text, every recorded call that
could not be lifted (rank, call order, the user's line, why), notes, and for each line of
the spec the script lines it was lifted from (so a finding of the checker points back at
the script).

Steps, on the last step of the trace that reached the optimizer:

1. Mesh axes: the DeviceMesh the script built (its dimension names and rank layout);
   without one, the process groups seen, factored into a 1-D or 2-D layout. Every
   collective's group must be the ranks that differ from the caller along a set of axes.
2. Roles: an axis along which ranks send and receive activations and gradients to their
   neighbours is a pipeline axis (``lift_pipeline``: stages, microbatches, schedule); one along
   which ranks that all compute a loss exchange in forward and backward is a context axis (ring
   attention: ``context_parallel``, its reductions and token counts read as a data axis's); of the
   others, an axis along which the ranks' model inputs differ splits the batch (data); one
   along which the inputs agree and parameters are sharded splits the weights (tensor).
   With a pipeline, the parameters are every stage's (read on that stage's rank) and the loss
   is read on the last stage.
3. Strategies: a data axis with parameters sharded on it is ``zero3`` (all-gathered again
   in backward) or ``fsdp_shard_grad_op``, else ``ddp``; a tensor axis is ``megatron_sp``
   when forward reduce-scatters/all-gathers activations over it, else ``megatron_tp``.
4. Parameter groups: by layout (split over the tensor axis, or whole on it — partial when
   its gradient is reduced over it or differs between tensor ranks, else invariant) and by
   gradient program (the reductions and constant scales between its computation and the
   optimizer step). The largest split group is ``dense``; the others are declared.
5. Overrides where the program departs from the strategy's derivation: the reductions
   (``grads[G]: reduce over``), the divisor relative to the loss convention
   (``grads[G]: divide by``, as a product of axis sizes where the numbers allow), the loss
   (``per_device_mean`` from a mean cross-entropy, ``sum``), the token count's reduction,
   the clip-norm reduction.
6. Gradient accumulation: k backward passes before one optimizer step are ``microbatches = k``;
   the loss multiplier is taken relative to 1 / k, and a departure is stated over k at the loss line.

The layout and records live in ``lift_layout``, the gradient programs in ``lift_programs``, the
pipeline in ``lift_pipeline``, the loss, clipping and rendering in ``lift_render``.
"""

from __future__ import annotations

from fractions import Fraction

from .lift_data import data_bindings
from .lift_facts import overflow, split_by_values, unmodelled, unreduced_outputs
from .lift_layout import (
    NOT_LIFTED_KINDS,
    Lifted,
    Unliftable,
    _express,
    _frames,
    _group_name,
    _ident,
    _layout,
    _placement_axes,
)
from .lift_pipeline import P2P_KINDS, _tied_across_stages, find_context_axes, find_pipeline, tied_pairs
from .lift_programs import Programs
from .lift_render import _clip, _empty_spec, _loss, _quoted, _render, _unobserved_loss


def lift(trace: dict, plan_name: str = "traced", path: str = "<trace>") -> Lifted:
    """The spec of what the traced script ran; a trace whose records do not fit the schema is PL612."""
    try:
        return _lift(trace, plan_name)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        from ..diagnostics import Diagnostic, DiagnosticError, Span

        raise DiagnosticError([Diagnostic("PL612", f"a record of the trace does not fit the schema "
                                          f"({type(exc).__name__}: {exc})", Span.point(path, 1, 1))]) from None


def _lift(trace: dict, plan_name: str) -> Lifted:
    script = str(trace.get("script", ""))
    items: list[Unliftable] = []
    notes: list[str] = []
    ranks = {r["rank"]: r for r in trace["ranks"]}
    layout, from_mesh = _layout(trace)
    by_seq = {r: {c["seq"]: c for c in ranks[r]["collectives"]} for r in ranks}

    # the step analysed: the last one that reached the optimizer on rank 0
    steps = [s for s in ranks[0]["steps"] if s.get("optimizer")]
    if not steps:
        items.append(Unliftable((0,), -1, "optimizer step", "no optimizer step was recorded: the script never called "
                                "step() on a torch.optim optimizer", ()))
        return Lifted(_empty_spec(trace, plan_name, layout), plan_name, items, notes)
    step_no = steps[-1]["step"]
    step = {r: next((s for s in ranks[r]["steps"] if s["step"] == step_no), {}) for r in ranks}
    observer = 0

    def coll(c_seq: int, r: int = observer) -> dict:
        return by_seq[r][c_seq]

    # micro-steps: a forward after a backward within one step starts the next accumulated micro-step
    micro: dict[int, dict[int, int]] = {}
    for r in ranks:
        k, last, prev_step, micro[r] = 0, "forward", None, {}
        for c in ranks[r]["collectives"]:
            if c["step"] != prev_step:
                k, last, prev_step = 0, "forward", c["step"]
            if c["phase"] == "forward" and last in ("backward", "after_backward"):
                k += 1
            last = c["phase"]
            # the recorder's count of backward passes where the trace has it (a step whose
            # collectives are all in backward, DDP's, shows no forward collective between them)
            micro[r][c["seq"]] = c.get("micro", k)

    def axes(c: dict, r: int = observer) -> tuple[str, ...]:
        return layout.axes_of(c["ranks"], r) or ()

    # pipeline stages: point-to-point calls between neighbours along one axis
    pipe, pipe_why = find_pipeline(ranks, layout, step_no, observer, script)
    pp = pipe.axis if pipe else None
    # ring attention: sends and recvs along an axis on which every rank computes a loss (a context axis)
    context = find_context_axes(ranks, layout, step_no) if pipe is None else []
    if len(context) > 1:
        for a in context[1:]:
            items.append(Unliftable((observer,), -1, f"axis {a}", "a second axis of ring attention is not lifted "
                                    "(one context axis)", ()))
    # the rank of each stage with the observer's other coordinates (the observer itself without a pipeline)
    stage_ranks = [pipe.rank_of(layout, observer, s) for s in range(pipe.size)] if pipe else [observer]
    loss_rank = stage_ranks[-1]

    # roles
    params = []
    for s, r in enumerate(stage_ranks):
        for p in (step[r].get("optimizer") or {}).get("params", []):
            # stages hold different parameters (their names may repeat): named by stage, read on their rank
            params.append(dict(p, name=f"stage{s}.{p['name']}", own=p["name"], rank=r) if pipe
                          else dict(p, own=p["name"], rank=r))
    unnamed = [p for p in params if p["own"].startswith("<unnamed")]
    if unnamed:
        items.append(Unliftable((observer,), -1, f"{len(unnamed)} of {len(params)} optimizer parameters",
                                "not held by any module seen in forward, nor over the storage of a module's "
                                "parameter (an optimizer over a flat buffer, as a hand-written ZeRO lays the "
                                "parameters end to end): their groups and gradient programs are not lifted reliably", tuple(step[observer]["optimizer"].get("stack", []))))
    first_no = steps[0]["step"]
    initial = {r: {p["name"]: p for s in ranks[r]["steps"] if s["step"] == first_no
                   for p in s.get("optimizer", {}).get("params", [])} for r in ranks}
    roles: dict[str, str] = {}
    for a in layout.names:
        if a == pp:
            roles[a] = "pipeline"
            continue
        if a in context[:1]:
            roles[a] = "context"
            continue
        other = layout.neighbour(observer, a)
        mine = [i["checksum"] for i in step[observer].get("inputs", [])]
        theirs = [i["checksum"] for i in step.get(other, {}).get("inputs", [])] if other is not None else mine
        sharded = any(a in _placement_axes(p, layout) for p in params)
        # activations exchanged over the axis in forward (no parameter carried): the weights are split
        exchanged = any(c["phase"] == "forward" and not c["carried"] and c["kind"] not in ("broadcast", *P2P_KINDS)
                        and a in (layout.axes_of(c["ranks"], observer) or ())
                        for c in ranks[observer]["collectives"] if c["step"] == steps[-1]["step"])
        if mine != theirs:
            roles[a] = "data"
        elif sharded or exchanged or split_by_values(initial, layout, observer, a):
            roles[a] = "tensor"
        else:
            roles[a] = "data"
            notes.append(f"axis {a}: the ranks along it saw the same inputs and hold whole parameters; lifted as a "
                         "data axis")
    # a context axis divides each sequence: its ranks' gradients and token counts are reduced as a data axis's
    data_axes = [a for a in layout.names if roles[a] in ("data", "context")]
    cp = next((a for a in layout.names if roles[a] == "context"), None)
    tensor_axes = [a for a in layout.names if roles[a] == "tensor"]
    if len(tensor_axes) > 1:
        for a in tensor_axes[1:]:
            items.append(Unliftable((observer,), -1, f"axis {a}", "a second axis that splits the weights is not "
                                    "lifted (one tensor axis)", ()))
    tp = tensor_axes[0] if tensor_axes else None
    if not from_mesh:
        taken: set[str] = set()
        rename = {a: _ident({"data": "dp", "pipeline": "pp", "context": "cp"}.get(roles[a], "tp"), taken)
                  for a in layout.names}
        layout.names = [rename[a] for a in layout.names]
        roles = {rename[a]: v for a, v in roles.items()}
        data_axes = [rename[a] for a in data_axes]
        tp = rename[tp] if tp else None
        pp = rename[pp] if pp else None
        cp = rename[cp] if cp else None
        if pipe:
            pipe.axis = pp

    if pipe:
        notes.extend(n.replace("<axis>", pp) for n in pipe.notes)
        for s, r in enumerate(stage_ranks):
            if not step[r].get("optimizer"):
                items.append(Unliftable((r,), -1, f"stage {s} of {pp}", "this stage never stepped an optimizer in "
                                        "the step: its parameters are not lifted", ()))

    # every collective must run over a set of mesh axes (a send or recv: between neighbouring stages of the
    # pipeline axis); experts are not lifted
    bad: dict[tuple, Unliftable] = {}
    for r, part in sorted(ranks.items()):
        for c in part["collectives"]:
            if c["step"] < 0 and c["kind"] not in ("send", "recv", "recv_any_source", "all_to_all"):
                continue  # set-up before the first step (DDP's broadcast, distributing weights by scatter)
            reason = None
            if c["kind"] in P2P_KINDS and cp is not None and layout.along(*c["ranks"][:2]) == cp \
                    and len(c["ranks"]) == 2:
                continue  # ring attention over the context axis
            if c["kind"] in P2P_KINDS and pipe is not None:
                if layout.along(*c["ranks"][:2]) != pp or len(c["ranks"]) != 2:
                    reason = (f"a {c['kind']} between ranks {c['ranks']}, which are not neighbouring stages along "
                              f"the pipeline axis {pp}")
            elif c["kind"] in P2P_KINDS:
                reason = (f"{c['kind']} is not lifted as a pipeline: " + (pipe_why or "the step lifted (the last "
                          "that reached the optimizer) has no send or recv, so no pipeline axis is recognised"))
            elif c["kind"] in NOT_LIFTED_KINDS:
                reason = f"{c['kind']} is not lifted (expert and gather/scatter schedules are not recognised)"
            elif layout.axes_of(c["ranks"], r) is None:
                reason = (f"its group {c['ranks']} is no set of mesh axes of the layout "
                          + ", ".join(f"{n}={s}" for n, s in zip(layout.names, layout.sizes)))
            if reason:
                # one report per call site and reason: the ranks and every call number it covers
                where = tuple((f["file"], f["line"]) for f in c["stack"][:1])
                key = (c["api"], where, reason)
                prev = bad.get(key)
                ranks_ = tuple(sorted(set((prev.ranks if prev else ()) + (r,))))
                calls = (prev.calls if prev else ()) + (c["seq"],)
                bad[key] = Unliftable(ranks_, min(calls), f"{c['kind']} ({c['api']})", reason, tuple(c["stack"]),
                                      calls)
        for u in part["unrecognised"]:
            where = tuple((f["file"], f["line"]) for f in u["stack"][:1])
            key = (u["op"], where, "unrecognised")
            prev = bad.get(key)
            ranks_ = tuple(sorted(set((prev.ranks if prev else ()) + (r,))))
            calls = (prev.calls if prev else ()) + (u["seq"],)
            bad[key] = Unliftable(ranks_, min(calls), u["op"],
                                  "an op of the c10d namespaces the recorder does not recognise", tuple(u["stack"]), calls)
    items.extend(bad.values())

    step_colls = [c for c in ranks[observer]["collectives"] if c["step"] == step_no]
    if tp:
        items.extend(unreduced_outputs(ranks, step, layout, tp, stage_ranks, loss_rank, script))
        rowwise = sorted({c["module"] for c in step_colls if c.get("module") and c["phase"] == "forward"
                          and c["kind"] == "all_reduce" and axes(c) == (tp,)})
        if rowwise:
            notes.append(f"{tp}: the outputs of {', '.join(rowwise[:4])} all-reduced over {tp} in their forward "
                         "(row-parallel), as megatron_tp derives")
    overflow_line, nonlinear, overflow_items = overflow(step_colls, axes, observer, script)
    items.extend(overflow_items)
    items.extend(unmodelled(ranks, step_no, step, loss_rank))
    # strategies
    bindings, binding_frames, no_regather = data_bindings(data_axes, params, layout, step_colls, axes, cp, step,
                                                          observer, items, script)
    if pipe:
        bindings[pp] = pipe.schedule
        binding_frames[pp] = pipe.frames
    sp = False
    if tp:
        sp = any(c["phase"] == "forward" and c["kind"] in ("reduce_scatter", "all_gather") and not c["carried"]
                 and axes(c) == (tp,) for c in step_colls)
        bindings[tp] = "megatron_sp" if sp else "megatron_tp"
        binding_frames[tp] = _frames((c["stack"] for c in step_colls if tp in axes(c) and c["phase"] == "forward"),
                                     script)

    # gradient programs
    programs = Programs(step, by_seq, micro, layout, tuple(data_axes), observer)
    program, every_of = programs.of, programs.every_of

    grads_of = {r: {p["name"]: p for p in step[r].get("optimizer", {}).get("params", [])} for r in ranks}
    info = []
    disagree: dict[tuple, list[str]] = {}
    across: dict[int, list] = {}  # stage -> gradients reduced across the pipeline stages
    ties = tied_pairs(stage_ranks, initial) if pipe else []
    tied = {(s, n) for s0, n0, s1, n1 in ties for s, n in ((s0, n0), (s1, n1))}
    summed: dict[tuple, list] = {}  # tied (stage, name) -> the stacks of its reduction across the stages
    for p in params:
        if p.get("grad") is None:
            notes.append(f"{p['name']}: no gradient at the optimizer step; counted in its layout's group")
        me, own = p["rank"], p["own"]
        reds, const, frames = program(p, me)
        cls = "split"
        numel = 1
        for d in p["shape"]:
            numel *= d
        if pipe and (pipe.stage_of(layout, me), own) in tied:
            if pp in reds:
                summed[(pipe.stage_of(layout, me), own)] = frames
            reds = tuple(a for a in reds if a != pp)  # the tie is stated as unobserved, its reduction with it
        elif pipe and pp in reds:
            across.setdefault(pipe.stage_of(layout, me), []).append((own, me, frames))
        if tp:
            other = layout.neighbour(me, tp)
            mine_plain = not p.get("placements")
            # the values before the first update: replicas start equal, local shards differ
            first_mine = initial.get(me, {}).get(own, {})
            first_theirs = initial.get(other, {}).get(own, {})
            if mine_plain and first_theirs and first_theirs.get("checksum") != first_mine.get("checksum"):
                cls = "split"  # a plain local shard (DDP over tensor-parallel shards): different values per rank
                numel *= layout.size((tp,))
            elif tp in _placement_axes(p, layout):
                cls = "split"
            else:
                theirs = grads_of.get(other, {}).get(own, {}).get("grad") or {}
                differs = (theirs.get("checksum") != (p.get("grad") or {}).get("checksum"))
                cls = "partial" if (tp in reds or differs) else "whole"
        info.append((p, cls, reds, const, frames, numel))
        # every rank must run the same program on this parameter's gradient
        for r in sorted(ranks):
            theirs = grads_of.get(r, {}).get(own)
            if r == me or theirs is None or theirs.get("grad") is None or p.get("grad") is None:
                continue
            if pipe and pipe.stage_of(layout, r) != pipe.stage_of(layout, me):
                continue  # another stage: other parameters
            r_reds, r_const, _ = program(theirs, r)
            if pipe and (pipe.stage_of(layout, me), own) in tied:
                r_reds = tuple(a for a in r_reds if a != pp)
            if (r_reds, r_const) != (reds, const):
                disagree.setdefault((r_reds, r_const, r), []).append(p["name"])

    for s, grads in sorted(across.items()):
        own, me, frames = grads[0]
        items.append(Unliftable((me,), -1, f"the gradient of {own}" + (f" and {len(grads) - 1} more" if len(grads) > 1
                                                                       else "") + f" on stage {s}",
                                f"reduced across the pipeline stages over {pp} (weights shared by stages, such as a "
                                "tied embedding): not lifted", tuple(frames[0] if frames else ())))
    if pipe:
        items.extend(_tied_across_stages(pp, stage_ranks, ties, summed, step, script))

    for (r_reds, r_const, r), names in sorted(disagree.items(), key=lambda kv: kv[0][2]):
        mine = next(e for e in info if e[0]["name"] == names[0])
        items.append(Unliftable((r,), -1, f"the gradient program of {names[0]}"
                                + (f" and {len(names) - 1} more" if len(names) > 1 else ""),
                                f"rank {r} reduces it over ({', '.join(r_reds)}) and scales it by {r_const}, rank "
                                f"{mine[0]['rank']} over ({', '.join(mine[2])}) by {mine[3]}: ranks that disagree are not "
                                "one plan", tuple(step[r]["optimizer"].get("stack", []))))

    # loss convention
    # gradient accumulation: k backward passes accumulate into one optimizer step; the loss
    # multiplier is taken relative to the whole step (every micro-batch's tokens)
    # (with a pipeline: on the last stage, which computes the loss; its backward passes are the microbatches)
    accum = max(1, len(step[loss_rank].get("losses", [])))
    loss_colls = [c for c in ranks[loss_rank]["collectives"] if c["step"] == step_no]
    loss_kind, w, loss_frames, tokens_axes, tokens_equal = _loss(step, layout, data_axes, loss_rank, loss_colls,
                                                                  tp, notes, script, accum)
    items.extend(_unobserved_loss(step[loss_rank], loss_rank))
    if pipe:
        accum = pipe.microbatches
    elif accum > 1:
        notes.append(f"{accum} backward passes accumulate into each optimizer step: lifted as microbatches = {accum}")
    if accum > 1:
        repeated = [e for e in info if len(e[2]) != len(set(e[2]))]
        if repeated:
            # synchronised on more than one micro-step, not as one average each (averages are lifted as
            # reduce_every_microbatch): the later reductions also carry the earlier micro-steps' already
            # reduced part, which one program per gradient cannot state
            first = repeated[0]
            items.append(Unliftable((observer,), -1, "backward", f"{len(repeated)} gradients reduced on more than one "
                                    f"of the {accum} accumulated backward passes (no no_sync), not each an average "
                                    "over its group: the earlier micro-steps' reduced part is reduced again, and "
                                    "the accumulated reductions are not lifted", tuple(first[4][0] if first[4] else ())))
    data_size = layout.size(data_axes)
    default_div = Fraction(data_size) if loss_kind == "per_device_mean" else Fraction(1)

    # groups: by class, then by program
    groups: dict[tuple, list] = {}
    for entry in info:
        p, cls, reds, const, frames, numel = entry
        groups.setdefault((cls, reds, const), []).append(entry)
    split_keys = sorted((k for k in groups if k[0] == "split"), key=lambda k: -sum(e[5] for e in groups[k]))
    taken: set[str] = set(layout.names)
    named: list[tuple[str, tuple, list]] = []
    for k in sorted(groups, key=lambda k: (k != (split_keys[0] if split_keys else None), k[0], -len(groups[k]))):
        members = groups[k]
        if split_keys and k == split_keys[0]:
            named.append(("dense", k, members))
        else:
            named.append((_group_name([e[0]["name"] for e in members], taken), k, members))

    # the plan's lines, with the script lines behind them
    lines: list[tuple[str, list[dict]]] = []
    # replicate x shard over two data axes is HYBRID_SHARD: the library's two-axis strategy
    hybrid = None
    if len(data_axes) == 2 and [bindings[a] for a in data_axes] == ["ddp", "zero3"]:
        hybrid = tuple(data_axes)
    for a in layout.names:
        if hybrid and a == hybrid[0]:
            lines.append((f"  [{hybrid[0]}, {hybrid[1]}]: hybrid_shard",
                          _frames([[f] for x in hybrid for f in binding_frames.get(x, [])], script)))
        elif not (hybrid and a == hybrid[1]):
            lines.append((f"  {a}: {bindings[a]}", binding_frames.get(a, [])))
    if loss_kind == "per_device_mean":
        lines.append(("  override loss: per_device_mean", loss_frames))
    elif loss_kind == "sum":
        lines.append(("  override loss: sum", loss_frames))
    if tokens_equal and loss_kind != "sum":
        lines.append(("  override tokens: equal  # observed: every rank held the same number of tokens, no padding",
                      loss_frames))
    elif tokens_axes is not None and loss_kind != "sum" and sorted(tokens_axes[0]) != sorted(data_axes):
        lines.append((f"  override tokens: reduce over ({', '.join(tokens_axes[0])})", tokens_axes[1]))
    if every_of:
        # averaged on every accumulated micro-step (DDP without no_sync): one reduction per gradient,
        # made once per microbatch
        reduced = [e for e in info if e[2]]
        stacks = [every_of[e[0]["name"]] for e in reduced if e[0]["name"] in every_of]
        if len(stacks) == len(reduced):
            lines.append(("  override grads: reduce_every_microbatch  # observed: the gradients all-reduced after "
                          f"each of the {accum} backward passes", _frames(stacks[:1], script)))
        else:
            items.append(Unliftable((observer,), -1, "backward",
                                    f"{len(stacks)} of {len(reduced)} reduced gradients are all-reduced after every "
                                    "accumulated backward pass, the others once per step: one plan reduces its "
                                    "gradient buffer one way", tuple(stacks[0])))
    recomputed = step[observer].get("recomputed") or []
    if recomputed:
        kinds = sorted({x["module"] for x in recomputed})
        lines.append((f"  use full_recompute  # observed: layers with weights ({', '.join(kinds[:4])}) ran their "
                      "forward again during backward", _frames([x.get("stack", []) for x in recomputed[:1]], script)))
        notes.append("layers ran their forward again during backward (activation checkpointing): lifted as "
                     "full_recompute; a checkpointed function of no layer (selective recomputation of the "
                     "attention scores) is not seen, which changes activations only")
    for _axis, frames in no_regather[:1]:
        lines.append(("  override params: no_regather  # the updated optimizer shards are never sent back", frames))
    for gname, (cls, reds, const), members in named:
        expected = sorted(data_axes + ([tp] if (tp and cls == "partial" and sp) else []))
        target = "grads" if len(named) == 1 else f"grads[{gname}]"
        frames = _frames((st for e in members for st in e[4]), script)
        opt_frames = _frames([step[observer]["optimizer"].get("stack", [])], script)
        if sorted(reds) != expected:
            lines.append((f"  override {target}: reduce over ({', '.join(reds)})", frames or opt_frames))
        q = (1 / const) / w
        if q != default_div:
            expr = _express(q, layout, [tuple(sorted(set(reds)))] + [tuple(data_axes)])
            if accum > 1 and w != 1:
                # the micro-steps' loss multiplier departs from 1 / k: stated over k, at the loss line
                whole = _express(q * accum, layout, [tuple(sorted(set(reds)))] + [tuple(data_axes)])
                # with a pipeline the departure is the microbatches' (its schedule scales them): 1 / k, not an axis
                expr = f"{whole} / {accum}" if whole not in (None, "1") else (f"1 / {accum}" if whole and pipe else expr)
                frames = loss_frames or frames
            if expr is None:
                expr = str(q)
                notes.append(f"grads[{gname}]: divided by {q}, which is no product of mesh sizes: lifted as a "
                             "constant, so the proof holds at these sizes only")
            lines.append((f"  override {target}: divide by {expr}", frames or opt_frames))
    clip = _clip([c for c in step_colls if c["seq"] not in nonlinear], params, layout, axes, info, tp, data_axes, script, pp)
    if clip is not None:
        lines.append(clip)
    if overflow_line is not None:
        lines.append(overflow_line)

    # what was not lifted is stated in the plan itself, so `placement check` of the lifted spec proves nothing
    # about the script either (every obligation it would prove is unknown, naming these)
    for what in dict.fromkeys(u.what for u in items):
        lines.append((f'  unobserved "{_quoted(what)} (not lifted: see placement lift)"', []))
    text, origins = _render(trace, plan_name, layout, roles, bindings, named, lines, loss_kind, step[observer], notes,
                            script, accum, pipe is not None)
    return Lifted(text, plan_name, items, notes, origins,
                  {g: [e[0]["name"] for e in members] for g, _, members in named})

