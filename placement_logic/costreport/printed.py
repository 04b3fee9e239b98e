"""``str`` of report formulas, each shared subformula printed once per report.

A report prints many formulas that share large parts (the step time is inside the throughput,
the MFU and the time per token; a stage's total is inside the peak). sympy's ``str`` prints
each formula whole with a new ``StrPrinter``; ``Printed`` is that printer with its result
stored per subexpression, so a shared part is printed once. A subexpression's text is a
function of the subexpression alone (sympy's ``StrPrinter`` keeps no other state while it
prints), except a float's: its trailing zeros are stripped below the top level (``full_prec``
"auto"); so the store is keyed by the subexpression and whether it is the top level, and the
text is ``str(expr)``'s (tests/test_printed.py compares them on every example's formulas).
"""

from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter


class Printed(StrPrinter):
    """``str(expr)`` of sympy expressions (``Printed()(expr)``), subexpressions printed once."""

    def __init__(self) -> None:
        super().__init__()
        self._texts: dict = {}

    def __call__(self, expr) -> str:
        if not isinstance(expr, sympy.Basic):
            return str(expr)
        return self.doprint(expr)

    def _print(self, expr, **kwargs) -> str:
        if kwargs or not isinstance(expr, sympy.Basic):
            return super()._print(expr, **kwargs)
        key = (expr, self._print_level == 0)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = super()._print(expr)
        return text
