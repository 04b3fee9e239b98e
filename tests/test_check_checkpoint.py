"""Checkpoint save, load and reshard: the checker's four `SC checkpoint` obligations against the
independent simulator (tests/checkpoint_sim.py) on generated plans and hand-derived cases, the
shipped bug and safe specs, diagnostics and the canonical form."""

from __future__ import annotations

import io
import shlex
from itertools import product

import checkpoint_sim
import pytest
from corpus import ROOT
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic.check.run import check_plan, check_spec
from placement_logic.cli import main
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_spec
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
KEYS = {"SC checkpoint save": ("ckpt_save",), "SC checkpoint load re-gather": ("ckpt_regather",),
        "SC checkpoint reshard": ("ckpt_reshard",), "SC checkpoint rng": ("ckpt_rng",)}


def checker_keys(report) -> dict[tuple, Verdict]:
    return {KEYS[o.name]: o.verdict for o in report.obligations if o.name in KEYS}


def simulated(p, sizes_each=(1, 2, 3)) -> set:
    found: set = set()
    names = p.mesh.names
    for sizes in product(sizes_each, repeat=len(names)):
        found |= checkpoint_sim.violations(p, {**dict(zip(names, sizes)), "microbatches": 1})
    return found


def agree(spec, p) -> None:
    report = check_plan(SESSION, spec, p, {})
    verdicts = checker_keys(report)
    assert set(verdicts) == set(KEYS.values())
    found = simulated(p)
    bad = [(k, v.word) for k, v in verdicts.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, p.placements, p.overrides)
    for k, v in verdicts.items():
        if v is Verdict.REFUTED:
            ob = next(o for o in report.obligations if KEYS.get(o.name) == k)
            assert ob.counterexample is not None and ob.counterexample.diagnosis
    return {k for k, v in verdicts.items() if v is Verdict.REFUTED}


# ----------------------------------------------------------------- hand-derived cases
# (axes, overrides, the violated keys, by hand)
DDP = {"dp": ("data", "R,R,R,R")}
ZERO1 = {"dp": ("data", "R,S,R,R")}
ZERO3 = {"dp": ("data", "S*,S,S,R")}
TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
EP = {"dp": ("data", "R,R,R,R"), "ep": ("expert", "S,S,S,R")}
HAND = [
    (DDP, (ov("checkpoint", "resume"),), set()),
    (ZERO3, (ov("checkpoint", "resume"),), set()),
    (DDP, (ov("checkpoint", "resume"), ov("checkpoint", "save_from", None, ("dp",))), {"ckpt_save"}),  # replicas
    (ZERO1, (ov("checkpoint", "resume"), ov("checkpoint", "save_rank0", None, ("dp",))), {"ckpt_save"}),  # shards
    (DDP, (ov("checkpoint", "resume"), ov("checkpoint", "skip_optimizer")), {"ckpt_save"}),
    (ZERO1, (ov("checkpoint", "resume"), ov("checkpoint", "no_regather_after_load")), {"ckpt_regather"}),
    (ZERO1, (ov("checkpoint", "reshard", None, ("dp",)),), set()),  # remapped by offset
    (ZERO1, (ov("checkpoint", "reshard", None, ("dp",)), ov("checkpoint", "load_by_rank", None, ("dp",))),
     {"ckpt_reshard"}),
    (TP, (ov("checkpoint", "resume"), ov("checkpoint", "save_from", "norms", ("tp",))), {"ckpt_save"}),
    (TP, (ov("checkpoint", "resume"), ov("checkpoint", "save_from", "dense", ("tp",))), "PL506"),  # derived
    (TP, (ov("checkpoint", "resume"), ov("checkpoint", "rng_shared")), "PL506"),  # seeds equal: nothing to restore
    (TP, (ov("checkpoint", "resume"), ov("dropout_seed", "vary", None, ("tp",)), ov("checkpoint", "rng_shared")),
     {"ckpt_rng"}),
    # no generator restored: every stream back at offset 0, wrong at every size (one rank too), seeds equal or not
    (DDP, (ov("checkpoint", "resume"), ov("checkpoint", "rng_not_restored")), {"ckpt_rng"}),
    (TP, (ov("checkpoint", "resume"), ov("dropout_seed", "vary", None, ("tp",)), ov("checkpoint", "rng_not_restored")),
     {"ckpt_rng"}),
    (ZERO1, (ov("checkpoint", "reshard", None, ("dp",)), ov("checkpoint", "rng_not_restored")), {"ckpt_rng"}),
    # streams read by the saved ranks' coordinates on a new size of an axis the seed varies over: the new
    # size n + 1 has a rank n no saved rank had; elsewhere (no reshard, seeds equal over it) each rank's own
    (TP, (ov("checkpoint", "reshard", None, ("tp",)), ov("dropout_seed", "vary", None, ("tp",)),
          ov("checkpoint", "rng_by_coordinates")), {"ckpt_rng"}),
    (DDP, (ov("checkpoint", "reshard", None, ("dp",)), ov("dropout_seed", "vary", None, ("dp",)),
           ov("checkpoint", "rng_by_coordinates")), {"ckpt_rng"}),
    (TP, (ov("checkpoint", "reshard", None, ("dp",)), ov("dropout_seed", "vary", None, ("tp",)),
          ov("checkpoint", "rng_by_coordinates")), "PL506"),  # tp keeps its size: every rank its own stream
    (TP, (ov("checkpoint", "reshard", None, ("tp",)), ov("checkpoint", "rng_by_coordinates")), "PL506"),  # one seed
    (TP, (ov("checkpoint", "resume"), ov("dropout_seed", "vary", None, ("tp",)), ov("checkpoint", "rng_by_coordinates")),
     "PL506"),  # the same mesh
    (TP, (ov("checkpoint", "reshard", None, ("tp",)), ov("checkpoint", "rng_by_coordinates", "dense")), "PL180"),
    (EP, (ov("checkpoint", "resume"), ov("checkpoint", "save_rank0", "experts", ("ep",))), {"ckpt_save"}),
    (EP, (ov("checkpoint", "resume"), ov("checkpoint", "save_rank0", "dense", ("ep",))), "PL506"),  # dense: replicas
    (EP, (ov("checkpoint", "reshard", None, ("ep",)), ov("checkpoint", "load_by_rank", "experts", ("ep",))),
     {"ckpt_reshard"}),
    (EP, (ov("checkpoint", "reshard", None, ("ep",)), ov("checkpoint", "load_by_rank", "dense", ("ep",))),
     "PL506"),  # dense is replicated over ep: read whole
    (DDP, (ov("checkpoint", "resume"), ov("checkpoint", "load_by_rank", None, ("dp",))), "PL506"),
    (DDP, (ov("checkpoint", "no_regather_after_load"),), "PL506"),
    (DDP, (ov("checkpoint", "reshard", "dense", ("dp",)),), "PL180"),
]


@pytest.mark.parametrize("axes,overrides,want", HAND)
def test_hand_cases(axes, overrides, want):
    spec, p = plan("p", axes, overrides=overrides, experts=4 if "ep" in axes else 1)
    if isinstance(want, str):
        with pytest.raises(DiagnosticError) as info:
            check_plan(SESSION, spec, p, {})
        assert info.value.diagnostics[0].code == want
        return
    found = {k[0] for k in simulated(p)}
    assert found == want  # the simulator against the hand-derived answer
    agree(spec, p)  # the checker against the simulator


def test_rng_not_restored_on_one_rank_by_hand():
    # one rank, 4 steps of 2 masks before the save: the uninterrupted run draws at offsets 8, 9;
    # a fresh process at its seed draws at 0, 1: different masks on a mesh of one device
    spec, p = plan("p", DDP, overrides=(ov("checkpoint", "resume"), ov("checkpoint", "rng_not_restored")))
    assert checkpoint_sim.violations(p, {"dp": 1, "microbatches": 1}) == {("ckpt_rng",)}
    report = check_plan(SESSION, spec, p, {})
    ob = next(o for o in report.obligations if o.name == "SC checkpoint rng")
    assert ob.verdict is Verdict.REFUTED and "offset 0" in ob.counterexample.equation
    _, p = plan("p", DDP, overrides=(ov("checkpoint", "resume"),))
    assert checkpoint_sim.violations(p, {"dp": 1, "microbatches": 1}) == set()


def test_rng_by_coordinates_tp1_to_tp2_by_hand():
    # Megatron-Bridge#5100's resume: saved on tp = 1 (one stream, under tp=0), loaded on tp = 2:
    # the new tp rank 1 finds no stream saved under tp=1
    spec, p = plan("p", TP, overrides=(ov("checkpoint", "reshard", None, ("tp",)),
                                       ov("dropout_seed", "vary", None, ("tp",)), ov("checkpoint", "rng_by_coordinates")))
    assert checkpoint_sim.violations(p, {"dp": 1, "tp": 1, "microbatches": 1}) == {("ckpt_rng",)}
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == "SC checkpoint rng")
    assert ob.verdict is Verdict.REFUTED and "no such stream" in ob.counterexample.equation


@pytest.mark.parametrize("second", ["rng_shared", "rng_not_restored", "rng_by_coordinates"])
def test_rng_restore_stated_twice_is_restated(second):
    from placement_logic.frontend.loader import load_string

    src = ("from std.data import ddp\nfrom std.tensor import megatron_sp\n\nmodel {\n  params = 1e9\n}\n\n"
           "mesh {\n  dp = 2\n  tp = 2\n}\n\nplan p {\n  dp: ddp\n  tp: megatron_sp\n"
           f"  override checkpoint: rng_not_restored\n  override checkpoint: {second}\n}}\n")
    with pytest.raises(DiagnosticError) as info:
        load_string(src, "x.place")
    d = info.value.diagnostics[0]
    assert d.code == Code.OVERRIDE_RESTATED and d.span.line == 17 and "line 16" in d.message


def test_simulator_reload_by_hand():
    # 2 shards read back on 3 ranks: remapped by offset every rank gets its elements; by rank
    # index rank 2 finds no file and ranks 0, 1 hold 3 elements where they need 2
    assert checkpoint_sim._reload(2, 3, by_rank=False)
    assert not checkpoint_sim._reload(2, 3, by_rank=True)
    assert checkpoint_sim._reload(2, 2, by_rank=True)


# ----------------------------------------------------------------- generated plans
ROLES = ("data", "tensor", "expert", "pipeline")
MODES = ("R", "S", "S*")


@hs.composite
def plans(draw):
    k = draw(hs.integers(1, 2))
    names = ["a", "b"][:k]
    axes = {}
    for n in names:
        role = draw(hs.sampled_from(ROLES))
        par = draw(hs.sampled_from(MODES))
        opt = draw(hs.sampled_from(("R", "S")))
        if role in ("tensor", "pipeline", "expert"):
            par, opt = "S", "S"
        grads = "S" if opt == "S" and role == "data" and draw(hs.booleans()) else ("S" if par != "R" else "R")
        axes[n] = (role, f"{par},{opt},{grads},R")
    axis_lists = hs.lists(hs.sampled_from(names), min_size=1, max_size=2, unique=True).map(tuple)
    group = hs.sampled_from([None, "dense", "norms", "all"])
    base = draw(hs.one_of(hs.just(ov("checkpoint", "resume")),
                          hs.builds(lambda a: ov("checkpoint", "reshard", None, a), axis_lists)))
    extra = hs.one_of(
        hs.builds(lambda g, a: ov("checkpoint", "save_from", g, a), group, axis_lists),
        hs.builds(lambda g, a: ov("checkpoint", "save_rank0", g, a), group, axis_lists),
        hs.builds(lambda g: ov("checkpoint", "skip_optimizer", g), group),
        hs.just(ov("checkpoint", "no_regather_after_load")),
        hs.builds(lambda g, a: ov("checkpoint", "load_by_rank", g, a), group, axis_lists),
        hs.just(ov("checkpoint", "rng_shared")),
        hs.just(ov("checkpoint", "rng_not_restored")),
        hs.just(ov("checkpoint", "rng_by_coordinates")),
        hs.builds(lambda a: ov("dropout_seed", "vary", None, a), axis_lists),
    )
    overrides = (base,) + tuple(draw(hs.lists(extra, max_size=2)))
    sp = "tensor" in [r for r, _ in axes.values()] and draw(hs.booleans())
    return plan("p", axes, sp=sp, overrides=overrides)


@settings(max_examples=examples(100), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(plans())
def test_checker_agrees_with_the_checkpoint_simulator(generated):
    spec, p = generated
    try:
        refuted = agree(spec, p)
        event(f"refuted: {', '.join(sorted(k[0] for k in refuted)) or 'none'}")
    except DiagnosticError:
        assume(False)  # a statement that changes nothing (PL506) or a malformed plan


# ----------------------------------------------------------------- the shipped specs
BUGS = {
    "ckpt_expert_shards_one_rank": "SC checkpoint save",
    "ckpt_tp_replicas_all_write": "SC checkpoint save",
    "ckpt_bf16_optimizer_skipped": "SC checkpoint save",
    "ckpt_zero1_no_regather_after_load": "SC checkpoint load re-gather",
    "ckpt_zero1_new_dp_by_rank": "SC checkpoint reshard",
    "ckpt_rng_from_tp0": "SC checkpoint rng",
    "ckpt_rng_not_restored": "SC checkpoint rng",
    "ckpt_rng_by_coordinates_new_tp": "SC checkpoint rng",
}
SAFE = ["ckpt_expert_shards", "ckpt_tp_replica_ids", "ckpt_dp_resume", "ckpt_zero1_new_dp", "ckpt_rng_per_rank",
        "ckpt_rng_restored", "ckpt_rng_fresh_on_new_tp"]


@pytest.mark.parametrize("name,want", sorted(BUGS.items()))
def test_bug_spec_refuted_for_its_root_cause(name, want, monkeypatch):
    path = ROOT / "examples" / "bugs" / f"{name}.place"
    report = check_spec(load_spec(path), timeout=20)
    refuted = [o for o in report.obligations if o.verdict is Verdict.REFUTED]
    assert [o.name for o in refuted] == [want]  # one defect, at its root cause
    cex = refuted[0].counterexample
    assert cex is not None and cex.equation and cex.diagnosis
    line = refuted[0].location.line
    assert "override checkpoint" in path.read_text().splitlines()[line - 1]  # found at the statement
    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    assert main(shlex.split(cex.command)[1:], out=out, err=err) == 1, err.getvalue()


@pytest.mark.parametrize("name", SAFE)
def test_safe_spec_proved(name):
    report = check_spec(load_spec(ROOT / "examples" / "safe" / f"{name}.place"), timeout=20)
    assert report.exit_status == 0
    assert {o.name for o in report.obligations} >= set(KEYS)
    assert all(o.verdict is Verdict.PROVED for o in report.obligations)


def test_no_checkpoint_statement_no_checkpoint_obligation():
    report = check_spec(load_spec(ROOT / "examples" / "safe" / "zero3.place"), timeout=20)
    assert not [o for o in report.obligations if o.name in KEYS]


@pytest.mark.parametrize("stmt", [
    "override checkpoint: resume", "override checkpoint: reshard over (dp)",
    "override checkpoint[dense]: save_from over (dp)", "override checkpoint[experts]: save_rank0 over (dp)",
    "override checkpoint[all]: skip_optimizer", "override checkpoint: no_regather_after_load",
    "override checkpoint[dense]: load_by_rank over (dp)", "override checkpoint: rng_shared",
    "override checkpoint: rng_not_restored", "override checkpoint: rng_by_coordinates",
])
def test_checkpoint_statements_format_round_trip(stmt):
    src = f"from std.data import ddp\n\nmodel {{\n  params = 1e9\n}}\n\nmesh {{\n  dp = 8\n}}\n\nplan p {{\n  dp: ddp\n  {stmt}\n}}\n"
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :  ").replace("(dp)", "( dp )"))
    assert format_source(messy, "x.place") == src


# ----------------------------------------------------------------- costs
@pytest.mark.parametrize("name,written", [
    # by hand: 2 B params and 12 B optimizer state per parameter; ZeRO-1 shards the optimizer over dp = 16
    ("safe/ckpt_zero1_new_dp", 7 * 10**9 * 2 + 7 * 10**9 * 12 // 16),
    ("safe/ckpt_dp_resume", 13 * 10**8 * (2 + 12)),  # DDP: rank 0 writes one whole copy
    ("bugs/ckpt_bf16_optimizer_skipped", 13 * 10**8 * 2),  # the optimizer state left out
])
def test_checkpoint_bytes_written_per_rank(name, written):
    from placement_logic.costreport.build import build

    report = build(load_spec(ROOT / "examples" / f"{name}.place"))
    notes = [n for p in report.plans for n in p.notes if n.startswith("checkpoint: bytes written per rank")]
    assert len(notes) == 1 and f"= {written:,} B" in notes[0], notes


def test_no_checkpoint_no_checkpoint_cost():
    from placement_logic.costreport.build import build

    report = build(load_spec(ROOT / "examples" / "safe" / "zero3.place"))
    assert not [n for p in report.plans for n in p.notes if n.startswith("checkpoint")]


KV_COPIED = """from std.data import ddp
from std.tensor import megatron_tp

model {
  transformer {
    hidden = 1024
    layers = 4
    heads = 8
    kv_heads = 2
    ffn = 4096
    vocab = 32000
  }
  seq = 1024
  microbatch = 1
}

mesh {
  dp = 2
  tp = 8
}

plan p {
  dp: ddp
  tp: megatron_tp
  override checkpoint: resume
  override checkpoint[kv]: VERB over (tp)
}
"""


@pytest.mark.parametrize("verb", ["save_rank0", "save_from"])
def test_copied_kv_heads_writers_are_unknown_never_proved(verb):
    """Each of 2 kv heads is copied on tp/2 ranks: one element per copy group, neither sharded nor
    replicated over tp. Who writes under a stated writer rule is outside the model: unknown."""
    from placement_logic.frontend.loader import load_string

    report = check_spec(load_string(KV_COPIED.replace("VERB", verb), "kv.place"), timeout=20)
    save = next(o for o in report.obligations if o.name == "SC checkpoint save")
    assert save.verdict is Verdict.UNKNOWN and "kv heads" in save.reason
