"""The catalogue of safety conditions and composition rules the checker reports.

Input: nothing (definitions). Output: ``RULES``, code -> ``Rule`` (stable code, short
name, one-line description, why it matters, the usual fix). ``docs/checker.md`` has one
entry per code and a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    description: str
    why: str
    fix: str


GRADIENT_INTEGRITY = "gradient_integrity"
STATE_CONSISTENCY = "state_consistency"

_RULES = (
    Rule("CR01", "axis-one-role",
         "Each mesh axis is used by one strategy role (or by one explicitly nested multi-axis strategy).",
         "Two strategies on one axis each assume they own its devices; their collectives interleave on the same group.",
         "Bind each axis to one strategy; express nesting with one multi-axis strategy such as hybrid_shard."),
    Rule("CR02", "reduce-where-varying",
         "Gradients are reduced over exactly the axes where their contributions vary, once each.",
         "A missing reduction leaves a partial sum; a repeated one, or one over identical copies, multiplies the gradient; "
         "one over a sharded axis adds up different parameters.",
         "Reduce each parameter group over its data, context, expert-data and sequence-parallel axes exactly once."),
    Rule("CR03", "gather-sharded-axes",
         "Every gather of an S* state ranges only over axes on which that state is sharded.",
         "All-gathering a state that is replicated on the axis concatenates identical copies: the buffer is n times too large "
         "and misaligned with the parameter layout.",
         "Gather only over the axes where the state is placed S* (or S/O)."),
    Rule("CR04", "offload-fetch",
         "A state offloaded off-device is brought back before use (an offloaded Θ needs a fetch or gather path).",
         "Forward and backward read parameters from device memory; an offloaded parameter with no fetch is never there.",
         "Fetch offloaded parameters per reconstruction unit before use (ZeRO-Infinity style), or keep them on device."),
    Rule("CR05", "sequence-parallel-tp",
         "Sequence parallel is only used with tensor parallel on the same axis, and parameters replicated over that axis "
         "(LayerNorm, biases) get their gradients reduced over it.",
         "Under sequence parallel each tensor-parallel rank sees a slice of the sequence, so the gradients of replicated "
         "LayerNorm weights and biases are partial sums; without the all-reduce the replicas drift apart.",
         "All-reduce the gradients of sequence-parallel replicated parameters over the tensor axis, once."),
    Rule("CR06", "sharded-grads-accumulation",
         "Gradients sharded or streamed (S/M) over a data axis combined with pipeline gradient accumulation need one "
         "reduce-scatter per microbatch or a full-size accumulation buffer.",
         "Without either, the gradient of every microbatch but the last is overwritten before it is reduced. "
         "DeepSpeed refuses ZeRO-2/3 together with pipeline parallelism for this reason.",
         "Reduce-scatter after every microbatch (pay m times the gradient traffic) or keep a full-size accumulation buffer."),
    Rule("CR07", "expert-reduction-groups",
         "Expert parameters are reduced over the expert-data axes and non-expert ones over the whole data group, "
         "each with its own divisor.",
         "An expert receives tokens from every rank of its expert group through the all-to-all, so its divisor counts "
         "those ranks too although they take no part in its all-reduce.",
         "Reduce expert gradients over the expert-data axes and divide by the full number of token shards."),
    Rule("CR08", "tied-weights-stages",
         "Tied weights that live on two pipeline stages get their gradients summed across them.",
         "The input embedding on the first stage and the output projection on the last stage are one parameter: "
         "each stage holds half of its gradient.",
         "All-reduce the tied embedding's gradient over the group of the first and last pipeline stage."),
)

RULES: dict[str, Rule] = {r.code: r for r in _RULES}

CONDITIONS: dict[str, str] = {
    GRADIENT_INTEGRITY: "the gradient entering every update equals the global-batch mean-loss gradient",
    STATE_CONSISTENCY: "every value a replicated update depends on is identical across the replicas",
}
