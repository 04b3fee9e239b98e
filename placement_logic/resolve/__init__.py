"""Resolution: surface tree (+ imported modules) -> checked IR (``ir.Spec``).

Names are bound, strategies expanded over the axes they are bound to, units and values
folded exactly, every rule of the language checked with a located diagnostic.

Modules, in the order the pass uses them: ``context`` (the diagnostics sink), ``scopes``
(imports and strategy lookup), ``values`` (expressions, units), ``model`` (mesh and model
blocks), ``entries`` (placement entries, settings, overrides), ``strategies`` (expansion),
``plans`` (plan assembly) and ``spec`` (the entry point, ``resolve_module``).
"""

from .context import LibraryIndex
from .scopes import ModuleLoader, ModuleScope, collect_scope
from .spec import resolve_module

__all__ = ["LibraryIndex", "ModuleLoader", "ModuleScope", "collect_scope", "resolve_module"]
