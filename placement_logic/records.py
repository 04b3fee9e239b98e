"""The compiled code of the methods ``dataclasses`` writes for this package's records, kept
between runs beside the package's own compiled files.

``@dataclass`` writes each record class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``
(and, frozen, ``__setattr__`` and ``__delattr__``) as source text and compiles it with
``exec`` when the class is created: about 570 functions for the records a cold ``placement
cost`` creates, 0.05 s CPU of compiling on every start (docs/benchmarks.md, "Start-up"). The
code compiled from a text is a function of that text and of the interpreter alone, as a
module's ``.pyc`` is of its source, so the code objects are stored (``marshal``, keyed by the
whole text, under the interpreter's bytecode magic number) in the package's ``__pycache__``
folder, where Python keeps the package's compiled modules, and read back instead of compiled.

``install`` makes ``exec`` inside ``dataclasses`` (a module global there, which shadows the
built-in for that module only) this module's ``_exec``: for a text compiled in the namespace
of a ``placement_logic`` module it takes the stored code, or compiles the text and stores it;
any other call compiles and runs as the built-in does. The text is compiled as the built-in
``exec`` called from ``dataclasses`` compiles it (file name ``<string>``, no ``__future__``
flags: ``dont_inherit``), so a method is the same function either way. Nothing is written
when Python writes no bytecode (``PYTHONDONTWRITEBYTECODE``) or the folder cannot be
written; a file that cannot be read is ignored.
"""

import atexit
import builtins
import dataclasses
import importlib.util
import marshal
import os
import sys

_HEADER = importlib.util.MAGIC_NUMBER + b"placement-logic records 1\n"
FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__",
                    f"records.{sys.implementation.cache_tag}.marshal")
_KEEP = 4  # a stored file more than this many times the texts a run used is rewritten with those alone

_codes: dict | None = None  # text -> code, read from FILE at the first use
_used: set = set()
_new = [0]  # texts compiled in this process (not read from FILE)


def _compile(text: str):
    return compile(text, "<string>", "exec", dont_inherit=True)


def _load() -> dict:
    global _codes
    if _codes is None:
        _codes = {}
        try:
            with open(FILE, "rb") as fh:
                data = fh.read()
            if data.startswith(_HEADER):
                codes = marshal.loads(data[len(_HEADER):])
                if isinstance(codes, dict):
                    _codes = codes
        except (OSError, ValueError, EOFError, TypeError):
            pass
    return _codes


def _exec(source, *args, **kwargs):
    """The built-in ``exec`` as ``dataclasses`` calls it, with the stored code of this package's
    methods."""
    scope = args[0] if args else kwargs.get("globals")
    if type(source) is str:
        if isinstance(scope, dict) and str(scope.get("__name__", "")).startswith("placement_logic"):
            codes = _load()
            code = codes.get(source)
            if code is None:
                code = codes[source] = _compile(source)
                _new[0] += 1
            _used.add(source)
            source = code
        else:
            source = _compile(source)
    return builtins.exec(source, *args, **kwargs)


def save() -> None:
    """Store the codes compiled in this process beside those read (only the ones this run used
    when the file has grown past ``_KEEP`` times them); nothing when none was compiled."""
    if not _new[0] or _codes is None or sys.dont_write_bytecode:
        return
    codes = _codes if len(_codes) <= _KEEP * len(_used) else {t: _codes[t] for t in _used}
    tmp = f"{FILE}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(FILE), exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(_HEADER + marshal.dumps(codes))
        os.replace(tmp, FILE)
        _new[0] = 0
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def install() -> None:
    """Route ``dataclasses``'s ``exec`` through ``_exec`` (once) and store the new codes at exit."""
    if getattr(dataclasses, "exec", None) is not _exec:
        dataclasses.exec = _exec
        atexit.register(save)
