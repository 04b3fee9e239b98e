"""One reduction in groups of two kinds over different axes (check.subgroups, check.encode_subgroups): each
axis cut by the statement naming it (blocks over one axis, strided groups or rank sets over another). The
checker's verdicts at pinned sizes against the independent simulator (tests/simulator_subgroups.py) and the
hand-derived answer (the reduction covers the mesh iff no axis is cut into two groups or more: blocks of B of
n ranks iff B < n, a stride S >= 2 of n >= 2 ranks, the first K of n > K, sets of two or more), the
replayed witness naming the statement that cuts, PL194 for one axis cut twice, the costs' group sizes."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator
from irkit import const, ov, plan

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
TWO_DP = {"a": ("data", "R,R,R,R"), "b": ("data", "R,R,R,R")}
ZERO2_TWO = {"a": ("data", "R,S,S,R"), "b": ("data", "R,S,S,R")}


def _ob(report, name):
    return next(o for o in report.obligations if o.name == name)


def _sim(p, sizes, key, seeds=4) -> bool:
    return any(key in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(seeds))


def _cut(verb: str, e, n: int) -> bool:
    """By hand: whether the statement cuts an axis of n ranks into two groups or more."""
    if verb == "reduce_blocks":
        return e < n
    if verb == "reduce_strided":
        return e >= 2 and n >= 2
    if verb == "reduce_first":
        return e < n
    if verb == "reduce_sets":  # the sets describe the axis at the number of ranks they hold only
        return n == sum(map(len, e)) and len(e) >= 2
    raise AssertionError(verb)


KINDS = [("reduce_blocks", 2), ("reduce_strided", 2), ("reduce_first", 1), ("reduce_sets", ((1,), (0,)))]


def _stmt(target, verb, e, axis):
    if verb == "reduce_sets":
        return ov(target, verb, None, (axis,), sets=e)
    return ov(target, verb, None, (axis,), const(e))


def _fits(kind, n: int) -> bool:
    """Rank sets are read at the number of ranks they hold (pinned elsewhere: PL268, tested in test_rank_sets)."""
    return kind[0] != "reduce_sets" or n == 2


@pytest.mark.parametrize("ka,kb,na,nb", [(ka, kb, na, nb) for ka, kb in product(KINDS, KINDS) if ka[0] != kb[0]
                                         for na, nb in ((1, 2), (2, 1), (2, 2), (3, 1), (2, 3))
                                         if _fits(ka, na) and _fits(kb, nb)])
def test_two_kinds_over_two_axes_agree_with_the_simulator_and_by_hand(ka, kb, na, nb):
    spec, p = plan("p", TWO_DP, overrides=(_stmt("grads", *ka, "a"), _stmt("grads", *kb, "b")))
    sizes = {"a": na, "b": nb, "microbatches": 1}
    report = check_plan(SESSION, spec, p, sizes)
    bad = _cut(*ka, na) or _cut(*kb, nb)
    ob = _ob(report, "GI grads[dense] blocks")
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (ka, kb, sizes, ob.verdict, ob.reason)
    assert _sim(p, sizes, ("blocks", "dense")) is bad
    assert _ob(report, "GI grads[dense]").verdict is (Verdict.REFUTED if bad else Verdict.PROVED)
    if bad:  # the witness's axis is one its statement cuts, and the diagnosis names that statement
        cex = ob.counterexample
        verb = next(v for (v, e), ax, n in ((ka, "a", na), (kb, "b", nb)) if _cut(v, e, n) and
                    f"(override {v} at line" in cex.diagnosis[0])
        assert verb in (ka[0], kb[0]), cex.diagnosis


@pytest.mark.parametrize("na,nb,bad", [(2, 1, False), (4, 1, True), (2, 3, True), (1, 1, False)])
def test_the_norm_in_blocks_over_one_axis_and_strided_groups_over_another(na, nb, bad):
    """ZeRO-2 over both axes: the norm sums shards over a and b; blocks of 2 over a, strided groups of stride 3
    over b (a stride >= the axis's size: every rank alone only at b = 1... and at b = 2, 3 two groups or more)."""
    spec, p = plan("p", ZERO2_TWO, overrides=(ov("clip_norm", "reduce_blocks", None, ("a",), const(2)),
                                             ov("clip_norm", "reduce_strided", None, ("b",), const(3))))
    sizes = {"a": na, "b": nb, "microbatches": 1}
    assert (_cut("reduce_blocks", 2, na) or _cut("reduce_strided", 3, nb)) is bad
    ob = _ob(check_plan(SESSION, spec, p, sizes), "SC clip_norm")
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (sizes, ob.verdict)
    assert _sim(p, sizes, ("clip",)) is bad


def _place(body: str) -> str:
    return ("from std.data import ddp\nmodel { params = 1e9 }\nmesh {\n  nodes = 4\n  gpus = 8\n}\n"
            f"plan p {{\n  [nodes, gpus]: ddp\n{body}}}\n")


def test_one_axis_cut_twice_is_pl194(tmp_path, capsys):
    f = tmp_path / "bad.place"
    f.write_text(_place("  override grads: reduce_blocks over (gpus) by 4\n"
                        "  override grads: reduce_strided over (nodes, gpus) by 2\n"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    first = f.read_text().splitlines().index("  override grads: reduce_blocks over (gpus) by 4") + 1
    assert f"{f}:{first + 1}:3: error:" in err and "[PL194]" in err and "gpus of the same reduction is already run " \
        f"in blocks of 4 consecutive ranks (line {first})" in err, err


def test_two_kinds_are_checked_from_the_file(tmp_path, capsys):
    """Blocks of 4 over gpus and rank sets over nodes ([0, 1], [2, 3]): both cut the reduction."""
    f = tmp_path / "two.place"
    f.write_text(_place("  override grads: reduce_blocks over (gpus) by 4\n"
                        "  override grads: reduce_sets over (nodes) ranks ([0, 1], [2, 3])\n"))
    assert main(["check", str(f), "--set", "nodes=4", "--set", "gpus=8"]) == 1
    out = capsys.readouterr().out
    assert "refuted GI grads[dense] blocks" in out, out
    assert "runs in blocks of 4 consecutive ranks over (gpus); the process groups of the rank sets" in out, out


def test_costs_price_each_axis_by_its_own_groups():
    """[nodes, gpus]: ddp with blocks of 2 nodes and the first 4 GPUs of each: the gradient all-reduce over
    (nodes, gpus) runs on groups of 2 · 4 = 8 ranks, a ring of 8 moving 2·(8 − 1)/8 of the 2Ψ-byte bf16 buffer
    per device (written out here), where the whole mesh of 32 would move 2·31/32 of it."""
    from fractions import Fraction

    from placement_logic.costs import derive
    from placement_logic.frontend.loader import load_string

    psi = 7 * 10**9
    text = _place("  override grads: reduce_blocks over (nodes) by 2\n"
                  "  override grads: reduce_first over (gpus) by 4\n").replace("params = 1e9", f"params = {psi}")
    pc = derive(load_string(text).plans[0])
    colls = [x for x in pc.communication.collectives if x.collective.phase.value == "grad_sync"]
    assert colls and all(x.bytes_per_device == Fraction(2 * 7, 8) * 2 * psi for x in colls), \
        [(x.collective.axes, x.bytes_per_device) for x in colls]
    rule = colls[0].collective.rule
    assert "within blocks of 2 ranks of (nodes)" in rule and "within the first 4 ranks only of (gpus)" in rule, rule


def test_a_witness_of_another_statement_keeps_the_size_the_sets_hold():
    """Free sizes: rank sets over b hold 2 ranks, so every witness has b = 2, also one whose cut is the first
    rank of a (the shrinking of the witness keeps b at 2); the simulator agrees at the witness's sizes."""
    spec, p = plan("p", TWO_DP, overrides=(ov("grads", "reduce_first", None, ("a",), const(1)),
                                          ov("grads", "reduce_sets", None, ("b",), sets=((0,), (1,)))))
    ob = _ob(check_plan(SESSION, spec, p, {}), "GI grads[dense] blocks")
    assert ob.verdict is Verdict.REFUTED
    sizes = dict(ob.counterexample.sizes)
    assert sizes["b"] == 2, sizes
    assert _sim(p, {"a": sizes["a"], "b": 2, "microbatches": 1}, ("blocks", "dense"))
