"""Framework configurations in and out: DeepSpeed JSON and Megatron-LM arguments <-> specs
(torchtitan's job configs: ``interop.torchtitan``).

Input: a DeepSpeed ``ds_config.json`` or a Megatron-LM argument list, with the device
count (and, for DeepSpeed, the model: a Hugging Face config or a parameter count). Output:
the text of a spec (model, mesh, one plan) that ``placement`` reads; or, the other way, the
DeepSpeed config or Megatron-LM arguments of a plan, with the list of what that framework
cannot express for it. Every error is a PL141 diagnostic; nothing is executed.

DeepSpeed: ``zero_optimization.stage`` 0-3 -> ddp, zero1, zero2, zero3;
``offload_optimizer.device`` cpu or nvme -> zero_offload (stages 1-2) or zero_infinity (stage
3, with ``offload_param``); ``train_micro_batch_size_per_gpu`` and
``gradient_accumulation_steps`` -> microbatch and microbatches (``train_batch_size`` must
agree); ``bf16``/``fp16`` -> 2-byte weights and gradients with a 12-byte Adam state (fp32:
4, 4 and 8). Megatron-LM: the tensor, pipeline (with virtual stages), context, expert and
expert tensor sizes (MoE parallel folding as whole mesh axes with the expert group's roles,
``interop.framework_common.fold_axes``), ``--sequence-parallel``,
``--use-distributed-optimizer``, ``--recompute-granularity`` and the model shape flags.
"""

from __future__ import annotations

from .deepspeed import deepspeed_to_spec, plan_to_deepspeed
from .megatron_args import plan_to_megatron
from .megatron_spec import megatron_to_spec

__all__ = ["deepspeed_to_spec", "megatron_to_spec", "plan_to_deepspeed", "plan_to_megatron"]
