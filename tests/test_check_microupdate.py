"""An optimizer update after every micro-step (``optimizer[g]: step_every_microbatch``): the checker
against the concrete simulator (tests/simulator_state.py, ``microstep_update_violations``, which trains
one step of m micro-steps on every device with one update or one per micro-step, in floating point),
the replay's exact arithmetic, and the statement that changes nothing (PL506)."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction
from itertools import product

import pytest
import simulator_state
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check import microupdate
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.ir import optimizers as opt
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
ASPECT = "] update over microbatches"


def _with(axes, overrides=(), algorithm=None, microbatches=None):
    spec, p = plan("p", axes, overrides=tuple(overrides))
    if algorithm is not None:
        p = replace(p, optimizers=(("all", opt.Choice(algorithm)),))
    if microbatches is not None:
        p = replace(p, model=replace(p.model, microbatches=ir.Const(microbatches)))
    return replace(spec, plans=(p,)), p


def verdicts(report) -> dict[str, Verdict]:
    """Each group's aspect (``GI grads[g] update over microbatches``) and whole-plan GI by group."""
    out = {}
    for o in report.obligations:
        if o.name.endswith(ASPECT):
            out[("update", o.name[9:-len(ASPECT)])] = o.verdict
        elif o.name.startswith("GI grads[") and "] " not in o.name:
            out[("gi", o.name[9:-1])] = o.verdict
    return out


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["sgd", "adamw", "lion", "muon"])
@pytest.mark.parametrize("group", [None, "dense"])
def test_agrees_with_the_simulator_at_small_sizes(algorithm, group):
    """dp and tp of 1..3 ranks, m of 1..3 micro-steps: the aspect is refuted exactly where the simulator's
    per-micro-step training ends elsewhere than one update from the accumulated gradient (m >= 2, at
    every mesh size: the data are the same on every rank or not, it makes no difference)."""
    rng = random.Random(7)
    spec, p = _with({"dp": ("data", "R,S,R,R"), "tp": ("tensor", "S,S,S,R")},
                    (ov("optimizer", "step_every_microbatch", group),), algorithm)
    for dp, tp, m in product((1, 2, 3), (1, 3), (1, 2, 3)):
        sizes = {"dp": dp, "tp": tp, "microbatches": m}
        # a difference for some data: Lion's m signs can add up to the one sign for some draws
        found = set().union(*(simulator_state.microstep_update_violations(p, sizes, rng) for _ in range(12)))
        v = verdicts(check_plan(SESSION, spec, p, sizes))
        aspects = {k[1]: x for k, x in v.items() if k[0] == "update"}
        assert aspects, "the aspect is stated for every group the statement reaches"
        bad = [(g, x.word) for g, x in aspects.items() if (x is Verdict.REFUTED) != (("update", g) in found)]
        assert not bad, (bad, sizes)
        # the whole-plan gradient integrity of the same groups falls with the aspect
        assert all(v[("gi", g)] is x for g, x in aspects.items())


@pytest.mark.parametrize("group,expected", [
    (None, {"dense", "norms", "biases", "embedding"}),
    ("all", {"dense", "norms", "biases", "embedding"}),
    ("dense", {"dense"}),
])
def test_refutes_the_groups_it_reaches(group, expected):
    spec, p = _with({"dp": ("data", "R,R,R,R")}, (ov("optimizer", "step_every_microbatch", group),))  # DDP
    report = check_plan(SESSION, spec, p, {})
    v = verdicts(report)
    assert {k[1] for k, x in v.items() if x is Verdict.REFUTED} == expected
    assert {k[1] for k in v if k[0] == "update"} == expected  # stated for the reached groups only
    # the step's own aspects (its reductions, accumulation, divisor) stay proved
    assert all(o.verdict is Verdict.PROVED for o in report.obligations if "] " in o.name and ASPECT not in o.name)
    cex = next(o for o in report.obligations if o.name == "GI grads[dense]" + ASPECT[1:]).counterexample
    # AdamW (the default) on a constant per-token gradient 1, m = 2: one update of the mean 1 is -lr·1/1 = -1
    # (bias-corrected m̂ = 1, v̂ = 1); two updates of the shares 1/2 are -1 each (m̂ = 1/2, v̂ = 1/4): -2
    assert dict(cex.sizes)["microbatches"] == 2
    assert "after the step = -2 (2 updates)" in cex.equation and "gives -1" in cex.equation
    assert "step_every_microbatch" in cex.diagnosis[0]


def test_sgd_replay_by_hand():
    """Plain SGD, lr 1, θ₀ = 0, losses (θ - 1)²/2 and θ²/2 weighted 1/2: one update from the mean gradient
    ((0 - 1) + 0)/2 = -1/2 gives 1/2; per micro-step, θ₁ = 0 - (0 - 1)/2 = 1/2, θ₂ = 1/2 - (1/2)/2 = 1/4."""
    assert microupdate.sgd_run(2, False) == Fraction(1, 2)
    assert microupdate.sgd_run(2, True) == Fraction(1, 4)
    # m = 3: one update -(-1/3) = 1/3; per micro-step 1/3, then 1/3·(2/3) = 2/9, then 2/9·(2/3) = 4/27
    assert (microupdate.sgd_run(3, False), microupdate.sgd_run(3, True)) == (Fraction(1, 3), Fraction(4, 27))


@pytest.mark.parametrize("algorithm", ["adamw", "lion", "muon", "dion", "soap"])
def test_normalised_replay_by_hand(algorithm):
    """A constant positive gradient: every normalising update moves θ by -lr (Muon: by its image of [1]),
    whatever the gradient's size, so m updates of the shares 1/m move m times as far as one of the sum."""
    c = opt.Choice(algorithm, (("ns_steps", 5),) if algorithm == "muon" else ())
    for m in (2, 3):
        assert microupdate.normalised_run(c, m, False) == -1
        assert microupdate.normalised_run(c, m, True) == -m


def test_one_microbatch_changes_nothing():
    spec, p = _with({"dp": ("data", "R,R,R,R")}, (ov("optimizer", "step_every_microbatch"),), microbatches=1)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == "PL506" and "one microbatch per step" in d.message


def test_one_microbatch_by_binding_is_proved():
    """m symbolic and bound to 1 at the check: the one update after the only micro-step is the step's."""
    spec, p = _with({"dp": ("data", "R,R,R,R")}, (ov("optimizer", "step_every_microbatch"),))
    v = verdicts(check_plan(SESSION, spec, p, {"dp": 2, "microbatches": 1}))
    assert v and all(x is Verdict.PROVED for x in v.values())


def test_a_group_the_model_lacks_is_located(tmp_path, capsys):
    """``optimizer[attention]`` in a model given by ``params`` alone (its one group is ``dense``): PL242 at
    the statement, exit 2, and the canonical form of a good statement round-trips through ``fmt``."""
    from placement_logic.cli import main

    good = ("from std.data import ddp\n\nmodel {\n  params = 1e9\n  microbatches = 4\n}\n\nmesh {\n  dp = 8\n}\n\n"
            "plan p {\n  dp: ddp\n  override optimizer[dense]: step_every_microbatch\n}\n")
    f = tmp_path / "s.place"
    f.write_text(good.replace("optimizer[dense]", "optimizer[attention]"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:14:3: error: the model has no parameter group 'attention'" in err and "[PL242]" in err
    f.write_text(good)
    assert main(["fmt", "--check", str(f)]) == 0
    assert main(["check", str(f)]) == 1  # refuted: four micro-steps, four updates


def test_the_whole_matrix_gather_runs_after_every_micro_step(monkeypatch):
    """ZeRO-3 with Muon gathered over dp = 8 (examples/*/zero3_muon_every_microbatch.place): the MLP's gated
    matrices are 3·h·ffn·layers = 3·2048·8192·16 = 805,306,368 elements of 2-byte gradients, 1,610,612,736 B;
    an all-gather over 8 ranks moves 7/8 of it to each, 1,409,286,144 B, once per step where Muon runs once,
    four times (5,637,144,576 B) where it runs after each of the 4 micro-steps."""
    import io
    import json

    from corpus import ROOT

    from placement_logic.cli import main

    monkeypatch.chdir(ROOT)
    for kind, count in (("safe", 1), ("bugs", 4)):
        out = io.StringIO()
        assert main(["cost", "--format", "json", f"examples/{kind}/zero3_muon_every_microbatch.place"], out=out) == 0
        plan_ = json.loads(out.getvalue())["plans"][0]
        mlp = [c for c in plan_["communication"]["collectives"] if c["payload"] == "mlp gradient matrices"]
        assert [(c["count"], c["bytes_per_device"]) for c in mlp] == [(count, count * 1_409_286_144)]


@pytest.mark.parametrize("line,count", [("", 1), ("  override optimizer: step_every_microbatch\n", 4)])
def test_zero1_writes_back_after_every_update(tmp_path, line, count):
    """ZeRO-1 over dp = 8, 1e9 parameters of 2 bytes: the updated shards are all-gathered after each update,
    7/8 · 2e9 B = 1,750,000,000 B per device, once per step or after each of the 4 micro-steps when every group
    steps then."""
    import io
    import json

    from placement_logic.cli import main

    f = tmp_path / "z.place"
    f.write_text("from std.data import zero1\n\nmodel {\n  params = 1e9\n  microbatches = 4\n}\n\nmesh {\n  dp = 8\n}\n\n"
                 f"plan p {{\n  dp: zero1\n{line}}}\n")
    out = io.StringIO()
    assert main(["cost", "--format", "json", str(f)], out=out) == 0
    refresh = [c for c in json.loads(out.getvalue())["plans"][0]["communication"]["collectives"]
               if c["phase"] == "refresh"]
    assert [(c["count"], c["bytes_per_device"]) for c in refresh] == [(count, count * 1_750_000_000)]


def test_a_group_the_model_lacks_is_refused_on_a_plan_that_skips_resolve():
    """A plan built in IR (not through resolve) naming a gradient group that is no parameter group of the model
    (``optimizer[norms]`` where the model's only parameter group is dense): the statement reached no group and
    every GI obligation was proved, while the state simulator, reading it as the norms' update, finds the norms
    parameters elsewhere than one update from the accumulated gradient (dp = 2, m = 2). Now PL242, as resolve."""
    spec, p = _with({"dp": ("data", "R,R,R,R")}, (ov("optimizer", "step_every_microbatch", "norms"),))
    sizes = {"dp": 2, "microbatches": 2}
    assert any(("update", "norms") in simulator_state.microstep_update_violations(p, sizes, random.Random(s))
               for s in range(4))
    with pytest.raises(DiagnosticError) as err:
        check_plan(SESSION, spec, p, {})
    assert err.value.diagnostics[0].code == "PL242" and "no parameter group 'norms'" in str(err.value)
