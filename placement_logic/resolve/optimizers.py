"""A plan's ``optimizer { GROUP = ALGORITHM(args) }`` section -> ``(group, Choice)`` pairs.

Input: the section (a ``surface.SubBlock`` of props), the model's parameter groups. Output:
the plan's ``optimizers`` (``ir.optimizers.Choice`` per group, ``all`` for every group not
named, ``matrices`` expanded to the weight-matrix groups the model has), after the checks:
an unknown algorithm (PL240), a bad or missing argument (PL241), a group the model does not
have (PL242), a matrix-, block- or sharded-matrix algorithm on a group of vectors (PL243), a
group named twice (PL244). ``check_overrides`` rejects an ``optimizer[G]: gather`` or
``round_robin`` that reaches nothing (PL245, PL246).
"""

from __future__ import annotations

from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Span, did_you_mean
from ..frontend import surface
from ..ir import groups as pg
from ..ir import optimizers as opt
from ..ir.overrides import OverrideTarget, OverrideVerb
from .values import Values


def _groups(model: ir.Model) -> tuple[str, ...]:
    return tuple(g.name for g in pg.param_groups(model))


def section(vals: Values, block: surface.SubBlock, model: ir.Model) -> dict[str, opt.Choice]:
    err = vals.cx.error
    names = _groups(model)
    out: dict[str, opt.Choice] = {}
    for p in block.props:
        c = _algorithm(vals, p)
        if c is None:
            continue
        if p.key == "matrices":
            targets = tuple(g for g in opt.MATRIX_GROUPS if g in names)
        elif p.key == "all" or p.key in names:
            targets = (p.key,)
        else:
            err(Code.OPTIMIZER_GROUP, f"the model has no parameter group '{p.key}'", p.span,
                did_you_mean(p.key, names + ("all", "matrices")) or (f"groups: {', '.join(names)}, all, matrices",))
            continue
        if c.locality != opt.ELEMENT:
            vec = [g for g in targets if g in opt.VECTOR_GROUPS]
            if vec:
                err(Code.OPTIMIZER_ON_VECTORS, f"{c.algorithm} updates matrices; group '{vec[0]}' holds vectors (norm weights or "
                    "biases)", p.span, ("Muon recipes keep vectors, the embedding and the head on AdamW: name the "
                                        "matrix groups (attention, kv, mlp, experts, ...) or 'matrices'",))
                continue
        for g in targets:
            if g in out and p.key != "all":
                err(Code.OPTIMIZER_TWICE, f"parameter group '{g}' is given two optimizers", p.span,
                    (f"first: {out[g].text()} at line {out[g].span.line}",))
                continue
            out[g] = c
    return out


def _algorithm(vals: Values, p: surface.Prop) -> opt.Choice | None:
    err = vals.cx.error
    v = p.value
    if isinstance(v, surface.Name):
        name, kwargs, args, span = v.id, (), (), v.span
    elif isinstance(v, surface.Call):
        name, kwargs, args, span = v.func, v.kwargs, v.args, v.span
    else:
        err(Code.UNKNOWN_OPTIMIZER, f"'{p.key}' needs an optimizer algorithm, e.g. {p.key} = muon(ns_steps = 5)", p.span,
            (f"algorithms: {', '.join(opt.ALGORITHMS)}",))
        return None
    alg = opt.ALGORITHMS.get(name)
    if alg is None:
        err(Code.UNKNOWN_OPTIMIZER, f"unknown optimizer algorithm '{name}'", span,
            did_you_mean(name, tuple(opt.ALGORITHMS)) or (f"algorithms: {', '.join(opt.ALGORITHMS)}",))
        return None
    if args:
        err(Code.OPTIMIZER_ARGUMENT, f"{name} takes its arguments by name, e.g. {name}({', '.join(f'{k} = ...' for k, _ in alg.args) or ''})",
            span)
        return None
    allowed = dict(alg.args)
    got: dict[str, int] = {}
    for kw in kwargs:
        if kw.name not in allowed:
            err(Code.OPTIMIZER_ARGUMENT, f"{name} has no argument '{kw.name}'", kw.span,
                did_you_mean(kw.name, tuple(allowed)) or ((f"arguments: {', '.join(allowed)}",) if allowed else
                                                          (f"{name} takes no arguments",)))
            return None
        n = _whole(vals, kw)
        if n is None:
            return None
        got[kw.name] = n
    for k, default in alg.args:
        if k not in got:
            if default is None:
                err(Code.OPTIMIZER_ARGUMENT, f"{name} needs '{k} = ...'", span)
                return None
            got[k] = default
    return opt.Choice(name, tuple((k, got[k]) for k, _ in alg.args), p.span)


def _whole(vals: Values, kw: surface.Kwarg) -> int | None:
    v = vals.count(kw.value, {}, f"'{kw.name}'")
    if v is None:
        return None
    if isinstance(v, ir.Sym):
        v = vals.let_value(v.name, []) or v
    val = v.value if isinstance(v, ir.Const) else None
    if not isinstance(val, (int, Fraction)) or val != int(val) or val < 1:
        vals.cx.error(Code.OPTIMIZER_ARGUMENT, f"'{kw.name}' is a positive whole number", kw.span)
        return None
    return int(val)


def _located(plan: ir.Plan, o: ir.Override, sites: dict) -> tuple[Span, tuple[str, ...]]:
    """Where a diagnostic on override ``o`` points: the override itself, or, for one a strategy of
    another file (the library) brings, the plan's line that binds or uses the strategy, with a note
    at the override."""
    site = sites.get(id(o))
    if site is None or not o.span.located or o.span.file == plan.span.file:
        return o.span, ()
    span, name = site
    return span, (f"the override: {o.span.file}:{o.span.line}:{o.span.column}, in strategy '{name}'",)


def check_overrides(vals: Values, plan: ir.Plan, sites: dict | None = None) -> None:
    """``optimizer[G]: gather`` / ``round_robin`` over an axis: G's update must need whole matrices
    (PL245), and a gather must undo a cut there (PL246). ``sites``: id of an override a strategy
    brings -> (where the plan binds or uses it, the strategy's name)."""
    need = dict(opt.whole_needed(plan))
    _check_stepped(vals, plan)
    for o in plan.overrides:
        if o.target != OverrideTarget.OPTIMIZER or o.verb not in (OverrideVerb.GATHER, OverrideVerb.ROUND_ROBIN):
            continue
        span, where = _located(plan, o, sites or {})
        groups = (tuple(need) if o.group in (None, "all") else
                  tuple(g for g in need if g in opt.MATRIX_GROUPS) if o.group == "matrices" else
                  (o.group,) if o.group in need else ())
        if o.group not in (None, "all", "matrices") and o.group not in _groups(plan.model):
            vals.cx.error(Code.OPTIMIZER_GROUP, f"the model has no parameter group '{o.group}'", o.span,
                          did_you_mean(o.group, _groups(plan.model)))
            continue
        if not groups:
            one = o.group not in (None, "all", "matrices")
            what = f"group '{o.group}' is updated by {opt.choice(plan, o.group).text()}" if one else \
                "every group it names is updated element-wise or by a sharded-matrix algorithm"
            vals.cx.error(Code.OPTIMIZER_GATHER_ELEMENTWISE, f"'optimizer: {o.verb}' reaches nothing: {what}, which needs no whole matrix",
                          span,
                          where + ("state a matrix-wise algorithm for it in the plan's optimizer section, e.g. "
                                   "optimizer { matrices = muon(ns_steps = 5) }",))
            continue
        if o.verb == OverrideVerb.GATHER:
            cut = set().union(*(opt.cuts(plan, g) for g in groups))
            idle = [a for a in (o.axes or ()) if a not in cut]
            if idle:
                vals.cx.error(Code.OPTIMIZER_GATHER_IDLE, f"'optimizer: gather over ({', '.join(idle)})': no matrix of "
                              f"{', '.join(groups)} is cut over {', '.join(idle)}, so there is nothing to gather",
                              span, where + ("a rank holds the whole matrix there already",))


def _check_stepped(vals: Values, plan: ir.Plan) -> None:
    """``optimizer[G]: step_every_microbatch``: G a parameter group of the model, ``matrices`` (one of its
    weight matrices present) or ``all`` (PL242)."""
    names = _groups(plan.model)
    for o in plan.overrides:
        if o.target != OverrideTarget.OPTIMIZER or o.verb != OverrideVerb.STEP_EVERY_MICROBATCH:
            continue
        if o.group == "matrices" and not any(g in opt.MATRIX_GROUPS for g in names):
            vals.cx.error(Code.OPTIMIZER_GROUP, "the model has no weight matrix group ('matrices': "
                          f"{', '.join(opt.MATRIX_GROUPS)})", o.span)
        elif o.group not in (None, "all", "matrices") and o.group not in names:
            vals.cx.error(Code.OPTIMIZER_GROUP, f"the model has no parameter group '{o.group}'", o.span,
                          did_you_mean(o.group, names))
