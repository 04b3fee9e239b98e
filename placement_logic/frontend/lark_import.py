"""lark, imported without the ``regex`` module, and the names of it the front end uses.

lark imports ``regex`` (a large third-party module, present wherever something else needs it,
such as transformers) whenever it is installed, to offer ``Lark(regex=True)`` and Unicode
categories (``\\p{...}``) in terminals; the grammar uses neither, and lark's parser uses
``re`` either way. Importing ``regex`` was about 0.01 s CPU of every command that parses a
spec, so lark is imported with ``regex`` hidden (lark then records it as absent); the entry
is removed at once, so ``import regex`` elsewhere in the process works as ever. Where lark or
``regex`` was imported before, nothing is hidden.
"""

from __future__ import annotations

import sys


def _import_lark() -> None:
    if "lark" in sys.modules or "regex" in sys.modules:
        return
    sys.modules["regex"] = None  # ``import regex`` raises ImportError while lark is imported
    try:
        import lark  # noqa: F401
    finally:
        del sys.modules["regex"]


_import_lark()

from lark import Lark, Token, Transformer, v_args  # noqa: E402
from lark.exceptions import (  # noqa: E402
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)
from lark.tree import Meta  # noqa: E402

__all__ = ["Lark", "Meta", "Token", "Transformer", "UnexpectedCharacters", "UnexpectedEOF", "UnexpectedInput",
           "UnexpectedToken", "VisitError", "v_args"]
