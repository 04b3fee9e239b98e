"""Process groups over part of an axis (check.subgroups: ``grads[g]: reduce_blocks`` and
``clip_norm: reduce_blocks over (AXES) by B``) and divisors on every rank but the last or on the
last rank only (``grads[g]: divide_except_last`` / ``divide_last_only``). The checker's verdicts at
pinned sizes against the independent simulator (tests/simulator_subgroups.py) and the hand-derived
answer (blocks of B ranks cover an axis of n ranks iff B >= n; a divisor on a proper subset of the
ranks differs between them iff an axis it names has two or more ranks), the replayed values,
located input errors and fmt."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from irkit import const, ov, plan
from test_check_simulator import checker_keys, simulated
from tiers import examples

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP = "R,R,R,R"
DP = {"dp": ("data", DDP)}
ZERO2 = {"dp": ("data", "R,S,S,R")}
DDP_TP = {"dp": ("data", DDP), "tp": ("tensor", "S,S,S,S")}
DP_PP = {"dp": ("data", DDP), "pp": ("pipeline", "S,S,S,S")}


def _ob(report, name):
    return next(o for o in report.obligations if o.name == name)


def _sim(p, sizes, key, seeds=4) -> bool:
    return any(key in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(seeds))


# ---------------------------------------------------------------------------------------------------
# the gradient reduction over blocks of B consecutive ranks


@pytest.mark.parametrize("b,n", list(product((1, 2, 3), (1, 2, 3, 4))))
def test_grad_blocks_agree_with_the_simulator_and_by_hand(b, n):
    spec, p = plan("p", DP, overrides=(ov("grads", "reduce_blocks", None, ("dp",), const(b)),))
    sizes = {"dp": n, "microbatches": 1}
    report = check_plan(SESSION, spec, p, sizes)
    bad = b < n  # hand-derived: two blocks or more
    for g in ("dense", "norms"):
        ob = _ob(report, f"GI grads[{g}] blocks")
        assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (b, n, ob.verdict, ob.reason)
        assert _sim(p, sizes, ("blocks", g)) is bad
    if bad:
        cex = _ob(report, "GI grads[dense] blocks").counterexample
        assert f"(dp={b})" in cex.equation and f"over all {n} ranks of dp" in cex.equation, cex.equation
        assert any(f"within blocks of {b} consecutive ranks" in d for d in cex.diagnosis), cex.diagnosis


def test_grad_blocks_of_one_group_leave_the_others_alone():
    spec, p = plan("p", DDP_TP, overrides=(ov("grads", "reduce_blocks", "norms", ("dp",), const(2)),))
    report = check_plan(SESSION, spec, p, {"dp": 4, "tp": 2, "microbatches": 1})
    assert _ob(report, "GI grads[norms] blocks").verdict is Verdict.REFUTED
    assert not any(o.name == "GI grads[dense] blocks" for o in report.obligations)
    assert _sim(p, {"dp": 4, "tp": 2, "microbatches": 1}, ("blocks", "norms"))
    assert not _sim(p, {"dp": 4, "tp": 2, "microbatches": 1}, ("blocks", "dense"))


def test_grad_blocks_unpinned_are_refuted_with_a_replayed_witness():
    spec, p = plan("p", DP, overrides=(ov("grads", "reduce_blocks", None, ("dp",), const(8)),))
    ob = _ob(check_plan(SESSION, spec, p, {}), "GI grads[dense] blocks")
    assert ob.verdict is Verdict.REFUTED and ob.counterexample is not None
    n = dict(ob.counterexample.sizes)["dp"]
    assert n > 8 and _sim(p, {"dp": n, "microbatches": 1}, ("blocks", "dense"))


# ---------------------------------------------------------------------------------------------------
# strided groups (rank i in group i mod S) and the first K ranks only (the others reduce nothing)


def _groups_by_hand(verb: str, e: int, n: int) -> list[set[int]]:
    """The groups of an axis of n ranks, listed from the definition (docs/semantics.md)."""
    if verb == "reduce_strided":
        return [set(range(r, n, e)) for r in range(min(e, n))]
    return [set(range(min(e, n)))] + [{i} for i in range(e, n)]


@pytest.mark.parametrize("verb,es", [("reduce_strided", (2, 3)), ("reduce_first", (1, 2, 3))])
@pytest.mark.parametrize("n", (1, 2, 3, 4))
def test_strided_and_first_k_agree_with_the_simulator_and_by_hand(verb, es, n):
    for e in es:
        spec, p = plan("p", DP, overrides=(ov("grads", verb, None, ("dp",), const(e)),))
        sizes = {"dp": n, "microbatches": 1}
        report = check_plan(SESSION, spec, p, sizes)
        bad = len(_groups_by_hand(verb, e, n)) > 1  # hand-derived: the axis cut into two groups or more
        for g in ("dense", "norms"):
            ob = _ob(report, f"GI grads[{g}] blocks")
            assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (verb, e, n, ob.verdict, ob.reason)
            assert _sim(p, sizes, ("blocks", g)) is bad
        if bad:
            cex = _ob(report, "GI grads[dense] blocks").counterexample
            other = dict(cex.devices)["rank B"]
            # the replayed rank B is outside rank 0's group: rank 1 (another residue), or rank K
            want = 1 if verb == "reduce_strided" else e
            assert other == f"(dp={want})", other
            assert not any(want in grp and 0 in grp for grp in _groups_by_hand(verb, e, n))
            assert f"over all {n} ranks of dp" in cex.equation, cex.equation
            words = "strided groups of stride" if verb == "reduce_strided" else f"the first {e} ranks only"
            assert any(words in d for d in cex.diagnosis), cex.diagnosis


@pytest.mark.parametrize("verb,e", [("reduce_strided", 4), ("reduce_first", 8)])
def test_strided_and_first_k_unpinned_are_refuted_with_a_replayed_witness(verb, e):
    spec, p = plan("p", DP, overrides=(ov("grads", verb, None, ("dp",), const(e)),))
    ob = _ob(check_plan(SESSION, spec, p, {}), "GI grads[dense] blocks")
    assert ob.verdict is Verdict.REFUTED and ob.counterexample is not None
    n = dict(ob.counterexample.sizes)["dp"]
    assert len(_groups_by_hand(verb, e, n)) > 1 and _sim(p, {"dp": n, "microbatches": 1}, ("blocks", "dense"))


def test_a_strided_group_of_data_ranks_is_wrong_even_where_each_rank_is_alone():
    """Stride 4 on an axis of 2 ranks: every rank its own group, nothing reduced: refuted (the first K
    ranks with K >= n, by contrast, hold the axis)."""
    spec, p = plan("p", DP, overrides=(ov("grads", "reduce_strided", None, ("dp",), const(4)),))
    assert _ob(check_plan(SESSION, spec, p, {"dp": 2, "microbatches": 1}), "GI grads[dense] blocks").verdict \
        is Verdict.REFUTED
    spec, p = plan("p", DP, overrides=(ov("grads", "reduce_first", None, ("dp",), const(4)),))
    assert _ob(check_plan(SESSION, spec, p, {"dp": 2, "microbatches": 1}), "GI grads[dense] blocks").verdict \
        is Verdict.PROVED


@pytest.mark.parametrize("verb", ["reduce_strided", "reduce_first"])
@pytest.mark.parametrize("e,n", list(product((2,), (1, 2, 3))))
def test_norm_in_strided_or_first_groups_agrees_with_the_simulator(verb, e, n):
    spec, p = plan("p", ZERO2, overrides=(ov("clip_norm", verb, None, ("dp",), const(e)),))
    sizes = {"dp": n, "microbatches": 1}
    clip = _ob(check_plan(SESSION, spec, p, sizes), "SC clip_norm")
    bad = len(_groups_by_hand(verb, e, n)) > 1
    assert clip.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (verb, e, n, clip.verdict)
    assert any(("clip",) in simulator.norm_violations(p, sizes, random.Random(s)) for s in range(6)) is bad
    if bad:
        assert "grad-norm² on" in clip.counterexample.equation and "= 0" in clip.counterexample.equation


# ---------------------------------------------------------------------------------------------------
# the grad norm's reduction over blocks


@pytest.mark.parametrize("axes,how", [(ZERO2, None), (ZERO2, "reduce"), (ZERO2, "max"), (DDP_TP, None)])
@pytest.mark.parametrize("b,n", list(product((1, 2), (1, 2, 3))))
def test_norm_blocks_agree_with_the_simulator_and_by_hand(axes, how, b, n):
    axis = "dp" if axes is ZERO2 else "tp"
    extra = (ov("clip_norm", how, None, (axis,)),) if how else ()
    spec, p = plan("p", axes, overrides=extra + (ov("clip_norm", "reduce_blocks", None, (axis,), const(b)),))
    sizes = {a: (n if a == axis else 2) for a in axes} | {"microbatches": 1}
    clip = _ob(check_plan(SESSION, spec, p, sizes), "SC clip_norm")
    bad = b < n or (how == "max" and n >= 2)  # a maximum over shards is wrong with or without blocks
    assert clip.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (b, n, clip.verdict, clip.reason)
    found = any(("clip",) in simulator.norm_violations(p, sizes, random.Random(s)) for s in range(6))
    assert found is bad
    if b < n and how != "max":
        assert "grad-norm² on" in clip.counterexample.equation and "= 0" in clip.counterexample.equation


# ---------------------------------------------------------------------------------------------------
# a divisor on every rank but the last, or on the last rank only


@pytest.mark.parametrize("verb", ["divide_except_last", "divide_last_only"])
@pytest.mark.parametrize("axes_named", [("pp",), ("dp", "pp")])
@pytest.mark.parametrize("dp,pp", list(product((1, 2), (1, 2, 3))))
def test_rank_set_divisors_agree_with_the_simulator_and_by_hand(verb, axes_named, dp, pp):
    spec, p = plan("p", DP_PP, overrides=(ov("grads", verb, None, axes_named, const(8)),))
    sizes = {"dp": dp, "pp": pp, "microbatches": 1}
    upd = _ob(check_plan(SESSION, spec, p, sizes), "SC update[dense]")
    apart = any({"dp": dp, "pp": pp}[a] >= 2 for a in axes_named)
    # on one rank the last rank divides too: its (the only) gradient divided beyond the step's normalisation
    bad = apart or verb == "divide_last_only"
    assert upd.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (upd.verdict, upd.reason)
    assert _sim(p, sizes, ("update", "dense")) is bad
    if bad and not apart:
        assert "-1/8 per element; single-device training's is -1" in upd.counterexample.equation
    elif bad:
        cex = upd.counterexample
        values = dict(cex.values)["coefficient applied"]
        applied, skipped = dict(cex.devices)["rank A"], dict(cex.devices)["rank B"]
        assert values == f"1/8 on {applied}, 1 on {skipped}"
        last = f"pp={pp - 1}"
        # the replayed ranks are the ones the statement names: the last one skips, or alone applies
        assert (last in skipped) if verb == "divide_except_last" else (last in applied), (applied, skipped)
        assert any(("every rank but the last" if verb == "divide_except_last" else "the last rank") in d
                   for d in cex.diagnosis)


def test_four_stages_every_stage_but_last_divides_again():
    """DeepSpeed#8152 with four stages: stages 0..2 divide again, stage 3 does not."""
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "divide_except_last", None, ("pp",), const(8)),))
    upd = _ob(check_plan(SESSION, spec, p, {"dp": 2, "pp": 4, "microbatches": 8}), "SC update[dense]")
    assert upd.verdict is Verdict.REFUTED
    assert "pp=3" in dict(upd.counterexample.devices)["rank B"]


# ---------------------------------------------------------------------------------------------------
# input errors, located


def _place(body: str, mesh: str = "dp = 4\n  tp = 2", extra: str = "") -> str:
    return (f"from std.data import ddp, zero2\nfrom std.tensor import megatron_tp\nmodel {{ params = 1e9 }}\n"
            f"mesh {{\n  {mesh}\n}}\nplan p {{\n  dp: ddp\n  tp: megatron_tp\n{extra}  {body}\n}}\n")


@pytest.mark.parametrize("body,extra,code,words", [
    ("override grads[dense]: reduce_blocks over (tp) by 2", "", "PL181", "is not reduced over tp"),
    ("override clip_norm: reduce_blocks over (dp) by 2", "", "PL182", "not reduced over dp"),
    ("override clip_norm[dense]: reduce_blocks over (tp) by 2", "", "PL182", "without a group"),
    ("override grads: reduce_blocks over (dp) by 0", "", "PL204", "is zero"),  # resolve refuses any `by 0`
    ("override grads: reduce_blocks over (dp) by 1.5", "", "PL183", "positive whole number"),
    ("override grads: reduce_blocks over (dp) by 4", "", "PL506", "holds the whole of every axis"),
    ("override grads: reduce_blocks over (dp, dp) by 2", "", "PL506", "the second time it names dp"),
    ("override grads: reduce_strided over (dp) by 1", "", "PL506", "a stride of 1 puts every rank"),
    ("override grads: reduce_strided over (dp) by 1.5", "", "PL183", "a stride of ranks is a positive whole"),
    ("override grads: reduce_first over (dp) by 4", "", "PL506", "the first 4 ranks holds the whole"),
    ("override grads[dense]: reduce_first over (tp) by 1", "", "PL181", "is not reduced over tp"),
    ("override clip_norm: reduce_strided over (dp) by 2", "", "PL182", "not reduced over dp"),
    ("override grads: reduce_first over (dp) by 2", "  override grads: reduce_strided over (dp) by 2\n", "PL194",
     "already run in strided groups of stride 2 (ranks r, r+2, r+4 ...) (line 11)"),
    ("override clip_norm: reduce_first over (dp) by 2", "  override clip_norm: reduce_blocks over (dp) by 2\n",
     "PL194", "already run in blocks of 2 consecutive ranks"),
    ("override grads: divide_except_last over (tp) by 1", "", "PL506", "division by 1"),
    ("override grads: divide_last_only by 8", "", "PL122", "needs 'over (axes...)'"),
    ("override grads: divide_last_only over () by 8", "", "PL506", "names no axis"),
])
def test_errors_are_located(tmp_path, capsys, body, extra, code, words):
    f = tmp_path / "bad.place"
    f.write_text(_place(body, extra=extra))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = f.read_text().splitlines().index("  " + body) + 1
    assert f"{f}:{line}:3: error:" in err and f"[{code}]" in err and words in err, err


def test_norm_blocks_over_a_sharded_axis_are_accepted(tmp_path, capsys):
    """ZeRO-2 shards the gradients over dp: the norm is reduced there, and blocks of 2 of 4 are refuted."""
    f = tmp_path / "ok.place"
    f.write_text(_place("override clip_norm: reduce_blocks over (dp) by 2", mesh="dp = 4\n  tp = 1").replace(
        "dp: ddp", "dp: zero2"))
    assert main(["check", str(f)]) == 1
    out = capsys.readouterr().out
    assert "refuted SC clip_norm" in out and "within blocks of 2 consecutive ranks" in out, out


def test_fmt_round_trips_the_new_verbs():
    src = ("from std.data import zero2\nfrom std.pipeline import one_f_one_b\nmodel { params = 1e9 }\n"
           "mesh { dp = 4\n pp = 4 }\nplan p {\n  dp: zero2\n  pp: one_f_one_b\n"
           "  override grads[norms]:reduce_blocks over(dp)by 2\n  override clip_norm : reduce_blocks over (dp) by 2\n"
           "  override grads:divide_except_last over(pp) by 8\n  override grads[dense]: divide_last_only over (pp)by 2\n}\n")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    for line in ("override grads[norms]: reduce_blocks over (dp) by 2", "override clip_norm: reduce_blocks over (dp) by 2",
                 "override grads: divide_except_last over (pp) by 8",
                 "override grads[dense]: divide_last_only over (pp) by 2"):
        assert line in out, out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    key = [(o.target, o.group, o.verb, o.axes) for o in a.plans[0].overrides]
    assert key == [(o.target, o.group, o.verb, o.axes) for o in b.plans[0].overrides] == [
        ("grads", "norms", "reduce_blocks", ("dp",)), ("clip_norm", None, "reduce_blocks", ("dp",)),
        ("grads", None, "divide_except_last", ("pp",)), ("grads", "dense", "divide_last_only", ("pp",))]


def test_fmt_round_trips_strided_and_first_k():
    src = ("from std.data import zero2\nmodel { params = 1e9 }\nmesh { dp = 8 }\nplan p {\n  dp: zero2\n"
           "  override grads[norms]:reduce_strided over(dp)by 2\n  override clip_norm : reduce_first over (dp) by 4\n}\n")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    assert "override grads[norms]: reduce_strided over (dp) by 2" in out and \
        "override clip_norm: reduce_first over (dp) by 4" in out, out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    key = [(o.target, o.group, o.verb, o.axes) for o in a.plans[0].overrides]
    assert key == [(o.target, o.group, o.verb, o.axes) for o in b.plans[0].overrides] == [
        ("grads", "norms", "reduce_strided", ("dp",)), ("clip_norm", None, "reduce_first", ("dp",))]


def test_other_process_groups_stay_out_of_scope_and_name_the_blocks(tmp_path, capsys):
    """`process_group` stays PL129 and points at the blocks the checker models."""
    f = tmp_path / "o.place"
    f.write_text(_place("override process_group: reduce over (dp)"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert "[PL129]" in err and "reduce_blocks" in err and f"{f}:11:3" in err, err


# ---------------------------------------------------------------------------------------------------
# random plans: roles, modes, statements, groups, axes and block sizes drawn at random


AXIS_KINDS = [("data", DDP), ("data", "R,S,S,R"), ("tensor", "S,S,S,S"), ("pipeline", "S,S,S,S")]


def _random_plan(rng: random.Random):
    from placement_logic import ir

    names = ["a", "b"][:rng.randint(1, 2)]
    axes = {n: rng.choice(AXIS_KINDS) for n in names}
    block = rng.choice([const(1), const(2), ir.Sym("a")])  # sizes 1 to 3 decide each of these
    named = tuple(rng.sample(names, rng.randint(1, len(names))))
    group = rng.choice([None, "dense", "norms", "all"])
    verb = rng.choice(["reduce_blocks", "reduce_strided", "reduce_first"])
    stmt = rng.choice([ov("grads", verb, group, named, block),
                       ov("clip_norm", verb, None, named, block),
                       ov("grads", rng.choice(["divide_except_last", "divide_last_only"]), group, named,
                          rng.choice([const(2), ir.Sym("a")]))])
    return plan("p", axes, overrides=(stmt,)), stmt


def _keys(report, stmt) -> dict:
    out = {}
    for o in report.obligations:
        if o.name.startswith("GI grads[") and o.name.endswith("] blocks"):
            out[("blocks", o.name[len("GI grads["):-len("] blocks")])] = o.verdict
        elif o.name.startswith("SC update["):
            out[("update", o.name[len("SC update["):-1])] = o.verdict
        elif o.name == "SC clip_norm" and stmt.target == "clip_norm":
            out[("clip",)] = o.verdict
    return out


@pytest.mark.parametrize("seed", range(36))
def test_random_plans_agree_with_the_simulator(seed):
    (spec, p), stmt = _random_plan(random.Random(seed))
    try:
        report = check_plan(SESSION, spec, p, {})
    except DiagnosticError:
        pytest.skip("a statement the step cannot read (a located error, tested above)")
    keys = _keys(report, stmt)
    assert keys and Verdict.UNKNOWN not in keys.values(), keys
    found: set = set()
    names = p.mesh.names
    for sizes in product((1, 2, 3), repeat=len(names)):
        for s in range(3):
            found |= simulator.violations(p, {**dict(zip(names, sizes)), "microbatches": 1}, random.Random(s),
                                          dict(spec.bindings), trials=1)
    wrong = [(k, v.word) for k, v in keys.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not wrong, (wrong, p.placements, stmt)


# ---------------------------------------------------------------------------------------------------
# generated plans: random roles and modes per axis, a group statement of any of the three kinds, and
# another statement beside it drawn from those that change the gradient or the norm; every verdict the
# checker gives against the simulator at sizes 1 to 3 (tests/test_check_simulator.py's keys)


@hs.composite
def _partition_plans(draw):
    from placement_logic import ir

    names = ["a", "b"][:draw(hs.integers(1, 2))]
    axes = {n: (draw(hs.sampled_from(("data", "tensor", "context", "pipeline"))),
                ",".join((draw(hs.sampled_from(("R", "S", "S*"))), draw(hs.sampled_from(("R", "S"))),
                          draw(hs.sampled_from(("R", "S", "M"))), "R"))) for n in names}
    named = tuple(draw(hs.lists(hs.sampled_from(names), min_size=1, max_size=2, unique=True)))
    target = draw(hs.sampled_from(["grads", "clip_norm"]))
    group = draw(hs.sampled_from([None, "dense", "norms", "all"])) if target == "grads" else None
    verb = draw(hs.sampled_from(["reduce_blocks", "reduce_strided", "reduce_first"]))
    by = draw(hs.sampled_from([const(2), ir.Sym("a")]))  # sizes 1 to 3 decide each of these
    other = draw(hs.sampled_from([(), (ov("grads", "reduce", None, tuple(names)),),
                                  (ov("clip_norm", "reduce", None, tuple(names)),),
                                  (ov("grads", "divide", None, by=ir.Sym(names[-1])),),
                                  (ov("tokens", "equal"),)]))
    return plan("p", axes, overrides=other + (ov(target, verb, group, named, by),))


@pytest.mark.slow
@settings(max_examples=examples(60), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(_partition_plans(), hs.integers(0, 10**6))
def test_generated_plans_with_groups_agree_with_the_simulator(generated, seed):
    spec, p = generated
    try:
        report = check_plan(SESSION, spec, p, {})
    except DiagnosticError:
        assume(False)  # a statement the step cannot read: a located error (tested above)
    verdicts = checker_keys(report)
    assert Verdict.UNKNOWN not in verdicts.values(), verdicts
    found = simulated(p, dict(spec.bindings), seed)
    wrong = [(k, v.word) for k, v in verdicts.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not wrong, (wrong, p.placements, p.overrides)
    assert all(k in verdicts for k in found), (found, verdicts)
