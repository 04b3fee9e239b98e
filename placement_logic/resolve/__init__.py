"""Resolution: surface tree (+ imported modules) -> checked IR (``ir.Spec``).

Names are bound, strategies expanded over the axes they are bound to, units and values
folded exactly, every rule of the language checked with a located diagnostic.
"""

from .resolver import ModuleScope, Resolver, collect_scope

__all__ = ["ModuleScope", "Resolver", "collect_scope"]
