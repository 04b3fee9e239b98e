"""Distributed Muon measured (measure/optimizer_muon.py, ranks/muon.py): which scheme each plan
runs as, why others are unrealised, and, on real gloo ranks, the bytes of every collective of the
first step against the cost engine and the first update against one process's whole-matrix Muon."""

from __future__ import annotations

from fractions import Fraction

import pytest

TEXT = """
from std.data import ddp, zero1, zero3
from std.optimizer import muon_zero1, muon_round_robin

model {
  transformer {
    hidden = 1024
    layers = 4
    heads = 16
    ffn = 4096
    vocab = 32000
  }
  seq = 2048
  microbatch = 4
  microbatches = 1
}

mesh {
  dp = 8
}

plan ddp_muon {
  dp: ddp
  optimizer { matrices = muon(ns_steps = 5) }
}

plan gather {
  dp: muon_zero1
  optimizer { matrices = muon(ns_steps = 5) }
}

plan owners {
  dp: muon_round_robin
  optimizer { matrices = muon(ns_steps = 5) }
}

plan local_shards {
  dp: zero1
  optimizer { matrices = muon(ns_steps = 5) }
}

plan fsdp_muon {
  dp: zero3
  optimizer { matrices = muon(ns_steps = 5) }
}

plan shampoo {
  dp: ddp
  optimizer { matrices = shampoo(block = 8) }
}

plan adamw_only {
  dp: zero1
}
"""


def _spec():
    from placement_logic.frontend.loader import load_string

    return load_string(TEXT, "muon_measure.place")


def test_schemes_by_plan():
    from placement_logic.measure.optimizer_muon import applies, scheme

    spec = _spec()
    want = {"ddp_muon": "replicated", "gather": "gather", "owners": "round_robin", "local_shards": "local"}
    for name, expected in want.items():
        got = scheme(spec.plan(name))
        assert isinstance(got, tuple) and got[0] == expected, (name, got)
        assert dict(got[1]) == {"attention": 5, "kv": 5, "mlp": 5}
    assert not applies(spec.plan("adamw_only"))
    fsdp = scheme(spec.plan("fsdp_muon"))
    assert isinstance(fsdp, list) and any("(S*, S, S)" in r for r in fsdp)
    assert any("shampoo(block = 8)" in r for r in scheme(spec.plan("shampoo")))


def test_unrealised_plans_need_no_torch():
    from pathlib import Path

    from placement_logic.frontend.loader import load_spec
    from placement_logic.measure.session import measure_many

    root = Path(__file__).resolve().parents[2]
    tp = load_spec(root / "examples" / "library" / "muon_tp.place")
    reports = measure_many([(_spec(), "fsdp_muon"), (_spec(), "shampoo"), (tp, "muon_tp")], with_checker=False)
    assert [r.outcome for r in reports] == ["unrealised"] * 3
    assert "one data axis" in " ".join(reports[2].reasons)


def test_entries_cover_each_group_once():
    """Every element of the tiny model's parameters in exactly one entry, q/k/v and gate/up apart."""
    from placement_logic.measure.optimizer_muon import entries, size
    from placement_logic.measure.shape import TinyShape

    shape = TinyShape(hidden=16, layers=2, heads=4, kv_heads=2, ffn=32, vocab=64, seq=8, microbatch=2,
                      tied_embeddings=False, gated_mlp=True, norm="rmsnorm", bias=False, groups=2)
    es = entries(shape)
    seen: dict[tuple[str, int], int] = {}
    for e in es:
        for r in (e.rows if e.rows is not None else range(e.dims[0])):
            seen[e.param, r] = seen.get((e.param, r), 0) + 1
    assert set(seen.values()) == {1}
    # hand count: fused q/k/v has (4 + 2·2)·4 = 32 rows, q = 16 of them; gate and up 32 rows each of 2·32
    assert sum(1 for (p, _) in seen if p == "blocks.0.attn.qkv.weight") == 32
    q = [e for e in es if e.group == "attention" and e.param == "blocks.0.attn.qkv.weight"][0]
    assert q.rows == (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)  # group by group: 2 q heads, k, v
    gate = [e for e in es if e.param == "blocks.0.mlp.fc1.weight"][0]
    assert gate.rows == tuple(range(16)) + tuple(range(32, 48))
    assert sum(size(e) for e in es if e.group == "mlp") == 2 * 3 * 16 * 32


def test_uneven_owners_are_unrealised():
    """Round robin over 4 ranks of a gated MLP's 6 matrices (2 layers × 3): owners of 2, 2, 1, 1."""
    pytest.importorskip("torch")  # measure asks for torch before it scales a runnable scheme down
    from placement_logic.frontend.loader import load_string
    from placement_logic.measure.session import measure_many

    text = TEXT.replace("    vocab = 32000\n", "    vocab = 32000\n    gated_mlp\n    bias = false\n")
    spec = load_string(text, "gated.place")
    [rep] = measure_many([(spec, "owners")], devices=4, with_checker=False)
    assert rep.outcome == "unrealised"
    assert any("round_robin on mlp" in r and "uneven" in r for r in rep.reasons), rep.reasons


def test_newton_schulz_is_the_checkers():
    """The ranks' iteration against the checker's exact rational one from the same X0 = M / s (s: the
    checker's sum of |entries|; Muon's ‖M‖_F otherwise)."""
    torch = pytest.importorskip("torch")
    from placement_logic.check.matrixwise import newton_schulz as exact
    from placement_logic.measure.ranks.muon import newton_schulz

    m = [[Fraction(3), Fraction(-1), Fraction(2)], [Fraction(1), Fraction(4), Fraction(-2)]]
    s = sum(abs(v) for r in m for v in r)
    t = torch.tensor([[float(v) for v in r] for r in m], dtype=torch.float64)
    got = newton_schulz(t, 5, float(s))
    want = exact(m, 5)
    for i in range(2):
        for j in range(3):
            assert abs(float(got[i, j]) - float(want[i][j])) < 1e-6
    tall = newton_schulz(t.t(), 5, float(s))
    assert torch.allclose(tall, got.t(), atol=1e-12)


@pytest.mark.torch
@pytest.mark.slow
def test_distributed_muon_on_gloo():
    pytest.importorskip("torch")
    from placement_logic.measure.session import measure_many

    spec = _spec()
    names = ("ddp_muon", "gather", "owners", "local_shards")
    reports = dict(zip(names, measure_many([(spec, n) for n in names])))
    # tiny shape on 2 ranks: h = 16, 2 layers, 2 heads of 8, ffn 64, vocab 64, layernorm, biases
    psi = 64 * 16 * 2 + 2 * (4 * 16 + 3 * 16 * 16 + 3 * 16 + 16 * 16 + 16 + 2 * 16 * 64 + 64 + 16) + 2 * 16
    assert psi == 8640
    per_group = {"attention": 2 * (2 * 16 * 16 + 16), "kv": 2 * (2 * 16 * 16 + 2 * 16),
                 "mlp": 2 * (2 * 16 * 64 + 64)}  # the group's column biases gathered with its matrices
    for name in ("ddp_muon", "gather", "owners"):
        rep = reports[name]
        assert rep.outcome == "matched", (name, rep.reasons, rep.rows)
        assert rep.equivalence.within and rep.equivalence.replicas_agree
        assert rep.checker.verdict == "proved"
        assert all(r.status == "match" and r.measured == r.predicted for r in rep.rows)
    rows = {r.quantity: r.measured for r in reports["gather"].rows}
    assert rows["reduce_scatter over (dp), grad_sync: accumulated gradients"] == 4 * psi
    assert rows["all_gather over (dp), refresh: updated parameters"] == 4 * psi
    for g, n in per_group.items():
        assert rows[f"all_gather over (dp), optimizer: {g} gradient matrices"] == 4 * n
    assert len(reports["owners"].rows) == 2  # whole-matrix slices: nothing beyond ZeRO-1's two collectives
    assert {r.quantity: r.measured for r in reports["ddp_muon"].rows} == {
        "all_reduce over (dp), grad_sync: accumulated gradients": 4 * psi}
    bug = reports["local_shards"]
    assert bug.outcome == "diverged" and not bug.equivalence.within
    assert bug.equivalence.param_rel > 0.1  # orthogonalised row blocks are not blocks of the orthogonalised matrix
    assert bug.checker.verdict == "refuted"
