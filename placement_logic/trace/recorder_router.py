"""The MoE router's input, noise and choice, as one rank records them (torch; read by ``lift_router``).

A router call is a forward softmax over the last dimension of a 2-D tensor of E columns (``recorder_terms``). On
its ``router`` record:

* ``input``: the router's input, the left operand of the last forward ``mm`` / ``addmm`` before the softmax whose
  output has the call's R rows and E columns (the router's linear; the logits' noise, added after it, is not in
  it): its exact checksum (``sha``), two linear checksums (``lin``: Σ x and Σ x·w, w a fixed sequence of
  weights: the checksums of a sum of tensors are the sums of theirs), Σ |x| (``abs``, their scale) and the
  linear's line (``stack``);
* ``noise_stack``: where the last forward random draw (``randn``, ``rand``, ``normal``, ``uniform``, ...) before
  the softmax of as many elements as the logits or the input ran (the router's jitter or gate noise);
* after the call's ``topk``: ``chosen`` and ``gates``, exact checksums of its indices and of its values, and its
  line (``choice_stack``);
* ``sampled``: each sampled routing decision of the call's forward after its softmax (while the module that ran
  the softmax is still in its forward): a ``multinomial`` (within it or a module it calls: a sampled expert,
  GShard's random routing), a ``bernoulli`` or a random draw (``RANDOM``) of the call's R or R·E elements in
  the module's own code (a coin that keeps or drops an expert, Gumbel noise on the probabilities): the op, an
  exact checksum of its result (the sampled indices, the coins, the draws), the multinomial's sample count
  and its line.

A ``multinomial`` in forward that no router call's forward holds is recorded on the step (``draws``: op, checksum,
micro-step, line): a sampled choice the lift cannot tie to a router call (a ``bernoulli`` there is not: dropout on
CPU draws its mask with one).

A forward all-reduce of one float tensor records the linear checksums of its input (``sums``): the all-reduced
activation's are their sum over the group, so the lift can tell a router reading one rank's summand of it. Tensors
of at most ``LIMIT`` elements are read.
"""

from __future__ import annotations

import torch

from .recorder_events import _checksum, _user_frames

LIMIT = 1 << 22  # the most elements of a tensor whose linear checksums are computed (float64 weights: 32 MiB)
SAMPLERS = ("multinomial", "bernoulli", "bernoulli_")
RANDOM = ("randn", "rand", "normal", "normal_", "uniform_", "rand_like", "randn_like", "exponential_",
          "log_normal_", "cauchy_", "geometric_")


def linear_sums(t: torch.Tensor) -> list[float]:
    """[Σ x, Σ x·w, Σ |x|] in float64, w_i = sin(0.7·i + 0.1): linear in x but for the last."""
    x = t.detach().to("cpu", torch.float64).reshape(-1)
    w = torch.sin(torch.arange(x.numel(), dtype=torch.float64) * 0.7 + 0.1)
    return [float(x.sum()), float((x * w).sum()), float(x.abs().sum())]


def note_router_op(rec, name: str, args, out) -> None:
    """In forward: remember the last 2-D ``mm`` / ``addmm`` of at most 256 output columns (its left operand) and
    the last random draw (its element count and line); ``rec`` is the recorder."""
    if name in ("mm", "addmm") and isinstance(out, torch.Tensor) and out.dim() == 2 and 2 <= out.shape[1] <= 256 \
            and out.is_floating_point():
        x = args[0] if name == "mm" else args[1]
        if isinstance(x, torch.Tensor) and x.dim() == 2:
            rec._router_mm = (int(out.shape[0]), int(out.shape[1]), x, _user_frames())
    elif name in RANDOM and isinstance(out, torch.Tensor):
        rec._router_noise = (int(out.numel()), _user_frames())
    if (name in RANDOM or name in SAMPLERS) and isinstance(out, torch.Tensor):
        note_sample(rec, name, args, out)


def _stack_ids(rec) -> tuple:
    return tuple(m[0] for m in getattr(rec, "module_stack", []))


def note_sample(rec, name: str, args, out) -> None:
    """A sampling op or random draw in forward: a routing decision of the router call whose forward holds it
    (``sampled`` on its record), else, for a ``multinomial``, a draw of the step (``draws``)."""
    if out.is_meta:
        return
    opened = getattr(rec, "_router_open", None)
    here, micro, step = _stack_ids(rec), rec.micro_step(), rec.step_record()
    entry = None
    if opened is not None and opened[2] == (step["step"], micro) and here[:len(opened[1])] == opened[1]:
        e, fit = opened[0], (opened[0]["rows"], opened[0]["rows"] * opened[0]["width"])
        if name == "multinomial" or (here == opened[1] and int(out.numel()) in fit):
            entry = e
    if entry is None and name != "multinomial":
        return  # a bernoulli elsewhere is dropout's mask (CPU dropout draws one), read by the RNG checks
    draw = {"op": name, "sha": _checksum(out.detach().contiguous()), "stack": _user_frames()}
    if name == "multinomial" and len(args) >= 2 and isinstance(args[1], int):
        draw["samples"] = int(args[1])
    if entry is not None:
        entry.setdefault("sampled", []).append(draw)
    else:
        step.setdefault("draws", []).append({**draw, "micro": micro})


def note_router_input(rec, entry: dict) -> None:
    """On a router call's record (the softmax): its input (the router linear's) and the noise drawn for it."""
    mm = getattr(rec, "_router_mm", None)
    if mm is not None and mm[0] == entry["rows"] and mm[1] == entry["width"] and mm[2].numel() <= LIMIT:
        x, sums = mm[2], linear_sums(mm[2])
        entry["input"] = {"sha": _checksum(x), "lin": sums[:2], "abs": sums[2],
                          "numel": int(x.numel()), "stack": mm[3]}
        noise = getattr(rec, "_router_noise", None)
        if noise is not None and noise[0] in (entry["rows"] * entry["width"], int(x.numel())):
            entry["noise_stack"] = noise[1]
    rec._router_mm = rec._router_noise = None
    rec._router_open = (entry, _stack_ids(rec), (rec.step_record()["step"], rec.micro_step()))  # its forward's sampled decisions (note_sample)


def note_router_choice(entry: dict, out) -> None:
    """After the call's ``topk``: its indices' and values' checksums."""
    entry["chosen"] = _checksum(out[1].contiguous())
    entry["gates"] = _checksum(out[0].detach().float().contiguous())
    entry["choice_stack"] = _user_frames()


def note_sums(rec, record: dict, inputs) -> None:
    """A forward all-reduce or reduce-scatter of one float tensor: its input's linear checksums (``sums``)."""
    if rec.phase == "forward" and record["kind"] in ("all_reduce", "reduce_scatter") and len(inputs) == 1 \
            and isinstance(inputs[0], torch.Tensor) and inputs[0].is_floating_point() and 1 < inputs[0].numel() <= LIMIT:
        record["sums"] = linear_sums(inputs[0])
