"""The embedding copy of a multi-token-prediction block on a middle pipeline stage, and the embedding group.

Input: the obligations of a plan, its step model and replay context. Output: where the plan states
``override embedding: mtp_stage over (PP)``, the aspect ``GI grads[embedding] mtp stage`` (the MTP stage's
copy of the embedding is summed with the other copies), and, where ``embedding: group_first_last over (PP)``
leaves that copy out of the embedding group, that aspect, the embedding's whole-plan gradient integrity and
its replicas' consistency wrapped so that the missing copy refutes them wherever PP has three or more
stages, each with a concrete replay of the stages' copies; PL296 and PL506 where the statements cannot
hold or change nothing (``check_overrides``).

The derived model keeps the multi-token-prediction block (``mtp_layers``) on the last stage. Megatron's
standalone layout places it on a stage of its own; that stage embeds the shifted tokens itself, so it holds
a copy of the embedding, and the embedding's copies (the first stage's, the MTP stage's, the last stage's
where the output layer is tied to it) each receive part of the gradient: the first stage's the main loss's
lookups, the MTP stage's the MTP lookups, the tied output layer's its logits'. Megatron Core's embedding
group spans the first stage, every MTP stage and, where tied, the last, so every copy is summed: the derived
group. ``group_first_last`` states the generic group of the first and last stage only
(NVIDIA-NeMo/Megatron-Bridge#5380's defect): on a middle stage (PP ≥ 3) the MTP copy keeps its own part and
the others never receive it, so no copy holds the whole gradient and the copies drift apart.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir import views
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import steps
from .encode_mtpstage import KIND, outside
from .obligation import Obligation
from .replay import Context
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY
from .wellformed import tied

ASPECT = "GI grads[embedding] mtp stage"


def _stated(plan: ir.Plan, verb: OverrideVerb) -> ir.Override | None:
    return next((o for o in plan.overrides if o.target == OverrideTarget.EMBEDDING and o.verb == verb), None)


def _err(code: str, msg: str, span) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, span)])


def check_overrides(plan: ir.Plan) -> tuple[ir.Override | None, ir.Override | None]:
    """The two statements, each over one pipeline axis (PL296), ``mtp_stage`` in a model with an MTP block
    (PL296), ``group_first_last`` beside it over the same axis (PL506: without an MTP stage the first and last
    stage are the derived group)."""
    stage, group = _stated(plan, OverrideVerb.MTP_STAGE), _stated(plan, OverrideVerb.GROUP_FIRST_LAST)
    pipeline = views.view(plan).axes_with_role(ir.Role.PIPELINE)
    for o in (stage, group):
        if o is None:
            continue
        head = f"override embedding: {o.verb} over ({', '.join(o.axes or ())})"
        bad = [a for a in (o.axes or ()) if a not in pipeline]
        if len(o.axes or ()) != 1 or bad:
            why = f"'{bad[0]}' is not a pipeline axis" if bad else "it names no axis" if not o.axes else "it names two axes"
            raise _err(Code.MTP_STAGE_AXIS, f"{head}: {why}; the multi-token-prediction block sits on a stage of one "
                       "pipeline axis", o.span)
    t = plan.model.transformer
    mtp = t.mtp_layers if t is not None else None
    if stage is not None and (mtp is None or (isinstance(mtp, ir.Const) and mtp.value == 0)):
        raise _err(Code.MTP_STAGE_AXIS, "override embedding: mtp_stage: the model has no multi-token-prediction "
                   "block (transformer { mtp_layers = N })", stage.span)
    if group is not None and (stage is None or stage.axes != group.axes):
        raise _err(Code.OVERRIDE_NO_EFFECT, f"override embedding: group_first_last over ({', '.join(group.axes)}) "
                   "changes nothing: with no multi-token-prediction block on a middle stage of that axis (override "
                   "embedding: mtp_stage) the first and last stage hold every copy of the embedding", group.span)
    return stage, group


def wrap(obs: list, step: steps.StepModel, ctx: Context, plan: ir.Plan | None) -> list:
    if plan is None:
        return obs
    stage, group = check_overrides(plan)
    if stage is None:
        return obs
    axis, both = stage.axes[0], tied(plan)
    aspect = Obligation(
        ASPECT, GRADIENT_INTEGRITY, stage.span,
        f"the embedding copy of the multi-token-prediction block on its stage of {axis} is in the embedding group: "
        "its gradient is summed with the first stage's" + (" and the tied last stage's" if both else ""),
        lambda env: ([env.sess.false()], lambda model: None), lambda w: None, aspect_of="embedding")
    obs = obs + [aspect]
    if group is None:
        return obs
    for ob in obs:
        if ob.name in (ASPECT, "GI grads[embedding]", "SC grads[embedding]"):
            ob.encode = outside(ob.encode, axis, ob.name)
            ob.replay = _replay(ob.replay, ctx, axis, both, group.span.line, ob.name.startswith("SC"))
            ob.span = group.span
    return obs


def _replay(orig, ctx: Context, axis: str, both: bool, line: int, replica: bool):
    def replay(w):
        if w.get("kind") != KIND:
            return orig(w)
        return replay_copies(ctx, w["sizes"], axis, both, line, replica)
    return replay


def copies(pp: int, both: bool, grouped: bool) -> dict[int, int]:
    """Each stage's embedding copy after the group's sum, one element: the first stage's lookups give it 1, the MTP
    block's (stage 1 of pp, a middle stage) 2, the tied output layer's on the last stage 4 (untied: no copy there).
    ``grouped``: the MTP stage is in the group (the derived one); else the group is the first and last stage."""
    own = {0: 1, 1: 2} | ({pp - 1: 4} if both else {})
    members = set(own) if grouped else {0, pp - 1} & set(own)
    total = sum(own[s] for s in members)
    return {s: (total if s in members else v) for s, v in own.items()}


def replay_copies(ctx: Context, sizes: dict[str, int], axis: str, both: bool, line: int, replica: bool):
    pp = sizes.get(axis, 1)
    if pp < 3:
        return None
    held = copies(pp, both, grouped=False)
    whole = copies(pp, both, grouped=True)[0]  # every copy holds the sum of all where the group spans them
    if held[0] == whole and held[1] == whole:
        return None
    last = f", the tied output layer's on stage {pp - 1}: 4" if both else " (untied: the last stage holds no copy)"
    fails = (f"the embedding copy on {axis} stage 0 holds {held[0]} and on stage 1 (the MTP stage) {held[1]}: replicas "
             "of one element step with different gradients" if replica else
             f"the embedding gradient on {axis} stage 0 = {held[0]}, on stage 1 = {held[1]}; the whole gradient = {whole}")
    return Counterexample(
        ctx.sizes_tuple(sizes), ((f"{axis} stage 0", "the first stage"), (f"{axis} stage 1", "the MTP stage")),
        (("per-copy gradient of embedding[0]", f"the first stage's lookups: 1, the MTP block's on stage 1: 2{last}"),),
        fails,
        (f"the embedding group is the first and last stage of {axis} (override at line {line}: group_first_last): "
         "the multi-token-prediction block's copy on stage 1 is never summed with the others",),
        ctx.command(sizes))
