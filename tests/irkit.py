"""Hand-built checked IR for checker tests (plans without going through the DSL)."""

from __future__ import annotations

from fractions import Fraction

from placement_logic import ir

ROLE = {"data": ir.Role.DATA, "tensor": ir.Role.TENSOR, "pipeline": ir.Role.PIPELINE,
        "context": ir.Role.CONTEXT, "expert": ir.Role.EXPERT, "sequence": ir.Role.SEQUENCE}


def const(x) -> ir.Const:
    return ir.Const(Fraction(x))


def plan(name: str, axes: dict[str, tuple[str, str]], *, sp: bool = False, tied: bool = False,
         overrides: tuple[ir.Override, ...] = (), residency: dict[str, ir.Residency] | None = None,
         schedule: bool = False, experts: int = 1) -> tuple[ir.Spec, ir.Plan]:
    """axes: name -> (role, 4-tuple of modes 'Θ,Ω,G,A' e.g. 'S*,S,S,R')."""
    mesh = ir.Mesh(tuple(ir.Axis(a, ir.Sym(a)) for a in axes))
    t = None
    if tied or experts > 1:
        t = ir.TransformerShape(const(1024), const(4), const(8), const(8), const(4096), const(32000),
                           tied_embeddings=tied, experts=const(experts))
    model = ir.Model(const(10**9), const(2), const(2), const(12), const(2), microbatches=ir.Sym("m"), transformer=t)
    bindings = tuple(ir.Binding(f"std.test.{a}", (a,), ((a, ROLE[r]),)) for a, (r, _) in axes.items())
    placements = []
    residency = residency or {}
    for i, s in enumerate(ir.STATES):
        modes = tuple((a, ir.Mode(m.split(",")[i])) for a, (_, m) in axes.items())
        placements.append(ir.Placement(s, modes, residency=residency.get(s.value, ir.Residency.DEVICE)))
    pipe = [a for a, (r, _) in axes.items() if r == "pipeline"]
    sched = ir.Schedule(ir.ScheduleKind.ONE_F_ONE_B, pipe[0]) if (schedule or pipe) and pipe else None
    p = ir.Plan(name, mesh, model, bindings, tuple(placements), sequence_parallel=sp, schedule=sched,
                overrides=tuple(overrides))
    spec = ir.Spec("<test>", tuple((a, const(2)) for a in axes) + (("m", const(4)),), (), model, mesh, (p,))
    return spec, p


def ov(target: str, verb: str, group: str | None = None, axes=None, by=None, ranks=None, sizes=None,
       sets=None) -> ir.Override:
    return ir.Override(target, group, verb, tuple(axes) if axes is not None else None, by,
                       ranks=tuple(ranks) if ranks is not None else None,
                       sizes=tuple(const(s) for s in sizes) if sizes is not None else None,
                       sets=tuple(tuple(const(r) for r in s) for s in sets) if sets is not None else None)
