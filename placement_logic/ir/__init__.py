"""The intermediate representation every later stage reads.

``nodes``: the frozen, span-carrying IR (``Spec``, ``Plan``, ``Placement``, values ...),
re-exported here so ``from placement_logic import ir; ir.Plan`` reads naturally.
``collectives``: the collective schedule of one step, derived from a plan's placements.
``summary``: the plain data ``placement inspect`` prints. Nothing here imports lark,
sympy, z3 or torch.
"""

from .nodes import *  # noqa: F403 - the package is the public face of its node module
from .nodes import __all__  # noqa: F401 - the package exports what its node module does
