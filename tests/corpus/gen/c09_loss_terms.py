"""The corpus generator's mutants of loss terms of the user's own and per-sequence normalisations
(check.seqterms; tests/corpus/generate.py imports the sections in order)."""

from __future__ import annotations

from .c00_bases import MODELS, mutant

MODELS.update({
    "plain_rl": MODELS["plain"] + ("losses {\n    policy = per_sequence_mean\n    kl = global_mean\n  }",),
    "plain_seq_sum": MODELS["plain"] + ("losses {\n    policy = per_sequence_sum\n  }",),
})
POLICY = ["GI loss[policy] grads[dense]", "GI loss[policy]"]
KL = ["GI loss[kl] grads[dense]", "GI loss[kl]"]
SEQ_MB = "seq-mean-token-mean averaged over each micro-batch's own responses (verl-project/verl#7321, closest report)"
NLL_LOCAL = "a named loss term normalised by the microbatch's local token count (NVIDIA-NeMo/RL#3791)"
DISTILL = "a token-mean loss computed as a mean of per-response token means (verl-project/verl#7200)"
mutant("policy_seq_mean_per_microbatch_count", "ddp",
       "a seq-mean-token-mean policy loss divided by each microbatch's own sequence count and averaged over the "
       "devices and microbatches (`loss[policy]: per_microbatch_mean`).",
       ["override loss[policy]: per_microbatch_mean"], POLICY, mirrors=SEQ_MB, model="plain_rl")
mutant("policy_seq_mean_per_device_count", "ddp",
       "a seq-mean-token-mean policy loss divided by each device's own sequence count (`loss[policy]: "
       "per_device_mean`).", ["override loss[policy]: per_device_mean"], POLICY, model="plain_rl")
mutant("policy_seq_mean_as_token_mean", "ddp",
       "a seq-mean-token-mean policy loss computed as a per-token mean over the global batch (`loss[policy]: "
       "global_mean`): another family.", ["override loss[policy]: global_mean"], POLICY, model="plain_rl")
mutant("policy_seq_mean_as_token_sum", "ddp",
       "each response's token sum where its token mean is meant (`loss[policy]: per_sequence_sum`).",
       ["override loss[policy]: per_sequence_sum"], POLICY, model="plain_rl")
mutant("kl_token_mean_per_microbatch", "ddp",
       "a KL penalty, per token over the global batch, divided by each microbatch's own token count "
       "(`loss[kl]: per_microbatch_mean`).", ["override loss[kl]: per_microbatch_mean"], KL, mirrors=NLL_LOCAL,
       model="plain_rl")
mutant("kl_token_mean_as_sequence_mean", "ddp",
       "a per-token KL penalty computed as a mean of per-sequence token means (`loss[kl]: per_sequence_mean`).",
       ["override loss[kl]: per_sequence_mean"], KL, mirrors=DISTILL, model="plain_rl")
mutant("seq_sum_divided_by_dp_only", "ddp",
       "a seq-mean-token-sum loss summed over the sequences and divided by the data size alone, with no sequence "
       "count (`loss[policy]: sum`, `loss[policy]: divide by dp`).",
       ["override loss[policy]: sum", "override loss[policy]: divide by dp"], ["GI loss[policy] grads[dense]",
                                                                              "GI loss[policy]"], model="plain_seq_sum")
SLICE_MEAN = ("seq-mean-token-mean under Ulysses sequence parallelism as each sp rank's slice mean, averaged over the sp "
              "ranks (huggingface/transformers#41832, closest report; examples/bugs/ulysses_seq_mean_over_slice_length.place)")
CHUNK_COUNT = ("a per-sample loss under context parallelism divided by each cp rank's own real-token count of the sample "
               "(PrimeIntellect-ai/prime-rl#2032, closest report)")
mutant("policy_seq_mean_slice_means_over_cp", "cp",
       "a seq-mean-token-mean policy loss under context parallelism as each cp rank's slice mean, the slices counted as "
       "sequences (`tokens[policy]: per_sequence_local over (cp)`, `tokens[policy]: reduce over (dp, cp)`): unequal "
       "slices weigh their tokens unequally.",
       ["override tokens[policy]: per_sequence_local over (cp)", "override tokens[policy]: reduce over (dp, cp)"], POLICY,
       mirrors=SLICE_MEAN, model="plain_rl")
mutant("policy_seq_mean_slice_length_summed_over_cp", "cp",
       "each cp rank divides its slice of a response by the slice's own length and the ranks' parts are summed "
       "(`tokens[policy]: per_sequence_local over (cp)`).",
       ["override tokens[policy]: per_sequence_local over (cp)"], POLICY, mirrors=CHUNK_COUNT, model="plain_rl")
mutant("seq_sum_count_over_cp", "cp",
       "a seq-mean-token-sum loss whose response count is all-reduced over the context axis too, every response "
       "counted once per cp rank (`tokens[policy]: reduce over (dp, cp)`).",
       ["override tokens[policy]: reduce over (dp, cp)"], ["GI loss[policy] grads[dense]", "GI loss[policy]"],
       model="plain_seq_sum")
