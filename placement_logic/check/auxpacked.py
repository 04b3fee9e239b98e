"""The aux load-balancing loss's statistics over packed rows (docs/semantics.md, "Loss terms"; the grouping
itself: check.auxstats).

A packed row (THD, ``cu_seqlens``) holds several documents of free, unequal real lengths. The model states it
(``losses { aux_packed = true }``); a sequence of the objective is then one document: ``aux_stats =
per_sequence`` (DeepSeek-V2/V3's sequence-wise balance loss) takes f and P per document, and the term is the
mean over the documents, each weighing one. The documents of a row are one more token dimension of the
grouping (``DOCUMENTS``, beside the sequences of a microbatch, which are the rows): a grouping that gathers
the rows of a microbatch gathers their documents, and the plan's ``override loss[aux]: stats_per_row over
(AXES)`` takes each packed row's statistics (every document of the row at once, over the ranks of AXES: the
code that ignores ``cu_seqlens`` and sees a batch of rows). ``stats_per_sequence`` is then per document.

Per-row statistics give the objective's value for every routing exactly where every row holds one document
(check.auxstats: groupings that differ on a dimension of two or more differ for some routing); the document
count per row is free (at least one), so the negation asks z3 for a row of two documents, and the replay
builds the routing on it. Where f and P are gathered over groups of their own and only one of them gathers
the documents, the documents' unequal real lengths make the cells' equal-weight mean depart even where the plan
states ``tokens: equal`` (every device and microbatch holds as many tokens; the documents of a row still
differ: check.encode_auxcells.split_dims).

A document that context or sequence parallelism splits over ranks is gathered there by the objective (its
group is the whole document): a path whose per-sequence statistics are each rank's local piece
(``stats_per_sequence over ()`` under cp) departs on that axis, as without packing.

A path may weight a row's documents by their real lengths (``override loss[aux]: stats_length_weighted``: a per-token
mean of each token's document's value); the objective weighs each document one. With per-document cells and free
lengths it departs at a row of two documents (the path's cells weighted by their token counts: a per-token mean;
the objective's documents each weighing one); the replay gives document 0 one token per shard, unmixed, and the
others two, one of each routing, so their values differ.

Input: the plan and the groupings check.auxstats computes. Output: the groupings with the documents'
dimension, the length-weighted mean, and the finding that names a per-row path.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

from ..ir import losses as terms
from ..ir.overrides import OverrideTarget

DOCUMENTS = "documents"  # the documents packed in one row (a sequence of the model's microbatch)
SEQUENCES = "sequences"
LENGTH = "length"  # the witness's kind where the path weights a row's documents by their lengths


def length_weighted(plan) -> bool:
    """``override loss[aux]: stats_length_weighted``: a row's per-document values averaged weighted by the documents'
    real lengths (a per-token mean of each token's document's value), not each document weighing one."""
    return any(o.target == OverrideTarget.LOSS and o.verb == terms.LENGTH_VERB for o in plan.overrides)


def departs_by_length(v) -> bool:
    """The path's cells are per document (f or P per document) and it weights them by length: documents of unequal
    lengths and unequal values give another mean (the PL506 of a path with no documents apart: ir.routerstats)."""
    return v.packed and v.length_weighted and DOCUMENTS not in (v.f_gathered & v.p_gathered)


def mean(values: dict, counts: dict, by_length: bool) -> Fraction:
    """The term's value from its cells' values (keyed by the cells' coordinates): their mean, or ``by_length`` the
    mean weighted by their token counts (each token taking its cell's value)."""
    if not by_length:
        return sum(values.values(), Fraction(0)) / len(values)
    return sum((counts[u] * x for u, x in values.items()), Fraction(0)) / sum(counts.values())


def length_cells(sizes: dict, names: tuple[str, ...], experts: int, top_k: int) -> dict:
    """Document 0 holds one token per shard routed to experts 0..k-1; every other document two per shard, one routed
    to 0..k-1 and one to 1..k (probability 1/k on each chosen): documents of unequal lengths and values."""
    c0, c1 = tuple(range(top_k)), tuple(range(1, top_k + 1))
    tok = {c: (c, tuple(Fraction(1, top_k) if i in c else Fraction(0) for i in range(experts))) for c in (c0, c1)}
    at = names.index(DOCUMENTS)
    return {c: [tok[c0]] if c[at] == 0 else [tok[c0], tok[c1]] for c in product(*[range(sizes[n]) for n in names])}


def describe(k: int) -> str:
    return (f"document 0 holds one token per shard choosing experts {', '.join(map(str, range(k)))}, every other "
            f"document two per shard, one choosing {', '.join(map(str, range(k)))} and one "
            f"{', '.join(map(str, range(1, k + 1)))}, probability 1/{k} on each chosen expert")


def packed(plan) -> bool:
    return plan.model.aux_packed is not None


def rows(dims: frozenset[str], is_packed: bool) -> frozenset[str]:
    """A grouping's dimensions with the documents': a grouping that gathers the rows of a microbatch gathers
    their documents; without packing there is no such dimension (each row is one sequence)."""
    if not is_packed:
        return dims - {DOCUMENTS}
    return dims | {DOCUMENTS} if SEQUENCES in dims else dims


def diagnose(v) -> list[str]:
    """The findings of a path that gathers a packed row's documents where the objective keeps them apart, and of one
    that weights them by length."""
    out = ["the aux term's per-document values are averaged weighted by the documents' lengths (loss[aux]: "
           f"{terms.LENGTH_VERB}: a per-token mean of each token's document's value), where the objective weighs every "
           "document one: a long document's balance counts more than a short one's"] if departs_by_length(v) else []
    if DOCUMENTS not in v.gathered - v.wanted:
        return out
    return out + ["the aux term's routing statistics are taken per packed row, not per document: the row's documents "
            "(cu_seqlens' boundaries) are pooled into one f and one P, so a document routed to some experts and "
            "another routed to others look balanced together, and the loss no longer penalises each document's own "
            "imbalance (the sequence-wise objective takes f and P per document and averages the documents)"]
