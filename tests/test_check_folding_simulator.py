"""MoE parallel folding (an expert group's own roles) against the concrete simulator: the
checker and tests/simulator.py, which reads each group's roles from its declaration, agree on
every obligation both decide, over plans that fold the expert axis over data and tensor axes."""

from __future__ import annotations

from itertools import product

import pytest
from test_check_simulator import checker_keys, simulated

from placement_logic import load_string
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
SPEC = """from std.data import ddp, zero1, zero2
from std.tensor import megatron_sp
model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = 4  top_k = 2  bias = false }}
  seq = 16
  group experts {{ role = {{{roles}}} }}
}}
mesh {{ d = 2  e = 2  t = 2 }}
plan p {{
  d: {d}
  e: {e}
  t: {t}
  {extra}
}}
"""
ROLES = ["e: expert", "e: expert, t: expert", "t: expert", "d: expert", "e: expert, t: data", "e: expert, t: tensor"]
DATA = ["ddp", "zero1", "zero2"]
CASES = [(r, d, e, t, "") for r, d, e, t in product(ROLES, DATA, DATA, ["megatron_sp", "zero1"])][::3]
# bugs: the experts' gradients summed over an axis that splits them, or not over their data axis
BUGS = [("e: expert", "ddp", "ddp", "megatron_sp", "override grads[experts]: reduce over (d, e)"),
        ("e: expert, t: expert", "zero1", "zero1", "megatron_sp", "override grads[experts]: reduce over ()"),
        ("t: expert", "ddp", "zero1", "zero1", "override grads[experts]: reduce over (d, e, t)")]
QUICK = CASES[:1] + BUGS[:1]  # the quick tier's: one layout and one bug


@pytest.mark.parametrize("roles, d, e, t, extra", QUICK + [pytest.param(*c, marks=pytest.mark.slow)
                                                          for c in CASES[1:] + BUGS[1:]])
def test_folding_agrees_with_the_simulator(roles, d, e, t, extra):
    text = SPEC.format(roles=roles, d=d, e=e, t=t, extra=extra)
    try:
        spec = load_string(text, "fold.place")
    except DiagnosticError:
        pytest.skip("a layout the language refuses")
    (p,) = spec.plans
    verdicts = checker_keys(check_plan(SESSION, spec, p, {}))
    found = simulated(p, dict(spec.bindings), 0)
    decided = {k: v for k, v in verdicts.items() if v is not Verdict.UNKNOWN}
    assert decided, verdicts
    disagree = [(k, v.word) for k, v in decided.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not disagree, (disagree, found)
    if extra:  # each bug is one: the simulator sees the experts' gradient wrong, and the checker says so
        assert ("gi", "experts") in found and decided[("gi", "experts")] is Verdict.REFUTED


ZERO3_EP = """from std.data import zero3
from std.expert import expert_parallel
model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = 4  top_k = 2  bias = false }}
  seq = 16
}}
mesh {{ d = 2  e = 2 }}
plan p {{
  d: zero3
  e: expert_parallel
  {extra}
}}
"""


@pytest.mark.parametrize("extra, ok", [
    # the non-expert params are ZeRO-3 shards over d and e alike (a replica on the expert axis is
    # placed as on the data axis): the derived schedule gathers them over d and then over e
    ("", True),
    ("override params: gather over (d, e)", True),  # stated: gathered over both, the whole weights
    # a system that gathers over d only: each e rank's forward uses its own shard of the dense weights
    ("override params: gather over (d)", False),
])
def test_zero3_replicas_on_an_expert_axis_are_gathered_there(extra, ok):
    spec = load_string(ZERO3_EP.format(extra=extra), "zero3_ep.place")
    (p,) = spec.plans
    verdicts = checker_keys(check_plan(SESSION, spec, p, {}))
    found = simulated(p, dict(spec.bindings), 0)
    assert (("gathered", "e") in found) is (not ok)
    assert (verdicts.get(("gathered", "e"), Verdict.PROVED) is Verdict.PROVED) is ok, verdicts
    disagree = [(k, v.word) for k, v in verdicts.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not disagree, (disagree, found)
