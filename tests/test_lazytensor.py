"""``costs.lazytensor``: sympy's tensor module is not loaded by the sums a report builds, and
loads as ever when something uses it (each check in a fresh interpreter, since the module is
process-wide)."""

import subprocess
import sys

# tensor expressions made after placement_logic's formulas: the same text as in a process
# that never imported placement_logic (the oracle)
TENSORS = (
    "import sympy\n"
    "from sympy.tensor.tensor import TensorIndexType, tensor_indices, TensorHead, TensAdd, TensExpr\n"
    "L = TensorIndexType('L'); i, j = tensor_indices('i j', L)\n"
    "A, B = TensorHead('A', [L]), TensorHead('B', [L])\n"
    "e = A(i) + B(i) + A(i)\n"
    "print(e, type(e).__name__, isinstance(e, TensExpr), isinstance(e, TensAdd), (A(i) * B(-i)).contract_metric(L.metric))\n"
)


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_formulas_do_not_load_the_tensor_module():
    out = _run(
        "import sys\n"
        "from placement_logic.costs import symbolic\n"
        "x, y = symbolic.symbol('x'), symbolic.symbol('y')\n"
        "print(x + y + 1, (x + 2) * (y + 3) + x / y)\n"
        "print('sympy.combinatorics' in sys.modules, type(sys.modules['sympy.tensor.tensor']).__name__)\n")
    assert out.splitlines() == ["x + y + 1 x/y + (x + 2)*(y + 3)", "False _Deferred"]


def test_tensors_after_formulas_are_sympys():
    ours = _run("from placement_logic.costs import symbolic\n"
                "x = symbolic.symbol('x'); print(x + 1 + x * x)\n" + TENSORS +
                "import sys, sympy.tensor.tensor as T\n"
                "print(sys.modules['sympy.tensor.tensor'] is T is sympy.tensor.tensor, x + 2)\n")
    theirs = _run("import sympy\nx = sympy.Symbol('x', positive=True); print(x + 1 + x * x)\n" + TENSORS +
                  "import sys, sympy.tensor.tensor as T\n"
                  "print(sys.modules['sympy.tensor.tensor'] is T is sympy.tensor.tensor, x + 2)\n")
    assert ours == theirs
    assert "TensAdd True True" in ours


def test_star_import_and_module_attribute_load_the_real_module():
    out = _run("from placement_logic.costs import symbolic\n"
               "x = symbolic.symbol('x'); x + 1\n"
               "import sympy.tensor.tensor\n"
               "print(sympy.tensor.tensor.TensorHead.__module__)\n"
               "from sympy.tensor.tensor import *\n"
               "print(TensorIndexType.__name__, type(sympy.tensor.tensor).__name__)\n")
    assert out.splitlines() == ["sympy.tensor.tensor", "TensorIndexType module"]
