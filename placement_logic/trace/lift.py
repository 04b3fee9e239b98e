"""Lift a trace into a ``.place`` spec: what the script really did, as a plan (no torch).

Input: a trace (``schema``). Output: a ``Lifted``: the spec text, every recorded call that
could not be lifted (rank, call order, the user's line, why), notes, and for each line of
the spec the script lines it was lifted from (so a finding of the checker points back at
the script).

Steps, on the last step of the trace that reached the optimizer:

1. Mesh axes: the DeviceMesh the script built (its dimension names and rank layout);
   without one, the process groups seen, factored into a 1-D or 2-D layout. Every
   collective's group must be the ranks that differ from the caller along a set of axes, or a block of
   B consecutive ranks of one axis, a strided group or the first K ranks of one (``lift_blocks``:
   ``grads: reduce_blocks`` / ``reduce_strided`` / ``reduce_first over (AXIS) by E``).
2. Roles: an axis along which ranks send and receive activations and gradients to their
   neighbours is a pipeline axis (``lift_pipeline``: stages, microbatches, schedule); one along
   which ranks that all compute a loss exchange in forward and backward is a context axis (ring
   attention: ``context_parallel``, its reductions and token counts read as a data axis's), as is one over which
   a forward all-gather's output is the logits of every cross-entropy (``lift_gathered``: ``override loss:
   on_gathered_sequence``, the token count's axes then always stated); of the
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
6. Per-rank departures (``lift_perrank``): a clip coefficient or a divisor on a set of an axis's ranks, every
   rank of the axis compared (``grads: clip_rank0_only`` / ``divide_rank0_only`` on rank 0,
   ``divide_except_last`` / ``divide_last_only``, else ``clip_on_ranks`` / ``divide_on_ranks ... ranks (R, ...)``),
   the chunks of every sequence each context rank holds (``layout[inputs|labels|position_ids]``,
   ``lift_cplayout``), a DDP module registered in another parameter order on
   some ranks (``grads: bucket_order``), an epsilon on each rank's norm piece before its all-reduce
   (``clip_norm: eps_before_reduce``) or on some ranks' (``eps_on_ranks``), the balancing loss added or scaled on
   some ranks (``loss[aux]: on_ranks`` / ``divide_on_ranks``, ``lift_termranks``); a loss scale updated from each rank's own found-inf flag
   (``loss_scale: local``, ``lift_facts``). Clip coefficients of different values on ranks that hold the gradient
   all-reduced over an axis (``lift_clipvalues``): named, no statement holds them.
7. Gradient accumulation: k backward passes before one optimizer step are ``microbatches = k``;
   the loss multiplier is taken relative to 1 / k, and a departure is stated over k at the loss line.
   Gradient buffers found uncleared at a step's first backward (``lift_timing``): never cleared again,
   ``grads: no_zero_grad``; cleared every K optimizer steps of one backward each, ``microbatches = K`` and
   ``optimizer: step_every_microbatch``. An accumulating buffer all-reduced again after every micro-step
   (``lift_rereduce``): summed in place, ``grads: reduce_summed_every_microbatch``; a copy added into a
   separate accumulator, ``grads: reduce_accumulated_every_microbatch``.
8. The loss's terms (``lift_terms``, before any pass reads the loss): label smoothing and the logit z-loss
   (``losses { label_smoothing  logit_z_loss }``, ``activations[loss]: reduce_smoothing | reduce_zloss over``
   under a vocabulary-parallel output), a loss mask on the per-token losses, a token count that includes the
   ignored labels (``tokens: count_ignored``); padding an attention mask alone marks, counted as tokens, is
   named (``lift_padding``: PL614), and read as padding by the capacity step and the balancing loss.
9. Checkpoints (``lift_checkpoint``): who saves which state, whose file each rank loads, whose RNG state it
   restores, as ``override checkpoint`` statements (``resume``, ``save_rank0``, ``save_from``, ``skip_optimizer``,
   ``no_regather_after_load``, ``rng_shared``).

The lift is a sequence of named passes over one typed input (``Step``: the trace read once, the
step analysed, every rank's record of it), each adding what it cannot lift to ``Step.items``:
``read_step``, ``pipeline_pass`` (stages or a context axis), ``params_pass``, ``axes_pass`` (roles),
``calls_pass`` (every call on a set of mesh axes), ``terms_pass`` (``lift_terms``), ``facts_pass`` (``lift_activations``: layers left
partial and input gradients never reduced over the tensor axis, as activation overrides; ``lift_partialops``: the
bias or a residual added before a row-parallel all-reduce; ``lift_facts``: overflow
flags, what no plan statement reads), ``strategies_pass``; then, in ``lift_plan``,
``gradients_pass``, ``loss_pass``, ``groups_pass`` and ``overrides_pass``; ``aux_lines`` (``lift_auxloss``: the
balancing loss ``terms_pass`` read, its statistics' groups and the router's group); ``capacity_lines``
(``lift_capacity``: the MoE dispatch's capacity step, padding routed or masked); ``router_lines`` (``lift_router``:
the router's choice on the tensor ranks, its noise drawn per rank or its input partial).

The layout and records live in ``lift_layout``, the gradient programs in ``lift_programs``, the
pipeline in ``lift_pipeline``, the loss, clipping and rendering in ``lift_render``.
"""

from __future__ import annotations

from ..diagnostics import Code
from .lift_activations import input_grad_reductions, unreduced_input_grads, unreduced_outputs
from .lift_asserted import asserted, dropout_seeds
from .lift_auxloss import aux_lines
from .lift_blocks import block_lines, find_blocks
from .lift_capacity import capacity_lines, router_width
from .lift_checkpoint import checkpoint_pass
from .lift_clipvalues import clip_values
from .lift_cplayout import layout_lines
from .lift_data import data_bindings
from .lift_facts import SEEDING, init_apart, local_overflow, overflow, split_by_values, unmodelled
from .lift_gathered import gathered_axes, gathered_lines
from .lift_layout import NOT_LIFTED_KINDS, Lifted, Unliftable, _frames, _ident, _layout, _placement_axes
from .lift_padding import padded_tokens
from .lift_partialops import partial_ops
from .lift_perrank import bucket_order, per_rank_pass, rank0_lines
from .lift_pipeline import P2P_KINDS, find_context_axes, find_pipeline
from .lift_render import _clip, _empty_spec, _quoted, _render
from .lift_router import router_lines
from .lift_step import AXIS_NAMES, Axes, LiftRole, Step, Strategies
from .lift_termranks import norm_eps, term_ranks
from .lift_terms import ignored_count, terms_pass
from .lift_timing import read_timing, timing_lines


def lift(trace: dict, plan_name: str = "traced", path: str = "<trace>",
         objective: dict[str, str] | None = None) -> Lifted:
    """The spec of what the traced script ran; a trace whose records do not fit the schema is PL612. ``objective``:
    the intended objective of a lifted term (``aux_stats``: the balancing loss's; default single-device training's)."""
    try:
        return _lift(trace, plan_name, objective or {})
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        from ..diagnostics import Diagnostic, DiagnosticError, Span

        raise DiagnosticError([Diagnostic(Code.BAD_TRACE, f"a record of the trace does not fit the schema "
                                          f"({type(exc).__name__}: {exc})", Span.point(path, 1, 1))]) from None


def _lift(trace: dict, plan_name: str, objective: dict[str, str]) -> Lifted:
    from .lift_plan import gradients_pass, groups_pass, loss_pass, overrides_pass, tie_pass

    st = read_step(trace, plan_name)
    if isinstance(st, Lifted):
        return st
    ax = pipeline_pass(st)
    params = params_pass(st, ax)
    axes_pass(st, ax, params)
    calls_pass(st, ax)
    loss_model, loss_lines = terms_pass(st, ax)  # the loss's terms and mask, before anything reads the loss
    overflow_line, nonlinear = facts_pass(st, ax)
    strategies = strategies_pass(st, ax, params)
    scale_line, st.items[:] = local_overflow(st.items, overflow_line, strategies.bindings, st.script, st.notes)
    departures = per_rank_pass(st, ax, params)  # clips and divisors on rank 0 of an axis only
    clip_values(st, ax.pp)  # clip coefficients of different values on replicas (lift_clipvalues): named
    order_line, order_items = bucket_order(st, strategies.bindings)
    st.items.extend(order_items)
    first = next((s for s in st.ranks[st.observer]["steps"] if s.get("optimizer")), {})
    init_line, st.items[:] = init_apart(st.items, st.initial, st.layout, st.observer, strategies.bindings,
                                        first.get("optimizer", {}).get("stack", []), st.script)
    timing = read_timing(st, ax.pipe is not None)  # an accumulation window stepped every micro-step (lift_timing)
    st.window = timing.window
    grads = gradients_pass(st, ax, params)
    loss = loss_pass(st, ax, grads)
    named = groups_pass(st, grads)
    lines = overrides_pass(st, ax, params, strategies, grads, loss, named)
    counted = ignored_count(st, ax.loss_rank)
    st.items.extend(padded_tokens(st))  # padding an attention mask marks, counted as tokens (lift_padding)
    if counted is not None and loss.kind != "sum":
        lines.append(("  override tokens: count_ignored  # observed: the count all-reduced is the positions, "
                      "ignored labels included", counted))
    lines.extend(loss_lines)
    lines.extend(gathered_lines(st, ax, loss.tokens_axes is not None, loss.kind))  # lift_gathered
    lines.extend(timing_lines(st, timing, {g: [e[0]["name"] for e in members] for g, _, members in named}))
    aux_readings, term_plan = term_ranks(st, st.aux_readings)  # the term on some ranks only (lift_termranks)
    aux_model, aux_groups, aux_plan = aux_lines(st, aux_readings, named, loss.kind, loss.accum,
                                                objective.get("aux_stats"))
    lines.extend(aux_plan + (term_plan if aux_plan else []))  # the balancing loss's statistics (lift_auxloss)
    cap_model, cap_plan = capacity_lines(st, router_width(named))
    lines.extend(cap_plan)  # the MoE dispatch's capacity step (lift_capacity)
    router_model, router_plan = router_lines(st, ax, strategies.sp, bool(cap_model))
    lines.extend(router_plan)  # the router's choice on the tensor ranks (lift_router)
    lines.extend(rank0_lines(st, departures, named))
    if ax.cp not in ax.gathered:  # a gathered sequence: every context rank holds every label
        lines.extend(layout_lines(st, ax))  # the chunks of every sequence each context rank holds
    lines.extend(block_lines(st, params, named, any((e[0].get("grad") or {}).get("dynamic_scales")
                                                   for e in grads.info)))
    tied = tie_pass(st, grads, named)
    if grads.tie is not None and grads.tie.line is not None:
        lines.append(grads.tie.line)
    clip = _clip([c for c in st.colls if c["seq"] not in nonlinear], params, st.layout, st.axes, grads.info, ax.tp,
                 ax.data_axes, st.script, ax.pp)
    eps = norm_eps(st, grads.info)
    lines.extend(x for x in (clip, eps, overflow_line, scale_line, order_line, init_line) if x is not None)
    lines.extend(st.activation_lines)
    lines.extend(_checkpoint(st, ax, strategies, named))
    # what was not lifted is stated in the plan itself, so `placement check` of the lifted spec proves nothing
    # about the script either (every obligation it would prove is unknown, naming these)
    for what in dict.fromkeys(u.what for u in st.items):
        lines.append((f'  unobserved "{_quoted(what)} (not lifted: see placement lift)"', []))
    text, origins = _render(trace, plan_name, st.layout, ax.roles, strategies.bindings, named, lines, loss.kind,
                            st.step[st.observer], st.notes, st.script, loss.accum, ax.pipe is not None, tied,
                            loss_model + aux_model, aux_groups + cap_model + router_model)
    return Lifted(text, plan_name, st.items, st.notes, origins,
                  {g: [e[0]["name"] for e in members] for g, _, members in named})


def _checkpoint(st: Step, ax: Axes, strategies: Strategies, named) -> list[tuple[str, list]]:
    """The checkpoint statements (``lift_checkpoint``): the dropout seed varies over the sequence-parallel tensor
    axis, or where a ``dropout_seed: vary`` was lifted."""
    vary = [ax.tp] if ax.tp and strategies.sp else []
    vary += [a.strip() for t, _ in st.activation_lines if "dropout_seed: vary over (" in t
             for a in t.split("over (")[1].split(")")[0].split(",")]
    whole = any(k[0] != "split" for _, k, _ in named)
    return checkpoint_pass(st, ax, strategies.bindings, whole, tuple(dict.fromkeys(vary)))


def read_step(trace: dict, plan_name: str) -> Step | Lifted:
    """The step analysed and the micro-step of every call; a trace with no optimizer step lifts to no plan."""
    ranks = {r["rank"]: r for r in trace["ranks"]}
    layout, from_mesh = _layout(trace)
    find_blocks(trace, layout)  # process groups of consecutive ranks of an axis: read as over the axis
    steps = [s for s in ranks[0]["steps"] if s.get("optimizer")]
    if not steps:
        items = [Unliftable((0,), -1, "optimizer step", "no optimizer step was recorded: the script never called "
                            "step() on a torch.optim optimizer", ())]
        return Lifted(_empty_spec(trace, plan_name, layout), plan_name, items, [])
    step_no = steps[-1]["step"]
    first_no = steps[0]["step"]
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
    return Step(
        trace, str(trace.get("script", "")), ranks, layout, from_mesh,
        {r: {c["seq"]: c for c in ranks[r]["collectives"]} for r in ranks}, steps, step_no,
        {r: next((s for s in ranks[r]["steps"] if s["step"] == step_no), {}) for r in ranks},
        {r: {p["name"]: p for s in ranks[r]["steps"] if s["step"] == first_no
             for p in s.get("optimizer", {}).get("params", [])} for r in ranks},
        micro)


def pipeline_pass(st: Step) -> Axes:
    """Pipeline stages (point-to-point calls between neighbours along one axis), else a ring-attention axis."""
    pipe, pipe_why = find_pipeline(st.ranks, st.layout, st.step_no, st.observer, st.script)
    # ring attention: sends and recvs along an axis on which every rank computes a loss (a context axis)
    context = find_context_axes(st.ranks, st.layout, st.step_no) if pipe is None else []
    for a in context[1:]:
        st.items.append(Unliftable((st.observer,), -1, f"axis {a}", "a second axis of ring attention is not lifted "
                                   "(one context axis)", ()))
    stage_ranks = [pipe.rank_of(st.layout, st.observer, s) for s in range(pipe.size)] if pipe else [st.observer]
    return Axes(pipe, pipe_why, context, stage_ranks, pp=pipe.axis if pipe else None)


def params_pass(st: Step, ax: Axes) -> list[dict]:
    """Every stage's optimizer parameters, read on that stage's rank (named by stage under a pipeline)."""
    params = []
    for s, r in enumerate(ax.stage_ranks):
        for p in (st.step[r].get("optimizer") or {}).get("params", []):
            # stages hold different parameters (their names may repeat): named by stage, read on their rank
            params.append(dict(p, name=f"stage{s}.{p['name']}", own=p["name"], rank=r) if ax.pipe
                          else dict(p, own=p["name"], rank=r))
    unnamed = [p for p in params if p["own"].startswith("<unnamed")]
    if unnamed:
        st.items.append(Unliftable(
            (st.observer,), -1, f"{len(unnamed)} of {len(params)} optimizer parameters",
            "not held by any module seen in forward, nor over the storage of a module's parameter (an optimizer "
            "over a flat buffer, as a hand-written ZeRO lays the parameters end to end): their groups and gradient "
            "programs are not lifted reliably", tuple(st.step[st.observer]["optimizer"].get("stack", []))))
    return params


def axes_pass(st: Step, ax: Axes, params: list[dict]) -> None:
    """The role of every axis (data, tensor, pipeline, context), and the axes named by role without a mesh."""
    layout, observer = st.layout, st.observer
    roles = ax.roles
    for a in layout.names:
        if a == ax.pp:
            roles[a] = LiftRole.PIPELINE
            continue
        if a in ax.context[:1]:
            roles[a] = LiftRole.CONTEXT
            continue
        other = layout.neighbour(observer, a)
        mine = [i["checksum"] for i in st.step[observer].get("inputs", [])]
        theirs = [i["checksum"] for i in st.step.get(other, {}).get("inputs", [])] if other is not None else mine
        sharded = any(a in _placement_axes(p, layout) for p in params)
        # activations exchanged over the axis in forward (no parameter carried): the weights are split
        exchanged = any(c["phase"] == "forward" and not c["carried"] and c["kind"] not in ("broadcast", *P2P_KINDS)
                        and a in (layout.axes_of(c["ranks"], observer) or ()) for c in st.colls)
        if mine != theirs:
            roles[a] = LiftRole.DATA
        elif sharded or exchanged or split_by_values(st.initial, layout, observer, a):
            roles[a] = LiftRole.TENSOR
        else:
            roles[a] = LiftRole.DATA
            st.notes.append(f"axis {a}: the ranks along it saw the same inputs and hold whole parameters; lifted as "
                            "a data axis")
    ax.gathered, ax.gathered_frames = gathered_axes(st, ax, params)  # a loss on a gathered sequence: context
    # a context axis divides each sequence: its ranks' gradients and token counts are reduced as a data axis's
    ax.data_axes = [a for a in layout.names if roles[a] in (LiftRole.DATA, LiftRole.CONTEXT)]
    ax.cp = next((a for a in layout.names if roles[a] is LiftRole.CONTEXT), None)
    tensor_axes = [a for a in layout.names if roles[a] is LiftRole.TENSOR]
    for a in tensor_axes[1:]:
        st.items.append(Unliftable((observer,), -1, f"axis {a}", "a second axis that splits the weights is not "
                                   "lifted (one tensor axis)", ()))
    ax.tp = tensor_axes[0] if tensor_axes else None
    if not st.from_mesh:
        taken: set[str] = set()
        rename = {a: _ident(AXIS_NAMES[roles[a]], taken)
                  for a in layout.names}
        layout.names = [rename[a] for a in layout.names]
        ax.roles = {rename[a]: v for a, v in roles.items()}
        ax.data_axes = [rename[a] for a in ax.data_axes]
        ax.tp, ax.pp, ax.cp = (rename[a] if a else None for a in (ax.tp, ax.pp, ax.cp))
        ax.gathered = tuple(rename[a] for a in ax.gathered)
        if ax.pipe:
            ax.pipe.axis = ax.pp
    if ax.pipe:
        st.notes.extend(n.replace("<axis>", ax.pp) for n in ax.pipe.notes)
        for s, r in enumerate(ax.stage_ranks):
            if not st.step[r].get("optimizer"):
                st.items.append(Unliftable((r,), -1, f"stage {s} of {ax.pp}", "this stage never stepped an "
                                           "optimizer in the step: its parameters are not lifted", ()))


def _call_reason(st: Step, ax: Axes, c: dict, r: int) -> str | None:
    """Why a recorded call is not lifted, or None (lifted, or set-up before the first step)."""
    layout, pipe = st.layout, ax.pipe
    if c["step"] < 0 and c["kind"] not in ("send", "recv", "recv_any_source", "all_to_all"):
        return None  # set-up before the first step (DDP's broadcast, distributing weights by scatter)
    if c["kind"] in P2P_KINDS and ax.cp is not None and layout.along(*c["ranks"][:2]) == ax.cp \
            and len(c["ranks"]) == 2:
        return None  # ring attention over the context axis
    if c["kind"] in P2P_KINDS and pipe is not None:
        if layout.along(*c["ranks"][:2]) != ax.pp or len(c["ranks"]) != 2:
            return (f"a {c['kind']} between ranks {c['ranks']}, which are not neighbouring stages along the "
                    f"pipeline axis {ax.pp}")
        return None
    if c["kind"] in P2P_KINDS:
        return (f"{c['kind']} is not lifted as a pipeline: " + (ax.pipe_why or "the step lifted (the last that "
                "reached the optimizer) has no send or recv, so no pipeline axis is recognised"))
    if c["kind"] in NOT_LIFTED_KINDS:
        return f"{c['kind']} is not lifted (expert and gather/scatter schedules are not recognised)"
    if layout.axes_of(c["ranks"], r) is None:
        return (f"its group {c['ranks']} is no set of mesh axes of the layout "
                + ", ".join(f"{n}={s}" for n, s in zip(layout.names, layout.sizes)))
    return None


def calls_pass(st: Step, ax: Axes) -> None:
    """Every collective must run over a set of mesh axes (a send or recv: between neighbouring stages of the
    pipeline axis); experts are not lifted. One report per call site and reason, with every rank and call."""
    bad: dict[tuple, Unliftable] = {}

    def report(key, r, seq, what, reason, stack):
        prev = bad.get(key)
        ranks_ = tuple(sorted(set((prev.ranks if prev else ()) + (r,))))
        calls = (prev.calls if prev else ()) + (seq,)
        bad[key] = Unliftable(ranks_, min(calls), what, reason, tuple(stack), calls)

    for r, part in sorted(st.ranks.items()):
        for c in part["collectives"]:
            reason = _call_reason(st, ax, c, r)
            if reason:
                where = tuple((f["file"], f["line"]) for f in c["stack"][:1])
                report((c["api"], where, reason), r, c["seq"], f"{c['kind']} ({c['api']})", reason, c["stack"])
        for u in part["unrecognised"]:
            where = tuple((f["file"], f["line"]) for f in u["stack"][:1])
            report((u["op"], where, "unrecognised"), r, u["seq"], u["op"],
                   "an op of the c10d namespaces the recorder does not recognise", u["stack"])
    st.items.extend(bad.values())


def facts_pass(st: Step, ax: Axes) -> tuple[tuple | None, set[int]]:
    """Layers left partial and input gradients never reduced over the tensor axis (activation overrides, kept in
    ``st.activation_lines``), a custom backward's input-gradient sum over it, overflow flags, and what no plan
    statement reads: (the overflow line, the non-linear reductions read as flags)."""
    colls = st.colls
    custom_ok: set[str] = set()
    if ax.tp:
        sp = any(c["phase"] == "forward" and c["kind"] in ("reduce_scatter", "all_gather") and not c["carried"]
                 and st.axes(c) == (ax.tp,) for c in colls)
        items, lines = unreduced_outputs(st.ranks, st.step, st.layout, ax.tp, ax.stage_ranks, ax.loss_rank,
                                         st.script)
        if not items and not lines and not ax.pipe and not sp:  # sequence parallelism: norms' gradients partial
            first = {r: next((s for s in part["steps"] if s["step"] == st.steps[0]["step"]), {})
                     for r, part in st.ranks.items()}
            items, lines = unreduced_input_grads(st.ranks, first, st.step, st.layout, ax.tp, st.observer,
                                                    st.script)
        st.items.extend(items)
        st.activation_lines.extend(lines)
        items, lines = partial_ops(st.step, st.ranks, st.layout, ax.tp, st.script)  # the bias before the reduce
        st.items.extend(items)
        st.activation_lines.extend(lines)
        rowwise = sorted({c["module"] for c in colls if c.get("module") and c["phase"] == "forward"
                          and c["kind"] == "all_reduce" and st.axes(c) == (ax.tp,)})
        if rowwise:
            st.notes.append(f"{ax.tp}: the outputs of {', '.join(rowwise[:4])} all-reduced over {ax.tp} in their "
                            "forward (row-parallel), as megatron_tp derives")
        custom_ok = input_grad_reductions(st.ranks, st.layout, ax.tp, sp)
        if custom_ok:
            st.notes.append(f"{ax.tp}: the input gradients all-reduced over {ax.tp} in the backward of "
                            f"{', '.join(sorted(custom_ok))} (column-parallel), as megatron_tp derives")
    overflow_line, nonlinear, overflow_items = overflow(colls, st.axes, st.observer, st.script, ax.tp)
    st.items.extend(overflow_items)
    lifted = {f"a collective (all_reduce) in the backward of the custom autograd function {fn}" for fn in custom_ok}
    st.items.extend(u for u in unmodelled(st.ranks, st.step_no, st.step, ax.loss_rank) if u.what not in lifted)
    items, lines = asserted(st.ranks, st.step_no, st.layout, ax.tp, st.script)  # DTensor.from_local's placements
    seed_line, seed_items = dropout_seeds(st.ranks, st.layout, ax.tp, st.script)
    items += seed_items
    if seed_line is not None:  # the ranks seeded apart, seen in the masks of a replicated region: a refutation
        lines.append(seed_line)
        # the losses that differ between the tensor ranks differ by those masks
        st.items[:] = [u for u in st.items if u.what not in (SEEDING, f"the loss over {ax.tp}")]
    st.items.extend(items)
    # a region's output asserted Replicate: the cause of its partial sums never reduced, lifted at the assertion
    regions = {t.split("]")[0] for t, _ in lines}
    st.activation_lines[:] = [x for x in st.activation_lines if not (x[0].split("]")[0] in regions
                                                                     and ": reduce over ()" in x[0])] + lines
    return overflow_line, nonlinear


def strategies_pass(st: Step, ax: Axes, params: list[dict]) -> Strategies:
    """The strategy of every axis: data axes by ``data_bindings``, the pipeline's schedule, the tensor axis."""
    colls = st.colls
    bindings, binding_frames, no_regather = data_bindings(ax.data_axes, params, st.layout, colls, st.axes, ax.cp,
                                                          st.step, st.observer, st.items, st.script)
    if ax.pipe:
        bindings[ax.pp] = ax.pipe.schedule
        binding_frames[ax.pp] = ax.pipe.frames
    sp = False
    if ax.tp:
        sp = any(c["phase"] == "forward" and c["kind"] in ("reduce_scatter", "all_gather") and not c["carried"]
                 and st.axes(c) == (ax.tp,) for c in colls)
        bindings[ax.tp] = "megatron_sp" if sp else "megatron_tp"
        binding_frames[ax.tp] = _frames((c["stack"] for c in colls if ax.tp in st.axes(c)
                                         and c["phase"] == "forward"), st.script)
    return Strategies(bindings, binding_frames, no_regather, sp)
