"""A loss term on some ranks (check.termranks, check.encode_termranks): ``override loss[T]: on_ranks over (AXES)
ranks (...)`` and ``divide_on_ranks ... by X``. The checker's verdicts on ``GI loss[T] grads[g]`` at pinned sizes
and for all sizes against the independent simulator (tests/simulator_termranks.py through
tests/simulator_losses.py) and the hand-derived answer (every device weights its own contributions by the
statements' factor; right iff every factor is 1, or every device divides by X and the path's divisor times X is
the objective's), the replayed counterexamples, the bug specs' counterexamples re-run in the simulator, input
errors and fmt."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction
from itertools import product

import pytest
import simulator_losses
from corpus import ROOT
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.plan import PlanChecker
from placement_logic.check.run import DEFAULT_BOUND, discharge
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP = "R,R,R,R"
DP_PP = {"dp": ("data", DDP), "pp": ("pipeline", "S,S,S,S")}
DP_TP = {"dp": ("data", DDP), "tp": ("tensor", "S,S,S,S")}
DP_EP = {"dp": ("data", DDP), "ep": ("expert", "S,S,S,R")}
LAST = ir.Op("-", (ir.Sym("pp"), ir.Const(Fraction(1))))


def _c(*ks):
    return tuple(ir.Const(Fraction(k)) for k in ks)


def _plan(axes, term, overrides, sp=False):
    spec, p = plan("p", axes, sp=sp, overrides=overrides, experts=4)
    model = replace(p.model, loss_terms=((term, "per_microbatch_mean", p.span),))
    p = replace(p, model=model)
    return replace(spec, model=model, plans=(p,)), p


def _verdict(spec, p, term, pinned):
    checker = PlanChecker(spec, p, dict(pinned))
    ob = next(o for o in checker.obligations() if o.name == f"GI loss[{term}] grads[router]")
    return discharge(SESSION, ob, checker.step, checker.bindings, dict(pinned), DEFAULT_BOUND)


def _sim(p, term, sizes) -> bool:
    rng = random.Random(3)
    return any(("term", term, "router") in simulator_losses.term_violations(p, sizes, rng, {}) for _ in range(3))


def _weights(stmts, sizes) -> list[Fraction]:
    """By hand: every device's factor on its own contributions. A statement is (verb, axes, ranks as functions of
    the sizes, X): the device's rank in the group over its axes is its coordinates there, first axis most
    significant."""
    out = []
    axes = list(sizes)
    for dev in product(*[range(sizes[a]) for a in axes]):
        c = dict(zip(axes, dev))
        f = Fraction(1)
        for verb, on_axes, ranks, x in stmts:
            k, n = 0, 1
            for a in on_axes:
                k, n = k * sizes[a] + c[a], n * sizes[a]
            named = k in {r(sizes) for r in ranks if 0 <= r(sizes) < n}
            if verb == "on_ranks" and not named:
                f = Fraction(0)
            elif verb == "divide_on_ranks" and named:
                f /= x(sizes)
        out.append(f)
    return out


# (axes, term, sp, statements by hand, path divisor missing m (divide by dp·ep only), overrides)
ONE, LASTF = (lambda s: 0), (lambda s: s["pp"] - 1)
CASES = [
    (DP_PP, "aux", False, [("on_ranks", ("pp",), (LASTF,), None)], False,
     (ov("loss", "on_ranks", "aux", ("pp",), ranks=(LAST,)),)),
    (DP_PP, "aux", False, [("on_ranks", ("pp",), (ONE, LASTF), None)], False,
     (ov("loss", "on_ranks", "aux", ("pp",), ranks=(ir.Const(Fraction(0)), LAST)),)),
    (DP_PP, "aux", False, [("on_ranks", ("dp", "pp"), (ONE, lambda s: 1), None)], False,
     (ov("loss", "on_ranks", "aux", ("dp", "pp"), ranks=_c(0, 1)),)),
    (DP_TP, "z", True, [("on_ranks", ("tp",), (ONE,), None)], False,
     (ov("loss", "on_ranks", "z", ("tp",), ranks=_c(0)),)),
    (DP_PP, "aux", False, [("divide_on_ranks", ("pp",), (LASTF,), lambda s: 2)], False,
     (ov("loss", "divide_on_ranks", "aux", ("pp",), ir.Const(Fraction(2)), ranks=(LAST,)),)),
    (DP_PP, "aux", False, [("divide_on_ranks", ("pp",), (LASTF,), lambda s: 2)], True,
     (ov("loss", "divide", "aux", by=ir.Sym("dp")),
      ov("loss", "divide_on_ranks", "aux", ("pp",), ir.Const(Fraction(2)), ranks=(LAST,)))),
    (DP_PP, "aux", False, [("on_ranks", ("pp",), (LASTF,), None),
                           ("divide_on_ranks", ("dp",), (ONE,), lambda s: 2)], False,
     (ov("loss", "on_ranks", "aux", ("pp",), ranks=(LAST,)),
      ov("loss", "divide_on_ranks", "aux", ("dp",), ir.Const(Fraction(2)), ranks=_c(0)))),
]
SIZES = [{"dp": dp, "x": n, "microbatches": mb} for dp, n, mb in ((1, 1, 1), (1, 1, 2), (2, 1, 1), (1, 2, 1),
                                                                   (2, 2, 2), (1, 3, 1))]


def _ok(stmts, missing_m, sizes) -> bool:
    """By hand: right iff every factor is 1 with the path as derived, or every factor is 1/m where the path
    lacks the 1/m of the microbatches."""
    ws = set(_weights(stmts, sizes))
    want = Fraction(1, sizes["microbatches"]) if missing_m else Fraction(1)
    return ws == {want}


@pytest.mark.parametrize("case", range(len(CASES)))
def test_term_on_ranks_agrees_with_the_simulator_and_by_hand(case):
    axes, term, sp, stmts, missing_m, overrides = CASES[case]
    spec, p = _plan(axes, term, overrides, sp)
    other = [a for a in axes if a != "dp"][0]
    bad_somewhere = False
    for s in SIZES:
        sizes = {"dp": s["dp"], other: s["x"], "microbatches": s["microbatches"]}
        ok = _ok(stmts, missing_m, sizes)
        bad_somewhere |= not ok
        assert _sim(p, term, sizes) is (not ok), (case, sizes)
        if s in (SIZES[0], SIZES[3], SIZES[4]):  # the checker at pinned sizes, where a query is cheap
            r = _verdict(spec, p, term, sizes)
            assert r.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (case, sizes, r.verdict, r.reason)
    r = _verdict(spec, p, term, {})
    assert r.verdict is (Verdict.REFUTED if bad_somewhere else Verdict.PROVED), (case, r.verdict)
    if r.verdict is Verdict.REFUTED:  # the replayed sizes show the violation in the simulator too
        sizes = dict(r.counterexample.sizes)
        assert _sim(p, term, sizes), sizes
        assert not _ok(stmts, missing_m, {k: v for k, v in sizes.items()}), sizes
        assert r.counterexample.diagnosis


def test_a_term_dropped_on_a_rank_names_the_device_and_its_weight():
    spec, p = _plan(DP_PP, "aux", (ov("loss", "on_ranks", "aux", ("pp",), ranks=(LAST,)),))
    r = _verdict(spec, p, "aux", {"dp": 1, "pp": 3, "microbatches": 1})
    assert r.verdict is Verdict.REFUTED
    cex = r.counterexample
    (label, dev), = cex.devices
    coords = dict(x.split("=") for x in dev.strip("()").split(", "))
    assert int(coords["pp"]) in (0, 1), dev  # a stage other than the last: weight 0 by hand
    assert f"0 on {dev}" in dict(cex.values)["weights applied"]
    assert "is not named, so its aux contributions are dropped" in cex.diagnosis[0]


def test_a_divisor_on_every_rank_at_one_stage_is_the_paths_divisor_times_x():
    """`ranks (pp - 1) by 2` with a path missing 1/m: right at pp = 1 with m = 2 (every device divides by 2), wrong
    at pp = 2."""
    spec, p = _plan(DP_PP, "aux", CASES[5][5])
    assert _verdict(spec, p, "aux", {"dp": 2, "pp": 1, "microbatches": 2}).verdict is Verdict.PROVED
    r = _verdict(spec, p, "aux", {"dp": 1, "pp": 2, "microbatches": 2})
    assert r.verdict is Verdict.REFUTED
    assert "1/2 on" in dict(r.counterexample.values)["weights applied"]


BUGS = ["moe_aux_loss_last_stage_only", "moe_aux_loss_scaled_last_stage_only", "moe_z_loss_tp_rank0_only"]


@pytest.mark.parametrize("name", BUGS)
def test_term_on_ranks_bugs_are_violations_in_the_simulator_and_the_fixes_are_not(name):
    bug = load_spec(ROOT / "examples" / "bugs" / f"{name}.place")
    from placement_logic.check.run import check_plan

    report = check_plan(SESSION, bug, bug.plans[0], {})
    ob = next(o for o in report.obligations if o.verdict is Verdict.REFUTED and " grads[router]" in o.name)
    sizes = dict(ob.counterexample.sizes)
    rng = random.Random(1)
    term = ob.name.split("[")[1].split("]")[0]
    assert ("term", term, "router") in simulator_losses.term_violations(bug.plans[0], sizes, rng, dict(bug.bindings))
    fixed = load_spec(ROOT / "examples" / "safe" / f"{name}.place")
    for n in (1, 2, 3):
        small = {a: (n if a in ("pp", "tp") else 1) for a in fixed.plans[0].mesh.names}
        small["microbatches"] = 2
        assert not simulator_losses.term_violations(fixed.plans[0], small, rng, dict(fixed.bindings)), small


SPEC = """from std.data import ddp
from std.expert import expert_parallel
from std.pipeline import one_f_one_b

model {{
  transformer {{
    hidden = 256
    layers = 4
    heads = 4
    ffn = 512
    vocab = 1000
    experts = 4
    top_k = 2
  }}
  seq = 128
  microbatch = 1
  microbatches = 2
  losses {{
    aux = per_microbatch_mean
  }}
}}

mesh {{
  dp = 2
  ep = 2
  pp = 2
}}

plan p {{
  dp: ddp
  ep: expert_parallel
  pp: one_f_one_b
  {line}
}}
"""


@pytest.mark.parametrize("line,code,words", [
    ("override loss[aux]: divide_on_ranks over (pp) ranks (0, 1) by 2", "PL280", "divide by 2"),
    ("override loss[aux]: on_ranks over (pp) ranks (1)\n  override loss[aux]: on_ranks over (pp) ranks (0)", "PL281",
     "one per verb"),
    ("override loss[aux]: on_ranks over (pp) ranks (0, 1)", "PL506", "names every rank"),
    ("override loss[aux]: on_ranks over (pp) ranks (0, 0)", "PL506", "second time"),
    ("override loss[aux]: divide_on_ranks over (pp) ranks (0) by 1", "PL506", "division by 1"),
    ("override loss[aux]: on_ranks over (pp) ranks (2)", "PL191", "not a rank of pp"),
    ("override loss[aux]: on_ranks over (pp)", "PL122", "needs 'ranks"),
    ("override loss[aux]: divide_on_ranks over (pp) ranks (0)", "PL122", "needs 'by"),
    ("override loss: on_ranks over (pp) ranks (0)", "PL122", "applies to a loss term"),
    ("override loss[aux]: global_mean ranks (0)", "PL122", "takes no"),
])
def test_term_on_ranks_input_errors_are_located(tmp_path, capsys, line, code, words):
    f = tmp_path / "s.place"
    f.write_text(SPEC.format(line=line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err and "s.place:" in err, err


def test_term_on_ranks_round_trips_through_fmt():
    src = SPEC.format(line="override loss[aux]:on_ranks over ( pp ) ranks (pp-1)\n"
                           "  override loss[aux]: divide_on_ranks over (dp,pp) ranks (0 , 3) by 2")
    out = format_source(src, "s.place")
    assert "  override loss[aux]: on_ranks over (pp) ranks (pp - 1)\n" in out, out
    assert "  override loss[aux]: divide_on_ranks over (dp, pp) ranks (0, 3) by 2\n" in out, out
    assert format_source(out, "s.place") == out
    a, b = (load_string(t, "s.place").plans[0].overrides for t in (src, out))
    assert [(o.verb, o.axes, tuple(map(ir.show, o.ranks)), o.by and ir.show(o.by)) for o in a] == \
        [(o.verb, o.axes, tuple(map(ir.show, o.ranks)), o.by and ir.show(o.by)) for o in b]
    assert len(a) == 2


def test_random_rank_sets_agree_with_the_simulator_and_by_hand():
    """Random `on_ranks` / `divide_on_ranks` statements over pp, dp or both (ranks as numbers or `pp - 1`), at pinned
    sizes: the checker's verdict, the simulator's and the hand-derived one agree."""
    rng = random.Random(25)
    for _ in range(6):
        verb = rng.choice(["on_ranks", "divide_on_ranks"])
        axes = rng.choice([("pp",), ("dp",), ("dp", "pp")])
        nums = sorted(rng.sample(range(4), rng.randint(1, 2)))
        ranks = _c(*nums) + ((LAST,) if axes == ("pp",) and rng.random() < 0.5 else ())
        hand = tuple((lambda s, k=k: k) for k in nums) + ((LASTF,) if len(ranks) > len(nums) else ())
        by = ir.Const(Fraction(2)) if verb == "divide_on_ranks" else None
        stmts = [(verb, axes, hand, (lambda s: 2) if by is not None else None)]
        spec, p = _plan(DP_PP, "aux", (ov("loss", verb, "aux", axes, by, ranks=ranks),))
        sizes = {"dp": rng.randint(1, 2), "pp": rng.randint(1, 3), "microbatches": 1}
        ok = _ok(stmts, False, sizes)
        assert _sim(p, "aux", sizes) is (not ok), (verb, axes, nums, sizes)
        r = _verdict(spec, p, "aux", sizes)
        assert r.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (verb, axes, nums, sizes, r.verdict)
