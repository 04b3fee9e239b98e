"""Golden files for `placement check` in every output format: stdout, stderr and exit
status. Set PLACEMENT_UPDATE_GOLDEN=1 to rewrite them."""

from __future__ import annotations

import io
import json

import pytest
from corpus import GOLDEN, ROOT
from golden import check_golden

from placement_logic.cli import main

CASES = [
    ("sp_layernorm_grads", ["examples/bugs/sp_layernorm_grads.place"], "text"),
    ("sp_layernorm_grads", ["examples/bugs/sp_layernorm_grads.place"], "markdown"),
    ("sp_layernorm_grads", ["examples/bugs/sp_layernorm_grads.place"], "json"),
    ("overflow_not_agreed", ["examples/bugs/overflow_not_agreed.place"], "text"),
    ("tied_embedding_not_summed", ["examples/bugs/tied_embedding_not_summed.place"], "text"),
    ("hybrid_shard", ["examples/safe/hybrid_shard.place"], "text"),
    ("hybrid_shard", ["examples/safe/hybrid_shard.place"], "json"),
    ("bad_timeout", ["examples/safe/hybrid_shard.place", "--timeout", "-1"], "json"),
]


def record(args, fmt, monkeypatch) -> str:
    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    status = main(["check", *args, "--format", fmt], out=out, err=err)
    return f"exit: {status}\n--- stdout\n{out.getvalue()}--- stderr\n{err.getvalue()}"


@pytest.mark.parametrize("name,args,fmt", CASES, ids=[f"{n}-{f}" for n, _, f in CASES])
def test_check_output_matches_golden(name, args, fmt, monkeypatch):
    ext = {"text": "txt", "markdown": "md", "json": "json"}[fmt]
    check_golden(GOLDEN / "check" / f"{name}.{ext}.golden", record(args, fmt, monkeypatch))


def test_json_schema(monkeypatch):
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    status = main(["check", "examples/bugs/zero1_no_regather.place", "--format", "json"], out=out, err=io.StringIO())
    assert status == 1
    data = json.loads(out.getvalue())
    assert data["schema_version"] == 2 and data["exit_status"] == status and data["tool"] == "placement-logic" and data["command"] == "check"
    assert set(data["summary"]) == {"proved", "refuted", "unknown"}
    for plan in data["plans"]:
        for ob in plan["obligations"]:
            assert {"name", "condition", "verdict", "location", "counterexample", "scope"} <= set(ob)
            assert ob["verdict"] in ("proved", "refuted", "unknown")
            assert ob["condition"] in ("gradient_integrity", "state_consistency") or ob["condition"].startswith("CR")
            if ob["verdict"] == "refuted":
                assert {"sizes", "equation", "diagnosis", "command"} <= set(ob["counterexample"])
    refuted = [o for p in data["plans"] for o in p["obligations"] if o["verdict"] == "refuted"]
    assert [o["name"] for o in refuted] == ["SC params re-gather"]
    assert data["verdict"] == "refuted"
