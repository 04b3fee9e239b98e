"""The loss computed on the sequence gathered over context axes: ``override loss: on_gathered_sequence
over (AXES)``.

Input: a plan (its context axes, its loss normalisation, its token-count statement). Output: the axes
the loss is gathered over, the token dimensions the loss normaliser sums and the divisor's axes
(``normalisation``, read by ``steps``), and the statement's diagnostics (``check_override``, from
``ir.lossgather``: PL292, PL293, PL506).

Under Ulysses (or ring) context parallelism a system may gather the model's per-token outputs over
the context group before the loss (verl's ``gather_outputs_and_unpad``, Megatron-DeepSpeed's
sequence-parallel cross entropy): every rank of AXES then computes the loss of the whole sequence,
and its local token count is the whole sequence's, the same on every rank of AXES. The gather's
backward keeps each rank's own shard of the incoming gradient, so each rank's gradient is still
that of its own tokens, divided by its (whole) count: the gradient reductions are those derived.
The count is already summed over AXES, as if reduced over them once before any all-reduce; a
statement ``tokens: reduce over (...)`` naming an axis of AXES sums it a second time, which
multiplies it by the axis's size (every token counted that many times, the loss and the gradient
that many times too small). The derived count is then reduced over the other token axes only, and
a per-device or per-microbatch mean divides by the other token axes' sizes only.

The statement is the main loss's. A loss term of the user's own (or mtp) beside it may be computed from
the same gathered outputs (verl computes its kl and entropy terms from the gathered log-probs: the
term's count is then the whole sequence's on every rank of AXES) or from each rank's own part (its
count its own): no statement says which, and ``tokens[T]: reduce over (dp, sp)`` is exact in one case
and sp times too small in the other, so the term's per-token obligations are unknown with that fact
named (``term_fact``). A term from the router's statistics (aux, z) is computed on each rank's own
tokens whatever the loss's outputs are gathered over.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Diagnostic, DiagnosticError
from ..ir import losses as terms
from ..ir import lossgather
from ..ir.lossgather import axes
from .dims import MICROBATCHES


def is_path(o: ir.Override) -> bool:
    """Whether a main-loss override states the loss's normalisation (not where it is computed)."""
    return o.verb != lossgather.VERB


def normalisation(loss: str, token_axes: tuple[str, ...], tok_o: ir.Override | None,
                  gathered: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the token dims the loss normaliser is summed over, the divisor's axes) for the loss path
    ``loss``: a gathered axis's count is summed once by the gather itself, before any reduction."""
    own = tuple(a for a in token_axes if a not in gathered)
    if loss == "global_mean":
        return (tuple(tok_o.axes or ()) if tok_o is not None else own) + gathered + (MICROBATCHES,), ()
    if loss == "per_device_mean":
        return (MICROBATCHES,) + gathered, own
    if loss == "sum":
        return (), ()
    return gathered, own + (MICROBATCHES,)


def term_fact(plan: ir.Plan, term: str) -> str:
    """The fact a per-token loss term's verdict lacks beside a main loss gathered over context axes, or ""."""
    over = axes(plan)
    if not over or term in terms.ROUTER_TERMS:
        return ""
    shown = ", ".join(over)
    return (f"whether the {term} term is computed on the sequence gathered over ({shown}) as the main loss is (its "
            f"token count then the whole sequence's on every rank of {shown}) or on each rank's own part of it "
            "(its count its own) is not stated")


def check_override(plan: ir.Plan) -> None:
    """The statement's diagnostics (``ir.lossgather.problems``: PL292, PL293, PL506) on a plan that did not
    come through resolve."""
    found = lossgather.problems(plan)
    if found:
        code, message, span, notes = found[0]
        raise DiagnosticError([Diagnostic(code, message, span, notes=notes)])
