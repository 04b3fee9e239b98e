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

Input: the plan and the groupings check.auxstats computes. Output: the groupings with the documents'
dimension, and the finding that names a per-row path.
"""

from __future__ import annotations

DOCUMENTS = "documents"  # the documents packed in one row (a sequence of the model's microbatch)
SEQUENCES = "sequences"


def packed(plan) -> bool:
    return plan.model.aux_packed is not None


def rows(dims: frozenset[str], is_packed: bool) -> frozenset[str]:
    """A grouping's dimensions with the documents': a grouping that gathers the rows of a microbatch gathers
    their documents; without packing there is no such dimension (each row is one sequence)."""
    if not is_packed:
        return dims - {DOCUMENTS}
    return dims | {DOCUMENTS} if SEQUENCES in dims else dims


def diagnose(v) -> list[str]:
    """The finding of a path that gathers a packed row's documents where the objective keeps them apart."""
    if DOCUMENTS not in v.gathered - v.wanted:
        return []
    return ["the aux term's routing statistics are taken per packed row, not per document: the row's documents "
            "(cu_seqlens' boundaries) are pooled into one f and one P, so a document routed to some experts and "
            "another routed to others look balanced together, and the loss no longer penalises each document's own "
            "imbalance (the sequence-wise objective takes f and P per document and averages the documents)"]
