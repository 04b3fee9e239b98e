"""Modes written inside a ``group`` block act exactly as the same modes written at plan level.

Three checks: the checker against the concrete simulator (``tests/simulator.py`` reads each
group's declaration itself) on plans whose groups place themselves; a metamorphic check —
one group whose own modes are a plan-level placement gets that placement's verdict and, for
its buffers, that placement's costs, on an axis of every role and for every state; and the
ill-typed placements (PL136, PL137) refused at the group's line as at the plan's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sympy
from irkit import const, ov, plan
from test_check_simulator import checker_keys, simulated

from placement_logic import costs, ir
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.costs import comm
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.ir import collectives, views
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
P, O, G = ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS


def with_groups(built, *decls: ir.GroupDecl):
    spec, p = built
    model = replace(p.model, groups=decls)
    p = replace(p, model=model)
    return replace(spec, model=model, plans=(p,)), p


def decl(name: str, modes: dict, **kw) -> ir.GroupDecl:
    return ir.GroupDecl(name, modes=tuple((s, tuple((a, ir.Mode(m)) for a, m in ms.items())) for s, ms in modes.items()),
                        **kw)


def vision(modes: dict, like: str | None = None) -> ir.GroupDecl:
    return decl("vision", modes, count=const(10**6), like=like)


def keys_of(spec, p) -> dict:
    return checker_keys(check_plan(SESSION, spec, p, {}))


AGREE = {
    # (a) the experts' own gradients R on the expert axis: all-reduced there, different experts added
    "experts_grads_R_on_ep": with_groups(plan("p", {"d": ("data", "R,R,R,R"), "e": ("expert", "S,S,S,R")}, experts=4),
                                         decl("experts", {G: {"e": "R"}})),
    # (b) a dense group's own gradients sharded over the expert axis, its optimizer state replicated there
    "dense_group_grads_S_opt_R_on_ep": with_groups(
        plan("p", {"d": ("data", "R,R,R,R"), "e": ("expert", "S,S,S,R")}), vision({G: {"e": "S"}, O: {"e": "R"}})),
    # (c) a group's own params R beside ZeRO-3: re-gathered after the step by its own buffer's all-gather
    "group_params_R_beside_zero3": with_groups(plan("p", {"d": ("data", "S*,S,S,R")}), vision({P: {"d": "R"}})),
    "group_params_R_beside_zero3_no_regather": with_groups(
        plan("p", {"d": ("data", "S*,S,S,R")}, overrides=(ov("params", "no_regather"),)), vision({P: {"d": "R"}})),
    # a group's own ZeRO-3 beside DDP: gathered once by its own buffer's all-gather
    "group_zero3_beside_ddp": with_groups(plan("p", {"d": ("data", "R,R,R,R")}),
                                          vision({P: {"d": "S*"}, O: {"d": "S"}, G: {"d": "S"}})),
    "group_grads_S_opt_R_on_dp": with_groups(plan("p", {"d": ("data", "R,R,R,R")}), vision({G: {"d": "S"}})),
    "group_params_S_on_dp": with_groups(plan("p", {"d": ("data", "R,R,R,R")}), vision({P: {"d": "S"}})),
    "group_norms_like_on_tp": with_groups(plan("p", {"d": ("data", "R,S,S,R"), "t": ("tensor", "S,S,S,S")}),
                                          vision({P: {"t": "R"}, O: {"t": "R"}, G: {"t": "R"}}, like="norms")),
}


@pytest.mark.parametrize("name", sorted(AGREE))
def test_checker_agrees_with_the_simulator_on_group_modes(name):
    spec, p = AGREE[name]
    verdicts = keys_of(spec, p)
    found = simulated(p, dict(spec.bindings), seed=1)
    for key in found:
        assert key in verdicts, (key, "violated in the simulator, no such obligation in the checker")
    bad = [(k, v.word) for k, v in verdicts.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, found)


def test_the_three_group_mode_bugs_are_refuted_and_their_repairs_proved():
    refuted = {n: {k for k, v in keys_of(*AGREE[n]).items() if v is Verdict.REFUTED} for n in AGREE}
    assert ("gi", "experts") in refuted["experts_grads_R_on_ep"]
    assert ("optimizer", "e") in refuted["dense_group_grads_S_opt_R_on_ep"]
    assert refuted["group_params_R_beside_zero3"] == set()
    assert ("regather",) in refuted["group_params_R_beside_zero3_no_regather"]
    assert refuted["group_zero3_beside_ddp"] == set()


# --------------------------------------------------------------------------- metamorphic: group level == plan level

BASES = {  # role -> (strategy import, binding, the axis's base modes)
    "data": ("", "x: ddp"),
    "tensor": ("from std.tensor import megatron_tp", "x: megatron_tp"),
    "expert": ("from std.expert import expert_parallel", "x: expert_parallel"),
    "pipeline": ("from std.pipeline import gpipe", "x: gpipe"),
}
MODES = {P: ("R", "S", "S*", "O"), O: ("R", "S"), G: ("R", "S", "M")}


def _text(role: str, plan_line: str, group_modes: str) -> str:
    imp, binding = BASES[role]
    return (f"from std.data import ddp\n{imp}\nmodel {{\n  params = 1000000000\n  microbatches = 2\n"
            f"  group vision {{ count = 1000000  {group_modes} }}\n}}\n"
            f"mesh {{\n  d = 2\n  x = 2\n}}\nplan p {{\n  d: ddp\n  {binding}\n  {plan_line}\n}}\n")


def _outcome(text: str, plan_wide: bool = True):
    """(verdict or diagnostic code, the refuted obligations about vision or the placement, the spec's plan)."""
    try:
        spec = load_string(text, "m.place")
    except DiagnosticError as exc:
        return exc.diagnostics[0].code, None, None
    p = spec.plan("p")
    report = check_plan(SESSION, spec, p, {})
    names = {o.name for o in report.obligations if o.verdict is Verdict.REFUTED
             and ("[vision]" in o.name or plan_wide and (o.name.startswith("SC params")
                                                     or o.name.startswith("SC optimizer")))}
    return report.verdict, frozenset(names), (spec, p)


def _vision_bytes(spec, p) -> sympy.Expr:
    """The bytes vision's buffers move in the model states' collectives: each collective that
    carries vision, sized for vision alone."""
    pc = costs.derive(p)
    out = sympy.Integer(0)
    for c in collectives.derive(p):
        if c.state is not ir.State.ACTIVATIONS and views.carries(c.payload, "vision"):
            c = replace(c, payload=replace(c.payload, groups=("vision",), without=()))
            out += comm.size(c, pc.shape, pc.layout).bytes_per_device
    return sympy.simplify(out)


CASES = [(r, s, m) for r in BASES for s in MODES for m in MODES[s]]


@pytest.mark.parametrize("role,state,mode", CASES, ids=[f"{r}-{s.value}-{m}" for r, s, m in CASES])
def test_a_group_placing_itself_is_the_plan_placing_it(role, state, mode):
    kind = "experts = true  like = experts" if role == "expert" else "like = dense"
    plan_level = _text(role, f"{state.value}: {{x: {mode}}}", kind)
    group_level = _text(role, "", f"{kind}  {state.value} = {{x: {mode}}}")
    # on an expert axis a plan-level mode places the dense replicas too (the state obligations
    # are the plan's); the expert group's own obligations are compared there
    a, b = _outcome(plan_level, role != "expert"), _outcome(group_level, role != "expert")
    assert a[:2] == b[:2], (a[:2], b[:2])
    if a[2] is None:
        return
    sa, sb = a[2], b[2]
    assert pc_group(sa, "vision") == pc_group(sb, "vision")
    own = [c for c in collectives.derive(sb[1]) if c.payload.groups == ("vision",)]
    if views.differs(sb[1], views.pg.class_of(sb[1].model, "vision")):
        assert own, "a group placed differently from the plan moves its buffers in collectives of its own"
    assert _vision_bytes(*sa) == _vision_bytes(*sb)


def pc_group(sp, name: str) -> dict:
    """The group's memory per state (its own modes priced as the plan's would be)."""
    return {s: sympy.simplify(v) for s, v in costs.derive(sp[1]).memory.groups[name].items()}


def test_a_group_restating_the_plans_modes_changes_nothing():
    plain = load_string(_text("data", "", "like = dense"), "m.place").plan("p")
    restated = load_string(_text("data", "", "like = dense  placement = {d: R}"), "m.place").plan("p")
    assert collectives.derive(plain) == collectives.derive(restated)


def test_findings_of_a_groups_own_mode_point_at_the_group(tmp_path, capsys):
    f = tmp_path / "g.place"
    f.write_text(_text("expert", "", "like = dense  grads = {x: S}  optimizer = {x: R}"))
    assert main(["check", str(f)]) == 1
    out = capsys.readouterr().out
    assert f"{f}:6:3: refuted SC optimizer step over x" in out and "group vision" in out


def test_override_no_regather_is_read_for_a_group_that_needs_a_regather(tmp_path, capsys):
    text = _text("data", "params: {d: S*}\n  optimizer: {d: S}\n  grads: {d: S}\n  override params: no_regather",
                 "params = {d: R}")
    f = tmp_path / "g.place"
    f.write_text(text)
    assert main(["check", str(f)]) == 1  # refuted, not PL506: the group's params are re-gathered
    assert "SC params re-gather" in capsys.readouterr().out


@pytest.mark.parametrize("group,code", [("grads = {x: R}", "PL136"), ("params = {x: R}", None)])
def test_ill_typed_group_modes_on_a_tensor_axis(tmp_path, capsys, group, code):
    f = tmp_path / "g.place"
    f.write_text(_text("tensor", "", group))
    status = main(["cost", str(f)])
    err = capsys.readouterr().err
    if code is None:
        assert status == 0, err
    else:
        assert status == 2 and f"{f}:6:3: error: " in err and f"[{code}]" in err and "group 'vision'" in err


@pytest.mark.parametrize("mode", ["R", "S*"])
def test_params_replicated_over_pipeline_stages_are_refused(tmp_path, capsys, mode):
    for line, where in ((f"params: {{x: {mode}}}", "15:3"), ("", "6:3")):
        f = tmp_path / "g.place"
        f.write_text(_text("pipeline", line, f"params = {{x: {mode}}}" if not line else "like = dense"))
        assert main(["check", str(f)]) == 2
        err = capsys.readouterr().err
        assert f"{f}:{where}: error: params {mode} on pipeline axis 'x'" in err and "[PL137]" in err
