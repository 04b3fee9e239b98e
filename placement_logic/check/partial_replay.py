"""The token count clamped before its reduction (``check.partial``): the obligations that read the
loss normaliser wrapped so that the clamp refutes them, and the concrete replay of a witness.

Input: the obligations of a plan, its step model and replay context. Output: the obligations with
their negation (``encode_partial.pending_clamp``) and replay extended."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

from .dims import MICROBATCHES, NORMALISATION
from .encode_partial import pending_clamp, pending_eps
from .partial import EPS_VERB, clamp_override, eps_override
from .replay import _frac, coords_text
from .report import Counterexample
from .values import fold, resolver


def pieces(g, axes: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The mesh axes a group's normaliser is reduced over and whether it sums microbatches."""
    return tuple(a for a in g.norm_dims if a in axes), MICROBATCHES in g.norm_dims


def _reading_the_normaliser(obs: list, step):
    """(obligation, group, axes, sums microbatches) of each obligation that reads the main loss's normaliser: a
    group's whole-plan gradient integrity and its normalisation aspect, for a group whose objective is a mean."""
    affected = {g.group: pieces(g, step.axes) for g in step.groups if g.objective == "mean" and g.norm_dims}
    for ob in obs:
        g = ob.whole or (ob.aspect_of if ob.name.endswith(NORMALISATION) else None)
        if g in affected:
            yield (ob, g, *affected[g])


def wrap(obs: list, step, ctx, plan) -> list:
    """Add the clamp's violation to every obligation that reads the main loss's normaliser: a
    group's whole-plan gradient integrity and its normalisation aspect."""
    obs = _wrap_eps(obs, step, ctx, plan)
    o = clamp_override(plan) if plan is not None else None
    if o is None:
        return obs
    for ob, g, axes, mb in _reading_the_normaliser(obs, step):
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


def _wrap_eps(obs: list, step, ctx, plan) -> list:
    """Add the per-piece epsilon's violation to the same obligations as the clamp's."""
    o = eps_override(plan) if plan is not None else None
    if o is None:
        return obs
    for ob, g, axes, mb in _reading_the_normaliser(obs, step):
        ob.encode = pending_eps(ob.encode, axes, mb, o.by, ob.name)
        ob.replay = _replay_eps(ob.replay, ctx, axes, mb, o, g)
        ob.span = o.span
    return obs


def _replay_eps(orig, ctx, axes, mb: bool, o, group: str):
    def replay(w):
        if w.get("kind") != "eps":
            return orig(w)
        return replay_eps(ctx, w["sizes"], axes, mb, o, group)
    return replay


def replay_eps(ctx, sizes: dict[str, int], axes, mb: bool, o, group: str):
    """Every piece (rank of the reduced axes, microbatch) holds one token of per-token gradient 1;
    each adds ε to its count, the counts are all-reduced concretely and the normaliser compared
    with T + ε. None: no such run here (one piece, or ε = 0 at these sizes)."""
    m = sizes.get(MICROBATCHES, 1) if mb else 1
    ranks = list(product(*[range(sizes[a]) for a in axes]))
    count = {(r, mu): 1 for r in ranks for mu in range(m)}
    eps = Fraction(fold(o.by, resolver(ctx.bindings, {k: Fraction(v) for k, v in sizes.items()})))
    local = {r: sum(count[(r, mu)] + eps for mu in range(m)) for r in ranks}  # accumulated over microbatches
    reduced = sum(local.values())  # the all-reduce over the axes: every rank holds the same sum
    right = sum(count.values()) + eps
    if len(count) < 2 or reduced == right:
        return None
    c0 = coords_text(ctx.step.axes, [0] * len(ctx.step.axes))
    over = " and ".join(x for x in ((f"all-reduced over ({', '.join(axes)})" if axes else ""),
                                    ("summed over the microbatches" if mb and m >= 2 else "")) if x)
    p, e = len(count), _frac(eps)
    what = (f"the normaliser of the {group} gradient on {c0}, over the {p} pieces it sums, is Σ (n + ε) = "
            f"{_frac(reduced)}, but Σ n + ε = {_frac(right)}: every token's loss weight is "
            f"{_frac(1 / reduced)} instead of {_frac(1 / right)}")
    diag = (f"each microbatch's token count has ε = {e} added on its rank (override {EPS_VERB} at line "
            f"{o.span.line}) before it is {over}: an offset on a partial value, counted once per piece, "
            f"{p}·ε in the reduced count where single-device training adds ε once ((1 + ε) + (1 + ε) ≠ 1 + 1 + ε)",)
    return Counterexample(ctx.sizes_tuple(sizes), (("rank A", c0),),
                          (("token counts n", f"1 in each of the {p} pieces (rank, microbatch)"),
                           ("ε", e), ("per-token gradient", "1 on every token")),
                          what, diag, ctx.command(sizes))
