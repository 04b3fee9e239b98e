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

f and P may be gathered over groups of their own (``loss[aux]: probs_per_* over (AXES)`` states P's;
Megatron-LM all-reduces the token counts and keeps each rank's probabilities): each cell of tokens
sharing both groups takes E · Σ f_i P_i, and the term is the mean over the cells. Over a dimension only
one of the two gathers, the other's mean over it is the gathered one's group's where the cells hold equal
numbers of real tokens, so the path computes the grouping of the union of the two (``effective``), and the
check above applies to it; where the counts are free (the plan does not state ``tokens: equal``) such a
dimension of the objective's groups departs on its own (check.encode_auxcells.split_dims: the replay gives
the cells unequal real-token counts). The path may count padded positions (``loss[aux]:
stats_count_padding``): the objective counts real tokens only, and a routing that sends the real tokens
to 0..k-1 and the padding to 1..k gives E/k without the padding and less with it, whatever the grouping
(unless the plan states ``tokens: equal``: nothing is padded).

Why ``GI aux_stats`` stands beside ``GI loss[aux]`` (check.losses): the term is Σ_g w_g · aux(g), the
weights w_g of its groups' values times those values. ``GI loss[aux]`` holds the weights (a divisor
with the microbatches, a per-device or per-token normalisation) to the objective's, an identity of
scalars over symbolic sizes in which aux(g) is one opaque value per device and microbatch; this
obligation holds the values (which tokens form g, which of them count, where f and P are taken), a
question about routings at which the weights play no part. Each departs without the other (wrong
groups at the right weights: pytorch/torchtitan#3000; right groups at a wrong weight:
NVIDIA-NeMo/Automodel#3359), so each is a root cause of its own and a finding names it alone.

Input: the plan, its model's ``aux_stats`` and overrides. Output: one obligation ``GI aux_stats``
where the model states the scope (the statements' axes are validated where the plan is resolved:
ir.routerstats.problems, PL214 and PL215).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from itertools import product

from .. import ir
from ..diagnostics import Span
from ..ir import losses as terms
from ..ir import routerstats
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import auxpacked
from . import encode_auxcells as auxcells
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
              OverrideVerb.STATS_PER_STEP: (SEQUENCES, MICROBATCHES),
              OverrideVerb.STATS_PER_ROW: (auxpacked.DOCUMENTS,)}  # each packed row's documents (check.auxpacked)
GROUP_OF = {**{v: v for v in VERB_EXTRA}, OverrideVerb.PROBS_PER_SEQUENCE: OverrideVerb.STATS_PER_SEQUENCE,
            OverrideVerb.PROBS_PER_MICROBATCH: OverrideVerb.STATS_PER_MICROBATCH,
            OverrideVerb.PROBS_PER_STEP: OverrideVerb.STATS_PER_STEP}
PADDING = "padding"  # the witness's dimension where the path counts padded positions


@dataclass(frozen=True)
class StatsView:
    objective: str  # ir.losses.STATS_OBJECTIVES
    token_axes: tuple[str, ...]  # the mesh axes that split the router's tokens
    split_axes: tuple[str, ...]  # those that split one sequence (context; tensor under sequence parallelism)
    wanted: frozenset[str]  # the dimensions the objective gathers
    gathered: frozenset[str]  # those the path's value gathers: f's and P's together (``effective``)
    stated: str | None  # the plan's statements as written, if any
    span: Span
    f_gathered: frozenset[str] = frozenset()  # the dimensions the routing fractions f are gathered over
    p_gathered: frozenset[str] = frozenset()  # those the mean probabilities P are gathered over
    padding: bool = False  # the statistics count the padded positions (``stats_count_padding``)
    equal: frozenset[str] = frozenset()  # call dimensions weighted equally (``stats_equal_cell_weights``, auxcells)
    capacity: str | None = None  # f after the capacity step: auxcells.DROP or PAD (``stats_after_capacity``, ...)
    counts_equal: bool = False  # ``override tokens: equal``: every shard holds as many real tokens (auxcells.split_dims)
    packed: bool = False  # the rows pack documents of free lengths (``aux_packed``): the dimension auxpacked.DOCUMENTS
    length_weighted: bool = False  # a row's documents weighted by their lengths (``stats_length_weighted``, auxpacked)


def _gathered(o, default: frozenset[str], packed: bool = False) -> frozenset[str]:
    if o is None:
        return default
    return auxpacked.rows(frozenset(o.axes or ()) | set(VERB_EXTRA[GROUP_OF[o.verb]]), packed)


def effective(f: frozenset[str], p: frozenset[str]) -> frozenset[str]:
    """The grouping whose value a path with f over ``f`` and P over ``p`` computes: their union. The path's
    value is the mean over its cells (the tokens sharing f's and P's group) of E·Σ f_i P_i; over a dimension
    only f gathers, f is one value and the mean of the cells' P is P over the dimension, and so for P: with
    cells of equal real-token counts the mean over the cells of f·P is the union's f times the union's P
    (unequal counts: check.encode_auxcells.split_dims)."""
    return f | p


def view(plan: ir.Plan) -> StatsView | None:
    """The objective's and the path's groupings, or None where the model states no scope. The statements'
    axes were validated where the plan was resolved (ir.routerstats.problems: PL214, PL215)."""
    scope = plan.model.aux_stats
    if scope is None:
        return None
    token, split = routerstats.token_axes(plan)
    objective, span = scope
    wanted = frozenset({"global_batch": set(token) | {SEQUENCES, MICROBATCHES},
                        "per_microbatch": set(split) | {SEQUENCES}, "per_sequence": set(split)}[objective])
    packed = auxpacked.packed(plan)
    wanted = auxpacked.rows(wanted, packed)
    fo, po = routerstats.stated(plan), routerstats.stated(plan, terms.PROBS_VERBS)
    pad = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.verb == terms.PADDING_VERB]
    f = _gathered(fo, wanted, packed)
    p = _gathered(po, f, packed)
    texts = [f"loss[aux]: {o.verb} over ({', '.join(o.axes or ())})" for o in (fo, po) if o is not None]
    texts += [f"loss[aux]: {terms.PADDING_VERB}"] if pad else []
    extra = [o for o in plan.overrides if o.target == OverrideTarget.LOSS and o.verb in auxcells_verbs()]
    texts += [f"loss[aux]: {o.verb}" + (f" over ({', '.join(o.axes)})" if o.axes is not None else "") for o in extra]
    where = (extra or pad or [o for o in (po, fo) if o is not None] or [None])[-1]
    return StatsView(objective, token, split, wanted, effective(f, p), "; ".join(texts) or None,
                     where.span if where is not None else span, f, p, bool(pad),
                     auxcells.equal_dims(plan, effective(f, p)), auxcells.stated(plan)[1], auxcells.counts_equal(plan),
                     packed, auxpacked.length_weighted(plan))


def auxcells_verbs() -> tuple[str, ...]:
    return (terms.EQUAL_WEIGHTS_VERB, terms.EQUAL_MICROBATCH_VERB) + terms.CAPACITY_VERBS + (terms.LENGTH_VERB,)


def _dims(v: StatsView) -> tuple[str, ...]:
    return v.token_axes + (MICROBATCHES, SEQUENCES) + ((auxpacked.DOCUMENTS,) if v.packed else ())


def aux_value(cells: dict[tuple, list[tuple[tuple[int, ...], tuple[Fraction, ...]]]], names: tuple[str, ...],
              f_gathered: frozenset[str], p_gathered: frozenset[str], experts: int, top_k: int,
              equal: frozenset[str] = frozenset(), capacity: tuple[str, Fraction] | None = None,
              by_length: bool = False) -> Fraction:
    """The term's value computed as a path does: each cell (the tokens sharing the coordinates outside
    the dimensions both f and P gather) takes E · Σ f_i P_i with f from its f-group (the cells sharing
    the coordinates outside ``f_gathered``) and P from its P-group, and the term is the mean over the
    cells. ``cells`` maps a shard's coordinates to its tokens, each (its chosen experts, its probabilities).
    Over the dimensions of ``equal`` a group's f and P are the mean of its parts' (check.encode_auxcells); f counts
    the routing map after ``capacity`` (mode, capacity factor) where one is given; ``by_length``: the cells
    weighted by their token counts (check.auxpacked)."""
    rows = [i for i, n in enumerate(names) if n not in (SEQUENCES, auxpacked.DOCUMENTS)]  # a call: every row at once
    calls: dict = {}
    for coord in sorted(cells):
        for j, (chosen, probs) in enumerate(cells[coord]):
            calls.setdefault(tuple(coord[i] for i in rows), []).append(((coord, j), chosen, probs))
    routed = auxcells.marked(calls, experts, top_k, capacity)

    def key(gathered):
        keep = [i for i, n in enumerate(names) if n not in gathered]
        return lambda coord: tuple(coord[i] for i in keep)

    def fractions(gathered, pick):
        """Per group: the mean over its parts (equal weights over ``equal``) of the parts' pooled fractions."""
        gkey, skey = key(gathered), key(gathered - equal)
        parts: dict = {}
        for coord, toks in cells.items():
            n = parts.setdefault(skey(coord), [gkey(coord), 0, [Fraction(0)] * experts])
            for j, tok in enumerate(toks):
                n[1] += 1
                for i, x in pick(coord, j, tok):
                    n[2][i] += x
        out: dict = {}
        for g, count, mass in parts.values():
            out.setdefault(g, []).append([m / count for m in mass])
        return {g: [sum(col) / len(vs) for col in zip(*vs)] for g, vs in out.items()}

    f = fractions(f_gathered, lambda c, j, tok: ((i, Fraction(1, top_k)) for i in routed[(c, j)]))
    p = fractions(p_gathered, lambda c, j, tok: enumerate(tok[1]))
    fkey, pkey, ckey = key(f_gathered), key(p_gathered), key(f_gathered & p_gathered)
    units = {ckey(coord): coord for coord in cells}
    counts: dict = {}
    for coord, toks in cells.items():
        counts[ckey(coord)] = counts.get(ckey(coord), 0) + len(toks)
    vals = {u: experts * sum(a * b for a, b in zip(f[fkey(c)], p[pkey(c)])) for u, c in units.items()}
    return auxpacked.mean(vals, counts, by_length)


def _cells(sizes: dict, names: tuple[str, ...], route, with_padding: bool) -> dict:
    """One real token per shard (and one padded position beside it where ``with_padding``), each routed by
    ``route(coord, padded)``."""
    return {coord: [route(coord, False)] + ([route(coord, True)] if with_padding else [])
            for coord in product(*[range(sizes[n]) for n in names])}


MAX_EXPERTS = 4096


def replay(ctx: rp.Context, w: dict, v: StatsView) -> Counterexample | None:
    """One token per shard (and a padded position beside it where the path counts padding). For a
    grouping dimension, the tokens at coordinate 0 of the witness's dimension route to experts 0..k-1,
    the others to 1..k, each with probability 1/k on its chosen experts (a padded position as its
    neighbour); for padding, every real token routes to 0..k-1 and every padded position to 1..k."""
    sizes = dict(w["sizes"])
    sizes[SEQUENCES] = w[SEQUENCES]
    sizes[auxpacked.DOCUMENTS] = w.get(auxpacked.DOCUMENTS, 1)
    e, k, dim = w["experts"], w["top_k"], w["dim"]
    if e > MAX_EXPERTS:  # the replay lists every expert's probability: not replayed, unknown (never a hang)
        return None
    names = _dims(v)
    if isinstance(dim, tuple):  # unequal calls or the capacity step (check.encode_auxcells)
        return _replay_cells(ctx, w, v, sizes, names)
    if not (e >= 2 and 1 <= k < e and (dim == PADDING or sizes[dim] >= 2)):
        return None
    c0, c1 = tuple(range(k)), tuple(range(1, k + 1))

    def route(coord, padded):
        chosen = (c1 if padded else c0) if dim == PADDING else c0 if coord[names.index(dim)] == 0 else c1
        return chosen, tuple(Fraction(1, k) if i in chosen else Fraction(0) for i in range(e))

    cap = (v.capacity, w["capacity_factor"]) if v.capacity else None
    got = aux_value(_cells(sizes, names, route, v.padding), names, v.f_gathered, v.p_gathered, e, k, v.equal, cap,
                    v.length_weighted)
    want = aux_value(_cells(sizes, names, route, False), names, v.wanted, v.wanted, e, k)
    if got == want:
        return None
    shown = lambda s: ", ".join(n for n in names if n in s) or "nothing: each rank's own tokens"  # noqa: E731
    what = (f"every real token chooses experts {', '.join(map(str, c0))}, every padded position "
            f"{', '.join(map(str, c1))}" if dim == PADDING else
            f"tokens at {dim}=0 choose experts {', '.join(map(str, c0))}, the others {', '.join(map(str, c1))}")
    path = (f"f gathered over ({shown(v.f_gathered)}), P over ({shown(v.p_gathered)})"
            if v.f_gathered != v.p_gathered else f"statistics gathered over ({shown(v.gathered)})")
    values = (
        ("objective", f"aux_stats = {v.objective}: statistics {SCOPE_TEXT[v.objective]} ({shown(v.wanted)}), "
                      "real tokens only"),
        ("path", _path_text(v, path)),
        ("routing", f"E = {e} experts, top-{k}; one token per shard" + (" and one padded position beside it"
                    if v.padding else "") + f"; {what}, probability 1/{k} on each chosen expert"),
        ("sequences per microbatch", str(sizes[SEQUENCES])),
    ) + _rows_text(v, sizes, names, 1)
    eq = (f"aux on this path = {rp._frac(got)} ({'the length-weighted ' if v.length_weighted else ''}mean over its cells of E·Σ f_i·P_i), but the objective's "
          f"grouping gives {rp._frac(want)}")
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("observer", "every device"),), values, eq,
                          tuple(diagnose(v)), ctx.command(w["sizes"]))


def _rows_text(v: StatsView, sizes: dict, names: tuple[str, ...], per: int, short: str | None = None) -> tuple:
    """The packed rows of a witness: its documents per row and their real lengths (tokens per rank of the row)."""
    if not v.packed:
        return ()
    shards = [n for n in v.split_axes if n in names]
    ranks = 1
    for n in shards:
        ranks *= sizes[n]
    docs = sizes[auxpacked.DOCUMENTS]
    lengths = [per * ranks * (2 if short == auxpacked.DOCUMENTS and d > 0 else 1) for d in range(docs)]
    return (("packed rows", f"{docs} document(s) per row, real lengths {', '.join(map(str, lengths))} tokens"
             + (f" (cut over {', '.join(shards)}: each rank holds a piece of every document)" if ranks > 1 else "")),)


def _path_text(v: StatsView, path: str) -> str:
    return (f"{v.stated or 'derived'}: {path}" + (", padded positions counted" if v.padding else "")
            + (f", the router calls weighted equally over {', '.join(d for d in _dims(v) if d in v.equal)}"
               if v.equal else "")
            + (", a row's documents weighted by their lengths" if v.length_weighted else "")
            + {None: "", auxcells.DROP: ", f after the capacity step (dropped tokens missing)",
               auxcells.PAD: ", f on the map padded to capacity"}[v.capacity])


def _replay_cells(ctx: rp.Context, w: dict, v: StatsView, sizes: dict, names: tuple[str, ...]):
    """The witness of check.encode_auxcells: calls of unequal real-token counts, or every token routed alike with as
    many tokens per shard as make the capacity step drop or pad."""
    e, k, kind = w["experts"], w["top_k"], w["dim"]
    cf = w.get("capacity_factor", Fraction(1))
    if not (e >= 2 and 1 <= k < e) or (kind[0] in (auxcells.UNEVEN, auxpacked.LENGTH) and sizes[kind[1]] < 2):
        return None
    cap = (v.capacity, cf) if v.capacity else None
    per = 1
    if kind[0] == auxpacked.LENGTH:
        cells = real = auxpacked.length_cells(sizes, names, e, k)
    elif kind[0] == auxcells.UNEVEN:
        cells = auxcells.uneven_cells(sizes, names, kind[1], e, k, v.padding)
        real = {c: ts[:1] if len(ts) == 2 and c[names.index(kind[1])] == 0 and v.padding else ts
                for c, ts in cells.items()}
    else:
        if kind[1] == auxcells.DROP and cf * k >= e:
            return None
        per = auxcells.capacity_per_shard(cf, e, k, sizes[SEQUENCES])
        cells = real = auxcells.uniform_cells(sizes, names, per, e, k)
    got = aux_value(cells, names, v.f_gathered, v.p_gathered, e, k, v.equal, cap, v.length_weighted)
    want = aux_value(real, names, v.wanted, v.wanted, e, k)
    if got == want:
        return None
    shown = lambda s: ", ".join(n for n in names if n in s) or "nothing: each rank's own tokens"  # noqa: E731
    values = (
        ("objective", f"aux_stats = {v.objective}: statistics {SCOPE_TEXT[v.objective]} ({shown(v.wanted)}), "
                      "real tokens pooled, f on the router's top-k"),
        ("path", _path_text(v, f"f gathered over ({shown(v.f_gathered)}), P over ({shown(v.p_gathered)})")),
        ("routing", f"E = {e} experts, top-{k}; " + (auxpacked.describe(k) if kind[0] == auxpacked.LENGTH
                                                     else auxcells.describe(kind, v, e, k, cf, per))),
        ("sequences per microbatch", str(sizes[SEQUENCES])),
    ) + _rows_text(v, sizes, names, per, kind[1] if kind[0] in (auxcells.UNEVEN, auxpacked.LENGTH) else None)
    eq = (f"aux on this path = {rp._frac(got)} ({'the length-weighted ' if v.length_weighted else ''}mean over its cells of E·Σ f_i·P_i), but the objective's "
          f"grouping gives {rp._frac(want)}")
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("observer", "every device"),), values, eq,
                          tuple(diagnose(v)), ctx.command(w["sizes"]))


def diagnose(v: StatsView) -> list[str]:
    """One cause per departure: the padding counted, each dimension the two groupings disagree on."""
    out = []
    if v.padding and not v.counts_equal:  # `tokens: equal`: no position is padded
        out.append("the aux term's routing statistics count the padded positions (loss[aux]: stats_count_padding): "
                   "their routing slots and probabilities enter f and P and their number divides them, so the loss "
                   "balances the padded batch, not its tokens (the objective counts real tokens only)")
    names = _dims(v)
    what = {MICROBATCHES: "the step's microbatches", SEQUENCES: "the sequences of a microbatch",
            auxpacked.DOCUMENTS: "the documents packed in a row"}
    for d in sorted(v.wanted - v.gathered, key=names.index):
        who = {MICROBATCHES: "microbatch", SEQUENCES: "sequence", auxpacked.DOCUMENTS: "document"}.get(d, f"{d} rank")
        out.append(f"the aux term's routing statistics are not gathered over {what.get(d, d)}: each "
                   f"{who} computes E·Σ f_i·P_i from its own tokens, and a mean of "
                   f"those is not the load-balancing loss of the objective's tokens ({v.objective})")
    for d in sorted(v.gathered - v.wanted, key=names.index):
        alone = ("" if d in v.f_gathered and d in v.p_gathered else
                 f" ({'f' if d in v.f_gathered else 'P'} alone: the mean over the ranks of f·P, one factor common "
                 "to them, is the product of the two over their union)")
        out.append(f"the aux term's routing statistics are gathered over {what.get(d, d)}, which its objective "
                   f"({v.objective}) keeps apart{alone}: the balance of the union is penalised, not that of each "
                   "group")
    return auxpacked.diagnose(v) + out + auxcells.diagnose(v)
