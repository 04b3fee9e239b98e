"""A group's squared norm counted on a set of one axis's ranks (check.rankcount: ``clip_norm[g]:
count_on_ranks over (AXIS) ranks (R1, ...)``). The checker's SC clip_norm at pinned sizes against the
independent simulator (tests/simulator.py with tests/simulator_rankset.py) and the hand-derived answer
(the named ranks that exist at size n, {r : r a whole number, 0 <= r < n}: a group sharded over the axis
is counted right iff they are all of 0 .. n-1, a replicated one iff there is exactly one), the
counterexample naming the dropped ranks, rank0_only as ranks (0), the for-all verdicts, located input
errors (PL259, PL260, PL192, PL170, PL129, PL506, PL191, PL122) and fmt."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DDP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}  # dense sharded over tp, norms replicated
LAST = ir.Op("-", (ir.Sym("tp"), ir.Const(Fraction(1))))


def _c(*ks):
    return tuple(ir.Const(Fraction(k)) for k in ks)


def _clip(report):
    return next(o for o in report.obligations if o.name == "SC clip_norm")


def _sim(p, sizes, seeds=8) -> bool:
    return any(("clip",) in simulator.norm_violations(p, sizes, random.Random(s)) for s in range(seeds))


def _right(ranks: tuple[int, ...], n: int, sharded: bool) -> bool:
    """By hand: which ranks the set names at size n, and whether that counts the group once."""
    on = {r for r in ranks if 0 <= r < n}
    return len(on) == n if sharded else len(on) == 1


# (norms, ranks (0)) is the derived duplicate filter: PL506, below
@pytest.mark.parametrize("group,ranks,n", [(g, r, n) for g, r, n in product(
    ("dense", "norms"), [(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)], (1, 2, 3)) if (g, r) != ("norms", (0,))])
def test_count_on_ranks_agrees_with_the_simulator_and_by_hand(group, ranks, n):
    spec, p = plan("p", DDP_TP, overrides=(ov("clip_norm", "count_on_ranks", group, ("tp",), ranks=_c(*ranks)),))
    sizes = {"dp": 2, "tp": n, "microbatches": 1}
    ok = _right(ranks, n, group == "dense")
    ob = _clip(check_plan(SESSION, spec, p, sizes))
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (group, ranks, n, ob.verdict)
    assert _sim(p, sizes) is (not ok)
    if not ok:
        why = " ".join(ob.counterexample.diagnosis)
        on = [r for r in ranks if r < n]
        if group == "dense":
            lost = ", ".join(str(k) for k in range(n) if k not in ranks)
            assert f"the squared norms of the pieces on tp rank{'s' if n - len(on) > 1 else ''} {lost} are dropped" \
                in why, why
        else:
            assert (f"{len(on)} of its copies are counted" if on else "it is not counted") in why, why


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_rank0_only_is_ranks_zero(n):
    """rank0_only over (tp) and count_on_ranks over (tp) ranks (0): the same verdict at every pinned size."""
    sizes = {"dp": 2, "tp": n, "microbatches": 1}
    got = []
    for o in (ov("clip_norm", "rank0_only", "dense", ("tp",)),
              ov("clip_norm", "count_on_ranks", "dense", ("tp",), ranks=_c(0))):
        spec, p = plan("p", DDP_TP, overrides=(o,))
        got.append(_clip(check_plan(SESSION, spec, p, sizes)).verdict)
    assert got[0] is got[1] is (Verdict.REFUTED if n >= 2 else Verdict.PROVED)


@pytest.mark.parametrize("group,ranks,ok", [
    ("norms", (LAST,), True),  # one copy, on the last tensor rank, at every size
    ("norms", _c(0, 1), False),  # two copies at tp >= 2
    ("norms", _c(1), False),  # no copy at tp = 1
    ("dense", (ir.Const(Fraction(0)), LAST), False),  # tp = 3 drops rank 1's piece
    ("dense", _c(0), False),
])
def test_for_all_verdicts(group, ranks, ok):
    spec, p = plan("p", DDP_TP, overrides=(ov("clip_norm", "count_on_ranks", group, ("tp",), ranks=ranks),))
    ob = _clip(check_plan(SESSION, spec, p, {}))
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), ob
    if not ok:
        n = dict(ob.counterexample.sizes)["tp"]
        on = {r for r in (int(ir.show(r)) if isinstance(r, ir.Const) else n - 1 for r in ranks) if r < n}
        assert not _right(tuple(on), n, group == "dense")  # the witness size is one where the count is wrong
        assert _sim(p, {"dp": dict(ob.counterexample.sizes)["dp"], "tp": n, "microbatches": 1})


@pytest.mark.parametrize("ranks", [(ir.Sym("tp"),), (ir.Op("+", (ir.Sym("tp"), ir.Sym("dp"))),),
                                   (ir.Op("-", (ir.Sym("dp"), ir.Op("+", (ir.Sym("dp"), ir.Const(Fraction(1)))))),),
                                   (ir.Op("/", (ir.Sym("tp"), ir.Const(Fraction(2)))), ir.Op("+", (ir.Sym("tp"), ir.Const(Fraction(1)))))])
def test_a_rank_of_no_size_is_pl259(ranks):
    """tp, tp + dp and dp - (dp + 1) are ranks of tp at no size (a whole number in [0, tp)); tp / 2 is (tp = 2:
    rank 1), tp + 1 is not (a number out of range: PL191, below)."""
    spec, p = plan("p", DDP_TP, overrides=(ov("clip_norm", "count_on_ranks", "norms", ("tp",), ranks=ranks),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == "PL259" and "at no size tp can take" in d.message, d.message
    assert f"rank {ir.show(ranks[-1])} is a rank of tp at no size" in d.message, d.message


def test_a_rank_of_some_size_is_read():
    """tp - 2 is a rank of tp from tp = 3 on: no PL259; at tp = 2 it names none of the replicated copies."""
    spec, p = plan("p", DDP_TP, overrides=(ov("clip_norm", "count_on_ranks", "norms", ("tp",),
                                              ranks=(ir.Op("-", (ir.Sym("tp"), ir.Const(Fraction(2)))),)),))
    assert _clip(check_plan(SESSION, spec, p, {})).verdict is Verdict.REFUTED


@pytest.mark.parametrize("overrides,code,words", [
    ((ov("clip_norm", "count_on_ranks", "norms", (), ranks=_c(0)),), "PL192", "it names none here"),
    ((ov("clip_norm", "count_on_ranks", "norms", ("tp",), ranks=_c(-1)),), "PL191", "rank -1 is not a rank of tp"),
    ((ov("clip_norm", "count_on_ranks", "dense", ("tp",), ranks=_c(1)),
      ov("clip_norm", "rank0_only", "dense", ("tp",))), "PL260", "state one rank set per axis"),
    ((ov("clip_norm", "reduce", "dense", ("dp",)), ov("clip_norm", "count_on_ranks", "dense", ("tp",), ranks=_c(1))),
     "PL170", "not summed over tp"),
    ((ov("clip_norm", "max", "dense", ("tp",)), ov("clip_norm", "count_on_ranks", "dense", ("tp",), ranks=_c(1))),
     "PL129", "plain sum of squared norms"),
    ((ov("clip_norm", "count_on_ranks", "norms", ("tp",), ranks=_c(0)),), "PL506", "counted on rank 0 already"),
    ((ov("clip_norm", "count_on_ranks", "dense", ("tp",), ranks=_c(1, 1)),), "PL506", "second time it names rank 1"),
])
def test_statements_the_step_cannot_read(overrides, code, words):
    spec, p = plan("p", DDP_TP, overrides=overrides)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == code and words in d.message, (d.code, d.message)


def _place(line: str) -> str:
    return ("from std.data import ddp\nfrom std.tensor import megatron_tp\n\nmodel {\n  params = 1e9\n}\n\n"
            f"mesh {{\n  dp = 4\n  tp = 4\n}}\n\nplan p {{\n  dp: ddp\n  tp: megatron_tp\n  {line}\n}}\n")


@pytest.mark.parametrize("line,code,words", [
    ("override clip_norm[norms]: count_on_ranks over (tp) ranks (4)", "PL191", "rank 4 is not a rank of tp of 4 ranks"),
    ("override clip_norm[norms]: count_on_ranks over (tp)", "PL122", "needs 'ranks (R1, R2, ...)'"),
    ("override clip_norm[norms]: rank0_only over (tp) ranks (1)", "PL122", "takes no 'ranks' clause"),
])
def test_file_errors_are_located(tmp_path, capsys, line, code, words):
    f = tmp_path / "bad.place"
    f.write_text(_place(line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    n = f.read_text().splitlines().index("  " + line) + 1
    assert f"{f}:{n}:3: error:" in err and f"[{code}]" in err and words in err, err


def test_fmt_round_trips_the_count():
    src = _place("override clip_norm[norms]:count_on_ranks over(tp)ranks( tp-1 )")
    out = format_source(src, "s.place")
    assert "override clip_norm[norms]: count_on_ranks over (tp) ranks (tp - 1)" in out, out
    assert format_source(out, "s.place") == out
    a, b = (load_string(x, "s.place").plans[0].overrides[0] for x in (src, out))
    assert (a.target, a.group, a.verb, a.axes, a.ranks) == (b.target, b.group, b.verb, b.axes, b.ranks)
