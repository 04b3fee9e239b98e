"""Strategy expansion: a strategy definition and its arguments -> ``Expanded``.

Parameters are bound to their arguments (or defaults), ``extends`` applies the parent
over renamed axes, the shorthand 4-tuple places all four states, and the body's entries,
settings and overrides are applied over the strategy's formal axes. Binding those formal
axes to mesh axes is the plan's business.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..diagnostics import Code, Span, did_you_mean
from ..frontend import surface
from .entries import mode, override, placement_entry, rename_override, setting
from .scopes import ModuleScope, lookup_strategy
from .values import STATE_NAMES, Values

ROLE_NAMES = tuple(r.value for r in ir.Role)
STRATEGY_SETTINGS = ("role", "schedule", "recompute", "flash_attention", "sequence_parallel")


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


class Expander:
    """Expands the strategies of one resolution; reports strategies that extend each
    other in a cycle."""

    def __init__(self, vals: Values):
        self.vals = vals
        self.cx = vals.cx
        self.expanding: list[str] = []  # qualified names of the strategies being expanded

    def expand(self, sdef: surface.StrategyDef, scope: ModuleScope, args: tuple[surface.Kwarg, ...],
               span: Span, caller_env: dict[str, ir.Value] | None = None) -> Expanded | None:
        """The strategy applied to ``args`` (evaluated in ``caller_env``); None after errors."""
        qual = f"{scope.name}.{sdef.name}"
        if qual in self.expanding:
            cycle = " -> ".join(self.expanding[self.expanding.index(qual):] + [qual])
            self.cx.error(Code.STRATEGY_CYCLE, f"strategies refer to each other in a cycle: {cycle}", sdef.span)
            return None
        self.expanding.append(qual)
        try:
            return self._expand(sdef, scope, args, span, caller_env or {})
        finally:
            self.expanding.pop()

    def _bind_params(self, sdef, args, span, caller_env) -> dict[str, ir.Value] | None:
        error, count = self.cx.error, self.vals.count
        env: dict[str, ir.Value] = {}
        declared = {p.name: p for p in sdef.params}
        ok = True
        for a in args:
            if a.name not in declared:
                error(Code.UNKNOWN_PARAMETER, f"strategy '{sdef.name}' has no parameter '{a.name}'", a.span,
                      did_you_mean(a.name, declared))
                ok = False
                continue
            v = count(a.value, caller_env, f"parameter '{a.name}'")
            if v is None:
                ok = False
            else:
                env[a.name] = v
        for p in sdef.params:
            if p.name in env:
                continue
            if p.default is None:
                error(Code.BAD_ARGUMENTS, f"strategy '{sdef.name}' needs a value for parameter '{p.name}'", span)
                ok = False
                continue
            v = count(p.default, {}, f"parameter '{p.name}'")
            if v is None:
                ok = False
            else:
                env[p.name] = v
        return env if ok else None

    def _expand(self, sdef, scope, args, span, caller_env) -> Expanded | None:
        error = self.cx.error
        mark = self.cx.mark()
        env = self._bind_params(sdef, args, span, caller_env)
        if env is None:
            return None
        qual = f"{scope.name}.{sdef.name}"
        axes = sdef.axes or ("_",)
        if len(set(axes)) != len(axes):
            error(Code.DUPLICATE_AXIS, f"strategy '{sdef.name}' names an axis twice", sdef.span)
            return None
        ex = Expanded(qual, axes, {}, {}, {}, {}, [], sdef.span, False)
        if sdef.extends is not None:
            found = lookup_strategy(sdef.extends, scope, self.cx)
            if found is None:
                return None
            parent = self.expand(found[0], found[1], sdef.extends.args, sdef.extends.span, env)
            if parent is None:
                return None
            if parent.placed and parent.axes != axes and sdef.body is not None:
                if len(parent.axes) != len(axes):
                    error(Code.ARITY_MISMATCH, f"strategy '{sdef.name}' has {len(axes)} axes but extends "
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
            ex.overrides = [rename_override(o, {a: (b,) for a, b in rename.items()}) for o in parent.overrides]
            ex.placed = parent.placed
        if sdef.shorthand is not None:
            self._apply_shorthand(ex, sdef.shorthand)
        for item in sdef.body or ():
            self._item(ex, item, env)
        if self.cx.failed_since(mark):
            return None
        if ex.placed:
            missing = [s.value for s in ir.STATES if s not in ex.modes]
            if missing:
                error(Code.MISSING_STATE, f"strategy '{sdef.name}' does not place {', '.join(missing)}", sdef.span,
                      ("every strategy bound to an axis places all four states: "
                       "params, optimizer, grads, activations",))
                return None
            for a in axes:
                ex.roles.setdefault(a, ir.Role.DATA)
        return ex

    def _apply_shorthand(self, ex: Expanded, sh: surface.Shorthand) -> None:
        if len(sh.modes) != 4:
            self.cx.error(Code.BAD_TUPLE, f"the shorthand needs 4 modes (params, optimizer, grads, activations), "
                          f"not {len(sh.modes)}", sh.span)
            return
        role = ir.Role.DATA
        if sh.role is not None:
            if sh.role not in ROLE_NAMES:
                self.cx.error(Code.UNKNOWN_ROLE, f"unknown role '{sh.role}'", sh.span, did_you_mean(sh.role, ROLE_NAMES))
                return
            role = ir.Role(sh.role)
        for state, ref in zip(ir.STATES, sh.modes):
            m = mode(ref, self.vals)
            if m is not None:
                ex.modes[state] = {a: m for a in ex.axes}
                if m is ir.Mode.O:
                    ex.options.setdefault(state, {}).setdefault("residency", ir.Residency.HOST)
        ex.roles = {a: role for a in ex.axes}
        ex.placed = True

    def _item(self, ex: Expanded, item, env: dict[str, ir.Value]) -> None:
        error = self.cx.error
        if isinstance(item, surface.Entry):
            if len(item.lhs) != 1 or item.lhs[0] not in STATE_NAMES:
                name = ".".join(item.lhs)
                error(Code.UNKNOWN_STATE, f"unknown state '{name}'", item.span,
                      did_you_mean(name, STATE_NAMES) or ("states are params, optimizer, grads, activations",))
                return
            placement_entry(self.vals, ex.modes, ex.options, item, ex.axes, env, formal=True)
            ex.placed = True
        elif isinstance(item, surface.Prop):
            if item.key == "role":
                self._role(ex, item)
            else:
                setting(self.vals, ex.settings, item, env, STRATEGY_SETTINGS, "a strategy")
        elif isinstance(item, surface.OverrideStmt):
            o = override(self.vals, item, env, set(ex.axes) - {"_"})
            if o is not None:
                ex.overrides.append(o)
        elif isinstance(item, surface.SubBlock):
            error(Code.UNKNOWN_PROPERTY, f"a strategy has no '{item.key}' section", item.span)
        elif isinstance(item, surface.Use):
            error(Code.UNKNOWN_PROPERTY, "'use' belongs in a plan, not in a strategy", item.span)
        elif isinstance(item, surface.Unobserved):
            error(Code.UNKNOWN_PROPERTY, "'unobserved' belongs in a plan, not in a strategy", item.span)

    def _role(self, ex: Expanded, prop: surface.Prop) -> None:
        value = prop.value
        if isinstance(value, surface.ModeMap):
            for entry in value.entries:
                if entry.key not in ex.axes:
                    self.cx.error(Code.UNDEFINED_AXIS, f"'{entry.key}' is not one of the strategy's axes", entry.span,
                                  did_you_mean(entry.key, ex.axes))
                    continue
                r = entry.value.text
                if r not in ROLE_NAMES:
                    self.cx.error(Code.UNKNOWN_ROLE, f"unknown role '{r}'", entry.value.span, did_you_mean(r, ROLE_NAMES))
                    continue
                ex.roles[entry.key] = ir.Role(r)
        else:
            w = self.vals.word(value, ROLE_NAMES, "'role'")
            if w:
                ex.roles = {a: ir.Role(w) for a in ex.axes}
        ex.placed = True
