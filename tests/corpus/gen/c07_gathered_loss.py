"""The corpus generator's loss on the gathered sequence (``override loss: on_gathered_sequence over (AXES)``,
check.gathered): each context rank counts the whole sequence, so a count all-reduced over the context axis too
counts every token cp times (tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import BASES, gi, gi_root, mutant
from .c03_equivalents import with_base

GATHERED_TOKENS = ("verl's Ulysses loss on the gathered sequence with its token count all-reduced over dp x sp "
                   "(verl-project/verl#1963, fixed by verl-project/verl#3691)")

for b in ["cp", "cp_zero3"]:
    gs = BASES[b].all_groups()
    mutant(f"loss_gathered_tokens_over_dp_cp_{b}", b, "the loss computed on the sequence gathered over cp, each cp "
           "rank's count the whole sequence's, and that count all-reduced over cp as well as dp: every token counted "
           "cp times (`loss: on_gathered_sequence over (cp)`, `tokens: reduce over (dp, cp)`).",
           ["override loss: on_gathered_sequence over (cp)", "override tokens: reduce over (dp, cp)"],
           gi(gs, "normalisation"), gi_root(gs, "normalisation"), mirrors=GATHERED_TOKENS)

with_base("loss_gathered_tokens_over_dp_cp", "cp", "the loss computed on the sequence gathered over cp counts the "
          "whole sequence on each cp rank, and the count all-reduced over dp only is the step's token count.",
          ["override loss: on_gathered_sequence over (cp)", "override tokens: reduce over (dp)"])
