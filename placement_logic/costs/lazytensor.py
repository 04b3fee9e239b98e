"""sympy's tensor module, loaded when something uses it rather than at the first sum built.

sympy's ``Add.flatten`` (every sum sympy builds that its cache has not seen) starts with
``from sympy.tensor.tensor import TensExpr, TensAdd``, to ask of each term whether it is a
tensor expression. The first such import loads ``sympy.tensor.tensor`` and with it
``sympy.combinatorics``, whose import builds the symmetry groups of the five regular
polyhedra: about 0.03-0.06 s CPU, in every process that builds a formula (a cold
``placement cost`` spent 5-10 % of its CPU there), for tensors it never makes.

``defer()`` puts a stand-in module under that name. Asked by ``Add.flatten`` itself for
``TensExpr`` or ``TensAdd``, it answers with a class that nothing is an instance of: while
sympy's tensor module has not been loaded, no tensor expression exists, so each term's
answer is the same as the real class would give. Asked for anything else, or by anyone
else, it loads the real module (which takes the stand-in's place in ``sys.modules`` and as
``sympy.tensor.tensor``) and answers from it; from then on ``Add.flatten`` gets the real
classes too. Where the real module was loaded before, nothing is deferred.
"""

from __future__ import annotations

import importlib
import sys
import types

NAME = "sympy.tensor.tensor"


class _NoTensor:
    """Stands for ``TensExpr`` and ``TensAdd`` while no tensor expression can exist."""


class _Deferred(types.ModuleType):
    def __getattr__(self, name: str):
        if name == "__path__":  # asked by every ``from ... import``: a module, not a package, has none
            raise AttributeError(name)
        if name in ("TensExpr", "TensAdd") and sys.modules.get(NAME) is self and _asked_by_flatten(sys._getframe(1)):
            return _NoTensor
        return getattr(load(), name)


def _asked_by_flatten(frame) -> bool:
    add = sys.modules.get("sympy.core.add")
    return add is not None and frame.f_code is add.Add.flatten.__func__.__code__


def defer() -> None:
    """Puts the stand-in in place, once sympy (and ``sympy.tensor``) is imported and the
    real module is not."""
    parent = sys.modules.get("sympy.tensor")
    if NAME in sys.modules or parent is None:
        return
    stand_in = _Deferred(NAME, __doc__)
    sys.modules[NAME] = stand_in
    parent.tensor = stand_in


def load() -> types.ModuleType:
    """The real ``sympy.tensor.tensor``, imported in the stand-in's place if it is there."""
    module = sys.modules.get(NAME)
    if isinstance(module, _Deferred):
        del sys.modules[NAME]
        module = None
    return module if module is not None else importlib.import_module(NAME)
