"""A clip coefficient or a divisor on a set of one axis's ranks (check.rankset: ``grads[g]:
clip_on_ranks / divide_on_ranks over (AXIS) ranks (R1, ...)``). The checker's verdicts at pinned
sizes against the independent simulator (tests/simulator_rankset.py) and the hand-derived answer
(the named ranks that exist at size n, {r : r a whole number, 0 <= r < n}, split the axis iff they
are neither none nor all of 0 .. n-1), the counterexample naming the ranks, the for-all verdict
over every size, located input errors (PL191, PL192, PL184, PL506, PL122) and fmt."""

from __future__ import annotations

import io
import random
from fractions import Fraction
from itertools import product
from pathlib import Path

import pytest
import simulator
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
ROOT = Path(__file__).resolve().parent.parent
DP = {"dp": ("data", "R,R,R,R")}
DP_PP = {"dp": ("data", "R,R,R,R"), "pp": ("pipeline", "S,S,S,S")}
LAST = ir.Op("-", (ir.Sym("pp"), ir.Const(Fraction(1))))


def _c(*ks):
    return tuple(ir.Const(Fraction(k)) for k in ks)


def _ob(report, name):
    return next(o for o in report.obligations if o.name == name)


def _sim(p, sizes, key, seeds=6) -> bool:
    return any(key in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(seeds))


def _splits(ranks: tuple[int, ...], n: int) -> bool:
    """By hand: the named ranks present at size n are some of 0 .. n-1 but not all."""
    on = {r for r in ranks if 0 <= r < n}
    return bool(on) and len(on) < n


def _divides(ranks: tuple[int, ...], n: int) -> bool:
    """By hand: some rank of 0 .. n-1 is named, so it divides its gradient by a divisor beyond the step's own
    normalisation (on some ranks: the ranks disagree; on every rank: the update is a fraction of single-device's)."""
    return any(0 <= r < n for r in ranks)


@pytest.mark.parametrize("ranks,n", list(product([(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2), (3,)], (1, 2, 3, 4))))
def test_divisor_on_ranks_agrees_with_the_simulator_and_by_hand(ranks, n):
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "divide_on_ranks", None, ("pp",), ir.Const(Fraction(4)),
                                             ranks=_c(*ranks)),))
    sizes = {"dp": 2, "pp": n, "microbatches": 1}
    ob = _ob(check_plan(SESSION, spec, p, sizes), "SC update[dense]")
    bad = _divides(ranks, n)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (ranks, n, ob.verdict)
    assert _sim(p, sizes, ("update", "dense")) is bad
    if bad and not _splits(ranks, n):  # every rank divides by 4: one rank's update against single-device's
        cex = ob.counterexample
        assert "-1/4 per element; single-device training's is -1" in cex.equation, cex.equation
        assert "beyond the step's own normalisation" in cex.diagnosis[0]
    elif bad:
        cex = ob.counterexample
        first = min(r for r in ranks if r < n)
        off = min(k for k in range(n) if k not in ranks)
        assert dict(cex.devices)[f"pp rank {first} (named)"] == f"(dp=0, pp={first})", cex.devices
        assert f"pp rank {off} (not named)" in dict(cex.devices), cex.devices
        assert "1/4 on (dp=0, pp=%d), 1 on (dp=0, pp=%d)" % (first, off) in dict(cex.values)["coefficient applied"]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_clip_named_on_no_rank_is_refuted(n):
    """ranks (3) at dp = n <= 3 names no rank: nobody clips, where single-device training clips."""
    spec, p = plan("p", DP, overrides=(ov("grads", "clip_on_ranks", None, ("dp",), ranks=_c(3)),))
    sizes = {"dp": n, "microbatches": 1}
    ob = _ob(check_plan(SESSION, spec, p, sizes), "SC update[dense]")
    assert ob.verdict is Verdict.REFUTED and _sim(p, sizes, ("update", "dense"))
    assert "no rank clips" in ob.counterexample.diagnosis[0], ob.counterexample.diagnosis


@pytest.mark.parametrize("n", [1, 2, 3])
def test_clip_on_the_last_rank_by_expression(n):
    """ranks (pp - 1): the last stage, at every size; one rank of n >= 2 splits the axis."""
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "clip_on_ranks", "norms", ("pp",), ranks=(LAST,)),))
    sizes = {"dp": 1, "pp": n, "microbatches": 1}
    ob = _ob(check_plan(SESSION, spec, p, sizes), "SC update[norms]")
    assert ob.verdict is (Verdict.REFUTED if n >= 2 else Verdict.PROVED), ob.verdict
    assert _sim(p, sizes, ("update", "norms")) is (n >= 2)


def test_every_size_is_checked_not_only_the_files():
    """ranks (0, 1, 2) at pp = 3 is every stage; at pp = 4 stage 3 is left out: refuted for all sizes,
    with a witness of at least 4 stages."""
    spec, p = plan("p", DP_PP, overrides=(ov("grads", "divide_on_ranks", None, ("pp",), ir.Const(Fraction(2)),
                                             ranks=_c(0, 1, 2)),))
    ob = _ob(check_plan(SESSION, spec, p, {}), "SC update[dense]")
    assert ob.verdict is Verdict.REFUTED
    sizes = dict(ob.counterexample.sizes)
    assert int(sizes["pp"]) >= 4, sizes
    assert not _splits((0, 1, 2), 3) and _splits((0, 1, 2), 4)


def test_rank_zero_is_the_rank0_verb():
    """ranks (0) over one axis and divide_rank0_only over it: the same verdicts at every pinned size."""
    for n in (1, 2, 3):
        sizes = {"dp": n, "microbatches": 1}
        got = []
        for o in (ov("grads", "divide_on_ranks", None, ("dp",), ir.Const(Fraction(3)), ranks=_c(0)),
                  ov("grads", "divide_rank0_only", None, ("dp",), ir.Const(Fraction(3)))):
            spec, p = plan("p", DP, overrides=(o,))
            got.append(_ob(check_plan(SESSION, spec, p, sizes), "SC update[dense]").verdict)
        # on one rank too: rank 0 divides its (the only) gradient by 3, a division single-device training lacks
        assert got[0] is got[1] is Verdict.REFUTED


def _place(line: str, mesh: str = "dp = 4\n  pp = 4") -> str:
    return ("from std.data import ddp\nfrom std.pipeline import one_f_one_b\n\nmodel {\n  params = 1e9\n"
            f"  microbatches = 4\n}}\n\nmesh {{\n  {mesh}\n}}\n\nplan p {{\n  dp: ddp\n  pp: one_f_one_b\n"
            f"  {line}\n}}\n")


@pytest.mark.parametrize("line,code,words", [
    ("override grads: divide_on_ranks over (pp) ranks (4) by 2", "PL191", "rank 4 is not a rank of pp of 4 ranks"),
    ("override grads: clip_on_ranks over (dp) ranks (1/2)", "PL191", "is not a rank of dp"),
    ("override grads: clip_on_ranks over (dp) ranks (pp - 5)", "PL191", "rank pp - 5 = -1 is not a rank"),
    ("override clip_norm: count_on_ranks over () ranks (1)", "PL192", "it names none here"),
    # a negative literal is shown once, not as an expression equal to itself
    ("override grads: clip_on_ranks over (dp) ranks (-1)", "PL191", "rank -1 is not a rank of dp of 4 ranks"),
    ("override grads: clip_on_ranks over (dp, pp) ranks (-1)", "PL191", "rank -1 is not a rank of (dp, pp) of 16"),
    ("override grads: divide_on_ranks over (dp, pp) ranks (16) by 2", "PL191",
     "rank 16 is not a rank of (dp, pp) of 16 ranks (its ranks are 0 .. dp * pp - 1)"),
    ("override grads: divide_on_ranks over (pp) ranks (1, 1) by 2", "PL506", "second time it names rank 1"),
    ("override grads: divide_on_ranks over (pp) ranks (1) by 1", "PL506", "division by 1"),
    ("override grads: divide_on_ranks over (pp) by 2", "PL122", "needs 'ranks (R1, R2, ...)'"),
    ("override grads: divide_rank0_only over (pp) ranks (1) by 2", "PL122", "takes no 'ranks' clause"),
])
def test_errors_are_located(tmp_path, capsys, line, code, words):
    f = tmp_path / "bad.place"
    f.write_text(_place(line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    n = f.read_text().splitlines().index("  " + line) + 1
    assert f"{f}:{n}:3: error:" in err and f"[{code}]" in err and words in err, err
    assert "-1 = -1" not in err, err


def test_two_divisors_on_rank_sets_of_two_axes_are_multiplied(tmp_path, capsys):
    """The last dp rank and pp rank 0 each halve: (dp last, pp 0) divides by 4, (dp 0, pp 1) by nothing at dp, pp
    >= 2 (check.encode_rankproduct_axes): two devices step apart."""
    f = tmp_path / "bad.place"
    f.write_text(_place("override grads: divide_last_only over (dp) by 2\n"
                        "  override grads: divide_on_ranks over (pp) ranks (0) by 2"))
    assert main(["check", str(f)]) == 1
    out = capsys.readouterr().out
    assert "refuted SC update[dense]" in out and "divisors on sets of ranks of different axes" in out, out


def test_fmt_round_trips_the_ranks_clause():
    src = _place("override grads[norms]:divide_on_ranks over(pp)ranks(0,pp-1)by 2\n"
                 "  override grads : clip_on_ranks over (dp) ranks ( 2 )")
    out = format_source(src, "s.place")
    assert "override grads[norms]: divide_on_ranks over (pp) ranks (0, pp - 1) by 2" in out, out
    assert "override grads: clip_on_ranks over (dp) ranks (2)" in out, out
    assert format_source(out, "s.place") == out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    oa, ob = (s.plans[0].overrides for s in (a, b))
    assert [(o.verb, o.axes, o.ranks, o.by) for o in oa] == [(o.verb, o.axes, o.ranks, o.by) for o in ob]
    assert [ir.show(r) for r in oa[0].ranks] == ["0", "pp - 1"]


def test_inspect_shows_the_ranks(tmp_path, capsys):
    """The resolved plan's overrides, as `placement inspect` lists them, keep the rank set."""
    from placement_logic.ir.summary import _override_text

    spec = load_string(_place("override grads: divide_on_ranks over (pp) ranks (0, pp - 1) by 2"), "s.place")
    assert _override_text(spec.plans[0].overrides[0]) == "grads: divide_on_ranks over (pp) ranks (0, pp - 1) by 2"


@pytest.mark.parametrize("k,code", [(9, 2), (3, 1)])
def test_a_rank_from_a_let_binding(tmp_path, capsys, k, code):
    """ranks (k) with let k = 9 over dp = 4 is located (PL191, at resolve); k = 3 is read (the last rank), and its
    witness is a size where some rank is not named."""
    f = tmp_path / "k.place"
    f.write_text(_place("override grads: clip_on_ranks over (dp) ranks (k)").replace("model {", f"let k = {k}\n\nmodel {{"))
    assert main(["check", str(f)]) == code
    captured = capsys.readouterr()
    if code == 2:
        assert "[PL191]" in captured.err and "rank k = 9 is not a rank of dp of 4 ranks" in captured.err, captured.err
    else:
        assert "refuted SC update[dense]" in captured.out and "(not named)" in captured.out, captured.out


def test_a_rank_set_moves_no_bytes():
    """A clip or a divisor on some ranks is local arithmetic: the bug and its fix cost the same, line for line
    (only the file and plan names differ)."""
    texts = []
    for path in ("examples/bugs/pipe_three_stages_rescaled_ranks.place", "examples/safe/pipe_three_stages_scaled_once.place"):
        out = io.StringIO()
        assert main(["cost", str(ROOT / path)], out=out, err=io.StringIO()) == 0
        texts.append([x for x in out.getvalue().splitlines() if ".place" not in x and not x.startswith("plan ")])
    assert texts[0] == texts[1] and len(texts[0]) > 10
