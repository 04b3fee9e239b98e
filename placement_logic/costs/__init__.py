"""Cost engine: a plan in, exact closed-form memory and communication out.

Input: an ``ir.Plan`` (and, for queries, the ``ir.Spec`` holding it). Output: ``PlanCost``
with the ``Shape``, ``Layout``, ``Activations``, ``Memory`` and ``Communication`` of the
plan, every quantity an exact sympy expression in the spec's symbols (lets and axis
sizes). With a pipeline axis and a transformer shape, ``Memory.stages`` and
``Activations.stages`` hold the first and the last stage. ``query_value`` gives the symbolic
value of an ``ir.Query`` (memory, host_memory, model_state, comm, volume) so that asserts,
claims and proofs share one definition; with stages, memory queries are the maximum over
them (``memory(plan)`` the larger stage total).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import sympy

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, did_you_mean
from ..ir import Role, State, views
from ..ir import collectives as schedule
from .activations import Activations, InFlight, Layout, StageActivations, activations
from .comm import Communication, size
from .memory import Memory, StageMemory, memory
from .sizes import Shape, Split, shape_of, transformer_params
from .symbolic import symbol, to_sympy

__all__ = [
    "PlanCost", "derive", "query_value", "layout_of", "transformer_params", "Shape", "Memory",
    "Communication", "Activations", "Layout", "StageMemory", "StageActivations", "InFlight",
]


@dataclass(frozen=True)
class PlanCost:
    """A plan's derived costs: shape, layout, activations, memory and communication."""

    plan: ir.Plan
    shape: Shape
    layout: Layout
    activations: Activations
    memory: Memory
    communication: Communication

    @property
    def notes(self) -> tuple[str, ...]:
        return self.memory.notes


def _product(axes: tuple[str, ...]) -> sympy.Expr:
    return sympy.Mul(*(symbol(a) for a in axes)) if axes else sympy.Integer(1)


def layout_of(plan: ir.Plan, sized: bool = False) -> Layout:
    sch = plan.schedule
    pp = schedule.pipeline_axis(plan)
    recompute = plan.recompute
    if recompute is ir.Recompute.NONE and plan.placement(State.ACTIVATIONS).axes_with(ir.Mode.M):
        recompute = ir.Recompute.FULL  # activations materialized: only layer inputs kept
    return Layout(
        t=_product(views.view(plan).axes_with_role(Role.TENSOR, Role.SEQUENCE)),
        c=_product(views.view(plan).axes_with_role(Role.CONTEXT)),
        p=symbol(pp) if pp else sympy.Integer(1),
        v=to_sympy(schedule.chunks_value(plan)),
        U=to_sympy(schedule.gather_unit_value(plan)),
        schedule=sch.kind if sch is not None else (ir.ScheduleKind.ONE_F_ONE_B if pp else None),
        sp=plan.sequence_parallel,
        recompute=recompute,
        flash=plan.flash_attention,
        expert_axes=views.view(plan).axes_with_role(Role.EXPERT),
        split=split_of(plan, sized),
    )


def split_of(plan: ir.Plan, sized: bool = False) -> Split:
    """How the plan's mesh axes divide the parameter groups (``costs.sizes.Split``); ``sized``:
    the mesh's numeric sizes decide what depends on a size (K/V heads per tensor rank)."""
    sizes = tuple((a.name, int(a.size.value)) for a in plan.mesh.axes
                  if sized and isinstance(a.size, ir.Const) and a.size.value.denominator == 1)
    return Split(views.view(plan).axes_with_role(Role.EXPERT),
                 views.view(plan).axes_with_role(Role.TENSOR, Role.SEQUENCE), sizes)


def derive(plan: ir.Plan, sized: bool = False) -> PlanCost:
    """All closed forms of one plan (pure; cached on the frozen plan). The formulas hold for
    every size of the mesh axes (≥ 2 where a size of one would change their form). With
    ``sized`` the plan's numeric axis sizes are the sizes meant: an axis of one device sends
    and gathers nothing, and K/V heads split as far as those sizes allow (reports use it,
    through ``with_sizes``)."""
    return _derive(plan, sized)


@lru_cache(maxsize=256)
def _derive(plan: ir.Plan, sized: bool) -> PlanCost:
    sh = shape_of(plan.model)
    lay = layout_of(plan, sized)
    act = activations(sh, lay)
    mem = memory(plan, sh, act, lay.split, sized)
    # a point-to-point transfer over an axis of one device has no peer (ring collectives over
    # it already cost (n − 1)/n = 0; their ZeRO volume is the paper's convention, kept)
    extra = ()
    if plan.optimizers:  # the gathers and owners of whole-matrix updates (costs.optimizer)
        from .optimizer import collectives as optimizer_collectives

        extra = tuple(optimizer_collectives(plan))
    comm = Communication(tuple(size(c, sh, lay) for c in schedule.schedule(plan) + extra
                               if not (sized and c.kind is schedule.Kind.P2P and _one_device(plan, c.axes))))
    return PlanCost(plan, sh, lay, act, mem, comm)


def active_params(sh: Shape) -> sympy.Expr:
    """Parameters one token uses: Ψ less the routed experts it is not sent to (top_k of E)."""
    if sh.experts == 1:
        return sh.psi
    idle = sum((g.count for g in sh.groups if g.group.expert), sympy.Integer(0)) * (1 - sh.top_k / sh.experts)
    return sympy.expand(sh.psi - idle)


def _one_device(plan: ir.Plan, axes: tuple[str, ...]) -> bool:
    """A group of mesh axes whose sizes are all the number 1: one device, nothing moves."""
    return bool(axes) and all(isinstance(plan.mesh.axis(a).size, ir.Const) and plan.mesh.axis(a).size.value == 1
                              for a in axes)


def with_sizes(plan: ir.Plan, subs) -> ir.Plan:
    """``plan`` with every mesh axis whose size the bindings (``--set`` included) make a
    number given that number, so what depends on a size (a group of one device, K/V heads
    per tensor rank) is decided for the size the report shows."""
    axes = []
    for a in plan.mesh.axes:
        v = subs.get(symbol(a.name))
        if v is not None and getattr(v, "is_Integer", False) and v >= 1:
            a = replace(a, size=ir.const(int(v)))
        axes.append(a)
    return replace(plan, mesh=replace(plan.mesh, axes=tuple(axes)))


QUERY_KINDS = ("memory", "host_memory", "model_state", "comm", "volume", "params", "active_params")


def query_value(spec: ir.Spec, q: ir.Query, subs=None) -> sympy.Expr:
    """The symbolic value of a cost query (bytes), in the spec's symbols (not substituted).

    With pipeline stages: ``memory`` is the larger stage total, ``memory(plan, state)``,
    ``host_memory`` and ``model_state`` the larger of that quantity over the stages.
    """
    try:
        plan = spec.plan(q.plan)
    except KeyError:
        raise DiagnosticError([Diagnostic(Code.NOT_A_PLAN, f"'{q.plan}' is not a plan", q.span,
                                          notes=did_you_mean(q.plan, [p.name for p in spec.plans]))]) from None
    pc = derive(with_sizes(plan, subs), sized=True) if subs else derive(plan)
    mem, comm = pc.memory, pc.communication
    if q.kind == "params":
        if q.arg is None:
            return pc.shape.psi
        return next((g.count for g in pc.shape.groups if g.name == q.arg), sympy.Integer(0))
    if q.kind == "active_params":
        return active_params(pc.shape)
    if q.kind == "memory":
        if q.arg is None or q.arg == "total":
            return mem.device_total
        if q.arg == "transient":
            return mem.transient_total
        if q.arg in {s.value for s in ir.STATES}:
            return mem.device[State(q.arg)]
        raise DiagnosticError([Diagnostic(Code.BAD_QUERY_ARGUMENT, f"memory() takes a state, 'transient' or nothing, not '{q.arg}'",
                                          q.span)])
    if q.kind == "host_memory":
        if q.arg in {s.value for s in ir.STATES}:
            return mem.host[State(q.arg)]
        return mem.host_total
    if q.kind == "model_state":
        return mem.model_state
    if q.kind in ("comm", "volume"):
        if q.arg is None:
            return comm.total_bytes if q.kind == "comm" else comm.total_volume
        if q.arg not in plan.mesh.names and q.arg != "host":
            raise DiagnosticError([Diagnostic(Code.UNDEFINED_AXIS, f"'{q.arg}' is not an axis of the mesh", q.span,
                                              notes=did_you_mean(q.arg, plan.mesh.names))])
        ring, vol = comm.on_axis(q.arg)
        return ring if q.kind == "comm" else vol
    raise DiagnosticError([Diagnostic(Code.UNKNOWN_QUERY, f"unknown cost query '{q.kind}'", q.span)])


def value_of(spec: ir.Spec, value: ir.Value, subs=None) -> sympy.Expr:
    """A question's side as sympy, its queries replaced by their symbolic values (derived for
    the mesh sizes ``subs`` binds, when given)."""
    return to_sympy(value, lambda q: query_value(spec, q, subs))
