"""Checkpoint keys on a new mesh: states laid out in blocks (a fused tensor's components over a tensor
axis, an interleaved pipeline's virtual stages) keyed block by block or by a flat offset
(`checkpoint[g]: fused over (tp) by C`, `checkpoint[g]: flat_offset over (AXES)`), against the
independent simulator (tests/simulator_ckptkeys.py) on hand cases and generated plans, the shipped
bug and safe specs, the diagnostics and the canonical form."""

from __future__ import annotations

import io
import shlex
from dataclasses import replace
from fractions import Fraction
from itertools import product

import checkpoint_sim
import pytest
import simulator_ckptkeys as keys
from corpus import ROOT
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from irkit import const, ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan, check_spec
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
RESHARD = "SC checkpoint reshard"


# ----------------------------------------------------------------- the simulator by hand
def test_simulator_shards_by_hand():
    # fused QKV (3 components), 2 tp ranks, 1 column each: rank 1 holds column 1 of Q, of K, of V
    assert keys.shard("fused", 3, 2, 1, 1) == [(0, 1), (1, 1), (2, 1)]
    # 4 layers, 2 stages, v = 2 (1 layer per virtual stage): stage 0 holds virtual stages 0 and 2,
    # layers 0 and 2; stage 1 layers 1 and 3
    assert keys.shard("virtual", 2, 2, 0, 1) == [(0,), (2,)]
    assert keys.shard("virtual", 2, 2, 1, 1) == [(1,), (3,)]


def test_simulator_reload_by_hand():
    # saved on tp = 1 the flat array is [Q | K | V]; on tp = 2 rank 0 needs [Q0 | K0 | V0] but
    # the flat offset gives it the first half of [Q | K | V]: all of Q and half of K
    assert not keys.reload_ok("fused", 3, 1, 2, flat=True)
    assert keys.reload_ok("fused", 3, 1, 2, flat=False)  # keyed by (component, column)
    assert keys.reload_ok("fused", 3, 2, 2, flat=True)  # the same size: the same keys both ways
    assert keys.reload_ok("contiguous", 1, 2, 3, flat=True)  # one block: the flat offset is the global one
    # 8 layers, 2 stages of v = 2: stage 0 holds 0, 1, 4, 5 and writes them at keys 0..3; on 4
    # stages (v = 2, 1 layer each) stage 0 holds layers 0 and 4 and reads keys 0, 1: layers 0, 1
    assert not keys.reload_ok("virtual", 2, 2, 4, flat=True)
    assert keys.reload_ok("virtual", 2, 2, 4, flat=False)


# ----------------------------------------------------------------- the checker against the simulator
TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
PP = {"dp": ("data", "R,S,R,R"), "pp": ("pipeline", "S,S,S,R")}


def interleaved(p: ir.Plan, v: int) -> ir.Plan:
    return replace(p, schedule=replace(p.schedule, kind=ir.ScheduleKind.INTERLEAVED, chunks=const(v)))


def build(axes, overrides, v: int = 1):
    spec, p = plan("p", axes, overrides=overrides)
    if v > 1:
        p = interleaved(p, v)
        spec = replace(spec, plans=(p,))
    return spec, p


def simulated(p, sizes_each=(1, 2, 3)) -> bool:
    names = p.mesh.names
    return any(keys.violated(p, {**dict(zip(names, s)), "microbatches": 1})
               or ("ckpt_reshard",) in checkpoint_sim.violations(p, {**dict(zip(names, s)), "microbatches": 1})
               for s in product(sizes_each, repeat=len(names)))


def reshard_verdict(spec, p) -> Verdict:
    report = check_plan(SESSION, spec, p, {})
    ob = next(o for o in report.obligations if o.name == RESHARD)
    if ob.verdict is Verdict.REFUTED:
        assert ob.counterexample is not None and ob.counterexample.diagnosis
    return ob.verdict


RS = ov("checkpoint", "reshard", None, ("tp",))
RP = ov("checkpoint", "reshard", None, ("pp",))
HAND = [  # (axes, overrides, v, refuted by hand)
    (TP, (RS, ov("checkpoint", "fused", "dense", ("tp",), const(3))), 1, False),  # remapped per component
    (TP, (RS, ov("checkpoint", "fused", "dense", ("tp",), const(3)), ov("checkpoint", "flat_offset", "dense", ("tp",))),
     1, True),  # Q, K, V mixed
    (TP, (RS, ov("checkpoint", "fused", None, ("tp",), const(2)), ov("checkpoint", "flat_offset", None, ("tp",))),
     1, True),  # gate and up mixed
    (PP, (RP,), 2, False),  # virtual stages keyed by global layer id
    (PP, (RP, ov("checkpoint", "flat_offset", None, ("pp",))), 2, True),  # keyed as if not interleaved
    (PP, (RP, ov("checkpoint", "flat_offset", "dense", ("pp",))), 3, True),
]


@pytest.mark.parametrize("axes,overrides,v,want", HAND)
def test_hand_cases(axes, overrides, v, want):
    spec, p = build(axes, overrides, v)
    assert simulated(p) == want  # the simulator against the hand-derived answer
    assert (reshard_verdict(spec, p) is Verdict.REFUTED) == want  # the checker against it
    if not want:
        assert reshard_verdict(spec, p) is Verdict.PROVED


MISUSE = [  # (axes, overrides, v, code)
    (TP, (ov("checkpoint", "resume"), ov("checkpoint", "fused", "dense", ("tp",), const(3))), 1, "PL506"),  # same size
    (TP, (RS, ov("checkpoint", "fused", "norms", ("tp",), const(3))), 1, "PL506"),  # norms are whole on every rank
    (TP, (RS, ov("checkpoint", "flat_offset", "dense", ("tp",))), 1, "PL506"),  # one block: flat = global offset
    (PP, (RP, ov("checkpoint", "flat_offset", None, ("pp",))), 1, "PL506"),  # 1F1B: contiguous stages
    (TP, (RS, ov("checkpoint", "fused", "dense", ("tp",), const(1))), 1, "PL287"),
    (TP, (RS, ov("checkpoint", "fused", "dense", ("tp",), ir.Const(Fraction(5, 2)))), 1, "PL287"),
    (TP, (RS, ov("checkpoint", "fused", "dense", ("tp",))), 1, "PL287"),  # no `by`
    (PP, (RP, ov("checkpoint", "fused", None, ("pp",), const(2))), 2, "PL288"),  # virtual stages: the schedule's
]


@pytest.mark.parametrize("axes,overrides,v,code", MISUSE)
def test_misuse_is_a_located_error(axes, overrides, v, code):
    spec, p = build(axes, overrides, v)
    with pytest.raises(DiagnosticError) as info:
        check_plan(SESSION, spec, p, {})
    assert info.value.diagnostics[0].code == code


@pytest.mark.parametrize("old,new,code", [("(tp) by 3", "(tp) by 1", "PL287"), ("(tp) by 3", "(dp) by 3", "PL288")])
def test_misuse_through_the_cli(tmp_path, old, new, code):
    path = tmp_path / "bad.place"
    src = (ROOT / "examples" / "safe" / "ckpt_fused_qkv_reshard.place").read_text()
    path.write_text(src.replace(f"fused over {old}", f"fused over {new}"))
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "fused" in t and "override" in t)
    out, err = io.StringIO(), io.StringIO()
    assert main(["check", str(path)], out=out, err=err) == 2
    assert "Traceback" not in err.getvalue()
    assert err.getvalue().splitlines()[0].startswith(f"{path}:{line}:3: error: override checkpoint[dense]: fused")
    assert err.getvalue().splitlines()[0].endswith(f"[{code}]")


@hs.composite
def plans(draw):
    tensor = draw(hs.booleans())
    axes = dict(TP) if tensor else dict(PP)
    axis = "tp" if tensor else "pp"
    v = 1 if tensor else draw(hs.sampled_from((1, 2, 3)))
    group = hs.sampled_from([None, "dense", "all"])
    stmts = [ov("checkpoint", "reshard", None, (axis,))]
    if tensor and draw(hs.booleans()):
        stmts.append(ov("checkpoint", "fused", draw(group), (axis,), const(draw(hs.sampled_from((2, 3))))))
    if draw(hs.booleans()):
        stmts.append(ov("checkpoint", "flat_offset", draw(group), (axis,)))
    if draw(hs.booleans()):
        stmts.append(ov("checkpoint", "load_by_rank", draw(group), (axis,)))
    return build(axes, tuple(stmts), v)


@pytest.mark.slow
@settings(max_examples=examples(30), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(plans())
def test_checker_agrees_with_the_keys_simulator(generated):
    spec, p = generated
    try:
        verdict = reshard_verdict(spec, p)
    except DiagnosticError:
        assume(False)  # a statement that changes nothing (PL506)
    assert (verdict is Verdict.REFUTED) == simulated(p), p.overrides
    assert verdict in (Verdict.REFUTED, Verdict.PROVED)


# ----------------------------------------------------------------- the shipped specs
BUGS = ["ckpt_vpp_layer_offset_flat", "ckpt_fused_qkv_flat_reshard", "ckpt_swiglu_fc1_flat_reshard",
        "ckpt_moe_local_expert_ids_new_ep", "ckpt_pp_stage_local_layer_ids"]
SAFE = ["ckpt_vpp_layer_offset", "ckpt_fused_qkv_reshard", "ckpt_swiglu_fc1_reshard",
        "ckpt_moe_global_expert_ids_new_ep", "ckpt_pp_global_layer_ids"]


@pytest.mark.parametrize("name", BUGS)
def test_bug_spec_refuted_for_its_root_cause(name, monkeypatch):
    path = ROOT / "examples" / "bugs" / f"{name}.place"
    report = check_spec(load_spec(path), timeout=20)
    refuted = [o for o in report.obligations if o.verdict is Verdict.REFUTED]
    assert [o.name for o in refuted] == [RESHARD]  # one defect, at its root cause
    cex = refuted[0].counterexample
    assert cex is not None and cex.equation and cex.diagnosis
    line = path.read_text().splitlines()[refuted[0].location.line - 1]
    assert "flat_offset" in line or "load_by_rank" in line  # found at the statement
    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    assert main(shlex.split(cex.command)[1:], out=out, err=err) == 1, err.getvalue()


@pytest.mark.parametrize("name", SAFE)
def test_safe_spec_proved(name):
    report = check_spec(load_spec(ROOT / "examples" / "safe" / f"{name}.place"), timeout=20)
    assert report.exit_status == 0
    assert RESHARD in {o.name for o in report.obligations}
    assert all(o.verdict is Verdict.PROVED for o in report.obligations)


def test_symbolic_virtual_stages_under_a_flat_offset_are_unknown():
    """v a symbol: whether the layers are interleaved is not known, so the flat offset's reshard is
    unknown with v named, never proved."""
    spec, p = build(PP, (RP, ov("checkpoint", "flat_offset", None, ("pp",))), 2)
    p = replace(p, schedule=replace(p.schedule, chunks=ir.Sym("v")))
    spec = replace(spec, plans=(p,))
    report = check_plan(SESSION, spec, p, {})
    ob = next(o for o in report.obligations if o.name == RESHARD)
    assert ob.verdict is Verdict.UNKNOWN and "missing fact: v" in ob.reason
    save = next(o for o in report.obligations if o.name == "SC checkpoint save")
    assert save.verdict is Verdict.PROVED  # who writes is decided whatever v is


@pytest.mark.parametrize("verb", ["fused over (tp) by 2", "flat_offset over (tp)"])
def test_copied_kv_heads_keys_are_unknown_never_proved(verb):
    """2 kv heads on tp = 4: each head copied on 2 ranks, neither sharded nor replicated over tp; how a
    copy is keyed under a block layout is outside the model: the reshard is unknown, never proved."""
    src = (ROOT / "examples" / "safe" / "ckpt_fused_qkv_reshard.place").read_text()
    src = src.replace("    heads = 32\n", "    heads = 32\n    kv_heads = 2\n").replace(
        "  override checkpoint[dense]: fused over (tp) by 3\n", f"  override checkpoint[kv]: {verb}\n")
    report = check_spec(load_string(src, "kv.place"), timeout=20)
    ob = next(o for o in report.obligations if o.name == RESHARD)
    assert ob.verdict is Verdict.UNKNOWN and "kv heads" in ob.reason and "keyed" in ob.reason


# ----------------------------------------------------------------- format round trip and costs
@pytest.mark.parametrize("stmt", [
    "override checkpoint[dense]: fused over (tp) by 3", "override checkpoint[dense]: flat_offset over (tp)",
    "override checkpoint: flat_offset over (tp)",
])
def test_statements_format_round_trip(stmt):
    src = ("from std.data import ddp\nfrom std.tensor import megatron_tp\n\nmodel {\n  params = 1e9\n}\n\n"
           f"mesh {{\n  dp = 8\n  tp = 4\n}}\n\nplan p {{\n  dp: ddp\n  tp: megatron_tp\n  {stmt}\n}}\n")
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :  ").replace("(tp)", "( tp )"))
    assert format_source(messy, "x.place") == src


@pytest.mark.slow
def test_the_layout_in_blocks_moves_no_other_bytes():
    """A remap block by block reads the same bytes as one by offset (each rank its own elements), in
    C runs per rank instead of one; the bytes written are those of the plan without the statement."""
    from placement_logic.costreport.build import build as cost

    def notes(spec):
        return [n for p in cost(spec).plans for n in p.notes if n.startswith("checkpoint")]

    path = ROOT / "examples" / "safe" / "ckpt_fused_qkv_reshard.place"
    fused = notes(load_spec(path))
    assert any("3 blocks" in n and "block by block" in n for n in fused), fused
    plain = notes(load_string(path.read_text().replace("  override checkpoint[dense]: fused over (tp) by 3\n", ""),
                              "plain.place"))
    written = [n for n in plain if n.startswith("checkpoint: bytes written")]
    assert len(written) == 1 and written[0] in fused
    assert not any("block by block" in n for n in plain)
