"""The grad norm's epsilon on some ranks (check.normeps, check.encode_normeps): ``override clip_norm: eps_on_ranks
over (AXES) ranks (...) by EPS``. ``SC clip_norm``'s verdicts at pinned sizes and for all sizes against the
independent simulator (tests/simulator_normeps.py through tests/simulator_norm.py) and the hand-derived answer
(a device's norm holds ε once per named device of its reduction group: right iff that count is 1), the
replayed counterexample, input errors and fmt."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import simulator
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.plan import PlanChecker
from placement_logic.check.run import DEFAULT_BOUND, discharge
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DP_TP = {"dp": ("data", "R,S,S,R"), "tp": ("tensor", "S,S,S,S")}  # ZeRO-2 x tensor parallelism: norm over both
EPS = ir.Const(Fraction(1, 1000))
LAST = ir.Op("-", (ir.Sym("tp"), ir.Const(Fraction(1))))


def _c(*ks):
    return tuple(ir.Const(Fraction(k)) for k in ks)


def _verdict(p, spec, pinned):
    checker = PlanChecker(spec, p, dict(pinned))
    ob = next(o for o in checker.obligations() if o.name == "SC clip_norm")
    return discharge(SESSION, ob, checker.step, checker.bindings, dict(pinned), DEFAULT_BOUND)


def _sim(p, sizes) -> bool:
    return any(("clip",) in simulator.violations(p, sizes, random.Random(s), trials=1) for s in range(3))


def _count(axes, ranks, sizes) -> int:
    """By hand: the named ranks of the group over ``axes`` that exist, times the norm axes it does not name."""
    n = 1
    for a in axes:
        n *= sizes[a]
    c = len({r(sizes) for r in ranks if 0 <= r(sizes) < n})
    for a in ("dp", "tp"):
        if a not in axes:
            c *= sizes[a]
    return c


CASES = [
    (("tp",), _c(0), (lambda s: 0,)),
    (("dp", "tp"), _c(0), (lambda s: 0,)),
    (("dp", "tp"), _c(0, 1), (lambda s: 0, lambda s: 1)),
    (("tp",), (LAST,), (lambda s: s["tp"] - 1,)),
    (("tp", "dp"), _c(3), (lambda s: 3,)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_eps_on_ranks_agrees_with_the_simulator_and_by_hand(case):
    axes, ranks, hand = CASES[case]
    spec, p = plan("p", DP_TP, overrides=(ov("clip_norm", "eps_on_ranks", None, axes, EPS, ranks=ranks),))
    bad_somewhere = False
    for dp, tp in ((1, 1), (1, 2), (2, 1), (2, 2), (1, 3)):
        sizes = {"dp": dp, "tp": tp, "microbatches": 1}
        bad = _count(axes, hand, sizes) != 1
        bad_somewhere |= bad
        assert _sim(p, sizes) is bad, (case, sizes)
        if (dp, tp) in ((1, 2), (2, 2)):
            r = _verdict(p, spec, sizes)
            assert r.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (case, sizes, r.verdict, r.reason)
    r = _verdict(p, spec, {})
    assert r.verdict is (Verdict.REFUTED if bad_somewhere else Verdict.PROVED), (case, r.verdict)
    if r.verdict is Verdict.REFUTED:
        sizes = dict(r.counterexample.sizes)
        k = _count(axes, hand, sizes)
        assert k != 1 and _sim(p, sizes), sizes
        assert f"S + {k}·ε" in r.counterexample.equation, r.counterexample.equation


SPEC = """from std.data import {dp}
from std.tensor import megatron_tp

model {{
  transformer {{
    hidden = 256
    layers = 4
    heads = 4
    ffn = 512
    vocab = 1000
  }}
  seq = 128
  microbatch = 1
  microbatches = 2
}}

mesh {{
  dp = 2
  tp = 2
}}

plan p {{
  dp: {dp}
  tp: megatron_tp
  {line}
}}
"""


@pytest.mark.parametrize("dp,line,code,words", [
    ("zero2", "override clip_norm: eps_on_ranks over (tp) ranks (0, 0) by 1e-6", "PL506", "second time"),
    ("zero2", "override clip_norm: eps_on_ranks over (tp) ranks (0) by 0", "PL506", "the epsilon is 0"),
    ("zero2", "override clip_norm[dense]: eps_on_ranks over (tp) ranks (0) by 1e-6", "PL506", "without a group"),
    ("zero2", "override clip_norm: eps_on_ranks over (tp) ranks (2) by 1e-6", "PL191", "not a rank of tp"),
    ("zero2", "override clip_norm: eps_on_ranks over (tp) by 1e-6", "PL122", "needs 'ranks"),
    ("zero2", "override clip_norm: eps_on_ranks over (tp) ranks (0)", "PL122", "needs 'by <epsilon>'"),
    ("zero2", "override clip_norm: eps_on_ranks over (tp) ranks (0) by 1e-6\n  override clip_norm: eps_before_reduce "
     "by 1e-6", "PL122", "stated twice"),
    ("zero1", "override clip_norm: eps_on_ranks over (dp) ranks (0) by 1e-6", "PL170", "not summed over (dp)"),
    ("zero2", "override clip_norm: average over (dp, tp)\n  override clip_norm: eps_on_ranks over (tp) ranks (0) by "
     "1e-6", "PL129", "not modelled"),
])
def test_eps_on_ranks_input_errors_are_located(tmp_path, capsys, dp, line, code, words):
    f = tmp_path / "s.place"
    f.write_text(SPEC.format(dp=dp, line=line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err and "s.place:" in err, err


def test_eps_on_ranks_round_trips_through_fmt():
    src = SPEC.format(dp="zero2", line="override clip_norm:eps_on_ranks over ( dp,tp ) ranks (0) by 1e-6")
    out = format_source(src, "s.place")
    assert "  override clip_norm: eps_on_ranks over (dp, tp) ranks (0) by 1e-6\n" in out, out
    assert format_source(out, "s.place") == out
    a, b = (load_string(t, "s.place").plans[0].overrides for t in (src, out))
    assert [(o.verb, o.axes, tuple(map(ir.show, o.ranks)), ir.show(o.by)) for o in a] == \
        [(o.verb, o.axes, tuple(map(ir.show, o.ranks)), ir.show(o.by)) for o in b]
