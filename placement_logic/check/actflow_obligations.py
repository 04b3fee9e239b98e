"""The obligations on activations and activation gradients per layer region (check.actflow
types them; check.actflow_replay replays a witness)."""

from __future__ import annotations

from ..diagnostics import NO_SPAN
from ..ir.actflow import KIND_TEXT, TP_REGIONS


def act_obligations(step, ctx, obligation) -> list:
    from . import encode as en
    from .actflow_replay import replay
    from .rules import GRADIENT_INTEGRITY

    out = []
    groups = {f.flow.tensor for f in step.actflow.typed if f.flow.region not in ("experts", "context", "expert_tensor")}
    cgroups = {f.flow.tensor for f in step.actflow.typed if f.flow.region == "context"}
    for ty in step.actflow.typed:
        span = next((s for _, _, s in ty.cause if s != NO_SPAN), step.sp_span)
        what = ("each rank's routed tokens come out of the expert MLPs as on a single device: gathered over the "
                f"expert tensor group {', '.join(ty.flow.tensor)} before them and their partial outputs "
                "reduce-scattered after them (the type the combine needs: " if ty.flow.region == "expert_tensor" and
                ty.direction == "forward" else
                "each rank's routed tokens receive their full input gradient from the expert MLPs: the output "
                f"gradient gathered over the expert tensor group {', '.join(ty.flow.tensor)} and the input gradient "
                "reduce-scattered (the type dispatch's conjugate needs: " if ty.flow.region == "expert_tensor" else
                "every query's attention output equals the single-device one: it meets every key/value block of its "
                "sequence, exchanged over exactly the context axes "
                f"{', '.join(ty.flow.tensor)}" if ty.flow.region == "context" and ty.direction == "forward" else
                "every key/value block's gradient equals the single-device one on the rank that owns it: the blocks "
                "exchanged again in backward (or sent by Ulysses' all-to-all) and their gradients returned to their "
                "owners over exactly the context axes "
                f"{', '.join(ty.flow.tensor)}" if ty.flow.region == "context" else
                "the output on every rank equals the single-device output: every token is dispatched to the rank "
                "holding its expert and its output combined back to it (the all-to-alls range over exactly the expert "
                f"axes {', '.join(ty.flow.tensor)})" if ty.flow.region == "experts" and ty.direction == "forward" else
                "the input gradient on every rank equals the single-device one: every token's output gradient reaches "
                "its expert and the input gradient comes back to it (the conjugate all-to-alls range over exactly the "
                f"expert axes {', '.join(ty.flow.tensor)})" if ty.flow.region == "experts" else
                "the loss of every token equals the single-device cross entropy on every rank: every rank of the "
                "tensor group subtracts the same max logit, the target's logit and the sum of exponentials are "
                "summed over it once (" if ty.flow.region == "loss" and ty.direction == "forward" else
                "the logits' gradient (softmax minus the one-hot target) equals the single-device one on every "
                "rank's vocabulary slice: the same max logit subtracted, the sum of exponentials summed once ("
                if ty.flow.region == "loss" else
                "the forward output of the region equals the single-device output on every rank (the type the "
                "next operation needs: " if ty.direction == "forward" else
                "the output gradient the embedding's weight gradient reads is the full gradient on every rank (the "
                "type it needs: " if ty.flow.region == "embedding" else
                "the gradient the region passes to the layers before it is the full gradient on every rank (the "
                "type they need: ") + ("" if ty.flow.region in ("experts", "context") else
                   ", ".join(f"{KIND_TEXT[k].split(' (')[0]} over {a}" for a, k in ty.needed) + ")")
        suffix = f" over ({', '.join(ty.flow.tensor)})" if len(groups) > 1 and ty.flow.region not in (
            "experts", "context", "expert_tensor") or len(cgroups) > 1 and ty.flow.region == "context" \
            or ty.flow.region == "expert_tensor" else ""
        # the MoE layer as a whole is wrong where its expert tensor group's collectives are (their own
        # obligation is the aspect "... over (AXES)")
        etp = next((t for t in step.actflow.typed if t.flow.region == "expert_tensor" and t.direction == ty.direction
                    ), None) if ty.flow.region == "experts" else None
        bad = tuple(dict.fromkeys(ty.bad + (etp.bad if etp is not None else ())))
        if etp is not None and etp.bad and not ty.bad:
            span = next((s for _, _, s in etp.cause if s != NO_SPAN), span)
        ob = obligation(
            f"GI {ty.name}{suffix}", GRADIENT_INTEGRITY, span if span != NO_SPAN else step.plan_span, what,
            lambda env, bad=bad: en.axes_negation(env, "actflow", [(a, env.sess.true()) for a in bad]),
            lambda w, ty=ty, etp=etp: replay(ctx, ty, w) or (replay(ctx, etp, w) if etp is not None else None))
        ob.unknown = across_groups(ty.flow, ty.direction, groups) if ty.flow.region in TP_REGIONS else ""
        if ob.unknown:  # never proved, never refuted: the negation left satisfiable
            ob.encode = lambda env: ([env.sess.true()], lambda model: {})
        out.append(ob)
    return out


def across_groups(flow, direction: str, groups: set) -> str:
    """Why the region's obligation on one of several separately bound tensor groups is unknown: a statement of
    one of its slots names tensor axes of two or more of those groups (``activations[mlp]: reduce over (tp_a,
    tp_b)`` with ``tp_a`` and ``tp_b`` bound apart). The typing reads one tensor group per region and flow, the
    other groups' axes as axes the value is not split over, so it would refute the collective over the combined
    group that the layers' two-dimensional split needs; "" where no statement does. The slots read: those of
    the direction (the cross entropy's backward reads its forward's sums: all of them)."""
    for name, slot in flow.slots:
        if not slot.verb:  # derived: over the flow's own group
            continue
        if flow.region != "loss" and not name.startswith("fwd" if direction == "forward" else "bwd"):
            continue
        axes = tuple(dict.fromkeys(a for st in slot.steps for a in st.axes) if slot.steps else slot.axes)
        spanned = [g for g in sorted(groups) if set(g) & set(axes)]
        if len(spanned) >= 2:
            at = f" at line {slot.span.line}" if slot.span != NO_SPAN else ""
            return (f"the statement {slot.verb} over ({', '.join(axes)}){at} names tensor axes of "
                    f"{len(spanned)} separately bound tensor groups ({'; '.join(', '.join(g) for g in spanned)}): "
                    f"the {flow.region} region's value is typed on one tensor group at a time, and one collective "
                    "over their combined group is not modelled; the missing fact is the layout of the value over "
                    "the product of the groups (bind them as one tensor group, [A, B]: STRATEGY, to check it)")
    return ""
