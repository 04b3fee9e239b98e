"""The loss terms of ignored tokens summed into the loss (``override tokens: ignored_in_loss``).

Input: a plan, its step model and replay context. Output: the located error of a statement the step
cannot read (``check_override``), and every group's whole-plan gradient integrity wrapped so that the
statement refutes it (``wrap``), with a z3 negation and a concrete replay.

A token whose label is ignored (``-100``: padding, a prompt position masked out, the position the label
shift drops) contributes no term to the single-device loss: the cross entropy's ``ignore_index`` (or a
loss mask of 0 at the position) takes its term and its gradient out, a label mask m_i ∈ {0, 1} per token
in Σ_i m_i·ℓ_i and in the gradient contributions Σ_i m_i·∇ℓ_i. ``tokens: ignored_in_loss`` states that the
mask is 1 everywhere: the vocabulary-parallel cross entropy has no ``ignore_index`` and no loss mask
covers the position, so the label -100 falls outside every tensor rank's vocabulary slice, the target's
logit is taken as 0 on every rank and the term ℓ = lse (its gradient the softmax p, not p - onehot) is
added to the loss. Unlike a count (``tokens: count_ignored``, check.ignored) the numerator is wrong, so
the gradient is wrong under every objective (a global, per-device or per-microbatch mean, a sum) and
whatever normaliser divides it; one ignored token in the step suffices, and a run may hold one at any
mesh size and microbatch count, so the negation is satisfiable everywhere.

The replay: two words, every token's logits [0, 1] (base 2: p = [1/3, 2/3]), the labelled tokens' target
word 0 (their gradient [p_0 - 1, p_1] = [-2/3, 2/3]); the first piece (rank, microbatch) holds one labelled
token and one ignored one, whose term adds lse = log2 3 to the loss and [1/3, 2/3] to the gradient.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

import z3

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from ..solver.session import value_of
from .report import Counterexample

VERB = OverrideVerb.IGNORED_IN_LOSS


def stated(plan: ir.Plan | None) -> ir.Override | None:
    if plan is None:
        return None
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.TOKENS and o.verb == VERB
                 and o.group is None), None)


def check_override(plan: ir.Plan) -> None:
    """A loss term's count (``tokens[T]: ignored_in_loss``) is PL122: the terms' normalisations read their
    token count's reduction only; the ignored tokens' terms are the main cross entropy's."""
    for o in plan.overrides:
        if o.target == OverrideTarget.TOKENS and o.verb == VERB and o.group is not None:
            raise DiagnosticError([Diagnostic(
                Code.BAD_OVERRIDE, f"'tokens[{o.group}]' has no override '{VERB}': the ignored tokens' terms are "
                "modelled in the main cross entropy (override tokens: ignored_in_loss); a loss term's count states "
                "only the axes it is reduced over (tokens[T]: reduce over (AXES))", o.span)])


def wrap(obs: list, step, ctx, plan) -> list:
    """Add the ignored tokens' terms to every group's whole-plan gradient integrity: each gradient reads the
    main loss, whatever its objective and normaliser."""
    o = stated(plan)
    if o is None:
        return obs
    groups = {g.group for g in step.groups}
    vocab_parallel = any(t.flow.region == "loss" for t in step.actflow.typed)
    aspects = []
    for ob in obs:
        if ob.whole not in groups:
            continue
        ob.encode = pending(ob.encode, ob.name)
        ob.replay = _replay(ob.replay, ctx, o.span.line, ob.whole, vocab_parallel)
        ob.span = o.span
        aspects.append(_aspect(ob, ctx, o.span, vocab_parallel))
    return obs + aspects


def _aspect(whole, ctx, span, vocab_parallel: bool):
    """The ignored tokens' terms as an aspect of the group's gradient of their own, at the statement: a
    root cause apart from any other aspect refuted beside it (a count of the ignored tokens, a reduction),
    so the report gives it a finding of its own. Its negation is the wrapped one's second arm alone."""
    group = whole.whole

    def encode(env):
        tag = f"{zlib.crc32(group.encode()):08x}"
        q = env.sess.int(f"ignored_aspect_{tag}")
        return [q >= 1], lambda model: {"kind": "ignored_in_loss", "sizes": env.size_values(model)}

    return replace(
        whole, name=f"GI grads[{group}] ignored tokens' terms", span=span,
        checked=f"the {group} gradient sums no term of a token whose label is ignored (the cross entropy's "
        "ignore_index or a loss mask takes it out)",
        encode=encode, replay=lambda w: replay_ignored_terms(ctx, w["sizes"], span.line, group, vocab_parallel),
        whole=None, aspect_of=group, notes=())


def pending(orig, name: str):
    """Either the original negation, or a run whose first piece holds an ignored token (q ≥ 1) whose term the
    loss sums: its gradient p ≠ 0 is added to a sum that single-device training leaves without it."""
    def encode(env):
        cons, extract = orig(env)
        tag = f"{zlib.crc32(name.encode()):08x}"
        flag = env.sess.bool(f"ignored_in_loss_{tag}")
        q = env.sess.int(f"ignored_terms_{tag}")
        out = [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, q >= 1)]

        def ex(model):
            if value_of(model, flag):
                return {"kind": "ignored_in_loss", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode


def _replay(orig, ctx, line: int, group: str, vocab_parallel: bool):
    def replay(w):
        if w.get("kind") != "ignored_in_loss":
            return orig(w)
        return replay_ignored_terms(ctx, w["sizes"], line, group, vocab_parallel)
    return replay


def replay_ignored_terms(ctx, sizes: dict[str, int], line: int, group: str, vocab_parallel: bool) -> Counterexample:
    c0 = ", ".join(f"{a}=0" for a in ctx.step.axes) or "the device"
    where = ("the label -100 falls outside every tensor rank's vocabulary slice, so each takes the target's logit "
             "as 0" if vocab_parallel else "the label -100 matches no word, so the target's logit is taken as 0")
    what = (f"the gradient of the loss summed over the tokens of the first piece ({c0}, microbatch 0) with respect "
            "to the logits of its 2 words = [-1/3, 4/3], single-device = [-2/3, 2/3]: the loss sums 2 terms "
            "(the labelled token's lse - z_0 = log2 3 and the ignored token's lse = log2 3) where single-device "
            "training sums 1")
    diag = (f"the loss sums the terms of the tokens whose label is ignored (override tokens: {VERB} at line {line}): "
            f"the cross entropy has no ignore_index and no loss mask covers them; {where}: the token's term adds lse to "
            f"the loss and the softmax p to the gradient, so every gradient of {group} is wrong whatever divides it; pass "
            "ignore_index to the cross entropy or multiply each token's loss by a mask that is 0 where the label "
            "is ignored",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", c0),),
                          (("logits of every token", "[0, 1] (base 2: softmax [1/3, 2/3])"),
                           ("labelled tokens", "1 in each piece (rank, microbatch), target word 0"),
                           ("ignored tokens", "1 in the first piece (label -100), 0 elsewhere")),
                          what, diag, ctx.command(sizes))
