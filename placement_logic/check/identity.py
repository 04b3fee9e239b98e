"""Initial state and identity: the parameters every replica starts from, and the tensors the
optimizer updates.

Input: an ``ir.Plan`` and its groups' replicated axes (``GroupModel.replicated_params``).
Output: an ``IdentityModel`` (plain frozen data): for every ``override params[g]:
no_init_broadcast over (AXES)`` the groups and axes where copies of one parameter start from
different values (each rank initialised from its own seed, no broadcast), and the groups whose
optimizer holds stale copies (``override optimizer[g]: stale_params``). The derived model is what
a correct system does: parameters broadcast (or seeded identically) over every replicating axis at
initialisation (DDP's constructor broadcasts from rank 0), and the optimizer built over the wrapped
model's own parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import OverrideTarget, OverrideVerb
from .dims import INVARIANT, SHARDED, SPLIT, TENSOR_ROLES


@dataclass(frozen=True)
class IdentityModel:
    # (group, axes, span): the group's copies over these axes start from per-rank values
    unbroadcast: tuple[tuple[str, tuple[str, ...], Span], ...] = ()
    # (group, span): the optimizer steps copies of the group's params the model never reads
    stale: tuple[tuple[str, Span], ...] = ()
    init_span: Span | None = None  # the first no_init_broadcast override
    stale_span: Span | None = None  # the first stale_params override

    @property
    def bad_axes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a for _, axes, _ in self.unbroadcast for a in axes))


def replicated(axes, dims, par_pl, role_of) -> tuple[str, ...]:
    """The axes over which a group's params are whole copies on every rank: a tensor axis where
    its gradient is invariant or split (not sharded), a data, context or expert axis where its
    params are placed R; never a pipeline axis (stages hold different layers)."""
    out = []
    for a in axes:
        kinds = {d.kind for d in dims if d.axis == a and not d.tie}
        if not kinds or SHARDED in kinds or role_of(a) is ir.Role.PIPELINE:
            continue
        if role_of(a) in TENSOR_ROLES:
            if kinds <= {INVARIANT, SPLIT}:
                out.append(a)
        elif par_pl.mode(a) is ir.Mode.R:
            out.append(a)
    return tuple(out)


def _targets(o: ir.Override, replicated: dict[str, tuple[str, ...]]) -> list[str]:
    return list(replicated) if o.group in (None, "all") else [o.group] if o.group in replicated else []


def model(plan: ir.Plan, replicated: dict[str, tuple[str, ...]]) -> IdentityModel:
    """``replicated``: group -> the mesh axes over which its params are whole copies on every rank.
    An override that reaches no copy (every axis it names splits or shards the groups it names) is
    an error (PL506): initialising shards from per-rank seeds is what a sharded model does."""
    unb: list[tuple[str, tuple[str, ...], Span]] = []
    stale: list[tuple[str, Span]] = []
    init_span = stale_span = None
    for o in plan.overrides:
        if o.target == OverrideTarget.PARAMS and o.verb == OverrideVerb.NO_INIT_BROADCAST:
            found = [(g, tuple(a for a in dict.fromkeys(o.axes or ()) if a in replicated[g]))
                     for g in _targets(o, replicated)]
            found = [(g, axes) for g, axes in found if axes]
            if not found:
                who = f"'{o.group}'" if o.group not in (None, "all") else "no group"
                raise DiagnosticError([Diagnostic(
                    Code.OVERRIDE_NO_EFFECT, f"override params{f'[{o.group}]' if o.group else ''}: no_init_broadcast changes "
                    f"nothing: {who} holds copies over ({', '.join(o.axes or ())}): its params are split or "
                    "sharded there, so every rank initialises different elements anyway", o.span)])
            unb += [(g, axes, o.span) for g, axes in found]
            init_span = init_span or o.span
        elif o.target == OverrideTarget.OPTIMIZER and o.verb == OverrideVerb.STALE_PARAMS:
            stale += [(g, o.span) for g in _targets(o, replicated)]
            stale_span = stale_span or o.span
    return IdentityModel(tuple(unb), tuple(dict.fromkeys(stale)), init_span, stale_span)
