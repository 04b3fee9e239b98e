"""Per-sequence normalisations of a loss term (``losses { kl = per_sequence_mean }``, ``ir.losses``).

A per-sequence term is a value per sequence, its tokens' mean (``per_sequence_mean``, verl's
seq-mean-token-mean) or sum (``per_sequence_sum``, seq-mean-token-sum), and its objective is the
mean of those values over the global batch's sequences. A token of a sequence of length L in a
step of S sequences weighs 1 / (L · S), or 1 / S. Within one family the sequence's own reduction
is the same on the path and in the objective, so each sequence's value is one contribution and the
sequence counts play the part token counts play for a per-token mean: ``check.losses`` encodes the
obligation as a global mean over sequence counts (a path that takes each microbatch's or each
device's own count is a mean of local means, equal to the objective only where every device and
microbatch holds the same number of sequences: ``tokens[T]: equal``; equal token counts do not make
sequence counts equal).

A path of another family (a per-token mean of a per-sequence term, a per-sequence mean of a
per-token term, a sequence's token sum where its mean is meant) weighs tokens differently within
one step whatever its constant factors: the obligation is refuted without the solver by three
steps whose every device and microbatch holds the same sequences (lengths (1, 3), (2), (1, 1)),
where the path's weights are not proportional to the objective's, so no normaliser reconciles
them.

Under context parallelism a rank holds a part of each sequence. Where the path takes each sequence's token
sum (``per_sequence_sum``) the parts add up to the sequence's value whatever their lengths: decided as
without context. Where it takes a token mean, the length a rank divides its part by is a fact of the path:
``tokens[T]: per_sequence_gathered over (CP)`` (the whole sequence's length, its count all-reduced over the
context group: each rank's part of the mean, the parts summed, is the sequence's mean, decided as without
context) or ``tokens[T]: per_sequence_local over (CP)`` (each rank's slice mean, the slice means averaged
over the context ranks as if they were sequences). The average of slice means is the sequence's mean only
when every slice holds as many real tokens; a sequence's real length is not a multiple of the context size
in general (padding, a zigzag layout's chunks), so the local path is refuted wherever the axis has two ranks
or more: one sequence of cp + 1 tokens, cut into slices (2, 1, ..., 1), weighs its tokens unequally
(``replay_local``). A context axis neither statement names leaves the verdict unknown, naming the fact.
"""

from __future__ import annotations

from fractions import Fraction

from ..ir import losses as terms
from .replay import Context
from .report import Counterexample

SEQUENCE = terms.SEQUENCE_OBJECTIVES
# the steps of the family test: every device and microbatch holds sequences of these lengths; the
# token looked at is the first of the sequence of the given length
STEPS: tuple[tuple[str, tuple[int, ...], int], ...] = (
    ("A", (1, 3), 1), ("A", (1, 3), 3), ("B", (2,), 2), ("C", (1, 1), 1))
CONTEXT_FACT = ("the sequence length a rank of ({axes}) divides its part of each sequence by (the whole sequence's, "
                "gathered over the context ranks, or its own part's) is not stated: state tokens[{term}]: "
                "per_sequence_gathered over ({axes}) or per_sequence_local over ({axes})")


def is_sequence(objective: str) -> bool:
    return objective in SEQUENCE


def mismatch(objective: str, path: str) -> bool:
    """Whether the path normalises a term in another family than its objective: per token against
    per sequence, or a sequence's token sum against its mean."""
    if path in SEQUENCE:
        return path != objective
    return objective in SEQUENCE and path == "global_mean"


def objective_weight(objective: str, lengths: tuple[int, ...], length: int) -> Fraction:
    """The objective's weight of a token of a sequence of ``length`` where every device and microbatch
    holds sequences of ``lengths`` (the number of devices and microbatches is common to every step and
    left out)."""
    if objective == "global_mean":
        return Fraction(1, sum(lengths))
    if objective == "per_sequence_mean":
        return Fraction(1, length * len(lengths))
    if objective == "per_sequence_sum":
        return Fraction(1, len(lengths))
    return Fraction(1)  # sum


def path_weight(objective: str, path: str, lengths: tuple[int, ...], length: int) -> Fraction:
    """The path's weight of the same token up to a factor common to every step (the mesh sizes, the
    path's divisor): its sequence's own reduction over the count of its normaliser's unit."""
    if path in SEQUENCE:
        return objective_weight(path, lengths, length)
    if path == "global_mean":
        return Fraction(1, sum(lengths))
    local = path in ("per_device_mean", "per_microbatch_mean")  # the objective's own unit, counted locally
    inner = Fraction(1, length) if objective == "per_sequence_mean" else Fraction(1)
    if not local:
        return inner
    return inner / (len(lengths) if objective in SEQUENCE else sum(lengths))


def family_witness(objective: str, path: str) -> tuple[list[Fraction], list[Fraction]] | None:
    """The objective's and the path's weights over ``STEPS`` where they are not proportional."""
    ow = [objective_weight(objective, s, n) for _, s, n in STEPS]
    pw = [path_weight(objective, path, s, n) for _, s, n in STEPS]
    k = ow[0] / pw[0]
    return None if all(o == k * p for o, p in zip(ow, pw)) else (ow, pw)


def _text(xs: list[Fraction]) -> str:
    return "(" + ", ".join(str(x) for x in xs) + ")"


def replay_family(ctx: Context, w: dict, term: str, objective: str, path: str) -> Counterexample | None:
    """The three steps whose weights no common factor reconciles, recomputed here without the solver."""
    found = family_witness(objective, path)
    if found is None:
        return None
    ow, pw = found
    on, pn = [x / ow[0] for x in ow], [x / pw[0] for x in pw]
    i = next(i for i, (a, b) in enumerate(zip(on, pn)) if a != b)
    steps_text = "; ".join(f"step {name}: sequences of lengths {lens} on every device and microbatch, the first token of "
                           f"the one of length {n}" for name, lens, n in STEPS)
    values = (
        ("objective", f"{term} = {objective}"),
        ("path", f"loss[{term}]: {path}"),
        ("tokens", steps_text),
        ("objective weights", f"{_text(ow)} per device and microbatch, relative to the first {_text(on)}"),
        ("path weights", f"{_text(pw)} up to the path's common factor, relative to the first {_text(pn)}"),
    )
    name, lens, n = STEPS[i]
    eq = (f"the {term} term's weight of that token of step {name} relative to the first token of step A is {pn[i]} on "
          f"the path, but {on[i]} in its objective: no normaliser makes the path agree on every step")
    why = (f"the {term} term is normalised as {path} on this path, another family than its objective {objective}: "
           + ("a token's weight depends on its sequence's length in one and not in the other"
              if "per_sequence_mean" in (objective, path) else
              "one counts sequences where the other counts tokens"),)
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("observer", "every device"),), values, eq, why,
                          ctx.command(w["sizes"]))


def inner_mean(objective: str, path: str) -> bool:
    """Whether the path divides each sequence by its length (a token mean per sequence): the only place a context
    rank's slice length can enter."""
    if path in SEQUENCE:
        return path == "per_sequence_mean"
    # a per-sequence term's own unit on a local or summed path: each sequence's value, a token mean here
    return objective == "per_sequence_mean" and path != "global_mean"


def slices(length: int, ranks: int) -> tuple[int, ...]:
    """A sequence of ``length`` real tokens cut into ``ranks`` contiguous slices, the first ones a token longer (the
    last slices' padding not counted): (2, 1) for 3 tokens on 2 ranks."""
    return tuple(length // ranks + (1 if r < length % ranks else 0) for r in range(ranks))


def local_weights(length: int, ranks: int) -> tuple[list[Fraction], list[Fraction]]:
    """The objective's and a slice-local path's weights of each token of one sequence, up to common factors: 1/L
    against 1/(the token's slice length) (the cp ranks' slice means then averaged)."""
    cut = slices(length, ranks)
    return [Fraction(1, length)] * length, [Fraction(1, n) for n in cut for _ in range(n)]


def replay_local(ctx: Context, w: dict, term: str, path: str, axis: str) -> Counterexample | None:
    """One sequence of ``cp + 1`` tokens cut over the ``cp`` ranks of ``axis`` (slices (2, 1, ..., 1)): the slice
    means' average weighs its tokens unequally where its token mean weighs them equally; recomputed here."""
    k = w["sizes"].get(axis, 1)
    if k < 2:
        return None
    length = k + 1
    ow, pw = local_weights(length, k)
    on, pn = [x / ow[0] for x in ow], [x / pw[0] for x in pw]
    if on == pn:
        return None
    cut = slices(length, k)
    values = (
        ("path", f"loss[{term}]: {path}, tokens[{term}]: per_sequence_local over ({axis})"),
        ("sequence", f"{length} real tokens cut over the {k} ranks of {axis} into slices of lengths {cut}"),
        ("objective weights", f"{_text(ow)}: the sequence's token mean, relative to the first {_text(on)}"),
        ("path weights", f"{_text([x / k for x in pw])}: the average of the {k} slice means, relative to the first "
                         f"{_text(pn)}"),
    )
    eq = (f"the {term} term's weight of the last token relative to the first is {pn[-1]} on the path, but {on[-1]} in "
          "its objective: no normaliser makes the path agree")
    why = (f"each rank of {axis} divides its slice of a sequence by the slice's own length; the average of the slice "
           "means equals the sequence's token mean only when every slice holds as many real tokens, and a sequence "
           f"whose length is not a multiple of {axis} (padding, a zigzag layout's chunks) has unequal slices",)
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("observer", "every device"),), values, eq, why,
                          ctx.command(w["sizes"]))
