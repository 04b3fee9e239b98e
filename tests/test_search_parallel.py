"""The search's structures derived on several processes (``search.parallel``) give the search of
one process: the same structures, the same rows, every figure the same number, the same ranking."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")

from placement_logic import search  # noqa: E402
from placement_logic.search import parallel  # noqa: E402

MODEL = """model {
  transformer { hidden = 2048 layers = 16 heads = 16 kv_heads = 4 ffn = 5632 vocab = 32000 norm = rmsnorm
                gated_mlp bias = false }
}
"""


def _space() -> search.Space:
    return search.Space(devices=16, global_batch=64, seq=4096, device="l40s", tp=(1, 2, 4), pp=(1, 2),
                        microbatch=(1, 2), chunks=(2,), strategies=("ddp", "zero1", "zero3"), recompute=("none", "full"))


def _fresh(monkeypatch) -> None:
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    for table in ("_COMPILED", "_PROGRAMS", "_EXACT_FORMS", "_DERIVED", "_EXACT_FNS", "_EXACT"):
        monkeypatch.setattr(search, table, {})


def _summary(result) -> tuple:
    parts = sorted((repr(s), sizes.tobytes(), values.tobytes()) for s, sizes, values in result.parts)
    ranked = [(c.label(), c.sizes, c.exact_memory, c.exact_step, c.verdict) for c in result.ranked]
    return result.candidates, result.structures, result.valid, result.fitting, parts, ranked


def test_two_processes_give_the_one_process_search(tmp_path, monkeypatch):
    spec = tmp_path / "m.place"
    spec.write_text(MODEL)
    calls = []
    real = parallel.derive_all

    def counted(texts, derive, jobs, tick):
        out = real(texts, derive, jobs, tick)
        calls.append((len(texts), jobs, len(out)))
        return out

    monkeypatch.setattr(parallel, "derive_all", counted)
    _fresh(monkeypatch)
    one = _summary(search.run(str(spec), _space(), top=5, check=False, jobs=1))
    _fresh(monkeypatch)
    two = _summary(search.run(str(spec), _space(), top=5, check=False, jobs=2))
    assert one == two
    # the second search handed its structures to the workers: each came back a program
    (n1, j1, got1), (n2, j2, got2) = calls
    assert j1 == 1 and got1 == 0
    assert j2 == 2 and n2 == one[1] and got2 == n2 >= 2 * parallel.PER_WORKER


def test_too_few_structures_stay_in_the_process():
    assert parallel.derive_all(["a"] * (2 * parallel.PER_WORKER - 1), str.upper, 2, lambda n, label: None) == {}
    assert parallel.derive_all(["a", "b"] * 8, str.upper, 1, lambda n, label: None) == {}


def test_each_text_gets_its_own_result_in_order():
    texts = [f"t{i}" for i in range(12)]
    ticks = []
    out = parallel.derive_all(texts, str.upper, 3, lambda n, label: ticks.append(n))
    assert out == {t: t.upper() for t in texts} and ticks == list(range(12))


def test_jobs_on_the_command_line(tmp_path):
    import io

    from placement_logic.cli import main

    spec = tmp_path / "m.place"
    spec.write_text(MODEL)
    err = io.StringIO()
    status = main(["search", str(spec), "--device", "l40s", "--devices", "16", "--global-batch", "64", "--seq",
                   "4096", "--jobs", "0"], io.StringIO(), err)
    assert status == 2 and "--jobs 0" in err.getvalue() and "PL" in err.getvalue()
