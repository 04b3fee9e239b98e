"""What a rank and the single-process reference share: the job, the batches, the loss, the
bytes a rank holds. Imported by ``worker`` (every run) and ``pipeline`` (pipeline runs).
"""

from __future__ import annotations

from ..job import Job  # noqa: F401 - what a rank runs
from ..realise import Realisation
from ..shape import TinyShape

IGNORE = -100  # target of a padding position: no loss, no gradient


def _batch(shape: TinyShape, global_batch: int, seed: int, step: int):
    """Token ids and targets of one step's global batch: variable-length sequences.

    Sequence i has ``n_i`` valid targets (1 <= n_i <= seq, drawn from the seeded
    generator); the positions after them are padding (target ``IGNORE``). Causal
    attention keeps padding from reaching valid positions, so only the number of valid
    tokens differs between sequences, and between the ranks that hold them.
    """
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + step + 1)
    tokens = torch.randint(0, shape.vocab, (global_batch, shape.seq + 1), generator=g)
    valid = torch.randint(1, shape.seq + 1, (global_batch, 1), generator=g)
    targets = tokens[:, 1:].clone()
    targets[torch.arange(shape.seq).expand(global_batch, -1) >= valid] = IGNORE
    return tokens[:, :-1], targets


def _loss_sum(logits, targets):
    """Sum of the token losses over the valid (unpadded) targets."""
    import torch
    import torch.nn.functional as F

    if logits.dtype != torch.float32:  # 16-bit parameters: the logits kept for the loss are fp32
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE,
                           reduction="sum")


def tokens_of(targets) -> int:
    return int((targets != IGNORE).sum())


def loss_normaliser(r: Realisation, global_tokens: int, local_tokens: int) -> float:
    """What a rank divides its token-loss sum by, as the plan's loss convention says.

    global_mean: the global token count over the data-parallel size (the count is summed
    over the ranks with the data, before the step, as a data loader does), so that the
    gradient all-reduce's mean is the global token mean; per_device_mean: the rank's own
    token count, a mean of per-device means once the gradients are averaged
    (per_microbatch_mean divides each microbatch by its own token count times the number of
    microbatches instead: the worker's loop does that).
    """
    if r.loss == "per_device_mean":
        return float(local_tokens)
    return global_tokens / r.data_size


def after_microstep(r: Realisation, optimizer, k: int, m: int) -> None:
    """What follows micro-step ``k`` of ``m``'s backward (and its reduction): under override optimizer:
    step_every_microbatch an update from that micro-step's gradient, then the buffers cleared, after
    every micro-step but the last, whose update is the step's own (taken after the loop); nothing
    otherwise, the gradients accumulating for the one update. With ``stepped_groups`` only those
    groups' optimizer (``SplitOptimizer.each``) steps here."""
    if r.step_every_microbatch and k < m - 1:
        stepped = getattr(optimizer, "each", optimizer)  # a SplitOptimizer: the stepped groups' own
        stepped.step()
        stepped.zero_grad()


def clear_after_step(r: Realisation, optimizer) -> None:
    """The buffers cleared after the step's update (``zero_grad``), except under override grads:
    no_zero_grad, where the next step's backward adds into them."""
    if not r.carry_gradients:
        optimizer.zero_grad()


def held_bytes(params, optimizer_state, gradients=None) -> dict:
    """Bytes held per state: parameters, their gradients (``gradients`` when the rank holds
    other tensors than the parameters' ``.grad``), optimizer moments and step counters."""
    import torch

    moments, counters = [], []
    for per_param in optimizer_state.values():
        for key, t in per_param.items():
            if isinstance(t, torch.Tensor):
                (counters if key == "step" else moments).append(t)
    return {
        "params": _storage_bytes(params),
        "grads": _storage_bytes(gradients if gradients is not None else (p.grad for p in params)),
        "optimizer": _storage_bytes(moments),
        "optimizer_step_counters": _storage_bytes(counters),
    }


def _storage_bytes(tensors) -> tuple[int, int]:
    """(bytes of the distinct storages behind ``tensors``, bytes of the elements themselves)."""
    from .torch_plan import local

    seen: dict[int, int] = {}
    elements = 0
    for t in tensors:
        if t is None:
            continue
        t = local(t)
        st = t.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        elements += t.numel() * t.element_size()
    return sum(seen.values()), elements


def _reference(job: Job, global_batch: int):
    """The same steps on one process: final parameters by name, the losses, and the first
    step's gradients by name (the global-batch gradient, clipped when the plan clips: what the
    optimizer's first step receives)."""
    from . import model as tiny
    from .common import param_dtype
    from .torch_plan import MAX_NORM, clip_global, make_training_optimizer

    r = job.realisation
    m = tiny.build(job.shape, job.seed).to(dtype=param_dtype(r.param_bytes))
    if r.context_axis is not None and job.shape.moe:  # experts route each context rank's sequence block as a group
        for block in m.blocks:
            block.mlp.seq_blocks = r.sizes[r.context_axis]
    opt = make_training_optimizer(r.optimizer, m.parameters(), r.master_copy)
    dropout = None
    if r.dropout:  # the same hidden dropout, every mask drawn for the whole batch
        dropout = tiny.HiddenDropout(job.seed, global_batch, job.shape.seq, job.shape.hidden)
        tiny.use_dropout(m, dropout)
    losses, first_grads = [], {}
    for step in range(job.steps):
        if dropout is not None:
            dropout.step = step
        x, y = _batch(job.shape, global_batch, job.seed, step)
        loss = _loss_sum(m(x), y) / tokens_of(y)  # the global token mean
        loss.backward()
        if job.realisation.clip is not None:
            clip_global(list(m.parameters()), MAX_NORM)
        if step == 0:
            first_grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in m.named_parameters()}, losses, first_grads


def gradient_difference(whole: dict | None, ref: dict, unavailable: str, partial: bool = False) -> dict:
    """The first step's whole gradients against one process's: the largest elementwise
    difference relative to the largest reference gradient magnitude, and the parameter where it
    is (``partial``: this rank holds some of the parameters, a pipeline stage's). Adam's update barely moves when a whole tensor's gradient is scaled (a gradient summed
    twice over a replicated axis, a clip coefficient from a wrong norm), so the parameters alone
    would pass it; the gradient does not."""
    if whole is None:
        return {"grad_unavailable": unavailable or "not held whole"}
    missing = sorted(set(whole) - set(ref)) if partial else sorted(set(ref) ^ set(whole))
    if missing:
        return {"grad_unavailable": f"gradients of {', '.join(missing[:3])} not held as one process holds them"}
    scale = max(g.abs().max().item() for g in ref.values())
    worst_abs, worst_name = 0.0, ""
    for name, g in whole.items():
        diff = (g - ref[name].float()).abs().max().item()
        if diff > worst_abs or not worst_name:
            worst_abs, worst_name = diff, name
    return {"grad_abs_diff": worst_abs, "grad_rel_diff": worst_abs / max(scale, 1e-30), "grad_worst": worst_name}

