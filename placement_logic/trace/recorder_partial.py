"""What a row-parallel layer adds to its partial sums before or after its all-reduce (torch).

A layer whose own forward issues an all-reduce (a sum) over plain tensors is a row-parallel linear: each rank
holds a slice ``W_r`` of the weight's input features and its input ``x_r`` is the matching slice, so the
reduced output is ``sum_r x_r W_r^T`` plus what the forward adds. Where the bias ``b`` (or a residual passed in
as an argument) is added decides the output: once after the reduction, ``t`` times before it. The recorder
recomputes the layer's bias-free local product ``P_r = x_r W_r^T`` (no gradient, no RNG) and keeps linear
fingerprints of it, of the output, of the bias and of every other tensor argument shaped like the output:
``f(T) = sum_i sum_j w_j T_ij`` with fixed weights ``w_j`` in [0.5, 1.5). The lift sums the product's over the
reduction's ranks and solves ``f(out) - sum_r f(P_r)`` for the coefficients of the bias and of the residuals
(``lift_partialops``). A layer it cannot recompute (no 2-D ``weight`` fitting its input and output) is recorded
as such, and the lift reports it rather than prove its region.

A layer whose forward reduce-scatters the sum instead (its output a slice of the product's rows) gets the same
fingerprints, its output's row count and the slice-shaped arguments as candidates for a residual added after.

A layer with a 2-D ``weight`` and a bias whose forward issues no all-reduce gets the same fingerprints and the
linear checksums of its output (``sums``, ``recorder_router.linear_sums``): where a later forward all-reduce's
input has the same checksums (``note_sums``), the layer's output is that all-reduce's summand, reduced by the
caller (the bias then in every summand when each rank's output carries it).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from .recorder_router import LIMIT, linear_sums

MAX_RESIDUALS = 2  # tensor arguments shaped like the output, fingerprinted as candidate residuals


def _weights(n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.rand(n, generator=g, dtype=torch.float64) + 0.5


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return _tensors(list(x.values()))
    return []


def _f(t: torch.Tensor, w: torch.Tensor) -> tuple[float, float]:
    """(the fingerprint, its magnitude: the same sum of absolute values) of ``t`` over its last dimension."""
    v = t.detach().to(torch.float64).reshape(-1, w.numel())
    return float((v @ w).sum()), float((v.abs() @ w).sum())


def _fits(ins: list, outs: list, weight, scattered: bool) -> bool:
    """Whether the first input and output fit ``weight``: the output the product's shape, or under a reduce-scatter
    a slice of it (the same width, a whole fraction of its rows)."""
    if (not ins or not outs or any(isinstance(t, DTensor) for t in ins[:1] + outs[:1])
            or not ins[0].is_floating_point() or not outs[0].is_floating_point()
            or ins[0].shape[-1:] != weight.shape[1:] or outs[0].shape[-1:] != weight.shape[:1]):
        return False
    if not scattered:
        return outs[0].shape[:-1] == ins[0].shape[:-1]
    whole = ins[0].numel() // weight.shape[1] * weight.shape[0]
    return 0 < outs[0].numel() <= whole and whole % outs[0].numel() == 0


def partial_ops(module, args, output, reduced: bool | str = True) -> dict | None:
    """The fingerprints of a layer whose forward all-reduced a value (``reduced``; ``"scatter"``: reduce-scattered
    it, the output a slice of the reduced sum, ``scattered`` with its own row count ``out_rows``):
    ``{"recomputed": False}`` where its bias-free product cannot be recomputed from its first input and its
    ``weight``; of another layer with a bias (None where it has none or cannot be recomputed), with its output's
    linear checksums. Under a reduce-scatter the residual candidates are the arguments shaped like the product
    (``residuals``, each rank's whole summand) and those shaped like the output slice (``slice_residuals``)."""
    weight = getattr(module, "weight", None)
    if isinstance(weight, DTensor):  # torch's parallel styles: DTensor orders the bias and the reduction itself
        return {"recomputed": False, "dtensor": True} if reduced else None
    ins, outs = _tensors(args), _tensors(output)
    scattered = reduced == "scatter"
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not _fits(ins, outs, weight, scattered):
        return {"recomputed": False} if reduced else None
    bias = getattr(module, "bias", None)
    has_bias = isinstance(bias, torch.Tensor) and not isinstance(bias, DTensor) and tuple(bias.shape) == weight.shape[:1]
    if not reduced and (not has_bias or not 1 < outs[0].numel() <= LIMIT):
        return None
    w = _weights(weight.shape[0])
    with torch.no_grad():
        product = torch.nn.functional.linear(ins[0].detach().to(torch.float64), weight.detach().to(torch.float64))
    rec = {"recomputed": True, "rows": int(product.numel() // weight.shape[0])}
    if scattered:
        rec.update(scattered=True, out_rows=int(outs[0].numel() // weight.shape[0]))
    rec["product"], rec["product_abs"] = _f(product, w)
    rec["output"], rec["output_abs"] = _f(outs[0], w)
    if has_bias:
        rec["bias"], _ = _f(bias, w)
    if not reduced:
        rec["sums"] = linear_sums(outs[0])
    plain = [t for t in ins[1:] if not isinstance(t, DTensor)]
    rec["residuals"] = [_f(t, w)[0] for t in plain if t.shape == product.shape][:MAX_RESIDUALS]
    if scattered:
        rec["slice_residuals"] = [_f(t, w)[0] for t in plain if t.shape == outs[0].shape
                                  and t.shape != product.shape][:MAX_RESIDUALS]
    return rec


# The op that made an all-reduce's summand, for a layer whose product the recorder cannot recompute: followed back
# through copies (a new storage holding the same values) to the op that wrote it; a view writes nothing.
COPIES = {"clone", "_to_copy", "contiguous", "copy_", "copy", "detach", "alias", "lift_fresh"}
MAX_ORIGINS = 1 << 16


def _ptr(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without real storage
        return None


# A reduction to a statistic: the op that wrote its own input is kept too (``statistic_of``), so that the statistic of
# an addition (``(fc2(h) + b).sum(-1)``) is told from that of a product alone.
STATISTICS = {"sum", "mean", "amax", "amin", "max", "min", "logsumexp", "norm", "linalg_vector_norm"}


def note_origin(origins: dict, name: str, args, out) -> None:
    """In forward: the op that wrote each output's storage (an in-place op its target's; a view nothing), and for a
    statistic the op that wrote its input."""
    if len(origins) > MAX_ORIGINS:
        origins.clear()
    ins = [t for t in _tensors(list(args)) if not isinstance(t, DTensor)]
    shared = {_ptr(t) for t in ins}
    src = _ptr(args[1] if name in ("copy_", "copy") and len(ins) > 1 else ins[0]) if ins else None
    of = origin_of(origins, ins[0]) if ins and name in STATISTICS else ""
    for t in _tensors(out):
        k = None if isinstance(t, DTensor) else _ptr(t)
        if k is None or (k in shared and not name.endswith("_")):
            continue  # a view: its values are its input's
        origins[k] = (name, src if name in COPIES and src != k else None, of)


def note_reduced(origins: dict, t) -> None:
    """A forward sum all-reduce in place: its buffer is now the reduction's (a second one sums it again)."""
    k = _ptr(t) if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) else None
    if k is not None:
        origins[k] = ("all_reduce", None, "")


def _origin(origins: dict, t) -> tuple[str, str]:
    k = _ptr(t) if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) else None
    name, of = "", ""
    for _ in range(8):
        if k is None or k not in origins:
            return name, of
        name, k, of = origins[k]
        if name not in COPIES:
            return name, of
    return name, of


def origin_of(origins: dict, t) -> str:
    """The op that made ``t``'s values, through copies; "" where none was seen."""
    return _origin(origins, t)[0]


def statistic_of(origins: dict, t) -> str:
    """Where a statistic (``STATISTICS``) made ``t``'s values: the op that wrote the statistic's input; else ""."""
    return _origin(origins, t)[1]
