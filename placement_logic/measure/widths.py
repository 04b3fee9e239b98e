"""The byte widths a measured run realises (no torch): parameters and gradients in one dtype
(bfloat16 or fp32), the optimizer that runs and whether it keeps an fp32 master copy, read from
the spec's stated widths (docs/validation.md, "Byte widths")."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping

from .. import ir
from .shape import ShapeError, value_of


def optimizer_for(bytes_optimizer: Fraction) -> str:
    """fp32 optimizer matching the spec's optimizer byte width when the spec states no widths
    (see docs/validation.md)."""
    if bytes_optimizer == 0:
        return "sgd"
    if bytes_optimizer == 4:
        return "sgd_momentum"
    return "adam"


OPTIMIZER_STATE = {"adam": 8, "sgd_momentum": 4, "sgd": 0}  # fp32 bytes per parameter of each optimizer's own state
MASTER = 4  # an fp32 master copy of the parameters, held by the optimizer
DTYPES = {2: "torch.bfloat16", 4: "torch.float32"}  # parameters and gradients


@dataclass(frozen=True)
class Widths:
    """The byte widths a run realises: parameters and gradients (one dtype), the optimizer that
    runs and whether it keeps an fp32 master copy."""

    params: int = 4
    optimizer: str = "adam"
    master_copy: bool = False

    @property
    def optimizer_bytes(self) -> int:
        return OPTIMIZER_STATE[self.optimizer] + (MASTER if self.master_copy else 0)

    def as_dict(self) -> dict[str, Fraction]:
        """Bytes per element of each state as the prediction takes them; the activations are
        computed in the parameters' dtype."""
        return {"params": Fraction(self.params), "grads": Fraction(self.params),
                "optimizer": Fraction(self.optimizer_bytes), "activations": Fraction(self.params)}


def realised_widths(model: ir.Model, bindings: Mapping[str, ir.Value]) -> Widths | str:
    """The widths a run realises for ``model``, or why the stated ones cannot be realised.

    A spec that states no widths runs in fp32 with the optimizer its default width selects
    (``optimizer_for``). Stated widths run as stated: parameters and gradients of 2 bytes in
    bfloat16, of 4 in fp32; the optimizer's K bytes per parameter are an fp32 master copy (4)
    when the parameters are 16-bit or K = 12, plus the fp32 state of Adam (8), SGD with momentum
    (4) or SGD (0).
    """
    if not model.bytes_stated:
        try:
            return Widths(4, optimizer_for(value_of(model.bytes_optimizer, bindings)))
        except ShapeError:
            return Widths(4, "adam")
    try:
        wp, wg, k = (value_of(v, bindings) for v in (model.bytes_params, model.bytes_grads, model.bytes_optimizer))
    except ShapeError as exc:
        return f"the stated byte widths have no value: {exc}"
    if wp != wg:
        return (f"parameters of {wp} bytes with gradients of {wg}: PyTorch's autograd gives a parameter's gradient "
                "the parameter's own dtype")
    if wp not in DTYPES:
        return (f"parameters and gradients of {wp} bytes: the harness realises 2 (torch.bfloat16) and 4 "
                "(torch.float32)")
    try:
        wa = value_of(model.bytes_activations, bindings) if "activations" in model.bytes_stated else wp
    except ShapeError:
        wa = wp
    if wa != wp:
        return (f"activations of {wa} bytes with parameters of {wp}: the harness runs the activations in the "
                "parameters' dtype, so the stated activation width would not be what runs")
    wp = int(wp)
    if wp == 2:
        if k != 12:
            return (f"optimizer = {k} with 16-bit parameters: the harness realises 12 (an fp32 master copy and "
                    "Adam's two fp32 moments); torch.optim keeps its state in the dtype of the tensors it "
                    "updates, so fp32 state without a master copy has no PyTorch optimizer")
        return Widths(2, "adam", True)
    if k == 12:
        return Widths(4, "adam", True)
    chosen = {v: name for name, v in OPTIMIZER_STATE.items()}.get(k)
    if chosen is None:
        return (f"optimizer = {k} bytes per parameter with fp32 parameters: the harness realises 0 (SGD), "
                "4 (SGD with momentum), 8 (Adam) and 12 (Adam with an fp32 master copy)")
    return Widths(4, chosen)
