"""Scopes and imports: a module's imports and strategy definitions -> ``ModuleScope``.

A scope maps local strategy names (definitions and ``from ... import`` names) and
namespace aliases (``import std.data as d``) to definitions; strategy references are
looked up in it, with "did you mean" and library-import hints when a name is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..diagnostics import Code, Span, did_you_mean
from ..frontend import surface
from .context import Context

ModuleLoader = Callable[[tuple[str, ...], Span], "ModuleScope"]


@dataclass
class ModuleScope:
    """The strategies (and their own imports) of one source module."""

    name: str  # qualified module name used in strategy names, e.g. std.data
    strategies: dict[str, tuple[surface.StrategyDef, "ModuleScope"]] = field(default_factory=dict)
    namespaces: dict[str, "ModuleScope"] = field(default_factory=dict)
    source: str = ""


def collect_scope(scope: ModuleScope, module: surface.Module, load_module: ModuleLoader, error) -> None:
    """Fill a module scope with its imports and strategy definitions."""
    for item in module.items:
        if isinstance(item, surface.ImportStmt):
            imported = load_module(item.module, item.span)
            if imported is None:
                continue
            if item.names is None:
                alias = item.alias or item.module[-1]
                if alias in scope.namespaces:
                    error(Code.DUPLICATE_DEFINITION, f"'{alias}' is imported twice", item.span)
                scope.namespaces[alias] = imported
            else:
                for name, alias in item.names:
                    if name not in imported.strategies:
                        error(Code.UNDEFINED_NAME, f"module '{'.'.join(item.module)}' has no strategy '{name}'", item.span,
                              did_you_mean(name, imported.strategies))
                        continue
                    local = alias or name
                    if local in scope.strategies:
                        error(Code.DUPLICATE_DEFINITION, f"strategy '{local}' is defined twice", item.span)
                        continue
                    scope.strategies[local] = imported.strategies[name]
    for item in module.items:
        if isinstance(item, surface.StrategyDef):
            if item.name in scope.strategies:
                error(Code.DUPLICATE_DEFINITION, f"strategy '{item.name}' is defined twice", item.span)
                continue
            scope.strategies[item.name] = (item, scope)


def lookup_strategy(ref: surface.StrategyRef, scope: ModuleScope,
                    cx: Context) -> tuple[surface.StrategyDef, ModuleScope] | None:
    """The definition a strategy reference names, and the scope it was defined in."""
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
    cx.error(Code.UNDEFINED_NAME, f"undefined strategy '{ref.dotted}'", ref.span,
             did_you_mean(ref.dotted, candidates) or _import_hint(ref.dotted, cx))
    return None


def _import_hint(name: str, cx: Context) -> tuple[str, ...]:
    for module, names in cx.library_index().items():
        if name in names:
            return (f"'{name}' is in the library: add 'from std.{module} import {name}'",)
    return ()
