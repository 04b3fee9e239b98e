"""placement_logic.records: a record's generated methods, read from the stored compiled code,
are the functions the built-in ``exec`` makes of the same text (oracle: ``dataclasses`` with
the built-in ``exec``), and the store round-trips through its file."""

from __future__ import annotations

import builtins
import dataclasses
import sys
import types
from pathlib import Path

import pytest

from placement_logic import records

SOURCE = '''
from __future__ import annotations
from dataclasses import dataclass, field

@dataclass(frozen=True)
class Point:
    x: int
    y: "tuple[int, ...]" = ()
    tags: list = field(default_factory=list, compare=False)

@dataclass
class Box:
    name: str
    corners: tuple = (1, 2)
'''

CODE_ATTRS = ("co_code", "co_consts", "co_names", "co_varnames", "co_freevars", "co_flags", "co_filename",
              "co_argcount", "co_kwonlyargcount", "co_name")


def make(module: str, builtin: bool) -> dict:
    """The classes of SOURCE, created in a namespace named ``module``; with ``builtin``
    ``dataclasses`` uses the built-in ``exec`` (the oracle)."""
    saved = dataclasses.__dict__.get("exec")
    mod = types.ModuleType(module)
    sys.modules[module] = mod  # dataclasses reads a class's module (its globals, string annotations)
    try:
        if builtin:
            dataclasses.__dict__.pop("exec", None)
        builtins.exec(compile(SOURCE, f"<{module}>", "exec"), mod.__dict__)
        return mod.__dict__
    finally:
        del sys.modules[module]
        if saved is not None:
            dataclasses.exec = saved


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "FOLDER", str(tmp_path))
    monkeypatch.setattr(records, "_codes", {})
    monkeypatch.setattr(records, "_used", {})
    monkeypatch.setattr(records, "_new", set())
    monkeypatch.setattr(records.sys, "dont_write_bytecode", False)
    records.install()
    return Path(records.path("placement_logic._fake"))


def compiled() -> int:
    """The texts of the fake module compiled (not read) in this process."""
    return len(records._codes.get("placement_logic._fake", {})) if "placement_logic._fake" in records._new else 0


def methods(cls) -> dict:
    return {n: getattr(cls, n) for n in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__")
            if getattr(cls, n, None) is not None and hasattr(getattr(cls, n), "__code__")}


def same_functions(ours, theirs) -> None:
    a, b = methods(ours), methods(theirs)
    assert a.keys() == b.keys() and "__init__" in a and "__repr__" in a
    for name in a:
        f, g = a[name], b[name]
        for attr in CODE_ATTRS:
            assert getattr(f.__code__, attr) == getattr(g.__code__, attr), (name, attr)
        assert f.__annotations__ == g.__annotations__, name  # no __future__ flag leaked into the text's compile
        assert f.__defaults__ == g.__defaults__ and f.__kwdefaults__ == g.__kwdefaults__, name


def test_stored_code_is_the_builtins(store):
    first = make("placement_logic._fake", builtin=False)  # compiled here and stored
    assert compiled() >= 8 and store.exists() is False
    records.save()
    assert store.exists() and not records._new
    records._codes.clear()
    again = make("placement_logic._fake", builtin=False)  # read back from the file
    assert compiled() == 0 and len(records._codes["placement_logic._fake"]) >= 8
    oracle = make("placement_logic._fake", builtin=True)
    for name in ("Point", "Box"):
        same_functions(first[name], oracle[name])
        same_functions(again[name], oracle[name])
    assert again["Point"].__init__.__annotations__["x"] == "int"  # strings: the module's own __future__ import
    p, q = again["Point"](1, (2,)), oracle["Point"](1, (2,))
    assert repr(p) == repr(q) == "Point(x=1, y=(2,), tags=[])"
    assert p == again["Point"](1, (2,), ["other"]) and hash(p) == hash(again["Point"](1, (2,)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3
    b = again["Box"]("b")
    b.name = "c"
    assert repr(b) == "Box(name='c', corners=(1, 2))"


def test_other_modules_compile_as_before(store):
    ns = make("elsewhere", builtin=False)
    assert not records._new and not records._used  # nothing stored for another package
    same_functions(ns["Point"], make("elsewhere", builtin=True)["Point"])


def test_unreadable_file_is_ignored(store):
    store.write_bytes(b"not a marshal file")
    ns = make("placement_logic._fake", builtin=False)
    assert compiled() >= 8
    same_functions(ns["Box"], make("placement_logic._fake", builtin=True)["Box"])
    records.save()
    assert store.read_bytes().startswith(records._HEADER)


def test_no_bytecode_writes_nothing(store, monkeypatch):
    monkeypatch.setattr(records.sys, "dont_write_bytecode", True)
    make("placement_logic._fake", builtin=False)
    records.save()
    assert not store.exists()


def test_package_records_go_through_the_store():
    assert dataclasses.exec is records._exec
    from placement_logic.ir import nodes

    fields = dataclasses.fields(nodes.Span)
    assert fields and nodes.Span.__init__.__code__.co_filename == "<string>"
