"""The loss convention, the clip-norm reduction and the rendering of a lifted spec."""

from __future__ import annotations

import re
from fractions import Fraction

from ..ir.groups import GradClass, Holding
from .lift_layout import Unliftable, _frames, _Layout, _placement_axes


def _loss(step, layout: _Layout, data_axes, observer, step_colls, tp, notes, script="", accum=1):
    """(kind, loss multiplier w, frames, (token axes, frames) or None, tokens equal).

    ``w`` is relative to the whole optimizer step: with ``accum`` micro-steps, a multiplier read
    against one micro-step's normaliser (a per-device mean, or a token count reduced per
    micro-step) is multiplied by ``accum``; one read against the step's token count (the
    token sum over every micro-step's cross-entropy) is not.
    """
    mine = step[observer]
    nll = mine.get("nll", [])
    losses = mine.get("losses", [])
    if not nll or not losses:
        notes.append("no cross-entropy (nll_loss) was recorded: the loss normalisation is assumed to be the global "
                     "token mean, scaled by the data-parallel size as DDP expects")
        return "global_mean", Fraction(layout.size(data_axes)), [], None, False
    first = nll[0]
    frames = _frames([first["stack"]], script)
    value = Fraction(losses[0]["value"]).limit_denominator(1 << 24)
    nll_value = Fraction(first["value"]).limit_denominator(1 << 24)
    # the ranks holding distinct data: one per data coordinate (the observer's tensor and pipeline coordinates)
    fixed = [i for i, a in enumerate(layout.names) if a not in data_axes]
    me = layout.coords[observer]
    data_ranks = [r for r, c in layout.coords.items() if all(c[i] == me[i] for i in fixed)]
    counts = [sum(n["tokens"] for n in step[r].get("nll", [])) for r in data_ranks]
    positions = [sum(n["positions"] for n in step[r].get("nll", [])) for r in data_ranks]
    total = sum(counts)
    equal = len(set(counts)) == 1 and counts == positions
    tokens_axes = None
    per_micro = False  # the reduced token count is one micro-step's, not the step's
    mine_total = sum(n["tokens"] for n in nll)
    # the count may hold the positions (ignored labels included: ``tokens: count_ignored``, lift_terms)
    whole = (float(mine_total), float(sum(n["positions"] for n in nll)))
    for c in step_colls:
        if c["phase"] in ("before_forward", "forward") and c["kind"] == "all_reduce" and c["numel"] == 1 and \
                c.get("value_in") in (float(first["tokens"]), float(first["positions"]), *whole):
            per_micro = accum > 1 and c.get("value_in") not in whole
            tokens_axes = (layout.axes_of(c["ranks"], observer) or (), _frames([c["stack"]], script),
                           c.get("value_out"))
    if nll_value == 0:
        return "global_mean", Fraction(1), frames, tokens_axes, equal
    if first["reduction"] == "mean":
        c = _nice(value / nll_value)
        return "per_device_mean", c * accum, frames, None, equal
    if first["reduction"] == "sum":
        if _nice(value / nll_value) == 1:
            return "sum", Fraction(1), frames, None, False
        if tokens_axes is not None and tokens_axes[0]:
            # normalised by the count summed over the token axes: the multiplier on top of it
            reduced = tokens_axes[2] if tokens_axes[2] is not None else sum(counts)
            w = _nice(value * Fraction(reduced) / nll_value)
            return "global_mean", w * accum if per_micro else w, frames, tokens_axes, False
        w = _nice(value * total / nll_value)
        return "global_mean", w, frames, tokens_axes, False
    notes.append(f"cross-entropy with reduction={first['reduction']} is not a recognised loss normalisation")
    return "global_mean", Fraction(1), frames, tokens_axes, False


def _nice(x: Fraction) -> Fraction:
    """A float ratio read back as the small rational it is (fp32 loss values)."""
    return x.limit_denominator(64)


def _clip(step_colls, params, layout, axes, info, tp, data_axes, script="", pp=None):
    dynamic = [e for e in info if (e[0].get("grad") or {}).get("dynamic_scales")]
    if not dynamic:
        return None
    # the norm's reductions: all-reduces after backward that carry no gradient
    in_programs = {s for e in info for s in ((e[0].get("grad") or {}).get("collectives") or [])}
    norm_colls = [c for c in step_colls if c["phase"] == "after_backward" and c["kind"] == "all_reduce"
                  and c["seq"] not in in_programs and c["dtype"].startswith(("float", "bfloat"))]
    sharded = set()
    for p, *_ in info:
        sharded |= _placement_axes(p, layout)
    # a pipeline's stages hold different parameters: the norm is summed over them too
    expected = sorted(sharded | ({pp} if pp else set()))

    def seen(c) -> tuple:  # rank sets over several axes: their statement (lift_blocks) names the other axes
        at = layout.blocks.get(frozenset(c["ranks"]), (None,))[0]
        return tuple(a for a in axes(c) if a in expected) if isinstance(at, tuple) else axes(c)
    observed = sorted({a for c in norm_colls for a in seen(c)})
    at = [sc for e in dynamic for sc in (e[0]["grad"].get("dynamic_at") or [])]
    frames = _frames([c["stack"] for c in norm_colls], script) or _frames([[a] for a in at], script)
    if observed == expected:
        return None
    return (f"  override clip_norm: reduce over ({', '.join(observed)})", frames)


def _render(trace, plan_name, layout, roles, bindings, named, lines, loss_kind, step, notes, script="",
            accum=1, pipelined=False, tied=None, losses=(), groups=()):
    opt = step.get("optimizer", {})
    params = opt.get("params", [])
    total = sum(e[5] for _, _, members in named for e in members)
    pbytes = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}.get(params[0]["dtype"], 4) if params else 4
    elements = opt.get("param_elements") or 0
    obytes = Fraction(opt.get("state_bytes", 0), elements) if elements else Fraction(0)
    # the strategies the plan's binding lines name
    used = {m.group(1) for t, _ in lines for m in [re.match(r"\s+(?:\[[^\]]*\]|\w+): (\w+)$", t)] if m}
    imports = sorted(used & {"ddp", "zero1", "zero3", "fsdp_shard_grad_op", "hybrid_shard"})
    tensor = sorted(used & {"megatron_tp", "megatron_sp"})
    pipeline = sorted(used & {"gpipe", "one_f_one_b"})
    context = sorted(used & {"context_parallel"})
    out: list[str] = []
    origins: dict[int, list[dict]] = {}
    out.append(f"# Lifted by `placement lift` from a trace of {trace.get('script', '?')} on {trace['world']} processes.")
    out.append("# The plan is what the script did; each override names where it departs from the library")
    out.append("# strategy it resembles, and the script line it was lifted from.")
    out.append("# The model block gives the parameter count only (no transformer shape is lifted), so"
               if not any(g.startswith("transformer {") for g in groups) else
               "# The model block gives the parameter count and the MoE router's experts and top-k (and capacity factor), so")
    out.append("# `placement cost` reports parameter, gradient, optimizer and gradient-communication")
    out.append("# bytes; activations and step time need a shape.")
    if imports:
        out.append(f"from std.data import {', '.join(imports)}")
    if tensor:
        out.append(f"from std.tensor import {', '.join(tensor)}")
    if pipeline:
        out.append(f"from std.pipeline import {', '.join(pipeline)}")
    if context:
        out.append(f"from std.context import {', '.join(context)}")
    if any(t.strip().startswith("use full_recompute") for t, _ in lines):
        out.append("from std.recompute import full_recompute")
    out.append("")
    out.append("model {")
    out.append(f"  params = {total}")
    if tied is not None:  # a weight tied across the first and last pipeline stage (its copy counted in params)
        out.append(f"  tied_embeddings = true  # {tied}")
    if pipelined:
        out.append(f"  microbatches = {accum}  # activations the first pipeline stage sends forward in each step")
    elif accum > 1 and any(t.startswith("  override optimizer: step_every_microbatch") for t, _ in lines):
        out.append(f"  microbatches = {accum}  # optimizer steps of one backward pass each between two clears of the "
                   "gradients (lift_timing)")
    elif accum > 1:
        out.append(f"  microbatches = {accum}  # backward passes accumulated into each optimizer step")
    if losses:  # the cross-entropy's own terms (lift_terms)
        out.append("  losses {")
        out.extend(f"    {t}" for t in losses)
        out.append("  }")
    out.append("  bytes {")
    out.append(f"    params = {pbytes}")
    out.append(f"    grads = {pbytes}")
    out.append(f"    optimizer = {obytes}  # {opt.get('class', '?')} state per parameter element, as observed")
    out.append("  }")
    for gname, (cls, _, _), members in named:
        if gname == "dense":
            continue
        count = sum(e[5] for e in members)
        like = GradClass.NORMS if cls == "partial" else GradClass.DENSE
        tensor_word = Holding.WHOLE if cls in ("partial", "whole") else Holding.SPLIT
        names = ", ".join(e[0]["name"] for e in members[:4]) + (", ..." if len(members) > 4 else "")
        out.append(f"  group {gname} {{ count = {count}  like = {like}  tensor = {tensor_word} }}  # {names}")
    out.extend(f"  {g}" for g in groups)  # groups of other classes read from the step (the router: lift_auxloss)
    out.append("}")
    out.append("")
    out.append("mesh {")
    for a, s in zip(layout.names, layout.sizes):
        out.append(f"  {a} = {s}  # {roles[a]}")
    out.append("}")
    out.append("")
    dense = next((members for g, _, members in named if g == "dense"), [])
    if dense:
        out.append(f"# dense: {len(dense)} parameter tensors ("
                   + ", ".join(e[0]["name"] for e in dense[:3]) + (", ..." if len(dense) > 3 else "") + ")")
    for n in notes:
        out.append(f"# note: {n}")
    out.append(f"plan {plan_name} {{")
    origins[len(out)] = _frames([opt.get("stack", [])], script)  # what the plan as a whole ran into: the step
    for text, frames in lines:
        where = "; ".join(f"{f['file']}:{f['line']}" for f in frames[:3])
        out.append(text + (("  # " if "#" not in text else "; ") + where if where else ""))
        origins[len(out)] = frames
    out.append("}")
    return "\n".join(out) + "\n", origins


def _empty_spec(trace, plan_name, layout) -> str:
    return (f"# Lifted by `placement lift` from a trace of {trace.get('script', '?')}: no optimizer step was "
            "recorded, so there is no plan to lift.\n")


def _unobserved_loss(mine: dict, rank: int) -> list[Unliftable]:
    """The loss normalisation when the trace does not show it: no cross-entropy recorded (a
    mean-squared error, a custom loss), or one of a reduction the lift does not read. Every
    gradient verdict depends on it (a loss not divided by the accumulation steps, or by the
    data-parallel size, is a real bug), so it is named and the verdict is not the script's."""
    nll, losses = mine.get("nll") or [], mine.get("losses") or []
    stack = tuple((losses[0].get("stack") or []) if losses else ())
    if not nll or not losses:
        return [Unliftable((rank,), -1, "the loss normalisation",
                           "no cross-entropy (nll_loss) was recorded, so how the loss is divided (by the tokens, the "
                           "devices, the accumulated micro-steps) is not observed; the lifted plan assumes the global "
                           "token mean", stack)]
    if nll[0].get("reduction") not in ("mean", "sum"):
        return [Unliftable((rank,), -1, "the loss normalisation",
                           f"a cross-entropy with reduction={nll[0].get('reduction')!r} is not read as a "
                           "normalisation; the lifted plan assumes the global token mean", stack)]
    return []


def _quoted(text: str) -> str:
    """``text`` as the body of a spec string: one line, no double quote."""
    return " ".join(text.replace('"', "'").split())
