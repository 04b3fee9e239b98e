"""The aux-loss-free routing bias (``override router: counts_reduce over (AXES)``, check.router_bias): every
rank moves each expert's bias by the single device's step from the global batch's counts. Verdicts are compared
with the concrete simulator (tests/simulator_router_bias.py: every device's counts, summed over the stated axes)
at sizes 1..3, the refutation's replay is re-checked by hand, statements that change nothing are PL506 and a
pipeline axis's counts PL270."""

from __future__ import annotations

from itertools import product

import pytest
import simulator_router_bias as sim

from placement_logic.check.router_bias import local_counts, update
from placement_logic.check.run import check_spec
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "SC router bias"
STRATEGY = {"data": ("ddp", "std.data"), "tensor": ("megatron_tp", "std.tensor"),
            "sequence": ("megatron_sp", "std.tensor"), "expert": ("expert_parallel", "std.expert"),
            "context": ("context_parallel", "std.context"), "pipeline": ("gpipe", "std.pipeline")}


def text(mesh: dict[str, tuple[str, int]], stmts: list[str], experts: int = 4, bias: bool = True) -> str:
    imports = sorted({STRATEGY[r] for r, _ in mesh.values()}, key=lambda s: s[1])
    head = "\n".join(f"from {m} import {s}" for s, m in imports)
    sizes = "\n".join(f"  {a} = {n}" for a, (_, n) in mesh.items())
    binds = "\n".join(f"  {a}: {STRATEGY[r][0]}" for a, (r, _) in mesh.items())
    lines = "".join(f"\n  override router: {s}" for s in stmts)
    flag = "\n    router_bias = true" if bias else ""
    return (f"{head}\n\nmodel {{\n  transformer {{\n    hidden = 1024\n    layers = 4\n    heads = 12\n"
            f"    ffn = 1536\n    vocab = 36864\n    experts = {experts}\n    top_k = 1{flag}\n  }}\n  seq = 2304\n"
            f"  microbatch = 1\n}}\n\nmesh {{\n{sizes}\n}}\n\nplan p {{\n{binds}{lines}\n}}\n")


def verdict(src: str, pinned: dict[str, int] | None = None):
    report = check_spec(load_string(src, "r.place"), pinned=pinned, timeout=20)
    found = [o for p in report.plans for o in p.obligations if o.name == NAME]
    return found[0] if found else None


SP = {"dp": ("data", 2), "tp": ("sequence", 2), "ep": ("expert", 2)}
TP = {"dp": ("data", 2), "tp": ("tensor", 2), "ep": ("expert", 2)}


@pytest.mark.parametrize("mesh,axes,expected", [
    (SP, ("dp", "ep"), Verdict.REFUTED),  # torchtitan#4154: the sequence shards' counts not summed
    (SP, ("dp", "tp", "ep"), Verdict.PROVED),
    (SP, ("tp", "ep"), Verdict.REFUTED),  # the data ranks' counts not summed
    (TP, ("dp", "ep"), Verdict.PROVED),  # without sequence parallelism the tensor ranks hold the same tokens
    (TP, ("dp", "tp", "ep"), Verdict.PROVED),  # summed over them too: every count times tp, the sign unchanged
    (TP, ("dp",), Verdict.REFUTED),
])
def test_hand_cases_checker_and_simulator(mesh, axes, expected):
    sizes = {a: n for a, (_, n) in mesh.items()}
    ob = verdict(text(mesh, [f"counts_reduce over ({', '.join(axes)})"]), sizes)
    assert ob is not None and ob.verdict == expected
    assert sim.agrees(sizes, {a: r for a, (r, _) in mesh.items()}, axes, 4) == (expected == Verdict.PROVED)


@pytest.mark.slow
def test_checker_agrees_with_the_simulator_at_sizes_1_to_3():
    """Every size of dp and tp (sequence parallel) in 1..3 and every subset of the axes summed over."""
    roles = {"dp": "data", "tp": "sequence"}
    for dp, tp in product((1, 2, 3), repeat=2):
        sizes = {"dp": dp, "tp": tp}
        mesh = {"dp": ("data", dp), "tp": ("sequence", tp)}
        for axes in (("dp",), ("tp",), ("dp", "tp")):
            ob = verdict(text(mesh, [f"counts_reduce over ({', '.join(axes)})"]), sizes)
            assert (ob.verdict == Verdict.PROVED) == sim.agrees(sizes, roles, axes, 4, trials=24), (sizes, axes)


@pytest.mark.slow
def test_checker_agrees_with_the_simulator_with_expert_and_replicating_tensor_axes():
    """dp = 2, tp (no sequence parallelism: its ranks hold the same tokens) and ep in 1..3, every sum naming dp."""
    roles = {"dp": "data", "tp": "tensor", "ep": "expert"}
    for tp, ep in product((1, 2, 3), repeat=2):
        sizes = {"dp": 2, "tp": tp, "ep": ep}
        mesh = {a: (roles[a], n) for a, n in sizes.items()}
        for axes in (("dp",), ("dp", "tp"), ("dp", "ep"), ("dp", "tp", "ep")):
            ob = verdict(text(mesh, [f"counts_reduce over ({', '.join(axes)})"], experts=6), sizes)
            assert (ob.verdict == Verdict.PROVED) == sim.agrees(sizes, roles, axes, 6, trials=24), (sizes, axes)


def test_the_replay_by_hand():
    """tp = 3, E = 4: rank 0 counts (2, 0, 0, 0), rank 1 (0, 2, 0, 0), rank 2 (1, 1, 0, 0); summed (3, 3, 0, 0),
    mean 6/4 = 3/2: the single device steps (-1, -1, +1, +1); rank 0's mean 1/2: (-1, +1, +1, +1)."""
    ranks = [local_counts(r, 3, 4) for r in range(3)]
    assert [list(map(int, c)) for c in ranks] == [[2, 0, 0, 0], [0, 2, 0, 0], [1, 1, 0, 0]]
    assert update([sum(c[e] for c in ranks) for e in range(4)]) == [-1, -1, 1, 1]
    assert update(ranks[0]) == [-1, 1, 1, 1] and update(ranks[1]) == [1, -1, 1, 1]
    ob = verdict(text(SP, ["counts_reduce over (dp, ep)"]), {"dp": 1, "tp": 3, "ep": 1})
    assert ob.verdict == Verdict.REFUTED
    shown = dict(ob.counterexample.values)
    assert shown["single device"].startswith("counts (3, 3, 0, 0)") and "(-1·u, -1·u, +1·u, +1·u)" in shown["single device"]


def test_a_tensor_axis_of_one_rank_holds_all_its_tokens():
    src = text(SP, ["counts_reduce over (dp, ep)"])
    assert verdict(src).verdict == Verdict.REFUTED
    assert verdict(src, {"tp": 1}).verdict == Verdict.PROVED
    assert sim.agrees({"dp": 2, "tp": 1, "ep": 2}, {"dp": "data", "tp": "sequence", "ep": "expert"}, ("dp", "ep"), 4)


def test_no_statement_no_obligation_and_the_choice_still_read():
    assert verdict(text(SP, [])) is None
    report = check_spec(load_string(text(TP, ["vary over (tp)", "counts_reduce over (dp, ep)"]), "r.place"), timeout=20)
    got = {o.name: o.verdict for p in report.plans for o in p.obligations}
    assert got["GI router"] == Verdict.REFUTED and got[NAME] == Verdict.PROVED


@pytest.mark.parametrize("stmts,bias,code,phrase", [
    (["counts_recomputed"], True, "PL506", "doubled alike"),
    (["counts_reduce over (dp, ep)"], False, "PL506", "no load-balancing bias"),
    (["counts_reduce over (dp, pp)"], True, "PL270", "pipeline axis"),
    (["counts_reduce over (dp, ep)", "counts_reduce over (dp, tp, ep)"], True, "PL291", "contradicts"),
])
def test_statements_rejected(stmts, bias, code, phrase):
    mesh = {"dp": ("data", 2), "tp": ("sequence", 2), "ep": ("expert", 2), "pp": ("pipeline", 2)}
    with pytest.raises(DiagnosticError) as e:
        check_spec(load_string(text(mesh, stmts, bias=bias), "r.place"), timeout=20)
    found = [d for d in e.value.diagnostics if d.code == code]
    assert found and phrase in found[0].message


def test_fmt_round_trip():
    src = text(SP, ["counts_reduce over (dp, tp, ep)"])
    once = format_source(src, "r.place")
    assert "override router: counts_reduce over (dp, tp, ep)" in once
    assert format_source(once, "r.place") == once
