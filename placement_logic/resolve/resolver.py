"""Resolution: syntax tree (+ imported modules) -> checked IR (``ir.Spec``).

Resolves names (lets, axes, strategies, plans, imports), checks units and types of
every expression (bytes vs counts), expands strategies (aliases, ``extends``,
parameters, shorthand 4-tuples) into one placement mode per state per mesh axis, and
composes the strategies bound in each plan. Every problem becomes a ``Diagnostic``;
all that are found in one pass are raised together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from .. import ir
from ..frontend import surface as st
from ..diagnostics import Diagnostic, DiagnosticError, Span, did_you_mean

BYTE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

STATE_NAMES = tuple(s.value for s in ir.STATES)
MODE_NAMES = ("R", "S", "S*", "M", "O")
ROLE_NAMES = tuple(r.value for r in ir.Role)
UNITS_OF_RECONSTRUCTION = ("layer", "block", "chunk", "stage", "model")
QUERY_KINDS = {
    "memory": "state",
    "host_memory": None,
    "model_state": None,
    "comm": "axis",
    "volume": "axis",
}
MODEL_PROPS = ("params", "seq", "microbatch", "microbatches")
BYTES_PROPS = ("params", "grads", "optimizer", "activations")
TRANSFORMER_NUMERIC = ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "experts", "top_k",
                       "capacity_factor")
TRANSFORMER_FLAGS = ("tied_embeddings", "gated_mlp", "bias")
STRATEGY_SETTINGS = ("role", "schedule", "recompute", "flash_attention", "sequence_parallel")
PLAN_SETTINGS = ("schedule", "recompute", "flash_attention", "sequence_parallel")
SCHEDULES = {"gpipe": ir.ScheduleKind.GPIPE, "one_f_one_b": ir.ScheduleKind.ONE_F_ONE_B,
             "interleaved": ir.ScheduleKind.INTERLEAVED, "zeropp": ir.ScheduleKind.ZEROPP}
SCHEDULE_ARGS = {"gpipe": (), "one_f_one_b": (), "interleaved": ("v",), "zeropp": ("v", "U")}
OPTION_NAMES = ("unit", "prefetch", "reshard_after_forward", "residency")

ModuleLoader = Callable[[tuple[str, ...], Span], "ModuleScope"]


@dataclass
class ModuleScope:
    """The strategies (and their own imports) of one source module."""

    name: str  # qualified module name used in strategy names, e.g. std.data
    strategies: dict[str, tuple[st.StrategyDef, "ModuleScope"]] = field(default_factory=dict)
    namespaces: dict[str, "ModuleScope"] = field(default_factory=dict)
    source: str = ""


@dataclass
class Expanded:
    """A strategy with its parameters applied, over its formal axes."""

    name: str
    axes: tuple[str, ...]
    roles: dict[str, ir.Role]
    modes: dict[ir.State, dict[str, ir.Mode]]
    options: dict[ir.State, dict[str, object]]
    settings: dict[str, object]
    overrides: list[ir.Override]
    span: Span
    placed: bool  # places states / has a role: bound to axes rather than `use`d


class Resolver:
    def __init__(self, module: st.Module, load_module: ModuleLoader, module_name: str = "__main__"):
        self.module = module
        self.file = module.file
        self.load_module = load_module
        self.diags: list[Diagnostic] = []
        self.scope = ModuleScope(module_name)
        self.lets: dict[str, st.LetStmt] = {}
        self.values: dict[str, ir.Value] = {}
        self.dims: dict[str, ir.Dim] = {}
        self.axes: dict[str, ir.Axis] = {}
        self.plans_syntax: dict[str, st.PlanDef] = {}
        self.expanding: list[str] = []

    # ------------------------------------------------------------------ diagnostics

    def error(self, code: str, message: str, span: Span, notes: tuple[str, ...] = ()) -> None:
        self.diags.append(Diagnostic(code, message, span, notes=notes))

    # ------------------------------------------------------------------ entry point

    def run(self) -> ir.Spec:
        items = self.module.items
        collect_scope(self.scope, self.module, self.load_module, self.error)
        for item in items:
            if isinstance(item, st.LetStmt):
                self._declare_value(item.name, item.span)
                self.lets[item.name] = item
        mesh = None
        meshes = [i for i in items if isinstance(i, st.MeshBlock)]
        for extra in meshes[1:]:
            self.error("PL102", "a spec has one mesh; this is a second one", extra.span)
        if meshes:
            mesh = self._mesh(meshes[0])
        for name, let in self.lets.items():
            self._let_value(name, [])
        models = [i for i in items if isinstance(i, st.ModelBlock)]
        for extra in models[1:]:
            self.error("PL102", "a spec has one model; this is a second one", extra.span)
        model = self._model(models[0]) if models else None
        for item in items:
            if isinstance(item, st.PlanDef):
                if item.name in self.plans_syntax:
                    self.error("PL102", f"plan '{item.name}' is defined twice", item.span,
                               (f"first defined at line {self.plans_syntax[item.name].span.line}",))
                else:
                    self.plans_syntax[item.name] = item
        plans = []
        if self.plans_syntax and (mesh is None or model is None):
            missing = "mesh" if mesh is None else "model"
            first = next(iter(self.plans_syntax.values()))
            self.error("PL118", f"plans need a {missing} block, and this spec has none", first.span)
        elif self.plans_syntax:
            for name, plan in self.plans_syntax.items():
                built = self._plan(plan, mesh, model, [])
                if built is not None:
                    plans.append(built)
        # Strategies defined in this file are expanded even when no plan binds them,
        # so their errors are reported.
        for name, (sdef, scope) in self.scope.strategies.items():
            if scope is self.scope and all(p.default is not None for p in sdef.params):
                self._expand(sdef, scope, (), sdef.span)
        questions = [q for q in (self._question(i) for i in items
                                 if isinstance(i, (st.AssertStmt, st.ClaimStmt))) if q is not None]
        if self.diags:
            raise DiagnosticError(sorted(self.diags, key=lambda d: (d.span.line, d.span.column)))
        bindings = tuple(self.values.items())
        return ir.Spec(
            file=self.file,
            bindings=bindings,
            dims=tuple(self.dims.items()),
            model=model,
            mesh=mesh,
            plans=tuple(plans),
            questions=tuple(questions),
            strategies=tuple(sorted(self.scope.strategies)),
        )

    # ------------------------------------------------------------------ values

    def _declare_value(self, name: str, span: Span) -> bool:
        if name in self.lets or name in self.axes:
            self.error("PL102", f"'{name}' is defined twice", span)
            return False
        return True

    def _let_value(self, name: str, stack: list[str]) -> ir.Value | None:
        if name in self.values:
            return self.values[name]
        if name in stack:
            cycle = " -> ".join(stack[stack.index(name):] + [name])
            self.error("PL126", f"definitions refer to each other in a cycle: {cycle}", self.lets[name].span)
            return None
        let = self.lets[name]
        result = self.expr(let.value, env={}, stack=stack + [name])
        if result is None:
            return None
        value, dim = result
        self.values[name] = value
        self.dims[name] = dim
        return value

    def expr(self, e: st.Expr, env: dict[str, ir.Value], stack: list[str] | None = None,
             allow_queries: bool = False) -> tuple[ir.Value, ir.Dim] | None:
        """Resolve and type an expression; None after reporting an error."""
        stack = stack or []
        if isinstance(e, st.Num):
            if e.unit is None:
                return ir.Const(e.value, e.span), ir.Dim.COUNT
            if e.unit not in BYTE_UNITS:
                self.error("PL208", f"unknown unit '{e.unit}'", e.span)
                return None
            return ir.Const(e.value * BYTE_UNITS[e.unit], e.span), ir.Dim.BYTES
        if isinstance(e, st.Name):
            if e.id in env:
                return env[e.id], ir.Dim.COUNT
            if e.id in self.axes:
                return ir.Sym(e.id, e.span), ir.Dim.COUNT
            if e.id in self.lets:
                if self._let_value(e.id, stack) is None and e.id not in self.values:
                    return None
                return ir.Sym(e.id, e.span), self.dims.get(e.id, ir.Dim.COUNT)
            self.error("PL101", f"undefined name '{e.id}'", e.span,
                       did_you_mean(e.id, list(self.lets) + list(self.axes) + list(env)))
            return None
        if isinstance(e, st.Bool):
            self.error("PL114", f"'{'true' if e.value else 'false'}' is not a number", e.span)
            return None
        if isinstance(e, st.Neg):
            r = self.expr(e.operand, env, stack, allow_queries)
            return None if r is None else (ir.Op("neg", (r[0],), e.span), r[1])
        if isinstance(e, st.BinOp):
            return self._binop(e, env, stack, allow_queries)
        if isinstance(e, st.Call):
            if allow_queries and e.func in QUERY_KINDS:
                return self._query(e)
            if e.func in QUERY_KINDS:
                self.error("PL205", f"'{e.func}(...)' is only allowed in assert and claim statements", e.span)
            else:
                self.error("PL205", f"unknown function '{e.func}'", e.span,
                           did_you_mean(e.func, QUERY_KINDS) if allow_queries else ())
            return None
        raise TypeError(f"unexpected expression node {type(e).__name__}")

    def _binop(self, e: st.BinOp, env, stack, allow_queries):
        left = self.expr(e.left, env, stack, allow_queries)
        right = self.expr(e.right, env, stack, allow_queries)
        if left is None or right is None:
            return None
        (lv, ld), (rv, rd) = left, right
        B, C = ir.Dim.BYTES, ir.Dim.COUNT
        if e.op in "+-":
            if ld is not rd:
                self.error("PL201", f"cannot {'add' if e.op == '+' else 'subtract'} bytes and a plain count",
                           e.span, ("give both sides a byte unit, or neither",))
                return None
            dim = ld
        elif e.op == "*":
            if ld is B and rd is B:
                self.error("PL207", "bytes times bytes has no meaning here", e.span)
                return None
            dim = B if B in (ld, rd) else C
        elif e.op == "/":
            if ld is C and rd is B:
                self.error("PL207", "a count divided by bytes has no meaning here", e.span)
                return None
            if isinstance(rv, ir.Const) and rv.value == 0:
                self.error("PL204", "division by zero", e.right.span)
                return None
            dim = C if ld is rd else B
        elif e.op == "^":
            if rd is B:
                self.error("PL202", "an exponent cannot carry a byte unit", e.right.span)
                return None
            if not (isinstance(rv, ir.Const) and rv.value.denominator == 1):
                self.error("PL203", "an exponent must be a whole-number constant", e.right.span)
                return None
            if abs(rv.value) > 64:
                self.error("PL203", "an exponent must be between -64 and 64", e.right.span)
                return None
            if ld is B and rv.value != 1:
                self.error("PL207", "bytes raised to a power has no meaning here", e.span)
                return None
            if isinstance(lv, ir.Const) and lv.value == 0 and rv.value < 0:
                self.error("PL204", "division by zero", e.span)
                return None
            dim = ld
        else:  # pragma: no cover - the grammar has no other operators
            raise ValueError(e.op)
        return ir.Op(e.op, (lv, rv), e.span), dim

    def _query(self, e: st.Call) -> tuple[ir.Value, ir.Dim] | None:
        kind = e.func
        if e.kwargs:
            self.error("PL206", f"'{kind}' takes no named arguments", e.kwargs[0].span)
            return None
        second = QUERY_KINDS[kind]
        max_args = 2 if second else 1
        if not (1 <= len(e.args) <= max_args):
            what = f"a plan and optionally a {second}" if second else "one plan"
            self.error("PL206", f"'{kind}' takes {what}", e.span)
            return None
        plan_arg = e.args[0]
        if not isinstance(plan_arg, st.Name):
            self.error("PL206", f"the first argument of '{kind}' must be a plan name", plan_arg.span)
            return None
        if plan_arg.id not in self.plans_syntax:
            self.error("PL117", f"'{plan_arg.id}' is not a plan", plan_arg.span,
                       did_you_mean(plan_arg.id, self.plans_syntax))
            return None
        arg = None
        if len(e.args) == 2:
            a = e.args[1]
            allowed = STATE_NAMES + ("transient", "total") if second == "state" else tuple(self.axes)
            if not isinstance(a, st.Name) or a.id not in allowed:
                shown = a.id if isinstance(a, st.Name) else "this argument"
                code = "PL103" if second == "state" else "PL109"
                self.error(code, f"'{shown}' is not a {second} of plan '{plan_arg.id}'", a.span,
                           did_you_mean(shown, allowed))
                return None
            arg = a.id
        return ir.Query(kind, plan_arg.id, arg, e.span), ir.Dim.BYTES

    def count(self, e: st.Expr, env: dict[str, ir.Value], what: str) -> ir.Value | None:
        """An expression that must be a plain count."""
        r = self.expr(e, env)
        if r is None:
            return None
        if r[1] is ir.Dim.BYTES:
            self.error("PL202", f"{what} is a plain count; a byte unit does not fit here", e.span)
            return None
        return r[0]

    def word(self, e, allowed: tuple[str, ...], what: str) -> str | None:
        if isinstance(e, st.Name) and e.id in allowed:
            return e.id
        shown = e.id if isinstance(e, st.Name) else None
        span = getattr(e, "span", None) or Span.point(self.file, 1, 1)
        notes = did_you_mean(shown, allowed) if shown else ()
        self.error("PL114", f"{what} must be one of {', '.join(allowed)}", span, notes)
        return None

    def flag_value(self, prop: st.Prop) -> bool | None:
        if prop.value is None:
            return True
        if isinstance(prop.value, st.Bool):
            return prop.value.value
        self.error("PL114", f"'{prop.key}' is true or false", prop.span)
        return None

    # ------------------------------------------------------------------ mesh and model

    def _mesh(self, block: st.MeshBlock) -> ir.Mesh:
        axes = []
        for decl in block.axes:
            if decl.name in self.axes:
                self.error("PL106", f"axis '{decl.name}' is declared twice", decl.span,
                           (f"first declared at line {self.axes[decl.name].span.line}",))
                continue
            if decl.name in self.lets:
                self.error("PL102", f"'{decl.name}' is both a let binding and a mesh axis", decl.span)
                continue
            size = self.count(decl.size, {}, f"the size of axis '{decl.name}'")
            if size is None:
                continue
            if isinstance(size, ir.Const) and (size.value.denominator != 1 or size.value < 1):
                self.error("PL107", f"the size of axis '{decl.name}' must be a positive integer, "
                           f"not {_show(size.value)}", decl.size.span)
                continue
            if isinstance(size, ir.Op) and not ir.symbols(size):
                self.error("PL107", f"write the size of axis '{decl.name}' as a number or a name",
                           decl.size.span)
                continue
            axis = ir.Axis(decl.name, size, decl.link, decl.span)
            self.axes[decl.name] = axis
            self.values[decl.name] = size
            self.dims[decl.name] = ir.Dim.COUNT
            axes.append(axis)
        return ir.Mesh(tuple(axes), block.span)

    def _model(self, block: st.ModelBlock) -> ir.Model | None:
        fields: dict[str, object] = {
            "params": None,
            "bytes_params": ir.const(2),
            "bytes_grads": ir.const(2),
            "bytes_optimizer": ir.const(12),
            "bytes_activations": ir.const(2),
            "microbatches": ir.const(1),
        }
        seen: set[str] = set()
        transformer = None
        errors_before = len(self.diags)
        for item in block.items:
            key = item.key
            if key in seen:
                self.error("PL119", f"'{key}' is given twice in the model block", item.span)
                continue
            seen.add(key)
            if isinstance(item, st.SubBlock):
                if key == "bytes":
                    for p in self._props(item.props, BYTES_PROPS, "bytes"):
                        v = self._width(p)
                        if v is not None:
                            fields["bytes_" + p.key] = v
                elif key == "transformer":
                    transformer = self._transformer(item)
                else:
                    self.error("PL113", f"the model block has no '{key}' section", item.span,
                               did_you_mean(key, ("bytes", "transformer")))
                continue
            if key not in MODEL_PROPS:
                self.error("PL113", f"the model block has no property '{key}'", item.span,
                           did_you_mean(key, MODEL_PROPS + ("bytes", "transformer")))
                continue
            if not isinstance(item.value, (st.Num, st.Name, st.BinOp, st.Neg, st.Call, st.Bool)):
                self.error("PL114", f"'{key}' needs a number", item.span)
                continue
            v = self.count(item.value, {}, f"'{key}'")
            if v is not None:
                fields[key] = v
        if len(self.diags) > errors_before:
            return None
        if fields["params"] is None and transformer is None:
            self.error("PL118", "the model needs 'params' (the parameter count Ψ) or a transformer shape",
                       block.span)
            return None
        return ir.Model(transformer=transformer, span=block.span, **fields)

    def _props(self, props, allowed, where):
        seen = set()
        for p in props:
            if p.key not in allowed:
                self.error("PL113", f"'{where}' has no property '{p.key}'", p.span, did_you_mean(p.key, allowed))
                continue
            if p.key in seen:
                self.error("PL119", f"'{p.key}' is given twice in '{where}'", p.span)
                continue
            seen.add(p.key)
            yield p

    def _width(self, p: st.Prop) -> ir.Value | None:
        if p.value is None or isinstance(p.value, (st.ModeMap, st.Bool)):
            self.error("PL114", f"the byte width of {p.key} needs a number", p.span)
            return None
        r = self.expr(p.value, {})
        return None if r is None else r[0]  # bytes per element: a count or a byte quantity

    def _transformer(self, block: st.SubBlock) -> ir.Transformer | None:
        vals: dict[str, object] = {}
        allowed = TRANSFORMER_NUMERIC + TRANSFORMER_FLAGS + ("norm",)
        for p in self._props(block.props, allowed, "transformer"):
            if p.key in TRANSFORMER_FLAGS:
                b = self.flag_value(p)
                if b is not None:
                    vals[p.key] = b
            elif p.key == "norm":
                w = self.word(p.value, ("layernorm", "rmsnorm"), "'norm'")
                if w:
                    vals["norm"] = w
            elif p.value is None or isinstance(p.value, st.ModeMap):
                self.error("PL114", f"'{p.key}' needs a number", p.span)
            else:
                v = self.count(p.value, {}, f"'{p.key}'")
                if v is not None:
                    vals[p.key] = v
        required = ("hidden", "layers", "heads", "vocab")
        missing = [k for k in required if k not in vals]
        if missing:
            self.error("PL118", f"the transformer shape needs {', '.join(missing)}", block.span)
            return None
        vals.setdefault("kv_heads", vals["heads"])
        vals.setdefault("ffn", ir.Op("*", (ir.const(4), vals["hidden"])))
        return ir.Transformer(span=block.span, **vals)

    # ------------------------------------------------------------------ strategies

    def lookup_strategy(self, ref: st.StrategyRef, scope: ModuleScope):
        path = ref.path
        if len(path) == 1:
            found = scope.strategies.get(path[0])
            if found:
                return found
            candidates = list(scope.strategies)
        else:
            ns = scope.namespaces.get(path[0])
            if ns is not None and len(path) == 2 and path[1] in ns.strategies:
                return ns.strategies[path[1]]
            candidates = [f"{n}.{s}" for n, m in scope.namespaces.items() for s in m.strategies]
        self.error("PL101", f"undefined strategy '{ref.dotted}'", ref.span,
                   did_you_mean(ref.dotted, candidates) or self._import_hint(ref.dotted))
        return None

    def _import_hint(self, name: str) -> tuple[str, ...]:
        from ..frontend.loader import library_index  # local import: the loader imports this module

        for module, names in library_index().items():
            if name in names:
                return (f"'{name}' is in the library: add 'from std.{module} import {name}'",)
        return ()

    def _expand(self, sdef: st.StrategyDef, scope: ModuleScope, args: tuple[st.Kwarg, ...],
                span: Span, caller_env: dict[str, ir.Value] | None = None) -> Expanded | None:
        qual = f"{scope.name}.{sdef.name}"
        if qual in self.expanding:
            cycle = " -> ".join(self.expanding[self.expanding.index(qual):] + [qual])
            self.error("PL110", f"strategies refer to each other in a cycle: {cycle}", sdef.span)
            return None
        self.expanding.append(qual)
        try:
            return self._expand_inner(sdef, scope, args, span, caller_env or {})
        finally:
            self.expanding.pop()

    def _bind_params(self, sdef, args, span, caller_env) -> dict[str, ir.Value] | None:
        env: dict[str, ir.Value] = {}
        declared = {p.name: p for p in sdef.params}
        ok = True
        for a in args:
            if a.name not in declared:
                self.error("PL123", f"strategy '{sdef.name}' has no parameter '{a.name}'", a.span,
                           did_you_mean(a.name, declared))
                ok = False
                continue
            v = self.count(a.value, caller_env, f"parameter '{a.name}'")
            if v is None:
                ok = False
            else:
                env[a.name] = v
        for p in sdef.params:
            if p.name in env:
                continue
            if p.default is None:
                self.error("PL206", f"strategy '{sdef.name}' needs a value for parameter '{p.name}'", span)
                ok = False
                continue
            v = self.count(p.default, {}, f"parameter '{p.name}'")
            if v is None:
                ok = False
            else:
                env[p.name] = v
        return env if ok else None

    def _expand_inner(self, sdef, scope, args, span, caller_env) -> Expanded | None:
        errors_before = len(self.diags)
        env = self._bind_params(sdef, args, span, caller_env)
        if env is None:
            return None
        qual = f"{scope.name}.{sdef.name}"
        axes = sdef.axes or ("_",)
        if len(set(axes)) != len(axes):
            self.error("PL106", f"strategy '{sdef.name}' names an axis twice", sdef.span)
            return None
        ex = Expanded(qual, axes, {}, {}, {}, {}, [], sdef.span, False)
        if sdef.extends is not None:
            found = self.lookup_strategy(sdef.extends, scope)
            if found is None:
                return None
            parent = self._expand(found[0], found[1], sdef.extends.args, sdef.extends.span, env)
            if parent is None:
                return None
            if parent.placed and parent.axes != axes and sdef.body is not None:
                if len(parent.axes) != len(axes):
                    self.error("PL115", f"strategy '{sdef.name}' has {len(axes)} axes but extends "
                               f"'{sdef.extends.dotted}' with {len(parent.axes)}", sdef.extends.span)
                    return None
            if sdef.body is None and not sdef.axes:
                axes = parent.axes  # a plain alias keeps the parent's axes
            rename = dict(zip(parent.axes, axes))
            ex.axes = axes
            ex.roles = {rename[a]: r for a, r in parent.roles.items()}
            ex.modes = {s: {rename[a]: m for a, m in ms.items()} for s, ms in parent.modes.items()}
            ex.options = {s: dict(o) for s, o in parent.options.items()}
            ex.settings = dict(parent.settings)
            ex.overrides = [_rename_override(o, rename) for o in parent.overrides]
            ex.placed = parent.placed
        if sdef.shorthand is not None:
            self._apply_shorthand(ex, sdef.shorthand)
        for item in sdef.body or ():
            self._strategy_item(ex, item, env, sdef)
        if len(self.diags) > errors_before:
            return None
        if ex.placed:
            missing = [s.value for s in ir.STATES if s not in ex.modes]
            if missing:
                self.error("PL105", f"strategy '{sdef.name}' does not place {', '.join(missing)}", sdef.span,
                           ("every strategy bound to an axis places all four states: "
                            "params, optimizer, grads, activations",))
                return None
            for a in axes:
                ex.roles.setdefault(a, ir.Role.DATA)
        return ex

    def _mode(self, ref: st.ModeRef) -> ir.Mode | None:
        text = ref.text
        if text in MODE_NAMES:
            return ir.Mode(text)
        self.error("PL104", f"unknown mode '{text}'", ref.span,
                   did_you_mean(text, MODE_NAMES) or ("modes are R, S, S*, M and O",))
        return None

    def _apply_shorthand(self, ex: Expanded, sh: st.Shorthand) -> None:
        if len(sh.modes) != 4:
            self.error("PL120", f"the shorthand needs 4 modes (params, optimizer, grads, activations), "
                       f"not {len(sh.modes)}", sh.span)
            return
        role = ir.Role.DATA
        if sh.role is not None:
            if sh.role not in ROLE_NAMES:
                self.error("PL121", f"unknown role '{sh.role}'", sh.span, did_you_mean(sh.role, ROLE_NAMES))
                return
            role = ir.Role(sh.role)
        for state, ref in zip(ir.STATES, sh.modes):
            m = self._mode(ref)
            if m is not None:
                ex.modes[state] = {a: m for a in ex.axes}
                if m is ir.Mode.O:
                    ex.options.setdefault(state, {}).setdefault("residency", ir.Residency.HOST)
        ex.roles = {a: role for a in ex.axes}
        ex.placed = True

    def _strategy_item(self, ex: Expanded, item, env, sdef) -> None:
        if isinstance(item, st.Entry):
            if len(item.lhs) != 1 or item.lhs[0] not in STATE_NAMES:
                name = ".".join(item.lhs)
                self.error("PL103", f"unknown state '{name}'", item.span,
                           did_you_mean(name, STATE_NAMES) or ("states are params, optimizer, grads, activations",))
                return
            self._placement_entry(ex.modes, ex.options, item, ex.axes, env, formal=True)
            ex.placed = True
        elif isinstance(item, st.Prop):
            self._setting(ex.settings, item, env, STRATEGY_SETTINGS, "a strategy", ex)
        elif isinstance(item, st.OverrideStmt):
            o = self._override(item, env, set(ex.axes) - {"_"})
            if o is not None:
                ex.overrides.append(o)
        elif isinstance(item, st.SubBlock):
            self.error("PL113", f"a strategy has no '{item.key}' section", item.span)
        elif isinstance(item, st.Use):
            self.error("PL113", "'use' belongs in a plan, not in a strategy", item.span)

    def _placement_entry(self, modes, options, item: st.Entry, axes, env, formal: bool) -> None:
        state = ir.State(item.lhs[0])
        rhs = item.rhs
        if isinstance(rhs, st.StrategyRef):
            if len(rhs.path) == 1 and not rhs.args:
                rhs = st.ModeRef(rhs.path[0], False, rhs.span)
            else:
                self.error("PL104", f"unknown mode '{rhs.dotted}'", rhs.span, ("modes are R, S, S*, M and O",))
                return
        if isinstance(rhs, st.ModeRef):
            m = self._mode(rhs)
            if m is None:
                return
            new = {a: m for a in axes}
        else:
            new = {}
            for entry in rhs.entries:
                if entry.key not in axes:
                    what = "formal axes" if formal else "mesh axes"
                    self.error("PL109", f"'{entry.key}' is not one of the {what} ({', '.join(axes)})",
                               entry.span, did_you_mean(entry.key, axes))
                    continue
                if entry.key in new:
                    self.error("PL106", f"axis '{entry.key}' appears twice in this placement", entry.span)
                    continue
                m = self._mode(entry.value)
                if m is not None:
                    new[entry.key] = m
            if formal:
                missing = [a for a in axes if a not in new]
                if missing and not modes.get(state):
                    self.error("PL105", f"the placement of {state.value} leaves {', '.join(missing)} without a mode",
                               rhs.span)
                    return
        modes[state] = {**modes.get(state, {}), **new}
        opts = options.setdefault(state, {})
        if ir.Mode.O in new.values():
            opts.setdefault("residency", ir.Residency.HOST)
        self._options(opts, item.options, state, set(modes[state].values()), env)

    def _options(self, opts, kwargs, state, modes_used, env) -> None:
        seen = set()
        for kw in kwargs:
            if kw.name not in OPTION_NAMES:
                self.error("PL113", f"a placement has no option '{kw.name}'", kw.span,
                           did_you_mean(kw.name, OPTION_NAMES))
                continue
            if kw.name in seen:
                self.error("PL119", f"option '{kw.name}' is given twice", kw.span)
                continue
            seen.add(kw.name)
            if kw.name in ("unit", "prefetch", "reshard_after_forward") and ir.Mode.S_STAR not in modes_used:
                self.error("PL124", f"'{kw.name}' applies to a sharded-with-gather (S*) state only", kw.span)
                continue
            if kw.name == "unit":
                w = self.word(kw.value, UNITS_OF_RECONSTRUCTION, "the reconstruction unit")
                if w:
                    opts["unit"] = w
            elif kw.name == "residency":
                w = self.word(kw.value, tuple(r.value for r in ir.Residency), "residency")
                if w:
                    opts["residency"] = ir.Residency(w)
            elif kw.name == "reshard_after_forward":
                if isinstance(kw.value, st.Bool):
                    opts["reshard_after_forward"] = kw.value.value
                else:
                    self.error("PL114", "'reshard_after_forward' is true or false", kw.value.span)
            else:
                v = self.count(kw.value, env, "prefetch")
                if v is None:
                    continue
                if not (isinstance(v, ir.Const) and v.value.denominator == 1 and v.value >= 1):
                    self.error("PL114", "prefetch depth must be a whole number of at least 1", kw.value.span)
                    continue
                opts["prefetch"] = int(v.value)

    def _setting(self, settings, prop: st.Prop, env, allowed, where, ex: Expanded | None) -> None:
        key = prop.key
        if key not in allowed:
            self.error("PL113", f"{where} has no setting '{key}'", prop.span,
                       did_you_mean(key, allowed + STATE_NAMES))
            return
        value = prop.value
        if key in ("flash_attention", "sequence_parallel"):
            b = self.flag_value(prop)
            if b is not None:
                settings[key] = b
        elif key == "recompute":
            w = self.word(value, tuple(r.value for r in ir.Recompute), "'recompute'")
            if w:
                settings[key] = ir.Recompute(w)
        elif key == "role":
            self._role(ex, prop)
        elif key == "schedule":
            sched = self._schedule(value, env, prop.span)
            if sched is not None:
                settings[key] = sched
        return

    def _role(self, ex: Expanded, prop: st.Prop) -> None:
        value = prop.value
        if isinstance(value, st.ModeMap):
            for entry in value.entries:
                if entry.key not in ex.axes:
                    self.error("PL109", f"'{entry.key}' is not one of the strategy's axes", entry.span,
                               did_you_mean(entry.key, ex.axes))
                    continue
                r = entry.value.text
                if r not in ROLE_NAMES:
                    self.error("PL121", f"unknown role '{r}'", entry.value.span, did_you_mean(r, ROLE_NAMES))
                    continue
                ex.roles[entry.key] = ir.Role(r)
        else:
            w = self.word(value, ROLE_NAMES, "'role'")
            if w:
                ex.roles = {a: ir.Role(w) for a in ex.axes}
        ex.placed = True

    def _schedule(self, value, env, span) -> tuple | None:
        if isinstance(value, st.Name):
            name, kwargs = value.id, ()
        elif isinstance(value, st.Call) and not value.args:
            name, kwargs = value.func, value.kwargs
        else:
            self.error("PL114", "a schedule is gpipe, one_f_one_b, interleaved(v = ...) or zeropp(v = ..., U = ...)",
                       getattr(value, "span", span))
            return None
        if name not in SCHEDULES:
            self.error("PL114", f"unknown schedule '{name}'", getattr(value, "span", span),
                       did_you_mean(name, SCHEDULES))
            return None
        args = {"v": ir.const(1), "U": ir.const(1)}
        for kw in kwargs:
            if kw.name not in SCHEDULE_ARGS[name]:
                self.error("PL206", f"schedule '{name}' takes no argument '{kw.name}'", kw.span)
                return None
            v = self.count(kw.value, env, f"'{kw.name}'")
            if v is None:
                return None
            args[kw.name] = v
        return (SCHEDULES[name], args["v"], args["U"])

    def _override(self, o: st.OverrideStmt, env, axes_allowed: set[str]) -> ir.Override | None:
        verbs = ir.OVERRIDE_VERBS.get(o.target)
        if verbs is None:
            self.error("PL122", f"cannot override '{o.target}'", o.span, did_you_mean(o.target, ir.OVERRIDE_VERBS))
            return None
        if o.verb not in verbs:
            self.error("PL122", f"'{o.target}' has no override '{o.verb}'", o.span,
                       did_you_mean(o.verb, verbs) or (f"accepted: {', '.join(verbs)}",))
            return None
        takes_over, takes_by = verbs[o.verb]
        if o.group is not None and o.group not in ir.PARAM_GROUPS:
            self.error("PL122", f"unknown parameter group '{o.group}'", o.span, did_you_mean(o.group, ir.PARAM_GROUPS))
            return None
        if takes_over and o.axes is None:
            self.error("PL122", f"'{o.target}: {o.verb}' needs 'over (axes...)'", o.span)
            return None
        if not takes_over and o.axes is not None:
            self.error("PL122", f"'{o.target}: {o.verb}' takes no 'over' clause", o.span)
            return None
        if takes_by and o.by is None:
            self.error("PL122", f"'{o.target}: {o.verb}' needs 'by <divisor>'", o.span)
            return None
        if not takes_by and o.by is not None:
            self.error("PL122", f"'{o.target}: {o.verb}' takes no 'by' clause", o.span)
            return None
        for a in o.axes or ():
            if a not in axes_allowed:
                self.error("PL109", f"'{a}' is not an axis here", o.span, did_you_mean(a, axes_allowed))
                return None
        by = None
        if o.by is not None:
            by = self.count(o.by, env, "the divisor")
            if by is None:
                return None
        return ir.Override(o.target, o.group, o.verb, o.axes, by, o.span)

    # ------------------------------------------------------------------ plans

    def _plan(self, p: st.PlanDef, mesh: ir.Mesh, model: ir.Model, stack: list[str]) -> ir.Plan | None:
        if p.name in stack:
            cycle = " -> ".join(stack[stack.index(p.name):] + [p.name])
            self.error("PL110", f"plans extend each other in a cycle: {cycle}", p.span)
            return None
        axes = mesh.names
        errors_before = len(self.diags)
        bindings: list[ir.Binding] = []
        modes: dict[ir.State, dict[str, ir.Mode]] = {}
        options: dict[ir.State, dict[str, object]] = {}
        settings: dict[str, object] = {}
        setting_src: dict[str, str] = {}
        overrides: list[ir.Override] = []
        bound: dict[str, Span] = {}
        schedule_axis = None
        if p.extends is not None:
            base_name = p.extends.dotted
            base_syntax = self.plans_syntax.get(base_name)
            if base_syntax is None:
                self.error("PL117", f"'{base_name}' is not a plan", p.extends.span,
                           did_you_mean(base_name, self.plans_syntax))
                return None
            base = self._plan(base_syntax, mesh, model, stack + [p.name])
            if base is None:
                return None
            bindings = list(base.bindings)
            for b in base.bindings:
                for a in b.axes:
                    bound[a] = b.span
            for pl in base.placements:
                modes[pl.state] = dict(pl.modes)
                options[pl.state] = {"unit": pl.unit, "prefetch": pl.prefetch,
                                     "reshard_after_forward": pl.reshard_after_forward,
                                     "residency": pl.residency}
            settings = {"recompute": base.recompute, "flash_attention": base.flash_attention,
                        "sequence_parallel": base.sequence_parallel}
            if base.schedule is not None:
                s = base.schedule
                settings["schedule"] = (s.kind, s.chunks, s.unit)
                schedule_axis = s.axis
            overrides = list(base.overrides)
        placement_items = []
        for item in p.body:
            if isinstance(item, st.Entry):
                if len(item.lhs) == 1 and item.lhs[0] in STATE_NAMES:
                    placement_items.append(item)
                    continue
                ax = self._bind(item, axes, bound, bindings, modes, options, settings, setting_src,
                                overrides)
                if ax:
                    schedule_axis = ax
            elif isinstance(item, st.Use):
                self._use(item, settings, setting_src, overrides)
            elif isinstance(item, st.Prop):
                self._setting(settings, item, {}, PLAN_SETTINGS, "a plan", None)
            elif isinstance(item, st.OverrideStmt):
                o = self._override(item, {}, set(axes))
                if o is not None:
                    overrides.append(o)
            elif isinstance(item, st.SubBlock):
                self.error("PL113", f"a plan has no '{item.key}' section", item.span)
        for item in placement_items:
            self._placement_entry(modes, options, item, axes, {}, formal=False)
        if len(self.diags) > errors_before:
            return None  # the errors already reported explain what is missing
        unbound = [a for a in axes if a not in bound]
        if unbound:
            self.error("PL125", f"plan '{p.name}' binds no strategy to axis {', '.join(unbound)}", p.span,
                       ("bind every mesh axis, e.g. 'dp: ddp' for plain data parallelism",))
            return None
        if any(s not in modes or set(modes[s]) != set(axes) for s in ir.STATES):
            return None  # an error was reported where the placement broke
        placements = []
        for s in ir.STATES:
            o = options.get(s, {})
            placements.append(ir.Placement(
                state=s,
                modes=tuple((a, modes[s][a]) for a in axes),
                residency=o.get("residency", ir.Residency.DEVICE),
                unit=o.get("unit", "layer"),
                prefetch=o.get("prefetch", 1),
                reshard_after_forward=o.get("reshard_after_forward", True),
            ))
        schedule = None
        if "schedule" in settings:
            kind, v, u = settings["schedule"]
            pipeline_axes = [a for b in bindings for a, r in b.roles if r is ir.Role.PIPELINE]
            axis = schedule_axis or (pipeline_axes[0] if pipeline_axes else None)
            if axis is None:
                self.error("PL114", f"plan '{p.name}' has a pipeline schedule but no pipeline axis", p.span)
                return None
            schedule = ir.Schedule(kind, axis, v, u)
        return ir.Plan(
            name=p.name,
            mesh=mesh,
            model=model,
            bindings=tuple(bindings),
            placements=tuple(placements),
            recompute=settings.get("recompute", ir.Recompute.NONE),
            flash_attention=settings.get("flash_attention", False),
            sequence_parallel=settings.get("sequence_parallel", False),
            schedule=schedule,
            overrides=tuple(overrides),
            span=p.span,
        )

    def _bind(self, item: st.Entry, axes, bound, bindings, modes, options, settings, setting_src,
              overrides) -> str | None:
        ok = True
        for a in item.lhs:
            if a not in axes:
                if a in STATE_NAMES:
                    self.error("PL114", f"state '{a}' cannot be bound together with axes", item.span)
                else:
                    notes = did_you_mean(a, tuple(axes) + STATE_NAMES)
                    self.error("PL109", f"'{a}' is neither a mesh axis nor a state", item.span,
                               notes or (f"mesh axes: {', '.join(axes)}",))
                ok = False
            elif a in bound:
                self.error("PL108", f"axis '{a}' is bound twice in one plan", item.span,
                           (f"first bound at line {bound[a].line}",))
                ok = False
        if len(set(item.lhs)) != len(item.lhs):
            self.error("PL108", "an axis appears twice in this binding", item.span)
            ok = False
        if not ok:
            return None
        rhs = item.rhs
        if not isinstance(rhs, st.StrategyRef):
            self.error("PL116", "an axis is bound to a strategy, not to a mode", rhs.span,
                       ("write e.g. 'dp: zero3', or place a state: 'params: {dp: S*}'",))
            return None
        ref = st.StrategyRef(rhs.path, item.options, rhs.span)
        found = self.lookup_strategy(ref, self.scope)
        if found is None:
            return None
        ex = self._expand(found[0], found[1], ref.args, ref.span)
        if ex is None:
            return None
        if not ex.placed:
            self.error("PL127", f"strategy '{ref.dotted}' places no state; add it with 'use {ref.dotted}'",
                       item.span)
            return None
        if len(ex.axes) != len(item.lhs):
            self.error("PL115", f"strategy '{ref.dotted}' spans {len(ex.axes)} axes "
                       f"({', '.join(a for a in ex.axes if a != '_') or 'one'}) but is bound to {len(item.lhs)}",
                       item.span)
            return None
        for a in item.lhs:
            bound[a] = item.span
        rename = dict(zip(ex.axes, item.lhs))
        for s, ms in ex.modes.items():
            for fa, m in ms.items():
                modes.setdefault(s, {})[rename[fa]] = m
        for s, opts in ex.options.items():
            options.setdefault(s, {}).update(opts)
        self._merge_settings(settings, setting_src, ex, item.span)
        overrides.extend(_rename_override(o, rename) for o in ex.overrides)
        bindings.append(ir.Binding(ex.name, tuple(item.lhs),
                                   tuple((rename[fa], ex.roles[fa]) for fa in ex.axes), item.span))
        pipeline = [rename[fa] for fa in ex.axes if ex.roles[fa] is ir.Role.PIPELINE]
        return pipeline[0] if pipeline and "schedule" in ex.settings else None

    def _merge_settings(self, settings, src, ex: Expanded, span: Span) -> None:
        for key, value in ex.settings.items():
            if key in settings and settings[key] != value and key in src:
                self.error("PL128", f"'{ex.name}' sets {key} differently from '{src[key]}'", span)
                continue
            settings[key] = value
            src[key] = ex.name

    def _use(self, item: st.Use, settings, src, overrides) -> None:
        found = self.lookup_strategy(item.ref, self.scope)
        if found is None:
            return
        ex = self._expand(found[0], found[1], item.ref.args, item.ref.span)
        if ex is None:
            return
        if ex.placed:
            self.error("PL127", f"strategy '{item.ref.dotted}' places states; bind it to mesh axes instead of 'use'",
                       item.span)
            return
        self._merge_settings(settings, src, ex, item.span)
        overrides.extend(ex.overrides)

    # ------------------------------------------------------------------ questions

    def _question(self, item) -> ir.Question | None:
        kind = "assert" if isinstance(item, st.AssertStmt) else "claim"
        test = item.test
        left = self.expr(test.left, {}, allow_queries=True)
        right = self.expr(test.right, {}, allow_queries=True)
        if left is None or right is None:
            return None
        if left[1] is not right[1]:
            self.error("PL201", "cannot compare bytes with a plain count", test.span,
                       ("give both sides a byte unit, or compare a ratio with a number",))
            return None
        return ir.Question(kind, test.op, left[0], right[0], left[1], item.label, item.span)


def _rename_override(o: ir.Override, rename: dict[str, str]) -> ir.Override:
    if o.axes is None:
        return o
    return ir.Override(o.target, o.group, o.verb, tuple(rename.get(a, a) for a in o.axes), o.by, o.span)


def _show(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def collect_scope(scope: ModuleScope, module: st.Module, load_module: ModuleLoader, error) -> None:
    """Fill a module scope with its imports and strategy definitions."""
    for item in module.items:
        if isinstance(item, st.ImportStmt):
            imported = load_module(item.module, item.span)
            if imported is None:
                continue
            if item.names is None:
                alias = item.alias or item.module[-1]
                if alias in scope.namespaces:
                    error("PL102", f"'{alias}' is imported twice", item.span)
                scope.namespaces[alias] = imported
            else:
                for name, alias in item.names:
                    if name not in imported.strategies:
                        error("PL101", f"module '{'.'.join(item.module)}' has no strategy '{name}'", item.span,
                              did_you_mean(name, imported.strategies))
                        continue
                    local = alias or name
                    if local in scope.strategies:
                        error("PL102", f"strategy '{local}' is defined twice", item.span)
                        continue
                    scope.strategies[local] = imported.strategies[name]
    for item in module.items:
        if isinstance(item, st.StrategyDef):
            if item.name in scope.strategies:
                error("PL102", f"strategy '{item.name}' is defined twice", item.span)
                continue
            scope.strategies[item.name] = (item, scope)
