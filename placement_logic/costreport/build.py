"""Build the cost report: spec and ``--set`` values in, ``CostReport`` (plain data) out.

Input: an ``ir.Spec``, optional plan names, optional re-bindings (name -> exact number) and
an optional baseline plan (``compare``). Output: a ``CostReport`` whose quantities carry the
symbolic formula, its LaTeX, and the exact value when every symbol is bound. Asserts and
claims are evaluated here: a bound comparison holds or fails on its exact values; an
unbound one is ``unknown``. ``--set`` values arrive parsed (``commands.options.parse_sets``) as exact numbers
(diagnostic PL301 when malformed or naming nothing in the spec).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable, Mapping

import sympy

from .. import costs, ir
from ..costs.budget import OutOfTime, bounded
from ..costs.extrema import exact_at, rational_values
from ..costs.symbolic import (
    LINE_WIDTH,
    PlacementLatexPrinter,
    latex_lines,
    rational,
    resolve_bindings,
    symbol,
    symbol_names,
    tex_width,
    to_sympy,
)
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span, did_you_mean
from ..ir import State, heads
from ..outcome import QuestionVerdict
from ..resolve.validate import check_rebinding
from . import checkpoint, units
from .factored import factored
from .model import (
    Binding,
    CollectiveRow,
    CostReport,
    FitReport,
    GroupTotal,
    ParamGroupRow,
    PlanReport,
    Quantity,
    QuestionResult,
    StageReport,
    TimeReport,
)
from .pieces import Pieces
from .printed import Printed

_OPS = {
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


# --------------------------------------------------------------------------- quantities

class _Q:
    """Makes ``Quantity`` records under one substitution and one set of display names."""

    def __init__(self, subs: Mapping[sympy.Symbol, sympy.Expr], axes: tuple[str, ...], latex: bool = True):
        self.subs = dict(subs)
        self.values = rational_values(self.subs)  # the bound symbols as Fraction, for exact_at
        self.axes = axes
        self.latex = latex
        self._made: dict[sympy.Expr, Quantity] = {}
        self.text = Printed()  # str() of a formula, shared subformulas printed once
        self.pieces = Pieces(self.text, {s.name for s in self.subs} | set(axes))  # long case analyses named

    def __call__(self, expr: sympy.Expr) -> Quantity:
        # a report asks for the same formula many times (a stage's total is also the peak, the
        # fit's peak, ...): each is made once; Quantity is immutable
        made = self._made.get(expr)
        if made is None:
            made = self._made[expr] = self._make(expr)
        return made

    def _make(self, expr: sympy.Expr) -> Quantity:
        expr = sympy.nsimplify(expr) if isinstance(expr, sympy.Float) else factored(expr)
        exact = exact_at(expr, self.values)  # sums, products and maxima of bound rationals
        if exact is not None:
            value, free = exact, []  # str(Fraction) is str(sympy.Rational) of the same number
        else:
            value = expr.xreplace(self.subs)
            free = sorted(s.name for s in value.free_symbols)
            if not free:
                value = sympy.nsimplify(value) if not value.is_Rational else value
                if value.is_Rational:
                    exact = Fraction(int(value.p), int(value.q))
        tex, lines = "", ()
        named, repl = self.pieces.name(expr)
        printer = PlacementLatexPrinter(symbol_names([expr], self.axes)) if self.latex else None
        if printer is not None:
            tex = printer.doprint(expr)
            if repl:  # the long case analyses named: the display equation prints the named form
                shown = PlacementLatexPrinter({**symbol_names([expr], self.axes), **{
                    s: rf"\mathcal{{P}}_{{{s.name[1:]}}}" for s in repl.values()}})
                lines = latex_lines(named, shown, LINE_WIDTH)
            else:
                lines = latex_lines(expr, printer) if tex_width(tex) > LINE_WIDTH else ()
        pieces = tuple(self.pieces.piece(pw, printer, exact_at(pw, self.values)) for pw in repl)
        return Quantity(formula=self.text(expr), latex=tex, exact=exact, value=self.text(value), unbound=tuple(free),
                        symbols=tuple(sorted(s.name for s in expr.free_symbols)), latex_lines=lines,
                        shown=self.text(named) if repl else "", pieces=pieces)

    def ratio(self, a: sympy.Expr, b: sympy.Expr) -> Quantity | None:
        if b == 0:
            return None
        r = a / b
        # a maximum over pipeline stages does not simplify; sympy would only spend time trying
        if r.has(sympy.Max, sympy.Min):
            return self(r)
        try:
            return self(bounded(lambda: sympy.simplify(r)))
        except OutOfTime:
            return self(r)  # the ratio as it stands, unsimplified


def _fit_and_time(pc: costs.PlanCost, q: _Q, device: str | None) -> tuple[FitReport | None, TimeReport | None]:
    hwr = pc.plan.mesh.hardware
    if device is None and hwr is None:
        return None, None
    from ..costs import steptime  # only a plan with hardware has a fit and a step time

    if device is not None:
        hwr = steptime.catalogue_hardware(pc.plan, device, hwr)
    if hwr is None:
        return None, None
    cap = to_sympy(hwr.memory)
    peak = pc.memory.device_total
    head = q(cap - peak)
    fits = None if head.exact is None else head.exact >= 0
    fit = FitReport(hwr.title, q(cap), q(peak), head, fits)
    st = steptime.step_time(pc, hwr)
    if st is None:
        return fit, None
    return fit, TimeReport(q(st.step), q(st.compute), q(st.bubble), q(st.overlapped), q(st.exposed), q(st.tokens),
                           q(st.tokens_per_second), q(st.model_flops), q(st.mfu),
                           {k: q(v) for k, v in st.per_link().items()}, st.assumptions, q(st.optimizer))


def _plan_report(pc: costs.PlanCost, q: _Q, device_name: str | None = None) -> PlanReport:
    mem, comm = pc.memory, pc.communication
    device = {s.value: q(mem.device[s]) for s in ir.STATES}
    device["transient"] = q(mem.transient_total)
    device["total"] = q(mem.device_total)
    host = {s.value: q(mem.host[s]) for s in (State.PARAMS, State.OPTIMIZER, State.GRADS)}
    host["total"] = q(mem.host_total)
    rows = tuple(
        CollectiveRow(
            kind=x.collective.kind.value, state=x.collective.state.value, axes=x.collective.axes,
            link=x.collective.link, phase=x.collective.phase.value, count=q(x.count), buffer=q(x.buffer),
            bytes_per_device=q(x.bytes_per_device), volume=q(x.volume),
            payload=x.collective.payload.description, rule=x.collective.rule)
        for x in comm.collectives
    )
    per_axis = {}
    for axis in pc.plan.mesh.names + ("host",):
        ring, vol = comm.on_axis(axis)
        link = pc.plan.mesh.axis(axis).link if axis != "host" else "pcie"
        per_axis[axis] = GroupTotal(axis, link, q(ring), q(vol))
    per_group = tuple(GroupTotal(g, link, q(b), q(v)) for g, (link, b, v) in comm.per_group().items())
    per_link = {k: GroupTotal(k, k, q(b), q(v)) for k, (b, v) in comm.per_link().items()}
    notes = list(pc.notes)
    copies = heads.copies_note(pc.plan)  # K/V heads copied on several tensor ranks
    if copies:
        notes.append(copies)
    notes += checkpoint.notes(pc, q)  # only where the plan states a checkpoint
    fit, time = _fit_and_time(pc, q, device_name)
    stages = tuple(_stage_report(st, sa, q) for st, sa in zip(mem.stages, pc.activations.stages))
    peak = _peak_stage(mem, q) if stages else None
    if stages:
        notes.append(_peak_note(peak))
        notes += _schedule_notes(pc, q)
    free = sorted({n for x in list(device.values()) + [q(comm.total_bytes)] for n in x.unbound})
    if free:
        notes.append(f"unbound symbols (give them with --set or in the spec): {', '.join(free)}")
    return PlanReport(
        name=pc.plan.name, strategies=tuple(dict.fromkeys(b.strategy for b in pc.plan.bindings)),
        device=device, host=host,
        transient_terms={k: q(v) for k, v in mem.transient.items()},
        model_state=q(mem.model_state), comm_total=q(comm.total_bytes), volume_total=q(comm.total_volume),
        per_axis=per_axis, per_group=per_group, per_link=per_link, collectives=rows, notes=tuple(notes),
        stages=stages, peak_stage=peak, param_groups=_param_groups(pc, q), fit=fit, time=time,
    )


def _param_groups(pc: costs.PlanCost, q: _Q) -> tuple[ParamGroupRow, ...]:
    rows = []
    for g in pc.shape.groups:
        per = pc.memory.groups.get(g.name, {})
        rows.append(ParamGroupRow(
            g.name, q(g.count), g.group.tensor, g.group.where, g.group.expert, g.group.user,
            {s.value: q(per.get(s, sympy.Integer(0))) for s in (State.PARAMS, State.OPTIMIZER, State.GRADS)}))
    return tuple(rows)


def _stage_report(st, sa, q: _Q) -> StageReport:
    device = {s.value: q(st.device[s]) for s in ir.STATES}
    device["transient"] = q(st.transient_total)
    device["total"] = q(st.device_total)
    f = sa.in_flight
    in_flight = {"layer_microbatches": q(f.layer_microbatches), "embedding_microbatches": q(f.embedding),
                 "output_microbatches": q(f.output)}
    return StageReport(st.stage, device, in_flight)


def _peak_stage(mem, q: _Q) -> str | None:
    """The stage whose total is the plan's peak: from the bound values, else symbolically."""
    first, last = (st.device_total for st in mem.stages)
    a, b = exact_at(first, q.values), exact_at(last, q.values)
    if a is not None and b is not None:  # both bound: compared exactly, without sympy
        return "both" if a == b else "first" if a > b else "last"
    diff = (first - last).xreplace(q.subs)
    if not diff.free_symbols:
        diff = sympy.nsimplify(diff)
    else:
        try:
            diff = bounded(lambda: sympy.simplify(diff))
        except OutOfTime:
            return None  # undecided in time: the peak is the maximum of both, as with unbound symbols
    if diff.is_zero:
        return "both"
    if diff.is_positive:
        return "first"
    if diff.is_negative:
        return "last"
    return None


def _peak_note(peak: str | None) -> str:
    if peak == "both":
        return "pipeline: the first and the last stage have the same peak"
    if peak is None:
        return "pipeline: which stage has the peak depends on unbound symbols (the peak is their maximum)"
    return f"pipeline: the {peak} stage decides the peak"


def _schedule_notes(pc: costs.PlanCost, q: _Q) -> list[str]:
    lay = pc.layout
    m, p = pc.shape.m.xreplace(q.subs), lay.p.xreplace(q.subs)
    if p == 1:
        return ["pipeline: the pipeline axis has size 1, so the first and the last stage are one device "
                "holding both the embedding and the output layer; the stage columns count them apart"]
    if lay.schedule in (ir.ScheduleKind.INTERLEAVED, ir.ScheduleKind.ZEROPP) and m.is_Rational and p.is_Rational \
            and (m < p or m % p != 0):
        return [f"pipeline: {m} microbatches on {p} stages; the interleaved schedule needs a multiple of the "
                "stages (Megatron-LM refuses other counts), so its in-flight counts do not apply"]
    return []


def symbolic_value(spec: ir.Spec, value: ir.Value) -> sympy.Expr:
    """A question side with its cost queries replaced by their closed forms (for proofs)."""
    return costs.value_of(spec, value)


def _verdict(spec: ir.Spec, qn: ir.Question, q: _Q) -> tuple[sympy.Expr, sympy.Expr, Quantity, Quantity, QuestionVerdict]:
    left, right = costs.value_of(spec, qn.left, q.subs), costs.value_of(spec, qn.right, q.subs)
    lq, rq = q(left), q(right)
    if lq.exact is not None and rq.exact is not None:
        verdict = QuestionVerdict.HOLDS if _OPS[qn.op](lq.exact, rq.exact) else QuestionVerdict.FAILS
    else:
        verdict = QuestionVerdict.UNKNOWN
    return left, right, lq, rq, verdict


def _expectation(spec: ir.Spec, qn: ir.Question, verdict: QuestionVerdict, q: _Q, sets: Mapping[str, Fraction]
                 ) -> tuple[str | None, bool | None]:
    """A claim marked ``expect fails [unless ...]``: what was expected, and whether it came true:
    it fails at the report's values and, with the ``unless`` names re-bound, holds (when the
    report's values are the ``unless`` values, as with ``--set dp=8``, it is expected to hold)."""
    if qn.expect != QuestionVerdict.FAILS:
        return None, None
    pins = {n: v.value for n, v in qn.unless if isinstance(v, ir.Const)}
    shown = ", ".join(f"{n} = {units.number(v)}" for n, v in pins.items())
    expected = f"holds only when {shown}" if pins else QuestionVerdict.FAILS
    if pins and all(q.subs.get(symbol(n)) == rational(v) for n, v in pins.items()):
        return expected, None if verdict is QuestionVerdict.UNKNOWN else verdict is QuestionVerdict.HOLDS
    if verdict is not QuestionVerdict.FAILS:
        return expected, None if verdict is QuestionVerdict.UNKNOWN else False
    if not pins:
        return expected, True
    there = _verdict(spec, qn, _Q(resolve_bindings(spec.bindings, {**sets, **pins}), ()))[4]
    return expected, None if there is QuestionVerdict.UNKNOWN else there is QuestionVerdict.HOLDS


def _question(spec: ir.Spec, qn: ir.Question, q: _Q, sets: Mapping[str, Fraction] | None = None) -> QuestionResult:
    left, right, lq, rq, verdict = _verdict(spec, qn, q)
    identity = None
    if qn.op in ("==", "!="):
        try:
            diff = bounded(lambda: sympy.simplify(left - right))
        except OutOfTime:
            diff = None  # not decided in time: no identity claimed
        if diff is None:
            pass
        elif diff == 0:
            identity = qn.op == "=="
        elif not diff.free_symbols:
            identity = qn.op == "!="
    s = qn.span
    expected, met = _expectation(spec, qn, verdict, q, sets or {})
    return QuestionResult(qn.kind, qn.label, qn.op, lq, rq, verdict, identity, f"{s.file}:{s.line}:{s.column}",
                          expected, met)


def build(spec: ir.Spec, plans: Iterable[str] = (), sets: Mapping[str, Fraction] | None = None,
          baseline: str | None = None, command: str = "cost", show_groups: bool = False,
          device: str | None = None, latex: bool = True, symbolic: bool = False) -> CostReport:
    """The report; with ``latex=False`` (a renderer that prints no LaTeX: text) the quantities'
    ``latex`` and ``latex_lines`` are left empty; with ``symbolic`` the formulas are in Ψ and
    the shape's symbols, bound to the model's numbers (``costreport.symbolic_shape``)."""
    sets = dict(sets or {})
    if symbolic:
        from .symbolic_shape import symbolic_spec

        spec = symbolic_spec(spec)
    names = list(plans) or [p.name for p in spec.plans]
    known = [p.name for p in spec.plans]
    for n in names + ([baseline] if baseline else []):
        if n not in known:
            raise DiagnosticError([Diagnostic(Code.UNKNOWN_PLAN, f"no plan named '{n}' in {spec.file}",
                                              notes=did_you_mean(n, known))])
    if command == "compare" and not names:
        raise DiagnosticError([Diagnostic(Code.MISSING_SECTION, "nothing to compare: the spec defines no plan",
                                          Span.point(spec.file, 1, 1))])
    check_rebinding(spec, sets)  # a re-bound value is held to what the same value written in the file is
    subs = resolve_bindings(spec.bindings, sets)
    axes = spec.mesh.names if spec.mesh else ()
    q = _Q(subs, axes, latex)
    bindings = tuple(Binding(n, q(v).exact, str(v), n in sets) for n, v in
                     ((sym.name, val) for sym, val in subs.items()))
    pcs = {n: costs.derive(costs.with_sizes(spec.plan(n), subs), sized=True) for n in names}
    reports = tuple(_plan_report(pcs[n], q, device) for n in names)
    ratios: dict = {}
    if command == "compare":
        baseline = baseline or names[0]
        base = pcs.get(baseline) or costs.derive(costs.with_sizes(spec.plan(baseline), subs), sized=True)
        for n in names:
            ratios[n] = _ratios(pcs[n], base, q)
    questions = tuple(_question(spec, qn, q, sets) for qn in spec.questions)
    first = pcs[names[0]] if names else None
    return CostReport(command=command, file=spec.file, bindings=bindings,
                      axes=tuple((a.name, a.link) for a in spec.mesh.axes) if spec.mesh else (),
                      plans=reports, questions=questions, baseline=baseline if command == "compare" else None,
                      ratios=ratios, show_groups=show_groups,
                      params=q(first.shape.psi) if first else None,
                      active_params=q(costs.active_params(first.shape)) if first else None)


def _ratios(pc: costs.PlanCost, base: costs.PlanCost, q: _Q) -> dict[str, Quantity | None]:
    out: dict[str, Quantity | None] = {}
    bind = q.subs

    def ratio(a: sympy.Expr, b: sympy.Expr) -> Quantity | None:
        if b.xreplace(bind) == 0 or b == 0:
            return None
        return q.ratio(a, b)

    m, bm = pc.memory, base.memory
    for s in ir.STATES:
        out[f"memory.{s.value}"] = ratio(m.device[s], bm.device[s])
    out["memory.transient"] = ratio(m.transient_total, bm.transient_total)
    out["memory.total"] = ratio(m.device_total, bm.device_total)
    out["memory.host"] = ratio(m.host_total, bm.host_total)
    for axis in pc.plan.mesh.names:
        out[f"comm.{axis}"] = ratio(pc.communication.on_axis(axis)[0], base.communication.on_axis(axis)[0])
    out["comm.total"] = ratio(pc.communication.total_bytes, base.communication.total_bytes)
    out["volume.total"] = ratio(pc.communication.total_volume, base.communication.total_volume)
    return out
