"""Operations on partial values: the token count clamped before its reduction.

Input: a plan, its step model and replay context. Output: PL506 where ``override tokens:
clamp_before_reduce`` changes nothing (``check_override``), and the obligations that read the loss
normaliser wrapped so that the clamp refutes them, with a concrete replay (``wrap``).

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
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError
from .dims import MICROBATCHES, NORMALISATION
from .encode_partial import pending_clamp

VERB = "clamp_before_reduce"


def clamp_override(plan: ir.Plan) -> ir.Override | None:
    return next((o for o in reversed(plan.overrides) if o.target == "tokens" and o.verb == VERB
                 and o.group is None), None)


def check_override(plan: ir.Plan, loss: str) -> None:
    """PL506 where the clamp changes nothing: each microbatch is normalised by its own count (a
    per-microbatch mean), or every piece holds the same count of at least one token (``tokens:
    equal``). (A sum loss: ``wellformed.no_effect``.) Under a per-device mean the pending sum is
    over the device's microbatches."""
    o = clamp_override(plan)
    if o is None:
        return
    why = None
    eq = next((x for x in plan.overrides if x.target == "tokens" and x.verb == "equal" and x.group is None), None)
    if loss == "per_microbatch_mean":
        why = ("the loss is a per-microbatch mean (override loss: per_microbatch_mean): each microbatch is "
               "normalised by its own count, which no sum is pending on")
    elif eq is not None:
        why = (f"every device and microbatch holds the same number of tokens (override tokens: equal, line "
               f"{eq.span.line}), at least one, so no count is below 1")
    if why:
        raise DiagnosticError([Diagnostic("PL506", f"override tokens: {VERB} changes nothing: {why}", o.span)])


def pieces(g, axes: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The mesh axes a group's normaliser is reduced over and whether it sums microbatches."""
    return tuple(a for a in g.norm_dims if a in axes), MICROBATCHES in g.norm_dims


def wrap(obs: list, step, ctx, plan: ir.Plan | None) -> list:
    """Add the clamp's violation to every obligation that reads the main loss's normaliser: a
    group's whole-plan gradient integrity and its normalisation aspect."""
    o = clamp_override(plan) if plan is not None else None
    if o is None:
        return obs
    affected = {g.group: pieces(g, step.axes) for g in step.groups if g.objective == "mean" and g.norm_dims}
    for ob in obs:
        g = ob.whole or (ob.aspect_of if ob.name.endswith(NORMALISATION) else None)
        if g not in affected:
            continue
        axes, mb = affected[g]
        ob.encode = pending_clamp(ob.encode, axes, mb, ob.name)
        ob.replay = _replay(ob.replay, ctx, axes, mb, o.span.line, g)
        ob.span = o.span
    return obs


def _replay(orig, ctx, axes, mb: bool, line: int, group: str):
    def replay(w):
        if w.get("kind") != "clamp":
            return orig(w)
        return replay_clamp(ctx, w["sizes"], axes, mb, line, group)
    return replay


def replay_clamp(ctx, sizes: dict[str, int], axes, mb: bool, line: int, group: str):
    """Every piece (rank of the reduced axes, microbatch) holds one token of per-token gradient 1,
    except microbatch 1 on rank 0, which holds none: the clamped counts are all-reduced concretely
    and the normaliser compared with the clamp of the reduced count. None: no such run here."""
    from .replay import _frac, coords_text
    from .report import Counterexample

    m = sizes.get(MICROBATCHES, 1) if mb else 1
    ranks = list(product(*[range(sizes[a]) for a in axes]))
    count = {(r, mu): (0 if (r == ranks[0] and mu == 0) else 1) for r in ranks for mu in range(m)}
    if len(count) < 2:
        return None
    clamped = {k: max(v, 1) for k, v in count.items()}
    local = {r: sum(clamped[(r, mu)] for mu in range(m)) for r in ranks}  # accumulated over microbatches
    reduced = sum(local.values())  # the all-reduce over the axes: every rank holds the same sum
    total = sum(count.values())
    right = max(total, 1)
    if reduced == right:
        return None
    step = ctx.step
    c0 = coords_text(step.axes, [0] * len(step.axes))
    where = f"microbatch 1 on {c0}" if mb and m >= 2 else f"rank {c0}"
    over = " and ".join(x for x in ((f"all-reduced over ({', '.join(axes)})" if axes else ""),
                                    ("summed over the microbatches" if mb and m >= 2 else "")) if x)
    what = (f"the normaliser of the {group} gradient on {c0}, over the {len(count)} pieces it sums, is Σ max(n, 1) = "
            f"{reduced}, but max(Σ n, 1) = {right}: every token's loss weight is {_frac(Fraction(1, reduced))} instead "
            f"of {_frac(Fraction(1, right))}")
    diag = (f"each microbatch's token count is clamped to at least 1 on its rank (override at line {line}) before it "
            f"is {over}: a clamp of a partial value, max(0, 1) + max(1, 1) = 2 but max(0 + 1, 1) = 1; every piece "
            "without a token adds 1 to the normaliser and nothing to the gradient",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", c0),),
                          (("token counts n", f"0 in {where}, 1 in each of the other {len(count) - 1} pieces "
                                               "(rank, microbatch)"),
                           ("per-token gradient", "1 on every token")),
                          what, diag, ctx.command(sizes))
