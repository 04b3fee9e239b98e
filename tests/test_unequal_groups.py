"""Consecutive groups of unequal sizes (``override grads / clip_norm: reduce_groups over (AXIS) by (S1, ...)``):
parsed and formatted, refused where the sizes cannot cut the axis (PL250, PL251, PL506), refuted with a
replayed counterexample, and priced per group. Expected figures are ring formulas written out here for
the largest group, not read back from the engine; the group of a rank is computed here by hand."""

from __future__ import annotations

import io
import json
from fractions import Fraction

import pytest

from placement_logic.check.run import check_spec
from placement_logic.cli import main
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

PSI = 10**9


def spec(mesh: str = "  dp = 5", override: str = "override grads: reduce_groups over (dp) by (3, 2)",
         plan: str = "dp: ddp") -> str:
    return (f"from std.data import ddp, zero3\nmodel {{\n  params = {PSI}\n}}\nmesh {{\n{mesh}\n}}\n"
            f"plan p {{\n  {plan}\n  {override}\n}}\n")


def run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def test_fmt_round_trips_the_list_of_sizes(tmp_path):
    f = tmp_path / "g.place"
    f.write_text(spec(override="override grads:   reduce_groups   over (dp) by (3,2)"))
    rc, out, _ = run(["fmt", str(f)])
    assert rc == 0 and "override grads: reduce_groups over (dp) by (3, 2)\n" in out
    f.write_text(out)
    assert run(["fmt", str(f)])[1] == out


@pytest.mark.parametrize("mesh,override,code,phrase", [
    ("  dp = 8", "override grads: reduce_groups over (dp) by (3, 2)", "PL250", "hold 5 ranks (3 + 2), but dp has 8"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by (5, 0)", "PL250", "not 0"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by (7/2, 3/2)", "PL250", "= 7/2"),
    ("  dp = 4\n  tp = 2", "override grads: reduce_groups over (dp, tp) by (3, 1)", "PL251", "cuts one axis"),
    ("  dp = 5", "override grads: reduce_blocks over (dp) by (3, 2)", "PL251", "takes no list of sizes"),
    ("  dp = 5", "override grads: reduce_groups over (dp) by 3", "PL122", "needs 'by (S1, S2, ...)'"),
])
def test_sizes_that_cannot_cut_the_axis_are_located_errors(tmp_path, mesh, override, code, phrase):
    f = tmp_path / "bad.place"
    f.write_text(spec(mesh, override))
    rc, _, err = run(["check", str(f)])
    line = 9 + mesh.count("\n") + 1
    assert rc == 2 and f"{f}:{line}:3: error:" in err and f"[{code}]" in err and phrase in err, err


def group_of(sizes, i):
    """The group of rank i, by hand: walk the runs."""
    j = 0
    while i >= sizes[j]:
        i -= sizes[j]
        j += 1
    return j


@pytest.mark.parametrize("sizes", [(3, 2), (1, 4), (2, 2, 1), (4, 4)])
def test_a_partition_into_two_groups_or_more_is_refuted_at_its_sum(sizes):
    n = sum(sizes)
    text = spec(f"  dp = {n}", f"override grads: reduce_groups over (dp) by ({', '.join(map(str, sizes))})")
    res = check_spec(load_string(text), timeout=20).plans[0]
    r = next(o for o in res.obligations if o.name == "GI grads[dense] blocks")
    assert r.verdict is Verdict.REFUTED, r
    cex = r.counterexample
    assert dict(cex.sizes)["dp"] == n
    ranks = dict(cex.devices)
    a, b = (int(ranks[k].split("=")[1].rstrip(")")) for k in ("rank A", "rank B"))
    assert group_of(sizes, a) != group_of(sizes, b)  # the two replayed ranks are in different groups
    assert "consecutive groups" in cex.diagnosis[0]


def test_pinned_at_another_size_the_statement_leaves_its_obligations_unknown():
    text = spec("  dp = 5")
    res = check_spec(load_string(text), pinned={"dp": 4}, timeout=20).plans[0]
    r = next(o for o in res.obligations if o.name == "GI grads[dense]")
    assert r.verdict is Verdict.UNKNOWN and "pinned at 4" in r.reason


def test_the_norm_reduced_in_unequal_groups_is_refuted():
    text = spec("  dp = 5", "override clip_norm: reduce_groups over (dp) by (3, 2)", "dp: zero3")
    res = check_spec(load_string(text), timeout=20).plans[0]
    r = next(o for o in res.obligations if o.name == "SC clip_norm")
    assert r.verdict is Verdict.REFUTED and "consecutive groups of 3, 2 ranks" in r.counterexample.diagnosis[0]


def _grad_sync(tmp_path, text):
    f = tmp_path / "c.place"
    f.write_text(text)
    rc, out, err = run(["cost", str(f), "--format", "json"])
    assert rc == 0, err
    comm = json.loads(out)["plans"][0]["communication"]
    return [c for c in comm["collectives"] if c["phase"] == "grad_sync"]


def test_priced_on_the_largest_group_inside_a_node(tmp_path):
    """dp = 12 on 8-GPU H100 nodes cut (8, 4): bf16 gradients (2Ψ bytes) all-reduced on the group of 8,
    2·7/8·2Ψ per device, each group inside one node (ranks 0..7, 8..11)."""
    coll = _grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_groups over (dp) by (8, 4)"))
    assert len(coll) == 1 and coll[0]["link"] == "intra_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI


def test_a_group_across_a_node_boundary_stays_on_the_network(tmp_path):
    """(4, 8) on 8-GPU nodes: the group of ranks 4..11 spans two nodes."""
    coll = _grad_sync(tmp_path, spec("  device = h100_sxm\n  dp = 12 @ inter_node",
                                     "override grads: reduce_groups over (dp) by (4, 8)"))
    assert coll[0]["link"] == "inter_node"
    assert Fraction(coll[0]["bytes_per_device"]) == Fraction(2 * 7, 8) * 2 * PSI
