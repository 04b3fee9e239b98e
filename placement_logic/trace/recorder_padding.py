"""The padding an attention mask marks, as one rank records it (torch; read by ``lift_padding``).

The outermost module call of a forward (a model called by the script, not by another module) gets its token ids
(the first integer tensor of its positional arguments, else its keyword ``input_ids``) and, beside them, an attention mask: the keyword argument
``attention_mask`` (a Hugging Face-style model call), else a later positional argument that is a bool tensor or
a 0/1 tensor, either of the token ids' shape (a tensor whose every row is 0, 1, 2, ... is position ids, not a
mask); plain tensors only (a DTensor's values are not read: reading them could communicate). It records on the step (``attention_masks``) the micro-step, the mask's shape and its values (0 a padded
position), so the lifts that read padding (the capacity step, the token count, the balancing loss's statistics)
see padding that neither the labels (-100) nor a loss mask mark. A global forward pre-hook receives the
positional arguments only: the keyword ones are read from the module call's frame (``Module._call_impl``).
"""

from __future__ import annotations

import sys

from .recorder_events import _user_frames

VALUES_MAX = 65536  # the most positions of a mask whose values are recorded
MASKS_MAX = 64  # masks recorded per step


def call_kwargs(module) -> dict:
    """The keyword arguments of the running call of ``module`` (its ``_call_impl`` frame), else {}."""
    f = sys._getframe(1)
    for _ in range(12):
        if f is None:
            return {}
        if f.f_code.co_name == "_call_impl" and f.f_locals.get("self") is module:
            kwargs = f.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else {}
        f = f.f_back
    return {}


def _ids(args):
    import torch

    return next((a for a in args if type(a) is torch.Tensor and not a.is_floating_point()
                 and a.dtype != torch.bool and a.dim() >= 1), None)


def _mask_like(t, ids) -> bool:
    """A bool or 0/1 tensor of the token ids' shape that is not position ids."""
    import torch

    if type(t) is not torch.Tensor or t is ids or tuple(t.shape) != tuple(ids.shape) or t.is_complex() \
            or t.is_meta or not 0 < t.numel() <= VALUES_MAX:
        return False
    if t.dtype == torch.bool:
        return True
    v = t.detach()
    if not bool(((v == 0) | (v == 1)).all()):
        return False
    ramp = torch.arange(t.shape[-1], device=t.device).expand(t.shape)
    return not bool((v == ramp).all())


def note_attention_mask(step: dict, micro: int, args, kwargs: dict) -> None:
    """The attention mask passed beside the token ids of the outermost module call, if any."""
    ids = _ids(args) if args else _ids([kwargs.get("input_ids")])  # model(input_ids=..., attention_mask=...)
    if ids is None or ids.is_meta:
        return
    named = kwargs.get("attention_mask")
    found = named if _mask_like(named, ids) else next((a for a in args[1:] if _mask_like(a, ids)), None)
    if found is None:
        return
    seen = step.setdefault("attention_masks", [])
    if len(seen) < MASKS_MAX:
        values = [int(x) for x in found.detach().reshape(-1).to(dtype=ids.dtype).tolist()]
        seen.append({"micro": micro, "shape": list(found.shape), "values": values,
                     "keyword": found is named, "stack": _user_frames()})
