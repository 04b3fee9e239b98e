"""Gradient and grad-norm reductions over process groups that cut a data axis into blocks of consecutive ranks.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json) into four ranks and rewrite each
collective's group (the recorder's global ranks of its process group) by hand: blocks of two consecutive ranks
(one group per node), blocks of three (the last shorter), the whole axis, every other rank (strided) and groups of
unequal sizes. Only consecutive blocks have a statement (``reduce_blocks``); the others are named with their group,
never proved. The slow test runs examples/traced/ddp_blocks.py on 4 ranks and requires each verdict and the line.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
AT = {"file": "examples/traced/ddp_summed.py", "line": 31, "code": "clip"}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _four(groups: list[list[int]]) -> dict:
    """The stored trace on four data ranks (ranks 2 and 3 copies of 0 and 1), every collective of a rank over its
    group in ``groups``."""
    trace = json.loads(STORED.read_text())
    for r in (2, 3):
        part = copy.deepcopy(trace["ranks"][r - 2])
        part["rank"] = r
        trace["ranks"].append(part)
    trace["world"] = 4
    for part in trace["ranks"]:
        mine = next(g for g in groups if part["rank"] in g)
        for c in part["collectives"]:
            c["ranks"] = list(mine)
    return trace


def _plan(text: str) -> list[str]:
    return [x.split("  #")[0] for x in text.split("plan ")[1].splitlines()[1:-1]]


@pytest.mark.parametrize("groups,stated", [
    ([[0, 1], [2, 3]], "  override grads: reduce_blocks over (dp) by 2"),  # one group per node of two
    ([[0, 1, 2], [3]], "  override grads: reduce_blocks over (dp) by 3"),  # blocks of three, the last shorter
    ([[0, 1, 2, 3]], None),                                              # the whole axis
])
def test_reductions_over_consecutive_blocks_are_reduce_blocks(groups, stated):
    lifted = lift(_four(groups))
    lines = [x for x in lifted.text.splitlines() if "reduce_blocks" in x]
    assert [x.split("  #")[0] for x in lines] == ([stated] if stated else []), lifted.text
    assert not lifted.unliftable, lifted.unliftable
    # one data axis of four ranks: the world group (which fits any factoring) and blocks of one axis need no
    # second axis
    assert "  dp = 4  # data" in lifted.text and "dp2" not in lifted.text, lifted.text
    if stated:
        assert lines[0].endswith("examples/traced/ddp_summed.py:16")  # the comm hook's all_reduce
        # the gradient programs read the blocks as the axis: no `reduce over ()` beside the statement
        assert not [x for x in _plan(lifted.text) if "reduce over" in x], lifted.text


@pytest.mark.parametrize("groups,named", [
    ([[0, 2], [1, 3]], "[0, 2]"),     # every other rank: strided
    ([[0], [1, 2, 3]], "[1, 2, 3]"),  # groups of unequal sizes
])
def test_other_partitions_are_named_with_their_group(groups, named):
    lifted = lift(_four(groups))
    assert "reduce_blocks" not in lifted.text, lifted.text
    assert any(named in u.reason for u in lifted.unliftable), lifted.unliftable
    assert "unobserved " in lifted.text


def test_a_blocks_lift_is_refuted_at_the_backward_line(tmp_path):
    spec = tmp_path / "lifted.place"
    spec.write_text(lift(_four([[0, 1], [2, 3]])).text)
    status, out, err = run(["check", str(spec)])
    assert status == 1, out + err
    assert "refuted GI grads[dense] blocks" in out, out


def _norm(trace: dict) -> dict:
    """Every rank all-reduces a one-element squared norm after backward over its group, then clips its
    gradients."""
    for part in trace["ranks"]:
        step = part["steps"][-1]["step"]
        mine = part["collectives"][-1]["ranks"]
        part["collectives"].append({
            "seq": 900, "step": step, "phase": "after_backward", "kind": "all_reduce", "ranks": list(mine),
            "stack": [dict(AT, line=30, function="<module>", code="dist.all_reduce(sq)")], "dtype": "float32",
            "bytes": 4, "numel": 1, "op": "sum", "api": "c10d.allreduce_", "carried": [], "inputs_reduced": [],
            "value_in": 2.5})
        for st in part["steps"]:
            for p in (st.get("optimizer") or {}).get("params", []):
                if p.get("grad") is not None:
                    p["grad"]["dynamic_scales"].append("after_backward")
                    p["grad"]["dynamic_at"].append(dict(AT))
    return trace


def test_a_grad_norm_over_blocks_of_a_replicated_axis_is_its_reduction_over_the_axis(tmp_path):
    """Under DDP every rank of dp holds the same squared norm: a block's all-reduce counts it B times, the norm's
    reduction over dp as the lift states it (refuted as a count), the blocks noted; never proved."""
    lifted = lift(_norm(_four([[0, 1], [2, 3]])))
    assert "clip_norm: reduce_blocks" not in lifted.text, lifted.text
    assert "  override clip_norm: reduce over (dp)" in lifted.text, lifted.text
    assert any("grad norm all-reduced within blocks of 2" in n for n in lifted.notes), lifted.notes
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, err = run(["check", str(spec)])
    assert status == 1 and "refuted SC clip_norm" in out, out + err


# --------------------------------------------------------------------------- slow: the example

def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,argv,status,lifted,where,obligation", [
    ("ddp_blocks.py", [], 1, "override grads: reduce_blocks over (dp) by 2", "loss.backward()",
     "GI grads[dense] blocks"),
    ("ddp_blocks.py", ["--whole"], 0, None, None, None),
    ("ddp_blocks.py", ["--strided"], 3, None, None, None),
    ("fsdp_clip_blocks.py", [], 1, "override clip_norm: reduce_blocks over (dp) by 2", "dist.all_reduce(sq",
     "SC clip_norm"),
    ("fsdp_clip_blocks.py", ["--whole"], 0, None, None, None),
])
def test_reductions_over_a_group_per_node_are_lifted_and_refuted(script, argv, status, lifted, where, obligation,
                                                                 tmp_path, monkeypatch):
    """DDP handed a process group per node of two ranks, and an FSDP grad norm all-reduced over one: each
    `reduce_blocks` at its line, refuted there; over every rank proved; strided groups unknown naming the
    group."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "4", "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *argv])
    assert got == status, out + err
    text = spec.read_text()
    assert ("reduce_blocks" in text) == bool(lifted), text
    if lifted:
        assert f"  {lifted}" in text
        assert f"examples/traced/{script}:{_line(script, where)}: refuted {obligation}: " in out, out
    elif status == 0:
        assert "proved for all mesh sizes" in out
    else:
        assert "its group [0, 2] is no set of mesh axes" in err, err
