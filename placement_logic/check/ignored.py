"""Ignored tokens counted in the loss normaliser (``override tokens: count_ignored``).

Input: a plan, its step model and replay context. Output: the located error of a statement the step
cannot read (``check_override``), and the obligations that read the main loss's normaliser
wrapped so that the statement refutes them (``wrap``), with a concrete replay.

A token whose label is ignored (``-100``: padding, a prompt token masked out, the first position the
label shift drops) adds nothing to the loss and nothing to the gradient: single-device training with
``ignore_index`` divides by the count of the other tokens, T = Σ n over every piece (rank,
microbatch) the normaliser sums. ``tokens: count_ignored`` states that the count a rank contributes is
of every position, n + q with q ≥ 0 ignored ones (Hugging Face's ``num_items_in_batch`` counting
labels the loss never reads, a ``labels.numel()`` in place of ``(labels != -100).sum()``): the
normaliser is Σ (n + q) = T + Q, which is T exactly when no piece holds an ignored token. Unlike an
epsilon (``check.partial``), one piece is enough: the count is wrong with or without a reduction, under
a global mean (the step's count), a per-device mean (the device's) and a per-microbatch mean (the
microbatch's). The replay gives every piece one labelled token of per-token gradient 1 and the first
one ignored token besides, and compares the two normalisers.
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget
from .dims import MICROBATCHES, NORMALISATION
from .report import Counterexample

VERB = "count_ignored"


def ignored_override(plan: ir.Plan | None) -> ir.Override | None:
    if plan is None:
        return None
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.TOKENS and o.verb == VERB
                 and o.group is None), None)


def check_override(plan: ir.Plan) -> None:
    """A loss term's count (``tokens[T]: count_ignored``) is PL122, as resolve says of it: the terms'
    normalisations (check.losses) read their token count's reduction only (a plan built without resolve)."""
    for o in plan.overrides:
        if o.target == OverrideTarget.TOKENS and o.verb == VERB and o.group is not None:
            raise DiagnosticError([Diagnostic(
                Code.BAD_OVERRIDE, f"'tokens[{o.group}]' has no override '{VERB}': ignored tokens are modelled in the "
                "main loss's token count; a loss term's count states only the axes it is reduced over (tokens[T]: "
                "reduce over (AXES))", o.span)])


def wrap(obs: list, step, ctx, plan) -> list:
    """Add the ignored tokens' violation to every obligation that reads the main loss's normaliser: a
    group's whole-plan gradient integrity and its normalisation aspect."""
    o = ignored_override(plan)
    if o is None:
        return obs
    from .encode_ignored import pending_ignored

    affected = {g.group: g for g in step.groups if g.objective == "mean"}
    for ob in obs:
        name = ob.whole or (ob.aspect_of if ob.name.endswith(NORMALISATION) else None)
        if name not in affected:
            continue
        g = affected[name]
        axes = tuple(a for a in g.norm_dims if a in step.axes)
        mb = MICROBATCHES in g.norm_dims
        ob.encode = pending_ignored(ob.encode, ob.name)
        ob.replay = _replay(ob.replay, ctx, axes, mb, o.span.line, name)
        ob.span = o.span
    return obs


def _replay(orig, ctx, axes, mb: bool, line: int, group: str):
    def replay(w):
        if w.get("kind") != "ignored":
            return orig(w)
        return replay_ignored(ctx, w["sizes"], axes, mb, line, group)
    return replay


def replay_ignored(ctx, sizes: dict[str, int], axes, mb: bool, line: int, group: str) -> Counterexample:
    """Every piece the normaliser sums (rank of the reduced axes, microbatch) holds one labelled token of
    per-token gradient 1; the first also holds one ignored token. The counted normaliser is P + 1, the
    single-device one P."""
    pieces = 1
    for a in axes:
        pieces *= sizes[a]
    if mb:
        pieces *= sizes.get(MICROBATCHES, 1)
    counted, right = pieces + 1, pieces
    c0 = ", ".join(f"{a}=0" for a in ctx.step.axes) or "the device"
    over = " and ".join(x for x in ((f"all-reduced over ({', '.join(axes)})" if axes else ""),
                                    ("summed over the microbatches" if mb else "")) if x) or "the microbatch's own"
    what = (f"the normaliser of the {group} gradient on {c0}, over the {pieces} piece(s) it sums ({over}), counts "
            f"{counted} tokens, but {right} carry a label: every token's loss weight is {Fraction(1, counted)} instead "
            f"of {Fraction(1, right)}")
    diag = (f"the token count includes the tokens whose label is ignored (override tokens: {VERB} at line {line}): "
            "an ignored token adds 1 to the normaliser and nothing to the loss or the gradient, so every gradient is "
            "scaled by T / (T + Q) with Q ignored tokens in the step; count the labels that are not ignored "
            "((labels != -100).sum()) before the count is summed and reduced",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", c0),),
                          (("labelled tokens n", f"1 in each of the {pieces} piece(s) (rank, microbatch)"),
                           ("ignored tokens q", "1 in the first piece (label -100), 0 elsewhere"),
                           ("per-token gradient", "1 on every labelled token")),
                          what, diag, ctx.command(sizes))
