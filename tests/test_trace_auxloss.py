"""The MoE load-balancing loss added to the cross-entropy and the groups its statistics are taken over, as
`placement trace` lifts them (trace/lift_auxloss.py).

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json, 2 data ranks; its `head.weight`
renamed `router.weight`) by hand: each rank's router call of E = 2 experts, top-1, with hand-chosen counts and
column sums, the counts' all-reduce over both ranks or none, and a term whose value is computed here from the
definition E · Σ_i f_i · P_i. The slow ones run examples/traced/moe_aux_counts.py on 4 ranks and require each
verdict at the script line that caused it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
FRAME = {"file": "examples/traced/ddp_summed.py", "line": 27, "function": "<module>", "code": "x"}
# rank -> (counts, column sums) of 4 tokens routed top-1 over 2 experts
ROUTED = {0: ([3, 1], [2.6, 1.4]), 1: ([1, 3], [1.4, 2.6])}


def _aux(f_counts, probs, rows) -> float:
    """E · Σ_i f_i · P_i from the counts and the column sums over ``rows`` tokens, by the definition."""
    return 2 * sum(c / sum(f_counts) * p / rows for c, p in zip(f_counts, probs))


# every rank: f gathered over both ranks is (1/2, 1/2), P its own (0.65, 0.35) or (0.35, 0.65): 1.0;
# f its own: rank 0 2 · (0.75 · 0.65 + 0.25 · 0.35) = 1.15, rank 1 likewise (no two-digit ratio of the two)
GATHERED = {r: _aux([4, 4], ROUTED[r][1], 4) for r in ROUTED}
OWN = {r: _aux(*ROUTED[r], 4) for r in ROUTED}


def _routed(values: dict[int, float], gathered: bool, coef: float = 1e-2) -> dict:
    trace = json.loads(STORED.read_text().replace('"head.weight"', '"router.weight"'))
    for part in trace["ranks"]:
        r = part["rank"]
        for st in part["steps"]:
            n = st["nll"][0]
            n["stats"] = {"zsq_true": 41.3, "smooth_true": 3.0}  # no z-loss or smoothing reads the term
            counts, colsum = ROUTED[r]
            st["router"] = [{"width": 2, "rows": 4, "colsum": colsum, "counts": counts, "top_k": 1, "micro": 0,
                             "stack": [FRAME]}]
            other = coef * values[r]
            st["terms"] = [{"ce": n["value"], "other": other, "micro": 0, "stack": [FRAME]}]
            st["losses"][0]["value"] = n["value"] + other
            if gathered:
                part["collectives"].append({
                    "seq": 20_000 + st["step"], "step": st["step"], "phase": "forward", "kind": "all_reduce",
                    "ranks": [0, 1], "dtype": "float32", "bytes": 8, "numel": 2, "op": "sum", "api": "c10d.allreduce_",
                    "carried": [], "vector_in": [float(c) for c in counts], "micro": 0, "stack": [FRAME]})
    return trace


def test_the_definition_gives_the_hand_values():
    assert GATHERED == pytest.approx({0: 1.0, 1: 1.0}) and OWN == pytest.approx({0: 1.15, 1: 1.15})


def test_counts_gathered_over_the_data_axis_are_stats_over_it_with_each_ranks_probabilities():
    out = lift(_routed(GATHERED, gathered=True))
    assert not out.unliftable, out.unliftable
    assert "    aux_stats = global_batch" in out.text and "aux = per_microbatch_mean" in out.text
    assert "like = router" in out.text and "router.weight" in out.text
    assert "  override loss[aux]: stats_per_step over (dp)" in out.text
    assert "  override loss[aux]: probs_per_step over ()" in out.text


def test_counts_never_gathered_are_each_ranks_own_statistics():
    out = lift(_routed(OWN, gathered=False))
    assert not out.unliftable, out.unliftable
    assert "  override loss[aux]: stats_per_step over ()" in out.text
    assert "probs_per" not in out.text  # f and P over one group: no statement of P's own


@pytest.mark.parametrize("values,gathered", [(OWN, True), (GATHERED, False)], ids=["gathered", "own"])
def test_a_term_whose_value_is_not_the_observed_groups_is_an_auxiliary_loss(values, gathered):
    """The term's value is the balancing loss of the other grouping: no statistics statement, named (PL614)."""
    out = lift(_routed(values, gathered))
    assert "loss[aux]" not in out.text and "aux_stats" not in out.text
    assert [u for u in out.unliftable if u.what == "an auxiliary loss"]


def test_a_balancing_loss_without_a_router_parameter_is_named():
    trace = _routed(GATHERED, gathered=True)
    trace = json.loads(json.dumps(trace).replace('"router.weight"', '"head.weight"'))
    out = lift(trace)
    assert "loss[aux]" not in out.text
    assert [u for u in out.unliftable if "router" in u.reason]


# ------------------------------------------------------- the checker: a group of one's own like the router

LIFTED = """from std.data import ddp

model {{
  params = 29696
  losses {{
    aux = per_microbatch_mean
    aux_stats = global_batch
  }}
  group moe_router {{ count = 128  like = router  tensor = whole }}
}}

mesh {{
  dp = 2
}}

plan p {{
  dp: ddp
  override loss: per_device_mean
  override tokens: equal
{body}}}
"""


@pytest.mark.parametrize("body,ok", [
    ("  override loss[aux]: stats_per_step over ()\n", False),  # each rank's own tokens
    ("  override loss[aux]: stats_per_step over (dp)\n  override loss[aux]: probs_per_step over ()\n", True),
    ("  override loss[aux]: stats_per_step over (dp)\n", True),
    ("", True),  # the objective's own grouping
], ids=["own", "f-gathered", "both-gathered", "derived"])
def test_a_group_like_the_router_carries_the_balancing_loss(body, ok):
    """The lifted model has no transformer shape: the balancing loss reaches the group declared like the router
    (no PL187), and ``GI aux_stats`` agrees with the simulator (random routings, dp and the microbatches at 1 and 2)
    and by hand: statistics of each rank's own tokens are not the global batch's."""
    import random
    from itertools import product

    import simulator_auxstats as sim

    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_string
    from placement_logic.outcome import Verdict

    spec = load_string(LIFTED.format(body=body), "lifted.place")
    rng = random.Random(0)
    differs = any(sim.differs(spec.plan("p"), "global_batch", {"dp": d, "microbatches": k}, 1, 4, 2, rng, tries=3)
                  for d, k in product((1, 2), repeat=2))
    assert differs is (not ok)
    report = check_spec(spec, ["p"], timeout=20).plans[0]
    ob = next(o for o in report.obligations if o.name == "GI aux_stats")
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), ob.unknown
    assert any(o.name == "GI grads[moe_router]" for o in report.obligations)


# --------------------------------------------------------------------------- slow: the example

def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(text: str) -> int:
    lines = (ROOT / "examples" / "traced" / "moe_aux_counts.py").read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


SCRIPTS = [
    # arguments, exit status, lines of the lifted spec, lines it must not hold
    ([], 1, ["  override loss[aux]: stats_per_step over (shard)", "  override loss[aux]: probs_per_step over ()"],
     ["replicate, shard)"]),
    (["--fixed"], 0, ["  override loss[aux]: stats_per_step over (replicate, shard)",
                      "  override loss[aux]: probs_per_step over ()"], []),
    (["--probs"], 1, ["  override loss[aux]: stats_per_step over (shard)"], ["probs_per"]),
    (["--fixed", "--probs"], 0, ["  override loss[aux]: stats_per_step over (replicate, shard)"], ["probs_per"]),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,lines,absent", SCRIPTS, ids=[" ".join(s[0]) or "bug" for s in SCRIPTS])
def test_the_balancing_loss_statistics_groups_are_lifted(argv, status, lines, absent, tmp_path, monkeypatch):
    """The counts all-reduced over the inner data axis only: f over (shard), refuted for the global batch at the
    all-reduce; over every rank proved. The objective, the router group and the coefficient 1e-2 as written."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "4", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/moe_aux_counts.py", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    assert "    aux_stats = global_batch" in text and "the balancing loss, 0.01 · E · Σ f·P" in text, text
    assert "  group moe_router { count = 128  like = router  tensor = whole }  # router.weight" in text, text
    for line in lines:
        assert line in text, text
    for line in absent:
        assert line not in text, text
    if status == 0:
        assert "proved for all mesh sizes" in out
    else:
        where = _line("dist.all_reduce(counts")
        assert f"examples/traced/moe_aux_counts.py:{where}: refuted GI aux_stats: " in out, out
        assert "not gathered over replicate" in out
