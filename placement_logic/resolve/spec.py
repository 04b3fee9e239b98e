"""Resolution of one module: surface ``Module`` (+ imported modules) -> ``ir.Spec``.

Collects the module's scope, folds its let bindings, builds the mesh, the model and the
plans, expands the strategies defined here even when no plan binds them (so their errors
are reported), and types the assert and claim statements. All diagnostics found in the
pass are raised together, in source order.
"""

from __future__ import annotations

from .. import ir
from ..diagnostics import Code, did_you_mean
from ..frontend import surface
from ..outcome import QuestionVerdict
from .context import Context, LibraryIndex
from .model import build_mesh, build_model
from .plans import PlanAssembler
from .scopes import ModuleLoader, ModuleScope, collect_scope
from .shapes import check_sizes, number
from .strategies import Expander
from .values import Values


def resolve_module(module: surface.Module, load_module: ModuleLoader, library_index: LibraryIndex,
                   module_name: str = "__main__", base_dir=None) -> ir.Spec:
    """The checked spec of ``module``; raises ``DiagnosticError`` with every problem found.

    ``load_module`` loads imported modules; ``library_index`` lists the strategies of the
    shipped library, for hints when a name is not imported.
    """
    cx = Context(module.file, library_index, base_dir=base_dir)
    vals = Values(cx)
    scope = ModuleScope(module_name)
    items = module.items
    collect_scope(scope, module, load_module, cx.error)
    for item in items:
        if isinstance(item, surface.LetStmt):
            vals.declare(item.name, item.span)
            vals.lets[item.name] = item
    mesh = None
    meshes = [i for i in items if isinstance(i, surface.MeshBlock)]
    for extra in meshes[1:]:
        cx.error(Code.DUPLICATE_DEFINITION, "a spec has one mesh; this is a second one", extra.span)
    if meshes:
        mesh = build_mesh(meshes[0], vals)
    for name in vals.lets:
        vals.let_value(name, [])
    if mesh is not None:
        check_sizes(mesh, vals)
    models = [i for i in items if isinstance(i, surface.ModelBlock)]
    for extra in models[1:]:
        cx.error(Code.DUPLICATE_DEFINITION, "a spec has one model; this is a second one", extra.span)
    model = build_model(models[0], vals) if models else None
    for item in items:
        if isinstance(item, surface.PlanDef):
            if item.name in vals.plans:
                cx.error(Code.DUPLICATE_DEFINITION, f"plan '{item.name}' is defined twice", item.span,
                         (f"first defined at line {vals.plans[item.name].span.line}",))
            else:
                vals.plans[item.name] = item
    expander = Expander(vals)
    plans = []
    if vals.plans and (not meshes or not models):
        missing = "mesh" if not meshes else "model"
        first = next(iter(vals.plans.values()))
        cx.error(Code.MISSING_SECTION, f"plans need a {missing} block, and this spec has none", first.span)
    elif vals.plans and (mesh is None or model is None):
        pass  # the mesh or model block failed and said why: its plans are not built (no cascade)
    elif vals.plans:
        assembler = PlanAssembler(vals, expander, scope, mesh, model)
        for plan in vals.plans.values():
            built = assembler.build(plan, [])
            if built is not None:
                plans.append(built)
    for sdef, defined_in in scope.strategies.values():
        if defined_in is scope and all(p.default is not None for p in sdef.params):
            expander.expand(sdef, defined_in, (), sdef.span)
    questions = [q for q in (_question(i, vals) for i in items
                             if isinstance(i, (surface.AssertStmt, surface.ClaimStmt))) if q is not None]
    cx.raise_errors()
    return ir.Spec(
        file=module.file,
        bindings=tuple(vals.values.items()),
        dims=tuple(vals.dims.items()),
        model=model,
        mesh=mesh,
        plans=tuple(plans),
        questions=tuple(questions),
        strategies=tuple(sorted(scope.strategies)),
        inputs=tuple(cx.sources.items()),
    )


def _question(item: surface.AssertStmt | surface.ClaimStmt, vals: Values) -> ir.Question | None:
    kind = "assert" if isinstance(item, surface.AssertStmt) else "claim"
    test = item.test
    left = vals.expr(test.left, {}, allow_queries=True)
    right = vals.expr(test.right, {}, allow_queries=True)
    if left is None or right is None:
        return None
    if left[1] is not right[1]:
        vals.cx.error(Code.UNIT_MISMATCH, "cannot compare bytes with a plain count", test.span,
                      ("give both sides a byte unit, or compare a ratio with a number",))
        return None
    if isinstance(item, surface.ClaimStmt) and item.expect is not None:
        pins = _pins(item.expect, vals)
        if pins is None:
            return None
        return ir.Question(kind, test.op, left[0], right[0], left[1], item.label, item.span, QuestionVerdict.FAILS, pins)
    return ir.Question(kind, test.op, left[0], right[0], left[1], item.label, item.span)


def _pins(expect: surface.Expect, vals: Values) -> tuple[tuple[str, ir.Value], ...] | None:
    """``unless NAME = VALUE, ...``: each NAME a let or a mesh axis, named once, each VALUE a
    number (an axis size a positive integer); None after reporting an error."""
    out: dict[str, ir.Value] = {}
    ok = True
    for name, e in expect.pins:
        span = getattr(e, "span", expect.span)
        if name not in vals.lets and name not in vals.axes:
            vals.cx.error(Code.UNDEFINED_NAME, f"'unless {name} = ...' names no let or mesh axis of the spec", expect.span,
                          did_you_mean(name, list(vals.lets) + list(vals.axes)))
            ok = False
            continue
        if name in out:
            vals.cx.error(Code.DUPLICATE_PROPERTY, f"'{name}' is given twice after 'unless'", span)
            ok = False
            continue
        r = vals.expr(e, {})
        if r is None:
            ok = False
            continue
        n = number(r[0], vals)
        if n is None:
            vals.cx.error(Code.BAD_PROPERTY_VALUE, f"'unless {name} = {ir.show(r[0])}': the value must be a number", span)
            ok = False
        elif name in vals.axes and (n.denominator != 1 or n < 1):
            vals.cx.error(Code.BAD_AXIS_SIZE, f"'unless {name} = {ir.show(r[0])}': the size of axis '{name}' must be a "
                          "positive integer", span)
            ok = False
        elif r[1] is not vals.dims.get(name, ir.Dim.COUNT):
            vals.cx.error(Code.UNIT_MISMATCH, f"'unless {name} = ...': {name} is {vals.dims.get(name, ir.Dim.COUNT).value}, "
                          f"the value is {r[1].value}", span)
            ok = False
        else:
            out[name] = ir.Const(n, span)
    return tuple(out.items()) if ok else None
