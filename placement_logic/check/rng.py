"""The RNG state of one step, per rank: which dropout regions draw from which generator, and
over which axes the states must agree or differ.

Input: an ``ir.Plan``. Output: an ``RngModel`` (plain frozen data). Every rank holds two
generators, each a (seed, offset) state: the default one, which the region replicated over the
tensor axes draws from (dropout after the row-parallel all-reduce, without sequence
parallelism), and the model-parallel tracker (Megatron-LM's ``CudaRNGStatesTracker``), which the
split regions draw from: dropout inside the tensor-parallel region (attention probabilities of the
heads a rank holds), the sequence-parallel residual region, and the experts of an expert rank.

Derived (what a correct system does): the default generator agrees over every tensor axis (same
seed, same number of draws); the tracker is forked per tensor and per expert rank (seed + rank);
recomputation restores the forward's states (``preserve_rng_state``, the tracker's
``get_states``/``set_states``). Overrides state what a real system does instead:

- ``rng: same over (AXES)``: the tracker not forked per rank of AXES (one state for all);
- ``rng: restored_from_one over (AXES)``: after a resume every rank of AXES restores one rank's
  states (both generators);
- ``rng: advance over (AXES)``: the default generator's offset advanced differently over AXES (a
  rank that runs an extra random op, expert ranks drawing per routed token);
- ``rng: not_preserved``: recomputation runs with the RNG state the forward left behind.

Over data, context and pipeline axes the states may agree or differ: ranks there hold different
data or layers (Megatron-LM seeds every data-parallel rank alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import OverrideTarget, OverrideVerb


@dataclass(frozen=True)
class RngModel:
    tensor_axes: tuple[str, ...] = ()
    expert_axes: tuple[str, ...] = ()
    sequence_parallel: bool = False
    recompute: bool = False
    same: tuple[tuple[str, Span, str], ...] = ()  # (axis, span, verb): the tracker is one state over axis
    advance: tuple[tuple[str, Span], ...] = ()  # (axis, span): default offsets differ over axis
    not_preserved: Span | None = None

    @property
    def split_axes(self) -> tuple[str, ...]:
        """Axes that split some region drawing from the tracker: every tensor and expert axis."""
        return tuple(dict.fromkeys(self.tensor_axes + self.expert_axes))

    @property
    def split_bad(self) -> tuple[tuple[str, Span, str], ...]:
        """(axis, span, verb): a split region whose tracker state is one over the axis."""
        return tuple(x for x in self.same if x[0] in self.split_axes)

    @property
    def replicated_bad(self) -> tuple[tuple[str, Span], ...]:
        """(axis, span): the replicated region's offsets differ over a tensor axis it is replicated on."""
        if self.sequence_parallel:
            return ()
        return tuple(x for x in self.advance if x[0] in self.tensor_axes)

    @property
    def recompute_bad(self) -> bool:
        return self.recompute and self.not_preserved is not None


def model(plan: ir.Plan, tensor: tuple[str, ...], expert: tuple[str, ...], sp: bool) -> RngModel:
    same: list[tuple[str, Span, str]] = []
    advance: list[tuple[str, Span]] = []
    not_preserved = None
    recompute = plan.recompute is not ir.Recompute.NONE
    for o in plan.overrides:
        if o.target != OverrideTarget.RNG:
            continue
        if o.group is not None:
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override rng[{o.group}]: {o.verb} changes nothing: the RNG state is a rank's, "
                "not a parameter group's (write override rng: ...)", o.span)])
        if o.verb in (OverrideVerb.SAME, OverrideVerb.RESTORED_FROM_ONE):
            same += [(a, o.span, o.verb) for a in dict.fromkeys(o.axes or ())]
        elif o.verb == OverrideVerb.ADVANCE:
            advance += [(a, o.span) for a in dict.fromkeys(o.axes or ())]
        elif o.verb == OverrideVerb.NOT_PRESERVED:
            if not recompute:
                raise DiagnosticError([Diagnostic(
                    Code.OVERRIDE_NO_EFFECT, "override rng: not_preserved changes nothing: the plan recomputes no activations "
                    "(recompute = none), so no forward is replayed", o.span)])
            not_preserved = not_preserved or o.span
        if o.verb != OverrideVerb.NOT_PRESERVED and not o.axes:
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override rng: {o.verb} over () changes nothing: it names no axis", o.span)])
    return RngModel(tensor, expert, sp, recompute, tuple(same), tuple(advance), not_preserved)


# ------------------------------------------------------------------ a concrete counter-based generator


def draw(seed: int, offset: int, i: int) -> int:
    """The i-th number after ``offset`` of the stream ``seed`` (a counter-based generator, as
    Philox is): a deterministic mix of the three, 0..2^31-1."""
    x = (seed * 1_000_003 + (offset + i) * 7919 + 12345) & 0x7FFFFFFF
    x ^= x >> 13
    x = (x * 1_103_515_245 + 12345) & 0x7FFFFFFF
    return x ^ (x >> 16)


def mask(seed: int, offset: int, n: int = 8) -> str:
    """A dropout mask (p = 1/2) of n elements drawn from state (seed, offset), as 0/1 text."""
    return "".join(str(draw(seed, offset, i) & 1) for i in range(n))
