"""A one-axis strategy bound to a product of axes, ``[ta, tb]: megatron_tp``, is one axis of size ta·tb.

Oracles: the same plan with one axis ``tp = ta·tb`` (its cost report, number for number, and
its verdicts), and ring bytes counted by hand from the definitions: an all-reduce of m bytes
over n devices sends 2·(n−1)/n·m per device, an all-gather or a reduce-scatter (n−1)/n·m, one
context ring step one K,V block."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from placement_logic import ir
from placement_logic.cli import main
from placement_logic.frontend.loader import load_string
from tests.jsonschema_lite import errors

SPEC = """from std.data import zero1, zero3
from std.tensor import megatron_tp, megatron_sp
from std.context import context_parallel
from std.expert import expert_parallel

model {{
  transformer {{ hidden = 256  layers = 4  heads = 8  ffn = 512  vocab = 1024{moe} }}
  seq = 512
  microbatch = 1
  microbatches = 2
}}

mesh {{
  dp = 2
{mesh}
}}

plan p {{
  dp: zero1
  {binding}: {strategy}
{extra}}}
"""

ONE = {"mesh": "  tp = 4", "binding": "tp", "moe": ""}
PRODUCT = {"mesh": "  ta = 2\n  tb = 2", "binding": "[ta, tb]", "moe": ""}
STRATEGIES = ["megatron_tp", "megatron_sp", "context_parallel", "zero1", "zero3", "expert_parallel"]
MOE = "  experts = 8  top_k = 2"
ROOT = Path(__file__).resolve().parent.parent


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _json(tmp_path, command, name, text, *extra):
    path = tmp_path / f"{name}.place"
    path.write_text(text)
    status, out, err = _run([command, str(path), "--format", "json", *extra])
    assert status == 0, err
    return json.loads(out)


def _numbers(report):
    """The cost report without what names the axes: formulas (symbols), the file, the mesh and its
    symbols; a group over ta and tb (named ta×tb) is renamed tp, and per-axis totals are taken apart (checked by
    the caller)."""
    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items() if "formula" not in k and "latex" not in k
                    and k not in ("file", "per_axis", "command")}
        if isinstance(x, list) and "ta" in x:  # a group's axes
            return ["tp" if a == "ta" else a for a in x if a != "tb"]
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return x.replace("ta×tb", "tp")
        return x
    plans = report["plans"]
    return walk([{k: v for k, v in p.items() if k != "strategies"} for p in plans]), \
        [walk(p["communication"]["per_axis"]) for p in plans]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_product_costs_what_one_axis_of_its_size_costs(tmp_path, strategy):
    moe = {"moe": MOE if strategy == "expert_parallel" else ""}
    one = _json(tmp_path, "cost", "one", SPEC.format(strategy=strategy, extra="", **{**ONE, **moe}), "--no-cache")
    two = _json(tmp_path, "cost", "two", SPEC.format(strategy=strategy, extra="", **{**PRODUCT, **moe}), "--no-cache")
    (a, axes_one), (b, axes_two) = _numbers(one), _numbers(two)
    assert a == b
    for got, want in zip(axes_two, axes_one):  # the group's traffic is on each of its axes
        assert got["ta"] == got["tb"] == want["tp"]
        assert {k: v for k, v in got.items() if k not in ("ta", "tb")} == \
            {k: v for k, v in want.items() if k != "tp"}


def _collectives(report, rule):
    return [c for c in report["plans"][0]["communication"]["collectives"] if c["rule"].startswith(rule)]


def test_product_tensor_all_reduce_is_one_ring_of_four(tmp_path):
    """Forward: 2 all-reduces per layer per microbatch of s·b·h·2 bytes = 512·1·256·2 = 262144,
    over 4 devices 2·3/4 of it each: 4 layers × 2 microbatches × 2 × 1.5 × 262144 = 6291456 bytes;
    two axes of 2 bound apart send 2·(2·1/2) = 2 times the buffer instead of 1.5 (8388608)."""
    two = _json(tmp_path, "cost", "two", SPEC.format(strategy="megatron_tp", extra="", **PRODUCT), "--no-cache")
    (fwd,) = [c for c in _collectives(two, "Megatron TP") if c["phase"] == "forward"]
    assert fwd["axes"] == ["ta", "tb"] and fwd["count"] == 16
    assert fwd["bytes_per_device"] == 16 * 262144 * 2 * 3 // 4 == 6291456
    apart = SPEC.format(strategy="megatron_tp", extra="  tb: megatron_tp\n", mesh=PRODUCT["mesh"], binding="ta", moe="")
    sep = _json(tmp_path, "cost", "apart", apart, "--no-cache")
    assert sum(c["bytes_per_device"] for c in _collectives(sep, "Megatron TP") if c["phase"] == "forward") \
        == 2 * 16 * 262144 * 2 * 1 // 2 == 8388608


def test_product_context_ring_has_its_size_less_one_steps(tmp_path):
    """Ring attention over 4 devices: 3 steps forward per layer per microbatch of one K,V block,
    2·(s/4)·b·h·2 bytes = 2·128·256·2 = 131072: 3 × 8 × 131072 = 3145728 (two rings of 2: 1 + 1 steps)."""
    two = _json(tmp_path, "cost", "two", SPEC.format(strategy="context_parallel", extra="", **PRODUCT), "--no-cache")
    (fwd,) = [c for c in _collectives(two, "context parallel") if c["phase"] == "forward"]
    assert fwd["axes"] == ["ta", "tb"] and fwd["bytes_per_device"] == 3 * 8 * 131072


@pytest.mark.parametrize("extra", ["", "  override grads: reduce over ()\n", "  override grads[norms]: reduce over (dp)\n",
                                   "  override grads[norms]: reduce over (dp, {})\n"],
                         ids=["as-derived", "grads-not-reduced", "norms-not-reduced-over-tensor",
                              "norms-reduced-over-tensor"])
def test_product_verdicts_are_the_one_axis_verdicts(tmp_path, extra):
    def verdicts(kind, axes):
        spec = SPEC.format(strategy="megatron_sp", extra=extra.format(axes), **kind)
        path = tmp_path / "s.place"
        path.write_text(spec)
        status, out, err = _run(["check", str(path), "--format", "json"])
        assert status in (0, 1), err
        report = json.loads(out)
        out = [status] + [(p["plan"], p["verdict"]) for p in report["plans"]]
        for o in (o for p in report["plans"] for o in p["obligations"]):
            # an obligation over one tensor axis is stated for each axis of the product: over ta, then tb
            row = (o["name"].replace(" over ta", " over tp").replace(" over tb", " over tp"), o["verdict"], o["scope"])
            if o["name"].endswith(" over tb"):
                assert out[-1] == row
            else:
                out.append(row)
        return out

    one, two = verdicts(ONE, "tp"), verdicts(PRODUCT, "ta, tb")
    assert one == two and one
    refuted = bool(extra) and "{}" not in extra
    assert one[:2] == ([1, ("p", "refuted")] if refuted else [0, ("p", "proved")])


def test_product_binding_in_the_ir():
    plan = load_string(SPEC.format(strategy="megatron_sp", extra="", **PRODUCT)).plan("p")
    (b,) = [b for b in plan.bindings if b.product]
    assert b.axes == ("ta", "tb") and b.strategy == "std.tensor.megatron_sp"
    assert plan.groups_with_role(ir.Role.TENSOR) == (("ta", "tb"),)
    assert plan.groups_with_role(ir.Role.DATA) == (("dp",),)
    for s in ir.STATES:
        assert plan.placement(s).mode("ta") is plan.placement(s).mode("tb") is ir.Mode.S


@pytest.mark.parametrize("binding,line,caret,message", [
    ("[ta, tb, dp]: hybrid_shard", "  [ta, tb, dp]: hybrid_shard", "  ^~~~~~~~~~~~~~~~~~~~~~~~~~",
     "strategy 'hybrid_shard' spans 2 axes (replicate, shard) but is bound to 3 [PL115]"),
    ("[ta, ta]: megatron_tp\n  [tb, dp]: zero1", "  [ta, ta]: megatron_tp", "  ^~~~~~~~~~~~~~~~~~~~~",
     "an axis appears twice in this binding [PL108]"),
    ("[ta, tb]: megatron_tp\n  dp: zero1\n  params: {ta: R}", "  [ta, tb]: megatron_tp", "  ^~~~~~~~~~~~~~~~~~~~~",
     "the axes of the product [ta, tb] are placed differently (params): a product of axes acts as one axis "
     "[PL132]"),
])
def test_product_that_cannot_be_one_group_is_a_diagnostic(tmp_path, binding, line, caret, message):
    text = ("from std.data import zero1, hybrid_shard\nfrom std.tensor import megatron_tp\n"
            "model { transformer { hidden = 64  layers = 2  heads = 4  vocab = 128 } }\n"
            "mesh { dp = 2  ta = 2  tb = 2 }\nplan p {\n  " + binding + "\n}\n")
    path = tmp_path / "bad.place"
    path.write_text(text)
    status, out, err = _run(["cost", str(path)])
    assert status == 2 and out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert lines[0] == f"{path}:6:3: error: {message}"
    assert lines[1] == f"   6 | {line}" and lines[2] == f"     | {caret}"


def test_product_exports_as_one_tensor_size(tmp_path):
    """Megatron-LM's --tensor-model-parallel-size and torchtitan's tensor_parallel_degree are the
    product's size, 4, with nothing stated as not expressible about the tensor axes; bound apart,
    the two axes are two tensor groups, which neither framework has."""
    path = tmp_path / "s.place"
    path.write_text(SPEC.format(strategy="megatron_sp", extra="", **PRODUCT))
    status, out, err = _run(["export", "megatron", str(path), "--plan", "p"])
    assert status == 0 and "--tensor-model-parallel-size 4 " in out and "tensor" not in err, err
    status, out, err = _run(["export", "torchtitan", str(path), "--plan", "p"])
    assert status == 1 and "tensor_parallel_degree = 4\n" in out and "tensor" not in err, err
    path.write_text(SPEC.format(strategy="megatron_sp", extra="  tb: megatron_sp\n", mesh=PRODUCT["mesh"], binding="ta",
                                moe=""))
    status, out, err = _run(["export", "megatron", str(path), "--plan", "p"])
    assert status == 1 and "2 tensor axes: Megatron-LM has one (bind them as one product, [ta, tb]: ...)" in err


@pytest.mark.parametrize("command,schema", [("inspect", "inspect"), ("cost", "cost"), ("check", "check")])
def test_product_reports_follow_their_schemas(tmp_path, command, schema):
    path = tmp_path / "s.place"
    path.write_text(SPEC.format(strategy="megatron_sp", extra="", **PRODUCT))
    status, out, err = _run([command, str(path), "--format", "json"])
    assert status == 0, err
    doc = json.loads(out)
    assert not errors(doc, json.loads((ROOT / "docs" / "schema" / f"{schema}.schema.json").read_text()))
    if command == "inspect":
        assert doc["plans"][0]["bindings"][1] == {"axes": ["ta", "tb"], "strategy": "std.tensor.megatron_sp",
                                                  "product": True}
