"""Loss terms besides the main loss (the model's ``losses`` section, ``override loss[TERM]: ...``):
the checker's per-term obligations against the independent simulator and hand-derived answers,
the bug specs' counterexamples re-run in the simulator, input errors, fmt and costs."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import product

import pytest
import simulator
import simulator_losses
from corpus import ROOT
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP = "R,R,R,R"
DP = {"dp": ("data", DDP)}
DP_CP = {"dp": ("data", DDP), "cp": ("context", DDP)}
DP_TP = {"dp": ("data", DDP), "tp": ("tensor", "S,S,S,S")}
DP_PP = {"dp": ("data", DDP), "pp": ("pipeline", "S,S,S,S")}
DP_EP = {"dp": ("data", DDP), "ep": ("expert", "S,S,S,R")}
m = ir.Sym("m")


def _prod(*names):
    out = ir.Sym(names[0])
    for n in names[1:]:
        out = ir.Op("*", (out, ir.Sym(n)))
    return out


# (axes, terms, overrides, sequence parallel, hand-derived: is every contribution weighted as the objective says)
CASES = [
    # MoE aux loss, one value per device and microbatch averaged over all of them
    (DP, {"aux": "per_microbatch_mean"}, (), False, True),
    (DP, {"aux": "per_microbatch_mean"}, (ov("loss", "divide", "aux", by=ir.Sym("dp")),), False, False),  # no 1/m
    (DP, {"aux": "per_microbatch_mean"}, (ov("loss", "divide", "aux", by=ir.Op("*", (ir.Sym("dp"), m))),), False,
     True),
    (DP, {"aux": "per_microbatch_mean"}, (ov("loss", "global_mean", "aux"),), False, False),  # divided by tokens
    (DP_EP, {"aux": "per_microbatch_mean"}, (), False, True),
    (DP_EP, {"aux": "per_microbatch_mean"}, (ov("loss", "divide", "aux", by=ir.Op("*", (ir.Sym("dp"), m))),), False,
     False),  # the expert ranks' values are not averaged
    (DP_PP, {"aux": "per_microbatch_mean"}, (), False, True),
    # context ranks compute parts of one value per microbatch: the mean is over dp and microbatches only
    (DP_CP, {"aux": "per_microbatch_mean"}, (), False, True),
    (DP_CP, {"aux": "per_microbatch_mean"},
     (ov("loss", "divide", "aux", by=ir.Op("*", (_prod("dp", "cp"), m))),), False, False),  # extra 1/cp
    (DP_TP, {"z": "per_microbatch_mean"}, (), True, True),
    # multi-token prediction, per token over the global batch
    (DP_CP, {"mtp": "global_mean"}, (), False, True),
    (DP_CP, {"mtp": "global_mean"}, (ov("tokens", "reduce", "mtp", ("dp",)),), False, False),  # cp count missed
    (DP_TP, {"mtp": "global_mean"}, (ov("tokens", "reduce", "mtp", ("dp", "tp")),), False, False),  # tp replicated
    (DP_TP, {"mtp": "global_mean"}, (ov("tokens", "reduce", "mtp", ("dp",)),), False, True),
    (DP, {"mtp": "global_mean"}, (ov("loss", "per_microbatch_mean", "mtp"),), False, False),  # local counts
    (DP, {"mtp": "global_mean"}, (ov("loss", "per_device_mean", "mtp"),), False, False),
    (DP, {"mtp": "sum"}, (), False, True),
    (DP, {"mtp": "sum"}, (ov("loss", "divide", "mtp", by=ir.Sym("dp")),), False, False),
    # two terms on one plan: each judged on its own
    (DP_EP, {"aux": "per_microbatch_mean", "mtp": "global_mean"}, (ov("loss", "divide", "aux", by=ir.Sym("dp")),),
     False, False),
]


def _plan(axes, terms, overrides, sp):
    spec, p = plan("p", axes, sp=sp, overrides=overrides, experts=4)
    model = replace(p.model, loss_terms=tuple((t, o, p.span) for t, o in terms.items()))
    p = replace(p, model=model)
    return replace(spec, model=model, plans=(p,)), p


def _simulated(p, bindings) -> set:
    rng = random.Random(7)
    found: set = set()
    names = p.mesh.names
    for sizes in product((1, 2, 3), repeat=len(names)):
        for mb in (1, 2):
            found |= simulator_losses.term_violations(p, {**dict(zip(names, sizes)), "microbatches": mb}, rng, bindings)
    return found


@pytest.mark.parametrize("axes,terms,overrides,sp,ok", CASES, ids=[str(i) for i in range(len(CASES))])
def test_term_verdicts_agree_with_the_simulator_and_by_hand(axes, terms, overrides, sp, ok):
    spec, p = _plan(axes, terms, overrides, sp)
    report = check_plan(SESSION, spec, p, {})
    verdicts = {o.name: o.verdict for o in report.obligations if o.name.startswith("GI loss[")}
    found = _simulated(p, dict(spec.bindings))
    for t in terms:
        for g in simulator_losses.TERM_GROUPS[t]:
            if g not in simulator.groups_of(p):
                continue
            checker = verdicts[f"GI loss[{t}] grads[{g}]"]
            assert checker is not Verdict.UNKNOWN
            assert (checker is Verdict.REFUTED) == (("term", t, g) in found), (t, g, checker, found)
    refuted = any(v is Verdict.REFUTED for v in verdicts.values())
    assert refuted is (not ok), verdicts
    # the main loss's obligations do not see the terms: the plan's own gradients stay proved
    assert all(o.verdict is Verdict.PROVED for o in report.obligations if o.name.startswith("GI grads["))
    for o in report.obligations:
        if o.verdict is Verdict.REFUTED:
            assert o.counterexample is not None and o.counterexample.diagnosis


TERM_SPECS = ["moe_aux_loss_accumulation", "mtp_loss_cp_scale", "mtp_loss_local_token_count"]


@pytest.mark.parametrize("name", TERM_SPECS)
def test_term_bug_counterexamples_are_violations_in_the_simulator(name):
    """The refuted plan's counterexample sizes show the violation in the simulator; the fixed spec
    shows none on small meshes."""
    from placement_logic.check.run import check_spec

    spec = load_spec(ROOT / "examples" / "bugs" / f"{name}.place")
    report = check_spec(spec, timeout=20)
    refuted = [o for o in report.obligations if o.name.startswith("GI loss[") and "] grads[" in o.name
               and o.verdict is Verdict.REFUTED]
    assert refuted
    bindings = dict(spec.bindings)
    p = spec.plans[0]
    for o in refuted:
        sizes = dict(o.counterexample.sizes)
        term, group = o.name[len("GI loss["):-1].split("] grads[")
        assert any(not simulator_losses.term_ok(p, term, group, sizes, random.Random(s), bindings) for s in range(20))
    safe = load_spec(ROOT / "examples" / "safe" / f"{name}.place")
    for p in safe.plans:
        names = p.mesh.names
        for sizes in product((1, 2), repeat=len(names)):
            for mb in (1, 2):
                assert not simulator_losses.term_violations(p, {**dict(zip(names, sizes)), "microbatches": mb},
                                                     random.Random(1), dict(safe.bindings))


SPEC = """from std.data import ddp
model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  vocab = 128  experts = 4  top_k = 2 }}
  microbatches = 2
  {losses}
}}
mesh {{ dp = 2 }}
plan p {{
  dp: ddp
  {line}
}}
"""


@pytest.mark.parametrize("losses,line,code,words", [
    ("", "override loss[aux]: per_microbatch_mean", "PL186", "does not declare"),
    ("losses { aux = per_microbatch_mean }", "override tokens[mtp]: reduce over (dp)", "PL186", "does not declare"),
    ("", "override aux_loss: sum", "PL186", "not a target of its own"),
    ("losses { aux = per_microbatch_mean }", "override loss: divide by dp", "PL122", "applies to a loss term"),
    ("losses { aux = per_microbatch_mean }", "override loss[aux]: divide", "PL122", "needs 'by"),
    ("losses { aux = per_microbatch_mean }", "override loss[aux]: equal", "PL122", "has no override 'equal'"),
    ("losses { aux = per_token }", "", "PL114", "normalisation of loss term 'aux'"),
    ("losses { router = sum }", "", "PL289", "clashes with a reserved word"),
    ("losses { aux = per_microbatch_mean }", "override tokens[aux]: reduce over (dp)", "PL506", "changes nothing"),
])
def test_term_input_errors_are_located_diagnostics(tmp_path, capsys, losses, line, code, words):
    f = tmp_path / "s.place"
    f.write_text(SPEC.format(losses=losses, line=line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err and "Traceback" not in err
    assert err.startswith(f"{f}:")


def test_a_term_that_reaches_no_group_is_an_error(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text("from std.data import ddp\nmodel {\n  params = 1e9\n  losses { z = sum }\n}\n"
                 "mesh { dp = 2 }\nplan p { dp: ddp }\n")
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:4:12: error:" in err and "[PL187]" in err and "reaches router" in err


def test_fmt_round_trips_the_losses_section_and_term_overrides():
    src = SPEC.format(losses="losses {  aux=per_microbatch_mean   mtp = global_mean }",
                      line="override loss[aux]:divide by dp*m\n  override tokens[mtp]: reduce over (dp)")
    src = src.replace("microbatches = 2", "microbatches = m").replace("from std.data import ddp",
                                                                       "from std.data import ddp\nlet m = 2")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    assert [(t, o) for t, o, _ in a.model.loss_terms] == [(t, o) for t, o, _ in b.model.loss_terms] == [
        ("aux", "per_microbatch_mean"), ("mtp", "global_mean")]
    strip = [(o.target, o.group, o.verb, o.axes, ir.show(o.by) if o.by else None) for o in a.plans[0].overrides]
    assert strip == [(o.target, o.group, o.verb, o.axes, ir.show(o.by) if o.by else None)
                     for o in b.plans[0].overrides]
    assert strip[0][:3] == ("loss", "aux", "divide")


def test_terms_move_no_bytes(tmp_path, capsys):
    """A loss term is a scale on gradients the plan reduces anyway: the costs are those of the plan
    without it."""
    with_terms = tmp_path / "a.place"
    without = tmp_path / "b.place"
    with_terms.write_text(SPEC.format(losses="losses { aux = per_microbatch_mean }",
                                      line="override loss[aux]: divide by dp * 2"))
    without.write_text(SPEC.format(losses="", line=""))
    outs = []
    for f in (with_terms, without):
        assert main(["cost", str(f)]) == 0
        outs.append(capsys.readouterr().out.replace(str(f), "F"))
    assert outs[0] == outs[1]


def test_fixed_paths_of_one_objective_are_both_proved():
    """The objective is stated once; the spec's two paths (with and without a pipeline) are both held
    to it: the fixed spec proves both, the bug spec refutes the accumulation path only."""
    from placement_logic.check.run import check_spec

    for kind, want in (("safe", {"accumulate_without_pipeline": True, "pipelined": True}),
                       ("bugs", {"accumulate_without_pipeline": False, "pipelined": True})):
        spec = load_spec(ROOT / "examples" / kind / "moe_aux_loss_accumulation.place")
        report = check_spec(spec, timeout=20)
        for pr in report.plans:
            terms = [r for r in pr.obligations if r.name.startswith("GI loss[")]
            assert terms and all((r.verdict is Verdict.PROVED) is want[pr.plan] for r in terms), pr.plan


def test_diagnostic_error_is_not_raised_for_declared_terms():
    spec = load_string(SPEC.format(losses="losses { aux = per_microbatch_mean }", line=""), "s.place")
    try:
        check_plan(SESSION, spec, spec.plans[0], {})
    except DiagnosticError as exc:  # pragma: no cover - the failure message
        pytest.fail(str(exc))
