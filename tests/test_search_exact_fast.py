"""The exact figures of a searched configuration from its structure's compiled forms.

``search.exact`` evaluates a structure's exact figures (``search.exactforms``: compiled once
from the structure's derivation with its sizes as symbols) at a row's sizes in rational
arithmetic. The oracle is the row written as a spec with literal sizes, derived on its own
(sized: what depends on a size's value is decided for that value) and every figure
substituted with sympy (``xreplace``), independently of both the compiled program and
``costs.extrema.exact_at``: peak memory per device, step time, each stage's peak, each link
class's bytes and the exposed communication time must be the same ``Fraction`` values, on rows
sampled over every structure of spaces that hold what a derivation decides by value (one chunk
per stage, tensor × context groups across nodes, K/V heads copied, hsdp's shard group).
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("numpy")

import sympy  # noqa: E402

from placement_logic import search  # noqa: E402
from placement_logic.costs import derive, steptime, with_sizes  # noqa: E402
from placement_logic.costs.compiled import cost_exprs  # noqa: E402
from placement_logic.costs.symbolic import symbol  # noqa: E402
from placement_logic.frontend.loader import load_string  # noqa: E402
from placement_logic.search import exactforms, program  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = """model {
  transformer {
    hidden = 2048
    layers = 16
    heads = 16
    kv_heads = 4
    ffn = 5632
    vocab = 32000
    norm = rmsnorm
    gated_mlp
    bias = false
  }
}
"""


def _fraction(v) -> Fraction:
    assert v.is_Rational, v
    return Fraction(int(v.p), int(v.q))


def _oracle(block: str, s: search.Structure, z: dict, space: search.Space) -> tuple:
    """The row derived on its own, every figure substituted in sympy."""
    plan = load_string(search.spec_text(block, s, z, space.device, space.mfu, literal=True), "<row>").plans[0]
    subs = {symbol(k): sympy.Integer(v) for k, v in z.items()}
    pc = derive(with_sizes(plan, subs), sized=True)
    st = steptime.step_time(pc, plan.mesh.hardware)
    exprs = cost_exprs(pc, subs)
    stage = {k.split(".")[1]: _fraction(v) for k, v in exprs.items() if k.startswith("stage.") and k.endswith(".total")}
    link = {k[len("comm.link."):]: _fraction(v) for k, v in exprs.items() if k.startswith("comm.link.")}
    step = _fraction(st.step.xreplace(subs))
    busy = _fraction((st.compute + st.optimizer).xreplace(subs))
    return _fraction(pc.memory.device_total.xreplace(subs)), step, stage, link, step - busy


def _sample(model: str, space: search.Space, per_structure: int, seed: int):
    result = search.run(model, space, top=0, check=False)
    rng = random.Random(seed)
    picked = []
    for s, sizes, _ in result.parts:
        rows = sizes.tolist()
        picked += [(s, dict(zip(search.SIZE_SYMBOLS, z))) for z in rng.sample(rows, min(per_structure, len(rows)))]
    return result, picked


def _check(model: str, space: search.Space, per_structure: int, seed: int) -> int:
    result, picked = _sample(model, space, per_structure, seed)
    wrong, compared = [], 0
    for s, z in picked:
        c = search.Candidate(s, z)
        if not search._valid(search._structure_spec(search.spec_text(result.block, s, {}, space.device, space.mfu)),
                             z):
            continue  # a row the search never ranks (the file refuses its sizes)
        fast = search._structure_figures(c, result.block, space)
        assert fast is not None, (s, z)  # the compiled forms apply to every row of the structure
        want = _oracle(result.block, s, z, space)
        compared += 1
        search.exact(c, result.block, space, check=False)
        got = (c.exact_memory, c.exact_step, c.stage_memory, c.link_bytes, c.exposed)
        if fast != want or got != want or not all(isinstance(x, Fraction) for x in (*want[:2], want[4])):
            wrong.append((s, z, fast, want))
    assert not wrong, f"{len(wrong)} of {compared} rows differ from their own derivation: {wrong[:2]}"
    return compared


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for table in ("_EXACT", "_EXACT_FORMS", "_EXACT_FNS", "_DERIVED"):
        monkeypatch.setattr(search, table, {})


@pytest.mark.parametrize("pp, strategies, per_structure, least", [
    ((2,), ("hsdp",), 1, 18),  # the quick tier's: hsdp's 18 structures
    pytest.param((2,), ("zero1", "hsdp"), 1, 40, marks=pytest.mark.slow),
    pytest.param((1, 2, 4), ("ddp", "zero3", "hsdp"), 3, 40, marks=pytest.mark.slow),
])
def test_compiled_figures_equal_each_rows_own_derivation(tmp_path, pp, strategies, per_structure, least):
    model = tmp_path / "model.place"
    model.write_text(MODEL)
    space = search.Space(devices=64, global_batch=64, seq=4096, device="h100_sxm", tp=(1, 2, 4, 8), pp=pp,
                         cp=(1, 2, 4), microbatch=(1, 2), chunks=(1, 2), strategies=strategies,
                         recompute=("none", "full"))
    assert _check(str(model), space, per_structure, seed=11) >= least


@pytest.mark.slow
def test_compiled_figures_on_the_70b_space():
    """The benchmark's space (benchmarks/bench_search.py), rows of every structure."""
    space = search.Space(devices=1024, global_batch=2048, seq=8192, device="h100_sxm", tp=(1, 2, 4, 8),
                         pp=(1, 2, 4, 5, 8, 10, 16, 20), cp=(1, 2, 4, 8), microbatch=tuple(range(1, 65)),
                         chunks=tuple(range(1, 17)))
    assert _check(str(ROOT / "examples" / "models" / "llama3_70b.place"), space, per_structure=1, seed=5) >= 200


def test_a_row_outside_its_structure_is_derived_on_its_own(tmp_path):
    """Sizes the structure's facts do not hold (tp × cp across a node in a structure whose
    groups stay inside one, a pipeline axis of one device) are not evaluated with its forms:
    the figures are the row's own derivation."""
    model = tmp_path / "model.place"
    model.write_text(MODEL)
    space = search.Space(devices=64, global_batch=64, seq=4096, device="h100_sxm", tp=(1, 2, 4, 8), pp=(2,),
                         cp=(1, 2, 4), microbatch=(1,), strategies=("zero1",), recompute=("none",),
                         schedules=("1f1b",))
    block, _, _ = search.model_text(str(model), space.seq)
    inside = search.Structure("zero1", "none", "1f1b", ("tp", "pp", "cp"))
    z = dict(dp=2, tp=4, pp=2, cp=4, ep=1, ds=1, mb=1, nmb=32, nv=1)  # tp × cp = 16 > 8 per node
    assert search._structure_figures(search.Candidate(inside, z), block, space) is None
    c = search.Candidate(inside, z)
    search.exact(c, block, space, check=False)
    own = search.Structure("zero1", "none", "1f1b", ("tp", "pp", "cp"), facts=("cp inter_node",))
    assert (c.exact_memory, c.exact_step, c.stage_memory, c.link_bytes, c.exposed) == _oracle(block, own, z, space)
    flat = dict(z, pp=1, cp=2, dp=8, nmb=8)
    assert search._structure_figures(search.Candidate(inside, flat), block, space) is None


X, Y = sympy.symbols("dp tp", positive=True, integer=True)


def _record(forms_: list) -> dict:
    prog = program.build(forms_, ("dp", "tp"))
    return {"program": prog, "stages": [], "links": [f"l{k}" for k in range(len(forms_) - 3)]}


def test_the_compiled_program_is_sympys_value_or_none():
    """Hand forms against sympy's substitution: exact rationals, maxima, piecewise forms; no
    value (None) at a division by zero or where no branch holds, as sympy gives none."""
    forms_ = [X * Y + Fraction(3, 7), X / Y - sympy.Max(X, 2 * Y) / 3, sympy.Integer(1) / 5,
              sympy.Piecewise((X / (Y - 1), X >= Y), (Y ** 2, True)),
              sympy.Piecewise((X, sympy.And(X > 2, sympy.Not(sympy.Eq(Y, 3)))), (Y, sympy.Or(X < 2, Y > 5)))]
    record = exactforms.load(_record(forms_))
    assert record is not None
    fn = exactforms.compile(record)
    for x in range(1, 8):
        for y in range(1, 8):
            subs = {X: sympy.Integer(x), Y: sympy.Integer(y)}
            want = [f.xreplace(subs) for f in forms_]
            got = fn([x, y])
            if not all(w.is_Rational for w in want):
                assert got is None, (x, y)
                continue
            memory, step, stages, links, exposed = got
            assert (memory, step, exposed) == (_fraction(want[0]), _fraction(want[1]),
                                               _fraction(want[1]) - _fraction(want[2]))
            assert stages == {} and links == {"l0": _fraction(want[3]), "l1": _fraction(want[4])}


def test_records_that_are_not_exact_are_refused():
    assert exactforms.load(_record([X * Y, sympy.Float(0.5) * X, X])) is None
    assert exactforms.load(_record([X * Y, sympy.sqrt(X), X])) is None
    assert exactforms.load({**_record([X, Y, X]), "links": ["extra"]}) is None  # outputs and names disagree
    assert exactforms.load(None) is None and exactforms.load({"program": None}) is None


def test_a_structures_exact_figures_come_from_the_cache_without_a_derivation(tmp_path, monkeypatch):
    """The search stores a structure's exact figures beside its program (content-addressed); a
    later process evaluates a row from them without deriving anything, the same figures."""
    model = tmp_path / "model.place"
    model.write_text(MODEL)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "0")
    monkeypatch.setattr(search, "_COMPILED", {})
    space = search.Space(devices=16, global_batch=32, seq=4096, device="h100_sxm", tp=(2,), pp=(2,), cp=(1,),
                         microbatch=(1,), chunks=(2,), strategies=("zero3",), recompute=("none",),
                         schedules=("interleaved",))
    result = search.run(str(model), space, top=1, check=False)
    assert list((tmp_path / "cache" / "placement-logic" / "exact-structures").glob("*.json"))
    c = result.ranked[0]
    want = _oracle(result.block, c.structure, c.sizes, space)
    for table in ("_EXACT", "_EXACT_FORMS", "_EXACT_FNS", "_DERIVED"):  # a later process
        monkeypatch.setattr(search, table, {})

    def no_derivation(*_args):
        raise AssertionError("derived again")

    monkeypatch.setattr(search, "_derived", no_derivation)
    monkeypatch.setattr(search, "derive_exact", no_derivation)
    again = search.Candidate(c.structure, c.sizes)
    search.exact(again, result.block, space, check=False)
    assert (again.exact_memory, again.exact_step, again.stage_memory, again.link_bytes, again.exposed) == want
