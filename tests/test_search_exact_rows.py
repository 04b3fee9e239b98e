"""Every row a search evaluates carries the figures of its own configuration.

The search evaluates a structure's closed forms, derived once with the sizes as symbols, over
many size assignments. The oracle here is each sampled row written as a spec of its own with
literal sizes and derived on its own (``with_sizes``, sized: what depends on a size's value is
decided for that value), in exact arithmetic. The row's structure's forms, evaluated exactly
at the row's sizes, must equal it as Fractions (peak memory per device, step time, bytes sent),
and the vectorised figures must be those numbers (memory to the byte, time and bytes to float
rounding). The spaces hold what a derivation decides from a size's value: the interleaved
schedule with one chunk per stage and with several, tensor × context groups inside a node and
across nodes, and (the small model: 4 kv heads) more tensor ranks than kv heads.
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("numpy")

from placement_logic import hardware as hw  # noqa: E402
from placement_logic import search  # noqa: E402
from placement_logic.costs import derive, steptime, with_sizes  # noqa: E402
from placement_logic.costs.symbolic import symbol  # noqa: E402
from placement_logic.frontend.loader import load_string  # noqa: E402
from placement_logic.search import space as sp  # noqa: E402

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


def _own(block: str, s: search.Structure, z: dict, space: search.Space) -> tuple[Fraction, Fraction, Fraction]:
    """The row as a spec with literal sizes, derived on its own: memory, step time, bytes sent."""
    plan = load_string(search.spec_text(block, s, z, space.device, space.mfu, literal=True), "<row>").plans[0]
    subs = {symbol(k): v for k, v in z.items()}
    pc = derive(with_sizes(plan, subs), sized=True)
    st = steptime.step_time(pc, plan.mesh.hardware)
    return tuple(_fraction(f.xreplace(subs)) for f in (pc.memory.device_total, st.step, pc.communication.total_bytes))


def _structure_forms(block: str, s: search.Structure, space: search.Space, memo: dict):
    if s not in memo:
        _, forms = search._forms(search.spec_text(block, s, {}, space.device, space.mfu))
        memo[s] = (forms[0], forms[1], forms[3])  # memory, step, bytes (the search's columns 0, 1, 3)
    return memo[s]


def _check_rows(model: str, space: search.Space, per_structure: int | None, sample: int | None, seed: int):
    result = search.run(model, space, top=0, check=False)
    rows = [(s, dict(zip(search.SIZE_SYMBOLS, z)), v) for s, sizes, vals in result.parts
            for z, v in zip(sizes.tolist(), vals.tolist())]
    rng = random.Random(seed)
    if per_structure is not None:  # a few rows of every structure
        by: dict = {}
        for r in rows:
            by.setdefault(r[0], []).append(r)
        picked = [r for rs in by.values() for r in rng.sample(rs, min(per_structure, len(rs)))]
    else:
        picked = rng.sample(rows, min(sample, len(rows)))
    memo: dict = {}
    wrong = []
    for s, z, v in picked:
        own = _own(result.block, s, z, space)
        subs = {symbol(k): x for k, x in z.items()}
        forms = tuple(_fraction(f.xreplace(subs)) for f in _structure_forms(result.block, s, space, memo))
        fast_ok = (abs(v[0] - own[0]) < 0.5 and abs(v[1] - float(own[1])) <= 1e-12 * float(own[1])
                   and abs(v[3] - float(own[2])) <= 1e-12 * max(1.0, float(own[2])))
        # the search's own exact path (what it prints for a ranked row) gives the same figures
        c = search.Candidate(s, z, v[0], v[1], v[2], v[3], True)
        search.exact(c, result.block, space, check=False)
        if forms != own or not fast_ok or (c.exact_memory, c.exact_step) != own[:2] or not c.agrees:
            wrong.append((s, z, [float(x) for x in own], [float(x) for x in forms], (v[0], v[1], v[3])))
    assert not wrong, f"{len(wrong)} of {len(picked)} rows differ from their own derivation: {wrong[:3]}"
    return [(s, z) for s, z, _ in picked]


def _covered(picked, device: str) -> set[str]:
    """The value-decided features the sampled rows hold (from their sizes, not their structures)."""
    per_node = hw.device(device).per_node
    seen = set()
    for s, z in picked:
        if s.schedule == "interleaved":
            seen.add("v=1" if z["nv"] == 1 else "v>1")
        if "cp" in s.axes:
            seen.add("tp*cp across nodes" if z["tp"] * z["cp"] > per_node else "tp*cp in a node")
        if z["tp"] > 4:
            seen.add("kv copies")
    return seen


@pytest.mark.parametrize("pp, strategies, per_structure", [
    ((2,), ("zero1",), 1),  # quick: one row of every structure, each fact still sampled
    pytest.param((1, 2, 4), ("zero1", "hsdp"), 2, marks=pytest.mark.slow),
])
def test_every_sampled_row_is_its_own_configuration(tmp_path, pp, strategies, per_structure):
    model = tmp_path / "model.place"
    model.write_text(MODEL)
    space = search.Space(devices=64, global_batch=64, seq=4096, device="h100_sxm", tp=(1, 2, 4, 8), pp=pp,
                         cp=(1, 2, 4), microbatch=(1,), chunks=(1, 2), strategies=strategies,
                         recompute=("none",))
    picked = _check_rows(str(model), space, per_structure=per_structure, sample=None, seed=3)
    assert _covered(picked, space.device) >= {"v=1", "v>1", "tp*cp across nodes", "tp*cp in a node", "kv copies"}


def test_structures_split_by_the_facts_their_rows_decide(tmp_path):
    """Rows whose derivations branch differently are never one structure: each structure's rows
    agree on one chunk or several, on which axes cross a node, and on K/V heads copied."""
    model = tmp_path / "model.place"
    model.write_text(MODEL)
    space = search.Space(devices=64, global_batch=64, seq=4096, device="h100_sxm", tp=(1, 2, 4, 8), pp=(2,),
                         cp=(1, 2, 4), microbatch=(1,), chunks=(1, 2), strategies=("zero1",), recompute=("none",),
                         schedules=("interleaved",))
    _, shape, _ = search.model_text(str(model), space.seq)
    groups = search.enumerate_space(space, shape)
    for s, (sizes, valid) in groups.items():
        z = sizes[valid]
        if not len(z):
            continue
        tp, cp, nv = z[:, 1], z[:, 3], z[:, 8]
        assert len(set((nv == 1).tolist())) == 1 and (sp.ONE_CHUNK in s.facts) == bool(nv[0] == 1), s
        assert len(set((tp * cp > 8).tolist())) == 1 and (sp.INTER_NODE["cp"] in s.facts) == bool(tp[0] * cp[0] > 8)
        assert len(set(tp[tp > 4].tolist())) <= 1 and any(f.startswith(sp.KV_COPIES) for f in s.facts) == bool(tp[0] > 4)


@pytest.mark.slow
def test_rows_of_the_70b_space_are_their_own_configurations():
    """The benchmark's space (benchmarks/bench_search.py: Llama-3-70B on 1,024 H100s), a seeded
    sample of its rows."""
    space = search.Space(devices=1024, global_batch=2048, seq=8192, device="h100_sxm", tp=(1, 2, 4, 8),
                         pp=(1, 2, 4, 5, 8, 10, 16, 20), cp=(1, 2, 4, 8), microbatch=tuple(range(1, 65)),
                         chunks=tuple(range(1, 17)))
    picked = _check_rows(str(ROOT / "examples" / "models" / "llama3_70b.place"), space, per_structure=None,
                         sample=216, seed=7)
    assert _covered(picked, space.device) >= {"v=1", "v>1", "tp*cp across nodes", "tp*cp in a node"}
