"""The checker on the shipped corpus: every bug refuted with the right condition and a
counterexample that survives a pinned re-run; every safe plan proved for all sizes;
unknown never shown as a pass; input errors as diagnostics."""

from __future__ import annotations

import io
import re
import shlex

import pytest
import z3
from corpus import EXAMPLES, ROOT, example_files, example_id

from placement_logic.check.report import Verdict
from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec
from placement_logic.solver.session import Session

BUGS = example_files("bugs")
SAFE = example_files("safe") + example_files("library") + sorted(EXAMPLES.glob("*.place"))


def expected(path) -> list[str]:
    m = re.search(r"^# expect: (.+)$", path.read_text(), re.M)
    assert m, f"{path} has no '# expect:' line"
    return [x.strip() for x in m.group(1).split(",")]


def run_cli(args, monkeypatch):
    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    status = main(args, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_catalogue_is_large_enough():
    assert len(BUGS) >= 15


@pytest.mark.slow
@pytest.mark.parametrize("path", BUGS, ids=[example_id(p) for p in BUGS])
def test_bug_is_refuted_with_a_replayable_counterexample(path, monkeypatch):
    import json

    spec = load_spec(path)
    report = check_spec(spec, timeout=20)
    assert report.exit_status == 1
    wants = expected(path)
    # a GI refutation names the right axis (or the normalisation): every GI obligation the
    # bug refutes is about an aspect that an expected GI obligation names
    aspects = {w.split("] ", 1)[1] for w in wants if w.startswith("GI ") and "] " in w}
    for o in report.obligations:
        if o.condition == "gradient_integrity" and o.verdict is not Verdict.PROVED and "] " in o.name:
            assert o.name.split("] ", 1)[1] in aspects, (o.name, o.verdict)
    # the whole-plan obligation of every group a GI aspect is refuted for is refuted too, in each plan
    # refuting it (a spec may hold several paths of one objective, some of them correct)
    for w in wants:
        if w.startswith("GI ") and "] " in w:  # an aspect (a whole-value obligation has no "] ")
            whole = w.split("] ", 1)[0] + "]"
            plans = [pr for pr in report.plans if any(o.name == w and o.verdict is Verdict.REFUTED
                                                      for o in pr.obligations)]
            assert plans, w
            for pr in plans:
                assert [o.verdict for o in pr.obligations if o.name == whole] == [Verdict.REFUTED], whole
    for want in wants:
        hits = [o for o in report.obligations if o.name == want or o.condition == want]  # rules by code
        assert hits, f"no obligation named {want}"
        ob = hits[0]
        assert ob.verdict is Verdict.REFUTED, want
        cex = ob.counterexample
        assert cex is not None and cex.equation and cex.diagnosis
        # the condition class: GI/SC obligations name their condition, rules their code
        if want.startswith("GI"):
            assert ob.condition == "gradient_integrity"
        elif want.startswith("SC"):
            assert ob.condition == "state_consistency"
        else:
            assert ob.condition == want and ob.why and ob.fix
        # the printed command re-runs the check with the counterexample's sizes pinned
        argv = shlex.split(cex.command)
        assert argv[:2] == ["placement", "check"]
        status, out, err = run_cli(argv[1:] + ["--format", "json"], monkeypatch)
        assert status == 1, err
        data = json.loads(out)
        again = [o for p in data["plans"] for o in p["obligations"] if o["name"] == ob.name]
        assert again[0]["verdict"] == "refuted"
        assert again[0]["scope"].startswith("at ")


@pytest.mark.slow
@pytest.mark.parametrize("path", SAFE, ids=[example_id(p) for p in SAFE])
def test_safe_plan_is_proved_for_all_sizes(path):
    report = check_spec(load_spec(path), timeout=20)
    assert report.exit_status == 0
    for ob in report.obligations:
        assert ob.verdict is Verdict.PROVED, (ob.name, ob.reason)
        held = ", ".join(f"{a}={n}" for a, n in ob.fixed_sizes)  # sizes the statement is read at (test_check_scope)
        assert ob.scope == (f"all sizes with {held}" if held else "all mesh sizes"), ob.name


class GivingUp(Session):
    def raw_check(self, solver):
        return z3.unknown


def test_unknown_is_never_a_pass(monkeypatch):
    spec = load_spec(EXAMPLES / "safe" / "hybrid_shard.place")
    report = check_spec(spec, session=GivingUp(timeout=1))
    assert {o.verdict for o in report.obligations} == {Verdict.UNKNOWN}
    assert report.exit_status == 3
    from placement_logic.check.render import render

    text = render(report, "text")
    assert text.rstrip().endswith("UNKNOWN")
    assert "proved" not in text.replace("0 proved", "")
    assert "(not a pass)" in text
    md = render(report, "markdown")
    assert "**unknown**" in md and "**proved**" not in md


class ForAllTimesOut(Session):
    """The for-all query times out; every bounded search still runs and finds nothing."""

    def check(self, label, constraints, timeout=None):
        if label.endswith(":for all"):
            from placement_logic.solver.session import Outcome

            self.timings.append((label, 0.0, "unknown"))
            return Outcome("unknown", reason="timeout")
        return super().check(label, constraints, timeout)


def test_a_bounded_search_without_counterexample_is_not_a_proof():
    """The path where every bounded tier is unsat but the for-all query timed out: unknown, exit 3,
    saying how far the search looked, never proved."""
    spec = load_spec(EXAMPLES / "safe" / "data_parallel.place")
    report = check_spec(spec, plans=["ddp"], session=ForAllTimesOut(timeout=5))
    assert report.obligations and {o.verdict for o in report.obligations} == {Verdict.UNKNOWN}
    assert all("a bounded search, not a proof" in o.reason and "timed out" in o.reason for o in report.obligations)
    assert report.exit_status == 3


def test_a_witness_that_fails_replay_is_not_shown(monkeypatch):
    """A solver model that the concrete replay does not confirm gives unknown, not refuted."""
    from placement_logic.check import plan as planmod

    spec = load_spec(EXAMPLES / "bugs" / "dp_mean_of_means.place")
    original = planmod.obligations

    def no_replay(step, derived, ctx, *plan):
        obs = original(step, derived, ctx, *plan)
        for ob in obs:
            ob.replay = lambda w: None
        return obs

    monkeypatch.setattr(planmod, "obligations", no_replay)
    report = check_spec(spec, timeout=5)
    gi = [o for o in report.obligations if o.name == "GI grads[dense] normalisation"][0]
    assert gi.verdict is Verdict.UNKNOWN
    assert "did not survive concrete replay" in gi.reason
    assert report.exit_status == 3


def test_pinned_sizes_and_scope(monkeypatch):
    status, out, err = run_cli(["check", "examples/safe/hybrid_shard.place", "--set", "nodes=2", "--set", "gpus=3",
                                "--set", "microbatches=2"], monkeypatch)
    assert status == 0, err
    assert "(at nodes=2, gpus=3, microbatches=2)" in out
    assert out.rstrip().endswith("PROVED")


def test_partially_pinned_sizes(monkeypatch):
    status, out, err = run_cli(["check", "examples/bugs/dp_mean_of_means.place", "--set", "dp=1"], monkeypatch)
    # one device: its mean over all of its microbatches' tokens is the global mean
    assert status == 0, out + err
    assert "all sizes with dp=1" in out


@pytest.mark.parametrize("args,code", [
    (["--timeout", "0"], "PL500"),
    (["--timeout", "abc"], "PL500"),
    (["--set", "dp"], "PL301"),
    (["--set", "dp=0"], "PL301"),
    (["--set", "nosuch=2"], "PL301"),
    (["--plan", "nosuch"], "PL302"),
])
def test_input_errors(args, code, monkeypatch):
    status, out, err = run_cli(["check", "examples/bugs/dp_mean_of_means.place"] + args, monkeypatch)
    assert status == 2
    assert f"[{code}]" in err


def test_plan_selection(monkeypatch):
    status, out, err = run_cli(["check", "examples/safe/data_parallel.place", "--plan", "zero3", "--plan", "ddp"],
                               monkeypatch)
    assert status == 0
    assert re.findall(r"^plan (\w+)$", out, re.M) == ["zero3", "ddp"]


def test_let_symbol_pins_microbatches(monkeypatch, tmp_path):
    src = (EXAMPLES / "bugs" / "grad_accum_mean_of_means.place").read_text()
    src = src.replace("from std.data import zero2\n", "from std.data import zero2\n\nlet m = 8\n")
    src = src.replace("microbatches = 8", "microbatches = m")
    f = tmp_path / "m.place"
    f.write_text(src)
    status, out, err = run_cli(["check", str(f), "--set", "m=1", "--set", "dp=1"], monkeypatch)
    # one device, one microbatch: a mean of means is the global mean
    assert status == 0, out + err
    assert "at dp=1, microbatches=1" in out


def test_tie_reduce_over_a_data_axis_is_an_input_error(monkeypatch, tmp_path):
    src = (EXAMPLES / "bugs" / "tied_embedding_not_summed.place").read_text()
    f = tmp_path / "t.place"
    f.write_text(src.replace("tie_reduce over ()", "tie_reduce over (dp)"))
    status, out, err = run_cli(["check", str(f)], monkeypatch)
    assert status == 2
    assert "[PL502]" in err and "not a pipeline axis" in err


@pytest.mark.parametrize("override,code", [
    ("axis", "PL501"),
    ("query", "PL503"),
    ("unbound", "PL504"),
])
def test_override_errors_on_hand_built_plans(override, code):
    from irkit import ov, plan

    from placement_logic import ir
    from placement_logic.diagnostics import DiagnosticError

    o = {
        "axis": ov("grads", "reduce", None, ("nosuch",)),
        "query": ov("grads", "divide", None, by=ir.Query("memory", "p")),
        "unbound": ov("grads", "divide", None, by=ir.Sym("nosuch")),
    }[override]
    spec, _ = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(o,))
    with pytest.raises(DiagnosticError) as info:
        check_spec(spec, timeout=5)
    assert info.value.diagnostics[0].code == code


def test_sequence_parallel_without_a_tensor_axis(monkeypatch, tmp_path):
    f = tmp_path / "sp.place"
    f.write_text("from std.data import ddp\n\nmodel {\n  params = 1e9\n}\n\nmesh {\n  dp = 8\n}\n\n"
                 "plan p {\n  dp: ddp\n  sequence_parallel\n}\n")
    status, out, err = run_cli(["check", str(f)], monkeypatch)
    assert status == 1
    assert "refuted CR05 sequence-parallel-tp" in out
    assert "no axis has the tensor role" in out


@pytest.mark.parametrize("path", SAFE, ids=[example_id(p) for p in SAFE])
def test_schedule_reductions_match_the_roles(path):
    """The cost engine's collective schedule reduces each group exactly over the axes
    where its contributions are partial: data and context axes, expert axes for
    non-expert parameters, and the copy groups of kv heads copied over a tensor axis."""
    from placement_logic.check import steps
    from placement_logic.ir import groups as pg
    from placement_logic.ir import views

    for p in load_spec(path).plans:
        step = steps.derive(p)
        for g in step.groups:
            for d in g.dims:
                if d.name == steps.MICROBATCHES or d.tie:
                    continue
                role = views.role_of(p, pg.class_of(p.model, g.group), d.axis).value  # folding: the group's own
                partial = role in ("data", "context") or (role == "expert" and g.group != "experts")
                sp_split = (step.role(d.axis) in ("tensor", "sequence") and step.sequence_parallel
                            and (g.group in ("norms", "biases", "router") or role == "expert"))
                copies = d.part == steps.COPY_PART  # K kv heads copied over the axis: summed over each copy group
                assert d.k == (1 if partial or sp_split or copies else 0), (p.name, g.group, d.name)


@pytest.mark.parametrize("name", ["cp_tokens_dp_only", "expert_grads_wrong_divisor"])
def test_a_tiny_time_limit_never_proves_a_bug(name):
    """With a 1 ms limit per query the solver may give up; that must not become a proof."""
    path = EXAMPLES / "bugs" / f"{name}.place"
    report = check_spec(load_spec(path), timeout=0.001)
    for want in expected(path):
        ob = [o for o in report.obligations if o.name == want or o.condition == want][0]
        assert ob.verdict in (Verdict.REFUTED, Verdict.UNKNOWN)
        if ob.verdict is Verdict.UNKNOWN:
            assert ob.reason
    assert report.exit_status in (1, 3)


def test_help_lists_the_options(monkeypatch):
    status, out, err = run_cli(["check", "--help"], monkeypatch)
    assert status == 0
    for opt in ("--plan", "--format", "--timeout", "--set"):
        assert opt in out


def test_gi_obligations_per_group_and_axis():
    """One GI obligation per group per axis its contribution is split on or the plan reduces
    over, one over microbatches and one for the normalisation; in mesh order."""
    from irkit import plan

    axes = {"dp": ("data", "R,R,R,R"), "cp": ("context", "R,R,R,R"), "tp": ("tensor", "S,S,S,S"),
            "pp": ("pipeline", "S,S,S,S")}
    spec, p = plan("p", axes, sp=True, tied=True)
    report = check_spec(spec, timeout=10)
    names = [o.name for o in report.obligations if o.condition == "gradient_integrity" and o.name.startswith("GI grads[")]
    tail = ["over microbatches", "normalisation"]
    want = {
        "dense": ["over dp", "over cp"] + tail,  # sharded over tp and pp: nothing to reduce there
        "norms": ["over dp", "over cp", "over tp"] + tail,  # sequence parallel splits tp
        "biases": ["over dp", "over cp", "over tp"] + tail,
        "embedding": ["over dp", "over cp", "over pp"] + tail,  # tied: first and last stage
    }
    groups = [g for g in want if any(n.startswith(f"GI grads[{g}]") for n in names)]
    assert names == [n for g in groups for n in [f"GI grads[{g}]"] + [f"GI grads[{g}] {a}" for a in want[g]]]
    assert {"dense", "norms", "embedding"} <= set(groups)
    assert report.exit_status == 0


def test_each_axis_is_judged_in_isolation():
    """Norms reduced twice over dp and not over the sequence-parallel tp axis: each axis's
    obligation is refuted for its own reason, the rest proved."""
    from irkit import ov, plan

    o = ov("grads", "reduce", "norms", ("dp", "dp"))
    spec, p = plan("p", {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}, sp=True, overrides=(o,))
    report = check_spec(spec, timeout=10)
    gi = {x.name: x for x in report.obligations if x.name.startswith("GI grads[norms]")}
    dp, tp = gi["GI grads[norms] over dp"], gi["GI grads[norms] over tp"]
    assert dp.verdict is Verdict.REFUTED and tp.verdict is Verdict.REFUTED
    assert any("reduced 2 times over dp" in d for d in dp.counterexample.diagnosis)
    assert not any("tp" in d for d in dp.counterexample.diagnosis)
    assert any("missing all-reduce over tp" in d for d in tp.counterexample.diagnosis)
    assert not any("over dp" in d for d in tp.counterexample.diagnosis)
    for name in ("GI grads[norms] over microbatches", "GI grads[norms] normalisation"):
        assert gi[name].verdict is Verdict.PROVED
