"""The search's compiled structures (``search.program``): a structure's closed forms as a
straight-line program, held to sympy's exact value of each form at integer points (the oracle:
``xreplace`` in rational arithmetic), and cached by content, in the process and on disk, so a
repeated structure is neither derived nor compiled again."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

np = pytest.importorskip("numpy")

import sympy  # noqa: E402

from placement_logic import search  # noqa: E402
from placement_logic.search import program  # noqa: E402
from placement_logic.search.space import SIZE_SYMBOLS, Structure  # noqa: E402

X, Y, Z = sympy.symbols("dp tp pp", positive=True, integer=True)
NAMES = ("dp", "tp", "pp")
FORMS = [
    X * Y + Fraction(3, 7) * Z,
    X / (Y * Z) + 5,
    sympy.Max(X, 2 * Y, Z + 1) - sympy.Min(X * Z, Y ** 2),
    sympy.Piecewise((X / Y, X >= Y), (Y - X, sympy.And(X < Y, Z > 1)), (sympy.Integer(7), True)),
    sympy.Piecewise((X, sympy.Eq(Y, 2)), (Z, sympy.Ne(X, 3))),  # no branch true: not a number
    (X + Y) ** 3 / Z ** 2 - sympy.sqrt(X),
    sympy.Float(0.25) * X + sympy.Integer(2),
]


def _exact(form, point) -> float:
    v = form.xreplace({s: sympy.Integer(point[s.name]) for s in (X, Y, Z)})
    return float(v) if v.is_number and v.is_real else float("nan")


def test_programs_equal_the_exact_value_of_each_form():
    prog = program.build(FORMS, NAMES)
    assert prog is not None
    rng = random.Random(5)
    points = [{n: rng.randint(1, 9) for n in NAMES} for _ in range(300)]
    cols = [np.array([p[n] for p in points], dtype=np.float64) for n in NAMES]
    with np.errstate(all="ignore"):
        got = [np.broadcast_to(v, (len(points),)) for v in program.run(prog, cols)]
    for k, form in enumerate(FORMS):
        for i, p in enumerate(points):
            want = _exact(form, p)
            if want != want:
                assert got[k][i] != got[k][i], (form, p)
            else:
                assert got[k][i] == pytest.approx(want, rel=1e-12), (form, p)


def test_merged_programs_give_each_forms_exact_value_and_share_their_terms():
    """Programs merged (the search evaluates the structures over the same rows together) give
    every output of each, held to sympy's exact value, with each shared term computed once."""
    first, second = program.build(FORMS[:4], NAMES), program.build(FORMS[2:], NAMES)
    merged = program.merge([first, second])
    assert len(merged["outputs"]) == len(FORMS[:4]) + len(FORMS[2:])
    assert len(merged["ops"]) < len(first["ops"]) + len(second["ops"])  # FORMS[2:4] once
    rng = random.Random(11)
    points = [{n: rng.randint(1, 9) for n in NAMES} for _ in range(200)]
    cols = [np.array([p[n] for p in points], dtype=np.float64) for n in NAMES]
    with np.errstate(all="ignore"):
        got = [np.broadcast_to(v, (len(points),)) for v in program.compile(merged)(cols)]
    for k, form in enumerate(FORMS[:4] + FORMS[2:]):
        for i, p in enumerate(points):
            want = _exact(form, p)
            if want != want:
                assert got[k][i] != got[k][i], (form, p)
            else:
                assert got[k][i] == pytest.approx(want, rel=1e-12), (form, p)


def test_merging_keeps_the_sign_of_a_zero():
    """0.0 and -0.0 are equal as keys but not as divisors: 1/x is +inf and -inf."""
    one, other = ({"names": ["dp"], "ops": [("sym", 0), ("float", z), ("mul", (0, 1)), ("pow", 2, -1, 1)],
                   "outputs": [3]} for z in (0.0, -0.0))
    with np.errstate(all="ignore"):
        got = program.compile(program.merge([one, other]))([np.ones(1)])
    assert [float(v[0]) for v in got] == [np.inf, -np.inf]


def test_a_shared_subterm_is_one_operation():
    prog = program.build([(X + Y) * Z, (X + Y) ** 2], NAMES)
    assert sum(op[0] == "add" for op in prog["ops"]) == 1


def test_an_unknown_node_or_symbol_gives_no_program():
    assert program.build([sympy.ceiling(X / Y)], NAMES) is None
    assert program.build([X + sympy.Symbol("q")], NAMES) is None


def test_stored_programs_are_checked_before_they_are_run():
    prog = program.build(FORMS, NAMES)
    assert program.load(prog) == {**prog, "ops": [tuple(program._tuple(o)) for o in prog["ops"]]}
    assert program.load({"names": ["dp"], "ops": [["sym", 0], ["add", [0, 1]]], "outputs": [1]}) is None  # forward
    assert program.load({"names": ["dp"], "ops": [["exec", 0]], "outputs": [0]}) is None
    assert program.load({"names": ["dp"], "ops": [["sym", 0]], "outputs": [3]}) is None
    assert program.load(None) is None and program.load({"ops": 1}) is None


MODEL = """model {
  transformer { hidden = 1024 layers = 8 heads = 8 kv_heads = 4 ffn = 2816 vocab = 32000
                norm = rmsnorm gated_mlp bias = false }
}
"""


def test_a_repeated_structure_is_neither_derived_nor_compiled(tmp_path, monkeypatch):
    """The second time a structure's spec text is met (this process, or a later one through
    the on-disk cache) its figures come without a derivation, and equal the first ones."""
    path = tmp_path / "m.place"
    path.write_text(MODEL)
    space = search.Space(devices=8, global_batch=16, seq=1024, device="l40s", tp=(1, 2), pp=(1, 2),
                         microbatch=(1, 2), strategies=("ddp", "zero3"), recompute=("none",), schedules=("1f1b",))
    block, _, _ = search.model_text(str(path), space.seq)
    s = Structure("zero3", "none", "1f1b", ("dp", "tp", "pp"), False)
    text = search.spec_text(block, s, {}, space.device, space.mfu)
    sizes = [np.array(v, dtype=np.float64) for v in ([2, 4, 2], [2, 1, 2], [2, 2, 2], [1, 1, 1], [1, 2, 1],
                                                    [4, 4, 4], [1, 1, 1], [1, 1, 1])]
    sizes = sizes[:len(SIZE_SYMBOLS)] + [np.ones(3)] * (len(SIZE_SYMBOLS) - len(sizes))

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "0")
    monkeypatch.setattr(search, "_COMPILED", {})
    monkeypatch.setattr(search, "_PROGRAMS", {})
    first = [np.array(v) for v in search._evaluator(text)(*sizes)]
    assert list((tmp_path / "cache" / "placement-logic" / "structures").glob("*.json"))

    def no_derivation(_text):
        raise AssertionError("derived again")

    monkeypatch.setattr(search, "_derived", no_derivation)
    again = [np.array(v) for v in search._evaluator(text)(*sizes)]  # this process's table
    monkeypatch.setattr(search, "_COMPILED", {})
    monkeypatch.setattr(search, "_PROGRAMS", {})
    later = [np.array(v) for v in search._evaluator(text)(*sizes)]  # a later process: the disk
    for a, b, c in zip(first, again, later):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def test_without_the_disk_cache_a_new_process_derives_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    monkeypatch.setattr(search, "_COMPILED", {})
    monkeypatch.setattr(search, "_PROGRAMS", {})
    path = tmp_path / "m.place"
    path.write_text(MODEL)
    block, _, _ = search.model_text(str(path), 1024)
    s = Structure("ddp", "none", "1f1b", ("dp",), False)
    search._evaluator(search.spec_text(block, s, {}, "l40s", None))
    assert not (tmp_path / "cache").exists()


def test_a_search_gives_each_structure_the_figures_of_its_own_program(tmp_path, monkeypatch):
    """The search evaluates the structures over the same rows with their programs merged; each
    structure's figures are, bit for bit, those of its own program run over its own rows."""
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    path = tmp_path / "m.place"
    path.write_text(MODEL)
    space = search.Space(devices=16, global_batch=64, seq=1024, device="h100_sxm", tp=(1, 2, 4), pp=(1, 2),
                         microbatch=(1, 2), strategies=("ddp", "zero1", "zero3", "hsdp"), chunks=(2,))
    result = search.run(str(path), space, top=1, check=False)
    assert len(result.parts) > 10
    for s, sizes, vals in result.parts:
        cols = [sizes[:, i].astype(np.float64) for i in range(len(SIZE_SYMBOLS))]
        with np.errstate(all="ignore"):
            own = search._evaluator(search.spec_text(result.block, s, {}, space.device, space.mfu))(*cols)
        want = np.stack([np.broadcast_to(np.asarray(v, dtype=np.float64), (len(sizes),)) for v in own], axis=1)
        assert vals.tobytes() == want.tobytes(), s
