"""Operations on partial values: the token count clamped before its reduction.

Input: a plan, its step model and replay context. Output: PL506 where ``override tokens:
clamp_before_reduce`` changes nothing (``check_override``), and the obligations that read the loss
normaliser wrapped so that the clamp refutes them, with a concrete replay (``partial_replay``).

The global token mean divides by T = Σ n, the tokens of every device and microbatch of the step.
A real system counts each microbatch's tokens on its rank, sums them over the microbatches and
all-reduces the sum over the token axes; a count guarded against an empty batch is clamped to at
least 1 (``clamp_min(1)``). The derived step clamps the reduced count, max(Σ n, 1), which is T
whenever the step holds a token. ``override tokens: clamp_before_reduce`` states that each
microbatch's local count is clamped first: the normaliser is Σ max(n, 1), a nonlinear operation on
a value whose sum is still pending. A piece (a rank's microbatch) may then hold no token (all of
its labels padding): it adds 1 to the normaliser and nothing to the gradient. The clamp is wrong
exactly when the normaliser sums two or more pieces (P = microbatches · the sizes of the axes the
count is reduced over ≥ 2: one piece with 0 tokens and one with 1 give max(0, 1) + max(1, 1) = 2 ≠
max(0 + 1, 1) = 1); with one piece the clamp is the derived one. With every count at least 1 it is
a no-op, so the rest of the plan is judged by the unchanged obligations.

An epsilon guarding the division (``n + ε``) is the same kind of operation. Single-device
training divides by T + ε, the epsilon added once to the whole count. ``override tokens:
eps_before_reduce by EPS`` states that each microbatch's local count has ε added on its rank before
the counts are summed and all-reduced: the normaliser is Σ (n + ε) = T + P·ε, which is T + ε exactly
when the normaliser sums one piece (P = 1) or ε = 0 (f(Σ n) = Σ f(n) fails for f(n) = n + ε).
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb

VERB = "clamp_before_reduce"
EPS_VERB = "eps_before_reduce"


def clamp_override(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.TOKENS and o.verb == VERB
                 and o.group is None), None)


def eps_override(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in reversed(plan.overrides) if o.target == OverrideTarget.TOKENS and o.verb == EPS_VERB
                 and o.group is None), None)


def check_override(plan: ir.Plan, loss: str) -> None:
    _check_eps(plan, loss)
    """PL506 where the clamp changes nothing: each microbatch is normalised by its own count (a
    per-microbatch mean), or every piece holds the same count of at least one token (``tokens:
    equal``). (A sum loss: ``wellformed.no_effect``.) Under a per-device mean the pending sum is
    over the device's microbatches."""
    o = clamp_override(plan)
    if o is None:
        return
    why = None
    eq = next((x for x in plan.overrides if x.target == OverrideTarget.TOKENS and x.verb == OverrideVerb.EQUAL and x.group is None), None)
    if loss == "per_microbatch_mean":
        why = ("the loss is a per-microbatch mean (override loss: per_microbatch_mean): each microbatch is "
               "normalised by its own count, which no sum is pending on")
    elif eq is not None:
        why = (f"every device and microbatch holds the same number of tokens (override tokens: equal, line "
               f"{eq.span.line}), at least one, so no count is below 1")
    if why:
        raise DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, f"override tokens: {VERB} changes nothing: {why}", o.span)])


def _check_eps(plan: ir.Plan, loss: str) -> None:
    """PL506 where the epsilon changes nothing: it is 0, or each microbatch is normalised by its own
    count (a per-microbatch mean: no sum is pending, and each microbatch's n + ε is its own)."""
    o = eps_override(plan)
    if o is None:
        return
    why = None
    if isinstance(o.by, ir.Const) and o.by.value == 0:
        why = "the epsilon is 0"
    elif loss == "per_microbatch_mean":
        why = ("the loss is a per-microbatch mean (override loss: per_microbatch_mean): each microbatch is "
               "normalised by its own count, which no sum is pending on")
    if why:
        raise DiagnosticError([Diagnostic(Code.OVERRIDE_NO_EFFECT, f"override tokens: {EPS_VERB} changes nothing: {why}", o.span)])
