"""The MoE router's top-k choice (``override router: same | vary over (AXES) | input_partial over (AXES)``,
check.router): every rank that holds a token routes it as the single device does. Verdicts are compared
with the concrete simulator (tests/simulator_router.py: per-rank noise and per-rank router inputs on every
rank of the mesh), refutations' replays are re-checked by hand, statements that change nothing are PL506."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import simulator_router as sim

from placement_logic.check.run import check_spec
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI router"
STRATEGY = {"data": ("ddp", "std.data"), "tensor": ("megatron_tp", "std.tensor"),
            "sequence": ("megatron_sp", "std.tensor"), "expert": ("expert_parallel", "std.expert"),
            "context": ("context_parallel", "std.context")}


def text(mesh: dict[str, tuple[str, int]], stmt: str | None, experts: int = 8, top_k: int = 2) -> str:
    imports = sorted({STRATEGY[r] for r, _ in mesh.values()}, key=lambda s: s[1])
    head = "\n".join(f"from {m} import {s}" for s, m in imports)
    sizes = "\n".join(f"  {a} = {n}" for a, (_, n) in mesh.items())
    binds = "\n".join(f"  {a}: {STRATEGY[r][0]}" for a, (r, _) in mesh.items())
    line = f"\n  override router: {stmt}" if stmt else ""
    return (f"{head}\n\nmodel {{\n  transformer {{\n    hidden = 1024\n    layers = 4\n    heads = 16\n"
            f"    ffn = 1024\n    vocab = 32768\n    experts = {experts}\n    top_k = {top_k}\n  }}\n  seq = 2048\n"
            f"  microbatch = 1\n}}\n\nmesh {{\n{sizes}\n}}\n\nplan p {{\n{binds}{line}\n}}\n")


def verdict(src: str, pinned: dict[str, int] | None = None):
    report = check_spec(load_string(src, "r.place"), pinned=pinned, timeout=20)
    found = [o for p in report.plans for o in p.obligations if o.name == NAME]
    return found[0] if found else None


def roles_of(mesh):
    return {a: r for a, (r, _) in mesh.items()}


TP = {"dp": ("data", 2), "tp": ("tensor", 2), "ep": ("expert", 2)}
SP = {"dp": ("data", 2), "tp": ("sequence", 2), "ep": ("expert", 2)}


@pytest.mark.parametrize("mesh,stmt,expected", [
    (TP, "vary over (tp)", Verdict.REFUTED),
    (TP, "vary over (dp, tp)", Verdict.REFUTED),
    (TP, "input_partial over (tp)", Verdict.REFUTED),
    (TP, "same", Verdict.PROVED),
    (SP, "vary over (tp)", Verdict.PROVED),  # sequence-parallel shards route their own tokens
    (SP, "input_partial over (tp)", Verdict.REFUTED),  # a reduce-scatter's input is partial too
    (SP, "same", Verdict.PROVED),
])
def test_hand_cases_checker_and_simulator(mesh, stmt, expected):
    ob = verdict(text(mesh, stmt), {a: n for a, (_, n) in mesh.items()})
    assert ob is not None and ob.verdict == expected
    verb, _, rest = stmt.partition(" over ")
    axes = tuple(a.strip() for a in rest.strip("()").split(",")) if rest else ()
    ok = sim.consistent({a: n for a, (_, n) in mesh.items()}, roles_of(mesh), False, verb, axes, 8, 2)
    assert ok == (expected == Verdict.PROVED)


def test_a_tensor_axis_of_one_rank_holds_one_replica():
    """The sizes matter: free, tp = 2 refutes; pinned at 1, one rank routes every token once."""
    src = text(TP, "vary over (tp)")
    assert verdict(src).verdict == Verdict.REFUTED
    assert verdict(src, {"tp": 1}).verdict == Verdict.PROVED
    assert sim.consistent({"dp": 2, "tp": 1, "ep": 2}, roles_of(TP), False, "vary", ("tp",), 8, 2)


def test_no_statement_no_obligation():
    assert verdict(text(TP, None)) is None


@pytest.mark.parametrize("stmt,words", [
    ("vary over (dp)", "hold different tokens"),
    ("vary over (ep)", "hold different tokens"),
    ("input_partial over (dp, ep)", "no axis of dp, ep is a tensor axis"),
])
def test_statements_that_change_nothing(stmt, words):
    with pytest.raises(DiagnosticError) as e:
        load_string(text(TP, stmt), "r.place")
    d = e.value.diagnostics[0]
    assert d.code == "PL506" and words in d.message


def test_vary_over_sequence_parallel_shards_only_changes_nothing_pl506():
    with pytest.raises(DiagnosticError) as e:
        load_string(text({"dp": ("data", 2), "tp": ("sequence", 2)}, "vary over (dp)"), "r.place")
    assert e.value.diagnostics[0].code == "PL506"


def test_a_dense_model_has_no_router_pl506():
    src = text(TP, "vary over (tp)", experts=1, top_k=1)
    with pytest.raises(DiagnosticError) as e:
        load_string(src, "r.place")
    assert e.value.diagnostics[0].code == "PL506" and "no experts" in e.value.diagnostics[0].message


def _route(scores, k):
    order = sorted(range(len(scores)), key=lambda e: (-scores[e], e))[:k]
    return sorted(order)


@pytest.mark.parametrize("stmt,k", [("vary over (tp)", 2), ("input_partial over (tp)", 1), ("vary over (tp)", 8)])
def test_refutation_replays_two_ranks_routing_one_token_differently(stmt, k):
    """Re-derived by hand from the replay's description: vary: the logits tied at 0, rank r's noise adds 3 to
    the experts r·k .. r·k + k - 1 mod E; input_partial: g_0 = (2, 0), g_1 = (0, 1), rank 1 scores (0, 1)."""
    ob = verdict(text(TP, stmt, top_k=k))
    assert ob.verdict == Verdict.REFUTED
    cx = ob.counterexample
    vals = dict(cx.values)
    e = 8
    if stmt.startswith("vary"):
        r1 = [1 + (3 if x in ({(k + j) % e for j in range(k)} if k < e else {1}) else 0) for x in range(e)]
        r0 = [1 + (3 if x in (range(k) if k < e else {0}) else 0) for x in range(e)]
    else:
        r1 = [1 + (1 if x == 1 else 0) for x in range(e)]
        r0 = [1 + (2 if x == 0 else 0) + (1 if x == 1 else 0) for x in range(e)]
    for r, s in ((0, r0), (1, r1)):
        chosen = _route(s, k)
        total = sum(s[x] for x in chosen)
        out = sum(Fraction(s[x], total) * (x + 2) for x in chosen)
        shown = vals[f"rank {r} of tp"]
        assert f"experts ({', '.join(map(str, chosen))})" in shown and shown.endswith(f"output {out}")
    assert "the root cause is the MoE router's choice" in cx.diagnosis[0] and "line" in cx.diagnosis[0]


def _random_mesh(rnd: random.Random):
    roles = rnd.sample(["data", "tensor", "sequence", "expert", "context"], rnd.randint(1, 3))
    if "tensor" in roles and "sequence" in roles:
        roles.remove("sequence")
    names = {"data": "dp", "tensor": "tp", "sequence": "tp", "expert": "ep", "context": "cp"}
    return {names[r]: (r, rnd.choice((1, 2, 4))) for r in roles}


@pytest.mark.parametrize("seed", range(30))
def test_checker_agrees_with_the_router_simulator(seed):
    rnd = random.Random(seed)
    mesh = _random_mesh(rnd)
    verb = rnd.choice(["vary", "input_partial", "same"])
    axes = tuple(rnd.sample(list(mesh), rnd.randint(1, len(mesh)))) if verb != "same" else ()
    stmt = verb + (f" over ({', '.join(axes)})" if axes else "")
    sizes = {a: n for a, (_, n) in mesh.items()}
    ok = sim.consistent(sizes, roles_of(mesh), False, verb, axes, 4, 1, tokens=6)
    try:
        ob = verdict(text(mesh, stmt, experts=4, top_k=1), sizes)
    except DiagnosticError as e:  # changes nothing: no token is routed differently, at any size
        assert [d.code for d in e.diagnostics] == ["PL506"], e
        big = {a: 2 for a in mesh}
        assert sim.consistent(big, roles_of(mesh), False, verb, axes, 4, 1, tokens=6)
        return
    assert (ob.verdict == Verdict.PROVED) == ok, (mesh, stmt)


@pytest.mark.parametrize("stmt", ["same", "vary over (tp)", "input_partial over (dp, tp)"])
def test_statements_format_round_trip(stmt):
    src = text(TP, stmt)
    assert format_source(src, "x.place") == src
    messy = src.replace(f"router: {stmt}", "router :  " + stmt.replace("(", "( ").replace(")", " )"))
    assert format_source(messy, "x.place") == src


def test_pl506_is_a_located_error_with_exit_2(tmp_path):
    import io

    from placement_logic.cli import main

    path = tmp_path / "r.place"
    path.write_text(text(TP, "vary over (dp)"))
    out, err = io.StringIO(), io.StringIO()
    assert main(["check", str(path)], out=out, err=err) == 2
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if "override router" in ln)
    assert f"r.place:{line}:3: error: override router: vary over (dp) changes nothing" in err.getvalue() + out.getvalue()
    assert "[PL506]" in err.getvalue() + out.getvalue()
