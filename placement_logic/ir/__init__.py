"""The intermediate representation every later stage reads.

``nodes``: the frozen, span-carrying IR (``Spec``, ``Plan``, ``Placement``, values ...),
re-exported here so ``from placement_logic import ir; ir.Plan`` reads naturally.
``collectives``: the collective schedule of one step, derived from a plan's placements.
``summary``: the plain data ``placement inspect`` prints. ``walker``: the one walker over
value expressions, with per-target operator tables (numbers and z3 terms, sympy, text). Nothing here imports lark,
sympy, z3 or torch.
"""

from .nodes import *  # noqa: F403 - the package is the public face of its node module
from .nodes import __all__ as _nodes_all
from .walker import show

__all__ = [*_nodes_all, "show"]
