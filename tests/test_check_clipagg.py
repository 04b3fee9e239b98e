"""How the ranks' squared gradient norms are combined over an axis (check.clipagg): a sum, an
average, a max, or each rank's root taken before the sum (a nonlinear operation on a partial
value). The checker's SC clip_norm against the independent simulator and hand-derived answers,
input errors and fmt."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP = "R,R,R,R"
DP = {"dp": ("data", DDP)}
DDP_TP = {"dp": ("data", DDP), "tp": ("tensor", "S,S,S,S")}


# ---------------------------------------------------------------------------------------------------
# how the squared norms are combined over an axis: a sum, an average, a max, or roots taken first

ZERO2_TP = {"dp": ("data", "R,S,S,R"), "tp": ("tensor", "S,S,S,S")}
CLIP_AGG_CASES = [
    # (axes, overrides, hand-derived: is every device's norm the global one)
    (DDP_TP, (), True),
    (DDP_TP, (ov("clip_norm", "average", None, ("tp",)),), False),  # dense sharded on tp: sum / tp
    (DDP_TP, (ov("clip_norm", "max", None, ("tp",)),), False),  # the largest tp shard
    (DDP_TP, (ov("clip_norm", "sqrt_before_reduce"),), False),  # roots of the tp shards added
    # copies, not shards: averaging or maximising copies of one value gives that value
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "max", "norms", ("tp", "dp")),
              ov("clip_norm", "max", "biases", ("tp",))), True),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "average", "norms", ("tp",)),
              ov("clip_norm", "average", "biases", ("tp",))), True),
    (DP, (ov("clip_norm", "average", None, ("dp",)),), True),  # DDP: every dp rank holds the whole gradient
    (DP, (ov("clip_norm", "reduce", None, ("dp",)),), False),  # ... summed: dp times
    (DP, (ov("clip_norm", "max", None, ("dp", "dp")),), True),
    # roots before the reduction: right only where one rank contributes (the duplicate filter on copies)
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "dedupe", None, ("tp",)),
              ov("clip_norm", "sqrt_before_reduce", "norms")), True),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "dedupe", "biases", ("tp",)),
              ov("clip_norm", "sqrt_before_reduce", "norms")), False),  # norms' tp copies: (tp·sqrt(x))²
    (DDP_TP, (ov("clip_norm", "sqrt_before_reduce", "dense"),), False),
    (ZERO2_TP, (ov("clip_norm", "sqrt_before_reduce"),), False),  # dp shards and tp shards
    (ZERO2_TP, (ov("clip_norm", "average", None, ("dp", "tp")), ov("clip_norm", "dedupe", None, ("tp",))), False),
]


@pytest.mark.parametrize("axes,overrides,ok", CLIP_AGG_CASES, ids=[str(i) for i in range(len(CLIP_AGG_CASES))])
def test_clip_aggregation_agrees_with_the_simulator_and_by_hand(axes, overrides, ok):
    spec, p = plan("p", axes, overrides=overrides)
    report = check_plan(SESSION, spec, p, {})
    clip = next(o for o in report.obligations if o.name == "SC clip_norm")
    assert clip.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (clip.verdict, clip.reason)
    names = p.mesh.names
    found = False
    for sizes in product((1, 2, 3), repeat=len(names)):
        for seed in range(3):
            found |= ("clip",) in simulator.norm_violations(p, {**dict(zip(names, sizes)), "microbatches": 1},
                                                             random.Random(seed))
    assert found is (not ok)
    if not ok:
        cex = clip.counterexample
        assert cex is not None and cex.diagnosis
        # the root cause names the aggregation, where the plan's aggregation is what is wrong
        verbs = {o.verb for o in overrides}
        if verbs & {"average", "max", "sqrt_before_reduce"} and "dedupe" not in verbs:
            assert any(w in cex.diagnosis[0] for w in ("averaged", "by max", "square root")), cex.diagnosis


def test_sqrt_before_no_reduction_changes_nothing(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text("from std.data import ddp\nmodel { params = 1e9 }\nmesh { dp = 2 }\nplan p {\n  dp: ddp\n"
                 "  override clip_norm: sqrt_before_reduce\n}\n")
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:6:3: error:" in err and "[PL506]" in err and "sqrt_before_reduce changes nothing" in err


def test_fmt_round_trips_the_aggregation_verbs():
    src = ("from std.data import zero2\nmodel { params = 1e9 }\nmesh { dp = 2 }\nplan p {\n  dp: zero2\n"
           "  override clip_norm[norms]:max over(dp)\n  override clip_norm: average   over (dp)\n"
           "  override clip_norm[dense]:sqrt_before_reduce\n}\n")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    key = [(o.target, o.group, o.verb, o.axes) for o in a.plans[0].overrides]
    assert key == [(o.target, o.group, o.verb, o.axes) for o in b.plans[0].overrides] == [
        ("clip_norm", "norms", "max", ("dp",)), ("clip_norm", None, "average", ("dp",)),
        ("clip_norm", "dense", "sqrt_before_reduce", None)]
