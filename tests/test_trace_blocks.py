"""Gradient and grad-norm reductions over process groups over part of a data axis: blocks of consecutive ranks,
strided groups, a group of the first K ranks, and consecutive groups of unequal sizes.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json) into four ranks and rewrite each
collective's group (the recorder's global ranks of its process group) by hand: blocks of two consecutive ranks
(one group per node), blocks of three (the last shorter), every other rank (stride 2), stride 3, the first two or
three ranks (the others recording no call over it), the whole axis, groups of unequal sizes (1 and 3), and groups
no statement holds (a run leaving a rank out, one strided group alone, a group in the middle, a set leaving a rank
out), and rank sets that are neither runs nor strided but hold every rank once. The first kinds are
`reduce_blocks`, `reduce_strided`, `reduce_first`, `reduce_groups` and `reduce_sets`; the others are named with
their group, never proved. The slow test runs the scripts of
examples/traced on 4 ranks and requires each verdict and the line."""

from __future__ import annotations

import copy
import io
import json
import re
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


def _members(groups: list[list[int]]) -> dict:
    """The stored trace on four data ranks, every collective of a rank in a group over that group; a rank in no
    group takes no part in the step's collectives (a call over a group it is not a member of does nothing there,
    so nothing is recorded): its gradients never reduced, its set-up broadcast over every rank."""
    members = [r for g in groups for r in g]
    trace = _four(groups + [[r] for r in range(4) if r not in members])
    for part in trace["ranks"]:
        if part["rank"] in members:
            continue
        part["collectives"] = [dict(c, ranks=[0, 1, 2, 3]) for c in part["collectives"] if c["step"] < 0]
        for st in part["steps"]:
            for p in (st.get("optimizer") or {}).get("params", []):
                if p.get("grad") is not None:
                    p["grad"]["collectives"] = []
    return trace


@pytest.mark.parametrize("groups,stated", [
    ([[0, 1], [2, 3]], "  override grads: reduce_blocks over (dp) by 2"),  # one group per node of two
    ([[0, 1, 2], [3]], "  override grads: reduce_blocks over (dp) by 3"),  # blocks of three, the last shorter
    ([[0, 2], [1, 3]], "  override grads: reduce_strided over (dp) by 2"),  # every other rank: stride 2
    ([[0, 3], [1], [2]], "  override grads: reduce_strided over (dp) by 3"),  # stride 3: {0, 3}, {1}, {2}
    ([[0, 1]], "  override grads: reduce_first over (dp) by 2"),  # the first two ranks; 2 and 3 take no part
    ([[0, 1, 2]], "  override grads: reduce_first over (dp) by 3"),  # the first three; 3 takes no part
    ([[0, 1, 2, 3]], None),                                              # the whole axis
    ([[0], [1, 2, 3]], "  override grads: reduce_groups over (dp) by (1, 3)"),  # groups of unequal sizes
    ([[0, 1], [2], [3]], "  override grads: reduce_groups over (dp) by (2, 1, 1)"),  # two ranks alone
    ([[0, 1, 3], [2]], "  override grads: reduce_sets over (dp) ranks ([0, 1, 3], [2])"),  # rank sets
    ([[0, 3], [2, 1]], "  override grads: reduce_sets over (dp) ranks ([0, 3], [1, 2])"),  # neither runs nor strided
])
def test_reductions_over_part_of_the_axis_are_lifted_by_their_groups(groups, stated):
    lifted = lift(_members(groups))
    lines = [x for x in lifted.text.splitlines() if "override grads: reduce_" in x]
    assert [x.split("  #")[0] for x in lines] == ([stated] if stated else []), lifted.text
    assert not lifted.unliftable, lifted.unliftable
    # one data axis of four ranks: the world group (which fits any factoring) and groups of one axis need no
    # second axis
    assert "  dp = 4  # data" in lifted.text and "dp2" not in lifted.text, lifted.text
    if stated:
        assert lines[0].endswith("examples/traced/ddp_summed.py:16")  # the comm hook's all_reduce
        # the gradient programs read the groups as the axis: no `reduce over ()` beside the statement
        assert not [x for x in _plan(lifted.text) if "reduce over" in x], lifted.text


@pytest.mark.parametrize("groups,named", [
    ([[1, 2, 3]], "[1, 2, 3]"),       # a run that leaves rank 0 out (rank 0 taking no part)
    ([[0, 2]], "[0, 2]"),             # one strided group, ranks 1 and 3 taking no part
    ([[1, 2]], "[1, 2]"),             # two ranks in the middle of the axis, the others taking no part
    ([[0, 1, 3]], "[0, 1, 3]"),       # neither consecutive nor strided, rank 2 taking no part
])
def test_other_partitions_are_named_with_their_group(groups, named):
    lifted = lift(_members(groups))
    assert "override grads: reduce_" not in lifted.text, lifted.text
    assert any(named in u.reason for u in lifted.unliftable), lifted.unliftable
    assert "unobserved " in lifted.text


def test_a_rank_outside_the_first_k_with_another_scale_is_stated_with_both():
    """Ranks 2 and 3 take no part in the first two ranks' reduction and also halve their gradients (at a line the
    first two lack): never lifted as `reduce_first` alone, but as the reduction and the division on ranks (2, 3)
    both; their programs, read with the division stated, are then the observer's less that reduction."""
    trace = _members([[0, 1]])
    for part in trace["ranks"][2:]:
        for st in part["steps"]:
            for p in (st.get("optimizer") or {}).get("params", []):
                if p.get("grad") is not None:
                    p["grad"]["scales"].append({"factor": "1/2", "at": dict(AT, code="p.grad.div_(2)"), "micro": 0})
    lifted = lift(trace)
    stated = [x.split("  #")[0] for x in lifted.text.splitlines() if x.startswith("  override grads: ")]
    assert "  override grads: reduce_first over (dp) by 2" in stated, lifted.text
    assert "  override grads: divide_on_ranks over (dp) ranks (2, 3) by 2" in stated, lifted.text
    assert not lifted.unliftable, lifted.unliftable


@pytest.mark.parametrize("groups", [[[0, 2], [1, 3]], [[0, 1]], [[0], [1, 2, 3]], [[0, 1], [2], [3]],
                                    [[0, 3], [1, 2]]])
def test_strided_and_first_k_lifts_are_refuted_for_their_groups(groups, tmp_path):
    """Each group sums part of the axis: the replicas step with different gradients (GI blocks)."""
    spec = tmp_path / "lifted.place"
    spec.write_text(lift(_members(groups)).text)
    status, out, err = run(["check", str(spec)])
    assert status == 1, out + err
    assert "refuted GI grads[dense] blocks" in out, out


def test_a_blocks_lift_is_refuted_at_the_backward_line(tmp_path):
    spec = tmp_path / "lifted.place"
    spec.write_text(lift(_four([[0, 1], [2, 3]])).text)
    status, out, err = run(["check", str(spec)])
    assert status == 1, out + err
    assert "refuted GI grads[dense] blocks" in out, out


def _norm(trace: dict, members=range(4)) -> dict:
    """Every rank all-reduces a one-element squared norm after backward over its group (the ranks in
    ``members``; the others take no part), then clips its gradients."""
    for part in trace["ranks"]:
        step = part["steps"][-1]["step"]
        mine = part["collectives"][-1]["ranks"]
        if part["rank"] in members:
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


@pytest.mark.parametrize("groups,words", [
    ([[0, 1], [2, 3]], "within groups of 2 consecutive dp ranks"),
    ([[0, 2], [1, 3]], "within strided groups of dp ranks (r, r+2"),
    ([[0, 1]], "within a group of the first 2 dp ranks only"),
    ([[0], [1, 2, 3]], "within consecutive groups of 1, 3 dp ranks"),
])
def test_a_grad_norm_over_groups_of_a_replicated_axis_is_its_reduction_over_the_axis(groups, words, tmp_path):
    """Under DDP every rank of dp holds the same squared norm: a group's all-reduce counts it as many times as the
    group has ranks, the norm's reduction over dp as the lift states it (refuted as a count), the groups noted;
    never proved."""
    lifted = lift(_norm(_members(groups), {r for g in groups for r in g}))
    assert "clip_norm: reduce_" not in lifted.text, lifted.text
    assert "  override clip_norm: reduce over (dp)" in lifted.text, lifted.text
    assert any(f"grad norm all-reduced {words}" in n for n in lifted.notes), lifted.notes
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
@pytest.mark.parametrize("script,argv,lifted,where,obligation", [
    ("ddp_blocks.py", [], "override grads: reduce_blocks over (dp) by 2", "loss.backward()", "GI grads[dense] blocks"),
    ("ddp_blocks.py", ["--whole"], None, None, None),
    ("ddp_blocks.py", ["--strided"], "override grads: reduce_strided over (dp) by 2", "loss.backward()",
     "GI grads[dense] blocks"),
    ("ddp_strided.py", [], "override grads: reduce_strided over (dp) by 2", "loss.backward()",
     "GI grads[dense] blocks"),
    ("ddp_strided.py", ["--whole"], None, None, None),
    ("fsdp_clip_blocks.py", [], "override clip_norm: reduce_blocks over (dp) by 2", "dist.all_reduce(sq",
     "SC clip_norm"),
    ("fsdp_clip_blocks.py", ["--whole"], None, None, None),
    ("fsdp_clip_first.py", [], "override clip_norm: reduce_first over (dp) by 2", "dist.all_reduce(sq",
     "SC clip_norm"),
    ("fsdp_clip_first.py", ["--whole"], None, None, None),
    ("manual_grads_first.py", [], "override grads: reduce_first over (dp) by 2", "dist.all_reduce(p.grad",
     "GI grads[dense] blocks"),
    ("manual_grads_first.py", ["--whole"], None, None, None),
    ("manual_grads_unequal.py", [], "override grads: reduce_groups over (dp) by (1, 3)", "dist.all_reduce(p.grad",
     "GI grads[dense] blocks"),
    ("manual_grads_unequal.py", ["--whole"], None, None, None),
    # node a holds ranks 0 and 3, node b ranks 1 and 2: the sets read off the script's placement by hand
    ("manual_grads_sets.py", [], "override grads: reduce_sets over (dp) ranks ([0, 3], [1, 2])",
     "dist.all_reduce(p.grad", "GI grads[dense] blocks"),
    ("manual_grads_sets.py", ["--whole"], None, None, None),
])
def test_reductions_over_part_of_an_axis_are_lifted_and_refuted(script, argv, lifted, where, obligation,
                                                                 tmp_path, monkeypatch):
    """DDP handed a process group per node of two ranks or a strided group (one rank per node), an FSDP grad norm
    all-reduced over a group per node or over the first two ranks only, gradients all-reduced by hand over the
    first two ranks only, over per-node groups of unequal sizes or of ranks out of order (rank sets): each statement
    at its line, refuted there; over every rank proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "4", "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *argv])
    assert got == (1 if lifted else 0), out + err
    text = spec.read_text()
    assert bool(re.search(r"override \S+: reduce_(blocks|strided|first|groups|sets)", text)) == bool(lifted), text
    assert "unobserved" not in text, text
    if lifted:
        assert f"  {lifted}" in text
        assert f"examples/traced/{script}:{_line(script, where)}: refuted {obligation}: " in out, out
    else:
        assert "proved for all mesh sizes" in out
