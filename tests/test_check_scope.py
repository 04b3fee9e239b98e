"""A verdict's scope names every size it is decided at: the ``--set`` pins and the sizes the
obligation's own encoding holds axes at (check.run ``_scope``, ``encode.Env.fix``): K/V copy groups
crossing tensor axes read at the axes' declared sizes (check.kvjoint), an axis of whole kv heads at its
declared size (check.kvproduct), an axis cut by a list of group sizes or of rank sets at the ranks
they hold (check.subgroups, check.encode_ranksets). The expected sizes are read here from the spec's
text by hand (the mesh block, the sizes and rank lists of the statement), never from the checker."""

from __future__ import annotations

import json
import re
from pathlib import Path

from placement_logic.check.render import render
from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_spec
from placement_logic.outcome import Verdict

ROOT = Path(__file__).resolve().parent.parent


def _mesh(text: str) -> dict[str, int]:
    """The mesh block's sizes, in order, read from the spec's text."""
    block = re.search(r"^mesh \{(.*?)^\}", text, re.S | re.M).group(1)
    return {a: int(n) for a, n in re.findall(r"^\s*(\w+) = (\d+)\s*$", block, re.M)}


def _kv_heads(text: str) -> int:
    return int(re.search(r"kv_heads = (\d+)", text).group(1))


def _check(name: str, pinned: dict[str, int] | None = None):
    path = ROOT / name
    report = check_spec(load_spec(path), pinned=pinned, timeout=20)
    return path.read_text(), report


def _with(sizes: dict[str, int]) -> str:
    return "all sizes with " + ", ".join(f"{a}={n}" for a, n in sizes.items())


def _by_name(report) -> dict:
    return {o.name: o for p in report.plans for o in p.obligations}


def test_copy_groups_crossing_the_axes_are_decided_at_the_declared_sizes():
    """(kvjoint) 2 kv heads over tp = 3, tl = 4: copy groups of 6 consecutive joint indices cross tl's
    blocks of 4, so the kv obligations hold at the declared tp and tl only; the dense group's at all sizes."""
    text, report = _check("examples/safe/kv_copies_joint_summed.place")
    mesh = _mesh(text)
    n = mesh["tp"] * mesh["tl"]
    assert (n // _kv_heads(text)) % mesh["tl"] and mesh["tl"] % (n // _kv_heads(text))  # runs cross tl's blocks
    want = _with({"tp": mesh["tp"], "tl": mesh["tl"]})
    obs = _by_name(report)
    kv = [o for name, o in obs.items() if name.startswith("GI grads[kv]")]
    assert len(kv) == 5
    for o in kv:
        assert o.verdict is Verdict.PROVED and o.scope == want, (o.name, o.scope)
        assert dict(o.fixed_sizes) == {"tp": mesh["tp"], "tl": mesh["tl"]}
    assert obs["SC clip_norm"].scope == want  # the norm counts each kv head on its copy group's first rank


def test_an_axis_of_whole_heads_is_decided_at_its_declared_size():
    """(kvproduct) 8 kv heads over tp = 2, tl = 8: runs of 2 joint indices, inside tl's blocks of 8, so
    each tp rank holds whole heads (tl/2 of them) and tp is held at its declared 2; tl takes every size."""
    text, report = _check("examples/safe/kv_copies_product_norm_once.place")
    mesh = _mesh(text)
    run = mesh["tp"] * mesh["tl"] // _kv_heads(text)
    assert run < mesh["tl"] and mesh["tl"] % run == 0  # the runs are blocks of tl: tp's ranks hold whole heads
    obs = _by_name(report)
    for name in ("GI grads[kv]", "GI grads[kv] over tl copy groups", "GI grads[kv] over dp", "SC clip_norm"):
        assert obs[name].verdict is Verdict.PROVED and obs[name].scope == _with({"tp": mesh["tp"]}), name


def test_rank_sets_over_several_axes_are_decided_at_the_mesh_sizes():
    """(reduce_sets over (dp, tp)) the sets number the ranks of dp x tp flattened at the mesh's sizes: both
    are held there, and the sets list exactly their product's ranks."""
    text, report = _check("examples/safe/data_groups_with_their_own_ranks.place")
    mesh = _mesh(text)
    sets = re.search(r"reduce_sets over \(dp, tp\) ranks (.*)$", text, re.M).group(1)
    assert len(re.findall(r"\d+", sets)) == mesh["dp"] * mesh["tp"]
    obs = _by_name(report)
    for name in ("GI grads[dense]", "GI grads[dense] blocks"):
        assert obs[name].verdict is Verdict.PROVED and obs[name].scope == _with(
            {"dp": mesh["dp"], "tp": mesh["tp"]}), name
    assert obs["GI grads[norms]"].scope == "all mesh sizes"  # the statement names dense only


def test_consecutive_groups_are_decided_at_their_sum():
    """(reduce_groups over (dp) by (1, 4)) the groups describe dp at 1 + 4 = 5 ranks only: the refutations
    say so."""
    text, report = _check("examples/bugs/grads_reduced_per_node_of_unequal_size.place")
    sizes = re.search(r"reduce_groups over \(dp\) by \(([\d, ]+)\)", text).group(1)
    want = _with({"dp": sum(int(s) for s in sizes.split(","))})
    blocks = [o for o in _by_name(report).values() if o.name.endswith(" blocks")]
    assert blocks and all(o.verdict is Verdict.REFUTED and o.scope == want for o in blocks)


def test_rank_sets_over_one_axis_are_decided_at_the_ranks_they_hold():
    """(reduce_sets over (dp)) four sets of one rank each hold dp at 4: the gradient's and the norm's
    refutations both say so."""
    text, report = _check("examples/bugs/grad_norm_in_groups_of_a_permuted_hostfile.place")
    sets = re.search(r"override grads: reduce_sets over \(dp\) ranks (.*)$", text, re.M).group(1)
    want = _with({"dp": len(re.findall(r"\d+", sets))})
    obs = _by_name(report)
    for name in ("GI grads[dense] blocks", "SC clip_norm"):
        assert obs[name].verdict is Verdict.REFUTED and obs[name].scope == want, (name, obs[name].scope)


def test_pins_and_fixed_sizes_are_merged_pins_first():
    """--set dp=3 beside the declared tp, tl of the crossing copy groups: one scope naming all three; the
    obligations that fix nothing name the pin alone."""
    text, report = _check("examples/safe/kv_copies_joint_summed.place", {"dp": 3})
    mesh = _mesh(text)
    obs = _by_name(report)
    assert obs["GI grads[kv]"].scope == _with({"dp": 3, "tp": mesh["tp"], "tl": mesh["tl"]})
    assert obs["GI grads[dense]"].scope == _with({"dp": 3})


def test_an_obligation_that_fixes_nothing_covers_all_mesh_sizes():
    text, report = _check("examples/safe/kv_copies_product_summed.place")  # copies over tp's blocks and tl wholly
    mesh = _mesh(text)
    assert mesh["tp"] % _kv_heads(text) == 0  # tp cut into head blocks: a multiple, no size fixed
    for o in _by_name(report).values():
        assert o.scope == "all mesh sizes" and o.fixed_sizes == (), o.name
    assert not any("decided only at" in a for a in report.plans[0].assumed)


def test_the_reports_carry_the_scope_and_the_plan_says_what_it_holds():
    text, report = _check("examples/safe/kv_copies_joint_summed.place")
    mesh = _mesh(text)
    want = _with({"tp": mesh["tp"], "tl": mesh["tl"]})
    data = json.loads(render(report, "json"))
    scopes = {o["name"]: o["scope"] for o in data["plans"][0]["obligations"]}
    assert scopes["GI grads[kv]"] == want and scopes["GI grads[dense]"] == "all mesh sizes"
    assert f"| GI grads[kv] | gradient integrity | {want} |" in render(report, "markdown")
    assert report.plans[0].fixed_sizes == {"tp": mesh["tp"], "tl": mesh["tl"]}
    assert any(f"decided only at tp={mesh['tp']}, tl={mesh['tl']}" in a for a in report.plans[0].assumed)
