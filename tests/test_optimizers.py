"""Optimizers whose update needs whole matrices: the language, the checker against the
concrete simulator (tests/sim_optimizer.py), and hand cases."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction
from itertools import product
from pathlib import Path

import pytest
import sim_optimizer
from irkit import ov, plan

from placement_logic.check.matrixwise import newton_schulz
from placement_logic.check.plan import PlanChecker
from placement_logic.check.run import check_plan, discharge
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.ir.groups import param_groups
from placement_logic.ir.optimizers import Choice
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)


def muon(steps: int = 2) -> Choice:
    return Choice("muon", (("ns_steps", steps),))


def verdict(spec, p, group: str, pinned=None) -> Verdict | None:
    checker = PlanChecker(spec, p, dict(pinned or {}))
    for ob in checker.obligations():
        if ob.name.startswith(f"SC optimizer[{group}] whole"):
            return discharge(SESSION, ob, checker.step, checker.bindings, dict(pinned or {}), 8).verdict
    return None


# ---------------------------------------------------------------- Newton–Schulz


def test_two_newton_schulz_implementations_agree_and_orthogonalise():
    rng = random.Random(3)
    for _ in range(5):
        rows, cols = rng.choice([(2, 2), (2, 3), (3, 2)])
        m = [[Fraction(rng.randint(-5, 5) or 1) for _ in range(cols)] for _ in range(rows)]
        a, b = newton_schulz(m, 5), sim_optimizer.orthogonalise(m, 5)
        assert a == b
        # Muon's quintic drives every singular value into roughly [0.7, 1.2]: X·Xᵀ near the identity
        x = a if rows <= cols else sim_optimizer.transpose(a)
        g = sim_optimizer.matmul(x, sim_optimizer.transpose(x))
        for i in range(len(g)):
            assert 0.4 < float(g[i][i]) < 1.5
            for j in range(len(g)):
                if i != j:
                    assert abs(float(g[i][j])) < 0.4


def test_a_piece_orthogonalised_is_not_the_piece_of_the_orthogonalised_matrix():
    m = [[Fraction(1), Fraction(2)], [Fraction(3), Fraction(4)]]
    whole = sim_optimizer.orthogonalise(m, 5)
    top = sim_optimizer.orthogonalise([m[0]], 5)
    assert top[0] != whole[0]
    # a 1×2 row orthogonalises towards its direction (1, 2)/√5; the whole matrix's row 0 does not
    assert abs(float(top[0][1] / top[0][0]) - 2) < 1e-9
    assert float(whole[0][0]) < 0


# ---------------------------------------------------------------- checker against the simulator

ROLES = ("data", "tensor", "pipeline", "expert", "context")
MODES = ("R", "S", "S*", "O")


def generated(seed: int):
    rng = random.Random(seed)
    names = ["a", "b"][:rng.randint(1, 2)]
    axes = {}
    for n in names:
        role = rng.choice(ROLES)
        pm, om, gm = rng.choice(MODES), rng.choice(MODES), rng.choice(("R", "S"))
        if role in ("tensor", "pipeline"):  # the weights are split there: params and grads S
            pm, gm = "S", "S"
        axes[n] = (role, f"{pm},{om},{gm},R")
    experts = rng.choice([1, 4])
    spec, p = plan("p", axes, experts=experts)
    have = [g.name for g in param_groups(p.model)]
    group = rng.choice([g for g in ("dense", "mlp", "experts", "router", "kv", "attention") if g in have])
    overrides = []
    for _ in range(rng.randint(0, 2)):
        verb = rng.choice(["gather", "round_robin"])
        named = rng.choice([None, "all", group, rng.choice(have)])
        overrides.append(ov("optimizer", verb, named, tuple(rng.sample(names, rng.randint(1, len(names))))))
    spec, p = plan("p", axes, experts=experts, overrides=tuple(overrides))
    p = replace(p, optimizers=((group, muon()),))
    spec = replace(spec, plans=(p,))
    return spec, p, group


@pytest.mark.parametrize("seed", range(60))
def test_checker_agrees_with_the_simulator(seed):
    spec, p, group = generated(seed)
    try:
        v = verdict(spec, p, group)
    except DiagnosticError:
        pytest.skip("an input the checker rejects with a diagnostic")
    names = p.mesh.names
    rng = random.Random(seed)
    found = any(sim_optimizer.violated(p, group, 2, dict(zip(names, sizes)), rng)
                for sizes in product((1, 2), repeat=len(names)))
    assert v in (Verdict.PROVED, Verdict.REFUTED), v
    assert (v is Verdict.REFUTED) == found, (p.placements, p.overrides, group, sim_optimizer.layout(p, group))


def test_the_generated_plans_reach_both_verdicts():
    seen = set()
    for seed in range(40):
        spec, p, group = generated(seed)
        try:
            seen.add(verdict(spec, p, group))
        except DiagnosticError:
            continue
    assert {Verdict.PROVED, Verdict.REFUTED} <= seen


# ---------------------------------------------------------------- hand cases

ZERO1_TP = {"dp": ("data", "R,S,R,R"), "tp": ("tensor", "S,S,S,S")}


@pytest.mark.parametrize("axes,overrides,ok", [
    ({"dp": ("data", "R,R,R,R")}, (), True),  # DDP: every rank holds and updates whole matrices
    ({"dp": ("data", "R,S,R,R")}, (), False),  # ZeRO-1's flat shard cuts each matrix
    ({"dp": ("data", "R,S,R,R")}, (ov("optimizer", "gather", "dense", ("dp",)),), True),
    ({"dp": ("data", "R,S,R,R")}, (ov("optimizer", "round_robin", "dense", ("dp",)),), True),
    ({"dp": ("data", "S*,S,S,R")}, (), False),  # FSDP
    (ZERO1_TP, (ov("optimizer", "gather", None, ("dp",)),), False),  # the tensor split still cuts
    (ZERO1_TP, (ov("optimizer", "gather", None, ("dp", "tp")),), True),
    ({"pp": ("pipeline", "S,S,S,S")}, (), True),  # stages hold whole layers
])
def test_hand_cases(axes, overrides, ok):
    spec, p = plan("p", axes, overrides=overrides)
    p = replace(p, optimizers=(("dense", muon(5)),))
    spec = replace(spec, plans=(p,))
    assert verdict(spec, p, "dense") is (Verdict.PROVED if ok else Verdict.REFUTED)


def test_experts_are_whole_on_the_expert_axis():
    spec, p = plan("p", {"ep": ("expert", "S,S,S,R")}, experts=4)
    p = replace(p, optimizers=(("experts", muon()),))
    assert verdict(replace(spec, plans=(p,)), p, "experts") is Verdict.PROVED


def test_dion_and_adamw_need_no_whole_matrix_and_shampoo_cut_is_unknown():
    spec, p = plan("p", {"dp": ("data", "R,S,R,R")})
    for c in (Choice("dion", (("rank", 64),)), Choice("adamw")):
        q = replace(p, optimizers=(("dense", c),))
        assert verdict(replace(spec, plans=(q,)), q, "dense") is None
    q = replace(p, optimizers=(("dense", Choice("shampoo", (("block", 1024),))),))
    assert verdict(replace(spec, plans=(q,)), q, "dense") is Verdict.UNKNOWN


def test_counterexample_shows_the_two_updates():
    spec, p = plan("p", {"dp": ("data", "R,S,R,R")})
    p = replace(p, optimizers=(("dense", muon(5)),))
    report = check_plan(SESSION, replace(spec, plans=(p,)), p, {})
    r = next(o for o in report.obligations if o.name == "SC optimizer[dense] whole matrices")
    assert r.verdict is Verdict.REFUTED
    cx = r.counterexample
    values = dict(cx.values)
    whole = sim_optimizer.orthogonalise([[Fraction(1), Fraction(2)], [Fraction(3), Fraction(4)]], 5)
    assert values["whole-matrix update (single device), row 0"] == ", ".join(f"{float(v):.4f}" for v in whole[0])
    assert dict(cx.sizes)["dp"] == 2


# ---------------------------------------------------------------- the language

SPEC = """from std.data import zero1
from std.tensor import megatron_tp

model {
  params = 7e9
}

mesh {
  dp = 4
  tp = 2
}

plan p {
  dp: zero1
  tp: megatron_tp
  optimizer {
    BODY
  }
  OVERRIDE
}
"""


def spec_with(body: str, override: str = ""):
    return SPEC.replace("BODY", body).replace("OVERRIDE", override)


def test_optimizer_section_resolves_and_round_trips():
    text = spec_with("dense = muon(ns_steps = 5)\n    all = adamw", "override optimizer[dense]: gather over (dp, tp)")
    assert format_source(text, "<t>") == text
    spec = load_string(text)
    p = spec.plans[0]
    assert dict(p.optimizers)["dense"] == Choice("muon", (("ns_steps", 5),))
    assert dict(p.optimizers)["all"].algorithm == "adamw"


@pytest.mark.parametrize("body,override,code,line", [
    ("dense = muonn", "", "PL240", 17),
    ("dense = 3", "", "PL240", 17),
    ("dense = muon(steps = 5)", "", "PL241", 17),
    ("dense = shampoo", "", "PL241", 17),
    ("dense = muon(ns_steps = 0)", "", "PL241", 17),
    ("attention = muon", "", "PL242", 17),
    ("norms = muon", "", "PL242", 17),  # no shape: the model is one dense group
    ("dense = muon\n    dense = dion(rank = 8)", "", "PL244", 18),
    ("dense = adamw", "override optimizer[dense]: gather over (dp)", "PL245", 19),
    ("dense = muon", "override optimizer[dense]: gather over (dp)\n  override optimizer: gather over (pp)", "PL109", 20),
    ("dense = muon", "override optimizer[mlp]: gather over (dp)", "PL242", 19),
])
def test_misuse_is_a_located_diagnostic(body, override, code, line):
    with pytest.raises(DiagnosticError) as e:
        load_string(spec_with(body, override))
    d = e.value.diagnostics[0]
    assert (d.code, d.span.line) == (code, line), d


def test_vectors_refuse_a_matrix_algorithm_and_an_idle_gather_is_an_error():
    shaped = SPEC.replace("params = 7e9", "transformer {\n    hidden = 64\n    layers = 2\n    heads = 4\n"
                          "    vocab = 100\n  }")
    with pytest.raises(DiagnosticError) as e:
        load_string(shaped.replace("BODY", "norms = muon").replace("OVERRIDE", ""))
    assert e.value.diagnostics[0].code == "PL243"
    with pytest.raises(DiagnosticError) as e:  # the router is whole on every tensor rank, replicated over dp
        load_string(shaped.replace("BODY", "mlp = muon").replace("dp: zero1", "dp: ddp").replace(
            "import zero1", "import ddp").replace("OVERRIDE", "override optimizer[mlp]: gather over (dp)"))
    assert e.value.diagnostics[0].code == "PL246"


def test_a_tensor_axis_cuts_split_weights_only():
    """Megatron TP places every state S on the tensor axis, but the router is held whole there:
    its update sees whole matrices; the experts' MLP matrices are split, so theirs do not."""
    spec, p = plan("p", {"tp": ("tensor", "S,S,S,S")}, experts=4)
    for group, ok in (("router", True), ("experts", False)):
        q = replace(p, optimizers=((group, muon()),))
        assert verdict(replace(spec, plans=(q,)), q, group) is (Verdict.PROVED if ok else Verdict.REFUTED)


KV_SPEC = """
from std.tensor import megatron_tp

LETS

model {
  transformer {
    hidden = 1024
    layers = 4
    heads = 16
    kv_heads = KV
    ffn = 4096
    vocab = 32000
  }
}

mesh {
  tp = 4
}

plan muon_kv {
  tp: megatron_tp
  optimizer {
    kv = muon(ns_steps = 5)
  }
}
"""


@pytest.mark.parametrize("lets,kv,expected", [
    ("", "1", Verdict.PROVED),  # one K/V head: copied whole on every tensor rank
    ("let kvh = 1", "kvh", Verdict.PROVED),  # the same head count through a let name
    ("let kvh = 4", "kvh", Verdict.REFUTED),  # four heads split over tp = 4: each rank orthogonalises one
    ("let hd = 16\nlet kvh = hd / 16", "kvh", Verdict.UNKNOWN),  # not a number here: never refuted
])
def test_a_kv_head_count_given_by_name(lets, kv, expected):
    spec = load_string(KV_SPEC.replace("LETS", lets).replace("KV", kv), "kv.place")
    p = spec.plan("muon_kv")
    assert verdict(spec, p, "kv") is expected


def test_an_idle_library_gather_points_at_the_plans_use_site():
    """std.optimizer.muon_zero1 in a plan with no matrix-wise algorithm: PL245 at the plan's line that
    binds the strategy, with a note at the library's override."""
    text = SPEC.replace("from std.data import zero1", "from std.optimizer import muon_zero1").replace(
        "dp: zero1", "dp: muon_zero1").replace("BODY", "").replace("OVERRIDE", "")
    text = text.replace("  optimizer {\n    \n  }\n", "")
    with pytest.raises(DiagnosticError) as e:
        load_string(text, "use.place")
    d = e.value.diagnostics[0]
    line = next(i for i, x in enumerate(text.splitlines(), 1) if "dp: muon_zero1" in x)
    assert (d.code, d.span.file, d.span.line) == ("PL245", "use.place", line), d
    assert any("<std.optimizer>:" in n and "muon_zero1" in n for n in d.notes), d.notes
    # a strategy of the same file keeps pointing at its own override
    own = text.replace("from std.optimizer import muon_zero1\n", "strategy mine over (d) {\n  role = data\n"
                       "  params: R\n  optimizer: S\n  grads: R\n  activations: R\n"
                       "  override optimizer: gather over (d)\n}\n").replace("dp: muon_zero1", "dp: mine")
    with pytest.raises(DiagnosticError) as e:
        load_string(own, "own.place")
    d = e.value.diagnostics[0]
    line = next(i for i, x in enumerate(own.splitlines(), 1) if "override optimizer: gather" in x)
    assert (d.code, d.span.file, d.span.line) == ("PL245", "own.place", line)
    assert not any("in strategy" in n for n in d.notes), d.notes


# ---------------------------------------------------------------- Megatron-LM's Muon options

MEGATRON = ("--tensor-model-parallel-size 2 --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
            "--ffn-hidden-size 1024 --swiglu --disable-bias-linear --normalization RMSNorm --padded-vocab-size 1024 "
            "--seq-length 512 --micro-batch-size 1 --global-batch-size 8 --bf16 --optimizer muon ")


@pytest.mark.parametrize("flags,verdicts", [
    # whole matrices on every tensor rank, whole layers owned per data rank: proved
    ("--muon-tp-mode duplicated --use-layer-wise-distributed-optimizer", {"tp": True, "dp": True}),
    # blockwise (the default): each tensor rank orthogonalises its own block
    ("", {"tp": False, "dp": True}),
    # the standard distributed optimizer's flat shards over dp (Megatron-LM forbids it with Muon)
    ("--muon-tp-mode distributed --use-distributed-optimizer", {"tp": True, "dp": False}),
])
def test_megatron_muon_options(flags, verdicts):
    from placement_logic.interop.megatron_spec import megatron_to_spec

    text = megatron_to_spec(MEGATRON + flags, "m.args", 8)
    assert "matrices = muon(ns_steps = 5)" in text
    spec = load_string(text)
    p = spec.plans[0]
    report = check_plan(SESSION, spec, p, {})
    for group in ("attention", "mlp"):
        r = next(o for o in report.obligations if o.name == f"SC optimizer[{group}] whole matrices")
        ok = all(verdicts.values())
        assert r.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (flags, r)
        if not ok:
            bad = next(a for a, v in verdicts.items() if not v)
            assert dict(r.counterexample.sizes)[bad] >= 2


def test_megatron_export_of_owners_round_trips_to_a_proved_plan(monkeypatch):
    """muon_round_robin exports as Megatron-LM's layer-wise optimizer (no flat distributed
    optimizer); importing those arguments gives a plan whose Muon update is proved."""
    import io

    from placement_logic.cli import main
    from placement_logic.interop.megatron_spec import megatron_to_spec

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    out, err = io.StringIO(), io.StringIO()
    assert main(["export", "megatron", "examples/library/muon_round_robin.place", "--plan", "muon_round_robin"],
                out=out, err=err) == 0
    args = out.getvalue()
    assert "--optimizer muon --muon-num-ns-steps 5" in args and "--use-layer-wise-distributed-optimizer" in args
    assert "--use-distributed-optimizer" not in args.split()
    spec = load_string(megatron_to_spec(args, "m.args", 8))
    report = check_plan(SESSION, spec, spec.plans[0], {})
    wm = [o for o in report.obligations if o.name.endswith("whole matrices")]
    assert wm and all(o.verdict is Verdict.PROVED for o in wm)


# ---------------------------------------------------------------- search --optimizer

@pytest.mark.slow
def test_search_across_optimizers(tmp_path):
    """`search --optimizer adamw,muon`: every structure is searched with each; a Muon row keeps
    8 bytes of state per matrix parameter where AdamW keeps 12, adds Newton–Schulz to the step,
    is re-derived exactly with the vectorised figures agreeing, and its plan is proved."""
    from fractions import Fraction as Fr

    from placement_logic import search
    from placement_logic.search import Space

    model = tmp_path / "m.place"
    model.write_text("model {\n  transformer {\n    hidden = 512\n    layers = 4\n    heads = 8\n    ffn = 1536\n"
                     "    vocab = 1024\n    norm = rmsnorm\n    gated_mlp\n    bias = false\n  }\n}\n")
    space = Space(devices=4, global_batch=8, seq=512, device="h100_sxm", tp=(1, 2), pp=(1,), ep=(1,),
                  strategies=("zero1",), recompute=("none",), microbatch=(1, 2), schedules=("1f1b",),
                  optimizers=("adamw", "muon"))
    result = search.run(str(model), space, top=50, check=True)
    by = {}
    for c in result.ranked:
        assert c.agrees is not False
        assert c.verdict == "proved", (c.label(), c.verdict)
        by[(c.structure.optimizer, c.structure.axes, tuple(sorted(c.sizes.items())))] = c
    pairs = [(a, by[("muon",) + k[1:]]) for k, a in by.items() if k[0] == "adamw" and ("muon",) + k[1:] in by]
    assert pairs
    h, L, f = 512, 4, 1536
    matrices = L * (2 * h * h + 2 * h * h + 3 * h * f)  # attention q, o; kv k, v; gate, up, down
    for adamw, muon in pairs:
        dp, tp = adamw.sizes["dp"], adamw.sizes["tp"]
        # 4 bytes less state per matrix parameter (ZeRO-1 over dp, TP over tp), less Newton–Schulz's working
        # copy of the largest matrix (the MLP's 1536 × 512 in 2-byte gradients, whole: gathered over tp)
        gathered = 2 * h * f
        assert adamw.exact_memory - muon.exact_memory == Fr(4 * matrices, dp * tp) - gathered
        assert muon.exact_step > adamw.exact_step


@pytest.mark.parametrize("drop", [None, "override optimizer[matrices]: gather over (dp)",
                                  "override optimizer[matrices]: round_robin over (tp)"])
def test_the_matrices_selector_agrees_with_the_simulator(drop):
    """`optimizer[matrices]` gathers every matrix group (docs/language.md): the shipped fixes are
    proved and whole in the simulator; without the statement the shards are cut in both."""
    f = Path(__file__).resolve().parents[1] / "examples" / "safe" / "muon_distributed.place"
    text = f.read_text()
    if drop:
        assert drop in text
        text = text.replace(drop, "")
    spec = load_string(text, str(f), base_dir=f.parent)
    seen = set()
    for p in spec.plans:
        names = p.mesh.names
        for group in ("attention", "kv", "mlp"):
            v = verdict(spec, p, group)
            if v is None:
                continue  # a sharded-matrix algorithm (Dion): no whole-matrix obligation
            found = any(sim_optimizer.violated(p, group, 2, dict(zip(names, sizes)), random.Random(0))
                        for sizes in product((1, 2), repeat=len(names)))
            assert (v is Verdict.REFUTED) == found, (p.name, group, v)
            seen.add((p.name, v))
    if drop is None:
        assert {v for _, v in seen} == {Verdict.PROVED}
    else:
        assert any(v is Verdict.REFUTED for _, v in seen)
