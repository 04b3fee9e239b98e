"""A plan is interpreted once: ``placement check`` and ``placement cost`` derive the collective
schedule, the buffers of parameter groups and the step model's passes once per plan
(``ir.views``), however many readers ask for them."""

from __future__ import annotations

import gc
import io
import pickle
import weakref
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from placement_logic import costs
from placement_logic.check import steps
from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec
from placement_logic.ir import Role, collectives, views

ROOT = Path(__file__).resolve().parent.parent


def _count(monkeypatch, module, name: str) -> Counter:
    """Count the calls of ``module.name`` by the name of the plan it is given."""
    calls: Counter = Counter()
    real = getattr(module, name)

    def counted(plan, *args):
        calls[plan.name] += 1
        return real(plan, *args)

    monkeypatch.setattr(module, name, counted)
    return calls


def _counters(monkeypatch) -> dict[str, Counter]:
    return {"schedule": _count(monkeypatch, collectives, "derive"),
            "buffers": _count(monkeypatch, views, "_buffers"),
            "step passes": _count(monkeypatch, steps, "_passes"),
            "step model": _count(monkeypatch, steps, "_stepmodel")}


def _variants(plan) -> int:
    """The distinct plans ``check`` reads: the plan, the plan without overrides (the correct
    derivation) and the plan keeping its loss overrides (the correct derivation under its loss)."""
    return len({plan.overrides, (), tuple(o for o in plan.overrides if o.target == "loss")})


@pytest.mark.parametrize("path", ["examples/llama70b_3d.place", "examples/zero_paper.place",
                                  "examples/bugs/cp_dkv_not_accumulated.place"])
def test_check_derives_each_plan_once(monkeypatch, path):
    spec = load_spec(ROOT / path)
    counters = _counters(monkeypatch)
    check_spec(spec)
    want = Counter({p.name: _variants(p) for p in spec.plans})
    for what, calls in counters.items():
        assert calls == want, what
    if path.endswith("llama70b_3d.place"):  # no overrides: one plan, one derivation of each
        assert set(want.values()) == {1}


@pytest.mark.parametrize("path", ["examples/llama70b_3d.place", "examples/zero_paper.place"])
def test_cost_derives_each_plan_once(monkeypatch, path):
    spec = load_spec(ROOT / path)
    costs._derive.cache_clear()
    counters = _counters(monkeypatch)
    out, err = io.StringIO(), io.StringIO()
    assert main(["cost", str(ROOT / path), "--no-cache"], out=out, err=err) == 0, err.getvalue()
    # every plan once, and a plan a question re-binds (a claim ``unless dp = 8``) once more
    rebound = Counter(q.plan for qn in spec.questions if qn.unless for q in _queries(qn))
    assert counters["schedule"] == Counter({p.name: 1 for p in spec.plans}) + rebound
    assert counters["buffers"] == counters["schedule"]
    assert not counters["step passes"]


def _queries(qn):
    from placement_logic import ir

    def walk(v):
        if isinstance(v, ir.Query):
            yield v
        for child in getattr(v, "args", ()) or ():
            yield from walk(child)
    yield from walk(qn.left)
    yield from walk(qn.right)


def test_a_view_belongs_to_one_plan_object_and_goes_with_it():
    plan = load_spec(ROOT / "examples/mixtral_folding.place").plan("folded")
    v = views.view(plan)
    assert views.view(plan) is v
    for a in plan.mesh.names:
        assert v.role(a) is plan.role(a)
    assert v.axes_with_role(Role.DATA) == tuple(a for a in plan.mesh.names if plan.role(a) is Role.DATA)
    experts = views.expert_group(plan)
    own = dict(experts.roles)
    assert own, "the example folds the experts"
    for a in plan.mesh.names:
        assert v.group_role(experts, a) is own.get(a, plan.role(a))
    other = replace(plan)  # an equal plan, another object: a view of its own
    assert views.view(other) is not v and other == plan
    assert views.view(other).once(collectives.derive) == v.once(collectives.derive)
    gone = weakref.ref(other)
    del other
    gc.collect()
    assert gone() is None  # the view goes with its plan
    back = pickle.loads(pickle.dumps(plan))
    assert back == plan and "_view" not in vars(back) and views.view(back).roles == v.roles
