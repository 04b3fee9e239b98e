"""The value of the MoE load-balancing loss: over which tokens its routing statistics are taken
(docs/semantics.md, "Loss terms"). With E experts, top-k routing and a group G of tokens,

    aux(G) = E · Σ_i f_i(G) · P_i(G),  f_i = (routing slots of G on expert i) / (k·|G|),
                                       P_i = (Σ_{t in G} p_t,i) / |G|,

and the term is the mean of aux(G) over the groups. f and P are sums over G's tokens, and their
product is not: the value depends on how the step's tokens are grouped, so the group is part of the
objective. The model states it once (``losses { aux_stats = global_batch | per_microbatch |
per_sequence }``); a plan states what its code gathers (``override loss[aux]: stats_per_sequence |
stats_per_microbatch | stats_per_step over (AXES)``: each sequence's, each local microbatch's or the
step's statistics, summed over the ranks of AXES), else it gathers what the objective says.

A grouping is a set of token dimensions: the mesh axes that split the router's tokens (data, context,
expert, and tensor axes under sequence parallelism), the microbatches and the sequences of a
microbatch. Two groupings give the same value for every routing exactly when they differ on no
dimension of two or more: where one gathers a dimension d the other does not, a routing that sends
the tokens at d = 0 to experts 0..k-1 and the others to 1..k (probability 1/k on each) gives E/k per
unmixed group and less for a mixed one (Σ f_i P_i of a mixture is below the mean of its parts'). The
negation asks z3 for sizes where such a dimension has two or more; the replay builds that routing on
one token per shard and computes both values exactly (the z3 encoding: check.encode_auxstats).

Input: the plan, its model's ``aux_stats`` and overrides. Output: one obligation ``GI aux_stats``
where the model states the scope; a stated gather with no such statement is PL214, an axis
that does not split the router's tokens PL215.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from itertools import product

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir import losses as terms
from ..ir import routerstats
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import replay as rp
from .dims import MICROBATCHES
from .report import Counterexample

SEQUENCES = "sequences"  # the sequences of one device's microbatch (the model's `microbatch`)
SCOPE_TEXT = {
    "global_batch": "over every token of the step (the global batch)",
    "per_microbatch": "over each device's microbatch, gathered over the ranks that split its sequences",
    "per_sequence": "over each sequence, gathered over the ranks that split it",
}
VERB_EXTRA = {OverrideVerb.STATS_PER_SEQUENCE: (), OverrideVerb.STATS_PER_MICROBATCH: (SEQUENCES,),
              OverrideVerb.STATS_PER_STEP: (SEQUENCES, MICROBATCHES)}


@dataclass(frozen=True)
class StatsView:
    objective: str  # ir.losses.STATS_OBJECTIVES
    token_axes: tuple[str, ...]  # the mesh axes that split the router's tokens
    split_axes: tuple[str, ...]  # those that split one sequence (context; tensor under sequence parallelism)
    wanted: frozenset[str]  # the dimensions the objective gathers
    gathered: frozenset[str]  # those the plan's path gathers
    stated: str | None  # the plan's verb and axes as written, if stated
    span: Span


def _err(code: str, msg: str, span: Span, notes: tuple[str, ...] = ()) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, span, notes=notes)])


def view(plan: ir.Plan) -> StatsView | None:
    """The objective's and the path's groupings, or None where the model states no scope."""
    stated = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.verb in terms.STATS_VERBS]
    scope = plan.model.aux_stats
    if scope is None:
        if stated:
            raise _err(Code.STATS_SCOPE_UNSTATED, f"'loss[aux]: {stated[-1].verb}' states which tokens the aux term's "
                       "statistics are gathered over, but the model states no objective for them", stated[-1].span,
                       ("state it in the model: losses { aux_stats = global_batch | per_microbatch | per_sequence }",))
        return None
    token, split = routerstats.token_axes(plan)
    objective, span = scope
    wanted = {"global_batch": set(token) | {SEQUENCES, MICROBATCHES},
              "per_microbatch": set(split) | {SEQUENCES}, "per_sequence": set(split)}[objective]
    if not stated:
        return StatsView(objective, token, split, frozenset(wanted), frozenset(wanted), None, span)
    o = stated[-1]
    axes = tuple(o.axes or ())
    for i, a in enumerate(axes):
        if a in axes[:i]:
            raise _err(Code.STATS_AXIS, f"'loss[aux]: {o.verb}' names {a} twice", o.span)
        if a not in token:
            raise _err(Code.STATS_AXIS, f"'loss[aux]: {o.verb} over ({', '.join(axes)})': the ranks of {a} hold the same "
                       "tokens, so the router's statistics do not differ over it", o.span,
                       (f"the axes that split the router's tokens here: {', '.join(token) or 'none'}",))
    text = f"loss[aux]: {o.verb} over ({', '.join(axes)})"
    return StatsView(objective, token, split, frozenset(wanted), frozenset(axes) | set(VERB_EXTRA[o.verb]), text, o.span)


def _dims(v: StatsView) -> tuple[str, ...]:
    return v.token_axes + (MICROBATCHES, SEQUENCES)


def aux_value(cells: dict[tuple, tuple[tuple[int, ...], tuple[Fraction, ...]]], names: tuple[str, ...],
              gathered: frozenset[str], experts: int, top_k: int) -> Fraction:
    """The term's value: the mean over groups (cells sharing the coordinates outside ``gathered``) of
    E · Σ_i f_i P_i. ``cells`` maps a token's coordinates to (its chosen experts, its probabilities)."""
    keep = [i for i, n in enumerate(names) if n not in gathered]
    groups: dict[tuple, list] = {}
    for coord, routed in cells.items():
        groups.setdefault(tuple(coord[i] for i in keep), []).append(routed)
    total = Fraction(0)
    for toks in groups.values():
        n = len(toks)
        f = [Fraction(sum(c.count(i) for c, _ in toks), top_k * n) for i in range(experts)]
        p = [sum((pr[i] for _, pr in toks), Fraction(0)) / n for i in range(experts)]
        total += experts * sum(fi * pi for fi, pi in zip(f, p))
    return total / len(groups)


def replay(ctx: rp.Context, w: dict, v: StatsView) -> Counterexample | None:
    """One token per shard; tokens at coordinate 0 of the witness's dimension route to experts 0..k-1,
    the others to 1..k, each with probability 1/k on its chosen experts."""
    sizes = dict(w["sizes"])
    sizes[SEQUENCES] = w[SEQUENCES]
    e, k, dim = w["experts"], w["top_k"], w["dim"]
    names = _dims(v)
    if not (e >= 2 and 1 <= k < e and sizes[dim] >= 2):
        return None
    c0, c1 = tuple(range(k)), tuple(range(1, k + 1))
    cells = {}
    for coord in product(*[range(sizes[n]) for n in names]):
        chosen = c0 if coord[names.index(dim)] == 0 else c1
        cells[coord] = (chosen, tuple(Fraction(1, k) if i in chosen else Fraction(0) for i in range(e)))
    got = aux_value(cells, names, v.gathered, e, k)
    want = aux_value(cells, names, v.wanted, e, k)
    if got == want:
        return None
    shown = lambda s: ", ".join(n for n in names if n in s) or "nothing: each rank's own tokens"  # noqa: E731
    values = (
        ("objective", f"aux_stats = {v.objective}: statistics {SCOPE_TEXT[v.objective]} ({shown(v.wanted)})"),
        ("path", f"{v.stated or 'derived'}: statistics gathered over ({shown(v.gathered)})"),
        ("routing", f"E = {e} experts, top-{k}; one token per shard; tokens at {dim}=0 choose experts "
                    f"{', '.join(map(str, c0))}, the others {', '.join(map(str, c1))}, probability 1/{k} on each "
                    "chosen expert"),
        ("sequences per microbatch", str(sizes[SEQUENCES])),
    )
    eq = (f"aux on this path = {rp._frac(got)} (mean over its groups of E·Σ f_i·P_i), but the objective's "
          f"grouping gives {rp._frac(want)}")
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("observer", "every device"),), values, eq,
                          tuple(diagnose(v)), ctx.command(w["sizes"]))


def diagnose(v: StatsView) -> list[str]:
    """One cause per dimension the two groupings disagree on."""
    out = []
    names = _dims(v)
    what = {MICROBATCHES: "the step's microbatches", SEQUENCES: "the sequences of a microbatch"}
    for d in sorted(v.wanted - v.gathered, key=names.index):
        who = {MICROBATCHES: "microbatch", SEQUENCES: "sequence"}.get(d, f"{d} rank")
        out.append(f"the aux term's routing statistics are not gathered over {what.get(d, d)}: each "
                   f"{who} computes E·Σ f_i·P_i from its own tokens, and a mean of "
                   f"those is not the load-balancing loss of the objective's tokens ({v.objective})")
    for d in sorted(v.gathered - v.wanted, key=names.index):
        out.append(f"the aux term's routing statistics are gathered over {what.get(d, d)}, which its objective "
                   f"({v.objective}) keeps apart: the balance of the union is penalised, not that of each group")
    return out
