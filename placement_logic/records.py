"""The compiled code of the methods ``dataclasses`` writes for this package's records, kept
between runs beside the package's own compiled files.

``@dataclass`` writes each record class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``
(and, frozen, ``__setattr__`` and ``__delattr__``) as source text and compiles it with
``exec`` when the class is created: about 570 functions for the records a cold ``placement
cost`` creates, 0.05 s CPU of compiling on every start (docs/benchmarks.md, "Start-up"). The
code compiled from a text is a function of that text and of the interpreter alone, as a
module's ``.pyc`` is of its source, so the code objects are stored (``marshal``, keyed by the
whole text, under the interpreter's bytecode magic number; one file per module, read at the
module's first record) in the package's ``__pycache__`` folder, where Python keeps the
package's compiled modules, and read back instead of compiled.

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
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
_KEEP = 4  # a stored file more than this many times the texts a run used is rewritten with those alone

_codes: dict = {}  # module -> {text: code}, each module's read from its file at its first record
_used: dict = {}  # module -> the texts this process used
_new: set = set()  # the modules with texts compiled in this process (not read from their file)


def path(module: str) -> str:
    """The file of ``module``'s stored codes."""
    return os.path.join(FOLDER, f"{module}.records.{sys.implementation.cache_tag}.marshal")


def _compile(text: str):
    return compile(text, "<string>", "exec", dont_inherit=True)


def _load(module: str) -> dict:
    codes = _codes.get(module)
    if codes is None:
        codes = _codes[module] = {}
        try:
            with open(path(module), "rb") as fh:
                data = fh.read()
            if data.startswith(_HEADER):
                stored = marshal.loads(data[len(_HEADER):])
                if isinstance(stored, dict):
                    codes.update(stored)
        except (OSError, ValueError, EOFError, TypeError):
            pass
    return codes


def _exec(source, *args, **kwargs):
    """The built-in ``exec`` as ``dataclasses`` calls it, with the stored code of this package's
    methods."""
    scope = args[0] if args else kwargs.get("globals")
    if type(source) is str:
        module = scope.get("__name__") if isinstance(scope, dict) else None
        if isinstance(module, str) and module.startswith("placement_logic"):
            codes = _load(module)
            code = codes.get(source)
            if code is None:
                code = codes[source] = _compile(source)
                _new.add(module)
            _used.setdefault(module, set()).add(source)
            source = code
        else:
            source = _compile(source)
    return builtins.exec(source, *args, **kwargs)


def save() -> None:
    """Store, per module, the codes compiled in this process beside those read (only the ones
    this run used when the file has grown past ``_KEEP`` times them); nothing for a module
    none of whose texts was compiled here."""
    if sys.dont_write_bytecode:
        return
    for module in sorted(_new):
        codes, used = _codes[module], _used.get(module, set())
        if len(codes) > _KEEP * len(used):
            codes = {t: codes[t] for t in used}
        target = path(module)
        tmp = f"{target}.{os.getpid()}.tmp"
        try:
            os.makedirs(FOLDER, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(_HEADER + marshal.dumps(codes))
            os.replace(tmp, target)
        except (OSError, ValueError):
            try:
                os.unlink(tmp)
            except OSError:
                pass
    _new.clear()


def install() -> None:
    """Route ``dataclasses``'s ``exec`` through ``_exec`` (once) and store the new codes at exit."""
    if getattr(dataclasses, "exec", None) is not _exec:
        dataclasses.exec = _exec
        atexit.register(save)
