"""Operations a traced step runs on some ranks of an axis only, and DDP buckets laid out in a rank-dependent order.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json, copied to 3 or 4 ranks) by hand, each
edit an independent statement of what one rank did (a clip coefficient or a division on its gradients alone, its
parameters registered in another order); the statement expected is the rank set the test edited, and the lifted
spec's check refutes `SC update` at it. The slow ones run the scripts of examples/traced/ on 2 to 4 ranks and
require each verdict and the script line it names. A departure no statement expresses (three sets of scales, two
sets at the same line, two rank-set divisors for one group) is named, never proved.
"""

from __future__ import annotations

import copy
import io
import json
from fractions import Fraction
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


def stored() -> dict:
    return json.loads(STORED.read_text())


def _params(trace: dict, rank: int) -> list[dict]:
    return [p for st in trace["ranks"][rank]["steps"] for p in (st.get("optimizer") or {}).get("params", [])]


def _clipped(trace: dict, rank: int, only=None) -> dict:
    """``rank`` scaled its gradients (those named in ``only``, else all) by a data-dependent coefficient."""
    for p in _params(trace, rank):
        if p.get("grad") is not None and (only is None or p["name"] in only):
            p["grad"]["dynamic_scales"].append("after_backward")
            p["grad"]["dynamic_at"].append(dict(AT))
    return trace


def _divided(trace: dict, rank: int, factor: str) -> dict:
    for p in _params(trace, rank):
        if p.get("grad") is not None:
            p["grad"]["scales"].append({"factor": factor, "at": dict(AT, code="p.grad.div_(2)"), "micro": 0})
    return trace


def _plan_lines(text: str) -> list[str]:
    return [x.split("  #")[0] for x in text.split("plan ")[1].splitlines()[1:-1]]


def test_a_clip_on_rank_0_alone_is_clip_rank0_only_at_its_line():
    base, lifted = lift(stored()), lift(_clipped(stored(), 0))
    added = [x for x in lifted.text.splitlines() if "clip_rank0_only" in x]
    assert [x.split("  #")[0] for x in added] == ["  override grads: clip_rank0_only over (dp)"], lifted.text
    assert added[0].endswith("examples/traced/ddp_summed.py:31")
    # nothing else of the plan changes (the unclipped rank's gradient program is the plan's)
    assert [x for x in _plan_lines(lifted.text) if "clip_rank0_only" not in x] == _plan_lines(base.text)


def test_a_clip_on_every_rank_is_no_departure():
    lifted = lift(_clipped(_clipped(stored(), 0), 1))
    assert "rank0_only" not in lifted.text and not lifted.unliftable


def test_a_clip_on_another_rank_than_rank_0_is_clip_on_ranks_at_its_line():
    base, lifted = lift(stored()), lift(_clipped(stored(), 1))
    assert "rank0_only" not in lifted.text and not lifted.unliftable, lifted.unliftable
    added = [x for x in lifted.text.splitlines() if "clip_on_ranks" in x]
    assert [x.split("  #")[0] for x in added] == ["  override grads: clip_on_ranks over (dp) ranks (1)"], lifted.text
    assert added[0].endswith("examples/traced/ddp_summed.py:31")
    assert [x for x in _plan_lines(lifted.text) if "clip_on_ranks" not in x] == _plan_lines(base.text)


def test_a_clip_on_some_parameters_of_a_group_is_named():
    trace = stored()
    first = _params(trace, 0)[-1]["name"]
    lifted = lift(_clipped(trace, 0, only={first}))
    stated = [x for x in lifted.text.splitlines() if "clip_rank0_only" in x]
    named = [u for u in lifted.unliftable if u.what.startswith("a per-rank clip of group ")]
    # the clipped parameter is either a group of its own (stated for it) or part of a group (named)
    assert bool(stated) != bool(named), (lifted.text, lifted.unliftable)
    if stated:
        assert stated[0].startswith("  override grads[")


@pytest.mark.parametrize("factor,by", [("1/2", "2"), ("2", "1 / 2")])
def test_a_division_on_rank_0_alone_is_divide_rank0_only(factor, by):
    base, lifted = lift(stored()), lift(_divided(stored(), 0, factor))
    added = [x for x in lifted.text.splitlines() if "divide_rank0_only" in x]
    assert [x.split("  #")[0] for x in added] == [f"  override grads: divide_rank0_only over (dp) by {by}"]
    # the divisor stated once: the gradient programs are read as the other ranks run them, and the ranks are one
    # plan (no disagreement named)
    assert [x for x in _plan_lines(lifted.text) if "divide_rank0_only" not in x] == _plan_lines(base.text)
    assert not [u for u in lifted.unliftable if u.what.startswith("the gradient program of")]


def test_the_trace_is_left_as_given():
    trace = _divided(stored(), 0, "1/2")
    before = copy.deepcopy(trace)
    lift(trace)
    assert trace == before


def _registered(trace: dict, swap: bool, rename: bool = False) -> dict:
    names = [[p["name"], p["shape"]] for p in trace["ranks"][0]["steps"][-1]["optimizer"]["params"]]
    for part in trace["ranks"]:
        mine = copy.deepcopy(names)
        if part["rank"] == 1 and swap:
            mine[1], mine[2] = mine[2], mine[1]
        if part["rank"] == 1 and rename:
            mine[0][0] = "other.weight"
        part["registration"] = [{"params": mine}]
    return trace


@pytest.mark.parametrize("swap,rename,stated,named", [
    (False, False, False, False),  # one order on every rank
    (True, False, True, False),    # the same parameters, another order on rank 1
    (False, True, False, True),    # another parameter on rank 1: not one plan's buckets
])
def test_a_rank_dependent_registration_order_is_bucket_order(swap, rename, stated, named):
    lifted = lift(_registered(stored(), swap, rename))
    lines = [x for x in lifted.text.splitlines() if "bucket_order" in x]
    assert bool(lines) == stated, lifted.text
    if stated:
        assert lines[0].startswith("  override grads: bucket_order over (dp)  # observed: rank 0 registers ")
        assert lines[0].endswith("examples/traced/ddp_summed.py:22")  # `model = DDP(tiny.build())`
    assert bool([u for u in lifted.unliftable if u.what.startswith("the parameters DDP holds")]) == named


def _norm_reduced(trace: dict, offset: float | None, clipped: bool = True, op: str = "sum") -> dict:
    """Every rank all-reduces a one-element squared norm after backward (``offset`` added to it first), then
    clips its gradients (or not)."""
    for part in trace["ranks"]:
        step = part["steps"][-1]["step"]
        rec = {"seq": 900, "step": step, "phase": "after_backward", "kind": "all_reduce", "ranks": [0, 1],
               "stack": [dict(AT, function="<module>", code="dist.all_reduce(sq)")], "dtype": "float32",
               "bytes": 4, "numel": 1, "op": op, "api": "c10d.allreduce_", "carried": [], "inputs_reduced": [],
               "value_in": 2.5}
        if offset is not None:
            rec["offset"] = {"value": offset, "at": dict(AT, line=30, code="sq = sq + eps")}
        part["collectives"].append(rec)
    if clipped:
        _clipped(_clipped(trace, 0), 1)
    return trace


@pytest.mark.parametrize("offset,clipped,op,stated", [
    (1e-6, True, "sum", True),     # each rank's squared norm plus an epsilon, then summed
    (None, True, "sum", False),    # the plain squared norm
    (1e-6, False, "sum", False),   # no clipping: a value the step does not use
    (1e-6, True, "max", False),    # a maximum is no norm sum (reported as a non-linear reduction)
])
def test_an_epsilon_before_the_norm_all_reduce_is_eps_before_reduce(offset, clipped, op, stated):
    lifted = lift(_norm_reduced(stored(), offset, clipped, op))
    lines = [x for x in lifted.text.splitlines() if "eps_before_reduce" in x]
    assert bool(lines) == stated, lifted.text
    if stated:
        assert lines[0].startswith("  override clip_norm: eps_before_reduce by 1e-06  # observed: ")
        assert lines[0].endswith("examples/traced/ddp_summed.py:30")


def test_a_malformed_registration_is_pl612(tmp_path):
    trace = stored()
    trace["ranks"][0]["registration"] = [{"params": 3}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and "registration" in err, err


# --------------------------------------------------------------------------- slow: the examples

def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


SCRIPTS = [
    # script, arguments, exit, the lifted line, the refuted obligation, the text of the script line it names
    ("ddp_rank0_only.py", [], 1, "override grads: clip_rank0_only over (dp)", "SC update[dense]",
     "clip_grad_norm_(model.parameters(), 1.0)  # the bug"),
    ("ddp_rank0_only.py", ["--divide"], 1, "override grads: divide_rank0_only over (dp) by 2", "SC update[dense]",
     "p.grad.div_(2)"),
    ("ddp_rank0_only.py", ["--every-rank"], 0, None, None, None),
    ("ddp_bucket_order.py", [], 1, "override grads: bucket_order over (dp)", "GI grads bucket layout",
     "model = DDP(model)"),
    ("ddp_bucket_order.py", ["--same-order"], 0, None, None, None),
    ("tp_column.py", ["--scaler"], 1, "override loss_scale: local over (tp)", "SC loss_scale",
     "scaler.step(opt)  #"),
    ("tp_column.py", ["--scaler", "--reduce-flag"], 0, "override overflow: reduce over (tp)", None, None),
    ("pipeline.py", ["--eps"], 1, "override clip_norm: eps_before_reduce by 1e-06", "SC clip_norm",
     "for p in stage.parameters()]).sum() + EPS"),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,argv,status,lifted,obligation,where", SCRIPTS,
                         ids=[" ".join([s[0], *s[1]]) for s in SCRIPTS])
def test_per_rank_operations_are_lifted_and_judged(script, argv, status, lifted, obligation, where, tmp_path,
                                                   monkeypatch):
    """A clip or a division on rank 0 alone, parameters registered in a rank-dependent order under DDP, a loss
    scale updated from each rank's own found-inf flag: each lifted as its statement and refuted at its script line
    with that cause; the fixed variants proved with no such statement."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    overrides = " ".join(x.split("  #")[0] for x in text.splitlines() if x.startswith("  override "))
    for verb in ("rank0_only", "bucket_order", "loss_scale", "eps_before_reduce"):
        assert (verb in overrides) == bool(lifted and verb in lifted), text
    if lifted:
        assert f"  {lifted}" in text
    if status == 0:
        assert "proved for all mesh sizes" in out
    else:
        assert f"examples/traced/{script}:{_line(script, where)}: refuted {obligation}: " in out, out


def _three(trace: dict) -> dict:
    """The stored trace on three data ranks: rank 2 a copy of rank 1, every collective over the three."""
    third = copy.deepcopy(trace["ranks"][1])
    third["rank"] = 2
    trace["ranks"].append(third)
    trace["world"] = 3
    for part in trace["ranks"]:
        for c in part["collectives"]:
            if sorted(c["ranks"]) == [0, 1]:
                c["ranks"] = [0, 1, 2]
    return trace


@pytest.mark.parametrize("clipped,stated", [
    ((0,), "clip_rank0_only over (dp)"),          # rank 0 alone
    ((0, 1), "clip_on_ranks over (dp) ranks (0, 1)"),  # rank 0 and rank 1, not rank 2
    ((1,), "clip_on_ranks over (dp) ranks (1)"),  # rank 1 alone
    ((2,), "clip_on_ranks over (dp) ranks (2)"),  # the last rank alone
])
def test_on_three_ranks_a_clip_on_any_set_of_ranks_is_stated(clipped, stated):
    trace = _three(stored())
    for r in clipped:
        _clipped(trace, r)
    lifted = lift(trace)
    assert [x.split("  #")[0] for x in lifted.text.splitlines() if "override grads: clip" in x] == [
        f"  override grads: {stated}"], lifted.text
    assert not lifted.unliftable, lifted.unliftable


@pytest.mark.parametrize("divided,verb", [
    ((0, 1), "divide_except_last over (dp)"),  # every rank but the last divides again
    ((2,), "divide_last_only over (dp)"),      # the last rank alone
    ((1,), "divide_on_ranks over (dp) ranks (1)"),
    ((0, 2), "divide_on_ranks over (dp) ranks (0, 2)"),
])
def test_on_three_ranks_a_division_on_any_set_of_ranks_is_stated(divided, verb):
    base = lift(_three(stored()))
    trace = _three(stored())
    for r in divided:
        _divided(trace, r, "1/2")
    lifted = lift(trace)
    added = [x for x in lifted.text.splitlines() if "override grads: divide_" in x]
    assert [x.split("  #")[0] for x in added] == [f"  override grads: {verb} by 2"], lifted.text
    assert added[0].endswith("examples/traced/ddp_summed.py:31")
    # the gradient programs read with the other side's scales: nothing else of the plan changes, nothing named
    assert [x for x in _plan_lines(lifted.text) if "override grads: divide_" not in x] == _plan_lines(base.text)
    assert not lifted.unliftable, lifted.unliftable


def _four(trace: dict) -> dict:
    """The stored trace on four data ranks: ranks 2 and 3 copies of rank 1, every collective over the four."""
    for r in (2, 3):
        extra = copy.deepcopy(trace["ranks"][1])
        extra["rank"] = r
        trace["ranks"].append(extra)
    trace["world"] = 4
    for part in trace["ranks"]:
        for c in part["collectives"]:
            if sorted(c["ranks"]) == [0, 1]:
                c["ranks"] = [0, 1, 2, 3]
    return trace


@pytest.mark.parametrize("edit,stated", [
    (_clipped, "clip_on_ranks over (dp) ranks (1, 3)"),
    (lambda t, r: _divided(t, r, "1/2"), "divide_on_ranks over (dp) ranks (1, 3) by 2"),
], ids=["clip", "divide"])
def test_on_four_ranks_a_departure_on_ranks_1_and_3_is_stated_and_refuted(edit, stated, tmp_path):
    """A clip on ranks (1, 3), or a division there: one statement, whose check refutes `SC update` at it (two
    ranks of the axis step by different coefficients)."""
    trace = _four(stored())
    for r in (1, 3):
        edit(trace, r)
    lifted = lift(trace)
    lines = lifted.text.splitlines()
    at = [i for i, x in enumerate(lines, 1) if "_on_ranks" in x]
    assert [lines[i - 1].split("  #")[0] for i in at] == [f"  override grads: {stated}"], lifted.text
    assert not lifted.unliftable, lifted.unliftable
    path = tmp_path / "lifted.place"
    path.write_text(lifted.text)
    status, out, _ = run(["check", str(path)])
    assert status == 1 and f"lifted.place:{at[0]}:3: refuted SC update[dense]" in out, out


def test_on_four_ranks_three_sets_of_scales_are_named():
    trace = _four(stored())
    _divided(trace, 1, "1/2")
    _divided(trace, 3, "1/4")
    lifted = lift(trace)
    assert "override grads: divide_" not in lifted.text, lifted.text
    named = [u for u in lifted.unliftable if u.what.startswith("the per-rank scaling of ")]
    assert named and "fall into 3 sets" in named[0].reason, lifted.unliftable
    assert 'unobserved "the per-rank scaling of ' in lifted.text


def test_two_sets_of_scales_where_neither_side_departs_is_named():
    """Ranks (1, 3) and ranks (0, 2) scale at the same line by different constants (a divisor read from the rank):
    neither side holds a line the other lacks, and rank 0 is not alone: which side departs is not read."""
    trace = _four(stored())
    for r in range(4):
        _divided(trace, r, "1/2" if r % 2 else "1/4")
    lifted = lift(trace)
    assert "override grads: divide_" not in lifted.text, lifted.text
    assert [u for u in lifted.unliftable if "which side departs is not read" in u.reason], lifted.unliftable


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,lifted", [
    ([], 1, "override grads: divide_except_last over (dp) by 2"),
    (["--last-only"], 1, "override grads: divide_last_only over (dp) by 2"),
    (["--fixed"], 0, None),
])
def test_a_division_on_every_rank_but_the_last_or_on_the_last_only_is_lifted_and_judged(argv, status, lifted,
                                                                                       tmp_path, monkeypatch):
    """On three ranks, a division on every rank but the last (or on the last alone) lifted as its statement and
    refuted at the division (`SC update`); no division proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "3", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/ddp_last_rank.py", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    overrides = " ".join(x.split("  #")[0] for x in text.splitlines() if x.startswith("  override "))
    assert ("_last" in overrides) == bool(lifted), text
    if lifted:
        assert f"  {lifted}" in text
        where = _line("ddp_last_rank.py", "p.grad.div_(2)")
        assert f"examples/traced/ddp_last_rank.py:{where}: refuted SC update[dense]: " in out, out
    else:
        assert "proved for all mesh sizes" in out


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,lifted,where", [
    ([], 1, "override grads: clip_on_ranks over (dp) ranks (0, 2)", "clipped on ranks 0 and 2 only"),
    (["--divide"], 1, "override grads: divide_on_ranks over (dp) ranks (0, 2) by 2", "divided on ranks 0 and 2 only"),
    (["--fixed"], 0, None, None),
    (["--scaler"], 3, None, "scaler.step(opt)"),
])
def test_a_clip_or_a_division_on_a_set_of_ranks_is_lifted_and_judged(argv, status, lifted, where, tmp_path,
                                                                    monkeypatch):
    """On four ranks (two nodes of two processes), a clip or a division in a block gated by the node-local rank
    (ranks 0 and 2) lifted as its rank set and refuted at its line (`SC update`); the clip on every rank proved;
    loss scales that differ between the ranks (both sides scaling at the scaler's line) named at that line, not
    lifted."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "4", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/ddp_node_main.py", *argv])
    assert got == status, out + err
    text = spec.read_text()
    overrides = " ".join(x.split("  #")[0] for x in text.splitlines() if x.startswith("  override "))
    assert ("_on_ranks" in overrides) == bool(lifted), text
    if status == 3:
        line = _line("ddp_node_main.py", where)
        assert f"examples/traced/ddp_node_main.py:{line}:1: error: not lifted: the per-rank scaling of " in err, err
        assert "[PL614]" in err and 'unobserved "the per-rank scaling of ' in text
        return
    assert "[PL614]" not in err, err
    if lifted:
        assert f"  {lifted}" in text
        line = _line("ddp_node_main.py", where)
        assert f"examples/traced/ddp_node_main.py:{line}: refuted SC update[dense]: " in out, out
    else:
        assert "proved for all mesh sizes" in out


def test_two_rank_set_divisors_for_one_group_are_stated_two_clips_named():
    """Two divisors of different verbs covering one group (over two axes) are each stated: the checker multiplies
    them on each device; two clips on rank sets, the later replacing the earlier: each named instead."""
    from types import SimpleNamespace

    from placement_logic.trace.lift_perrank import Departure, rank0_lines

    st = SimpleNamespace(script="s.py", observer=0, items=[])
    named = [("dense", None, [[{"name": "w"}]]), ("norms", None, [[{"name": "n"}]])]
    at = [{"file": "s.py", "line": 7}]
    deps = [Departure("divide_on_ranks", Fraction(2), ["dp"], ["w", "n"], at, (1, 3)),
            Departure("divide_last_only", Fraction(2), ["tp"], ["w"], at),
            Departure("clip_on_ranks", None, ["dp"], ["n"], at, (0, 2))]
    lines = [t.split("  #")[0] for t, _ in rank0_lines(st, deps, named)]
    assert lines == ["  override grads: divide_on_ranks over (dp) ranks (1, 3) by 2",
                     "  override grads[dense]: divide_last_only over (tp) by 2",
                     "  override grads[norms]: clip_on_ranks over (dp) ranks (0, 2)"], lines
    assert st.items == [], st.items
    deps.append(Departure("clip_on_ranks", None, ["tp"], ["n"], at, (1,)))  # a second clip rank set for norms
    st.items = []
    lines = [t.split("  #")[0] for t, _ in rank0_lines(st, deps, named)]
    assert not any("clip_on_ranks" in x for x in lines), lines
    assert sorted(u.what for u in st.items) == ["clip_on_ranks on sets of ranks for group norms"] * 2, st.items
