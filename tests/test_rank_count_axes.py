"""A group's squared norm counted on a rank set over several axes at once (``override clip_norm[g]:
count_on_ranks over (A, B) ranks (R1, ...)``, ranks of the process group over A and B, the first axis the most
significant): every piece of the group over those axes must be held by exactly one named rank. Verdicts
against the independent simulator (tests/simulator_rankset.py) and a count by hand; located errors; the replay
names the piece and how many named ranks hold it."""

from __future__ import annotations

import io
import random
from itertools import product

import pytest
import simulator
from irkit import const, ov, plan

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
# dense sharded over the tensor axis b, replicated over the data axis a; norms replicated over both
AXES = {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")}


def by_hand(group: str, ranks, na: int, nb: int) -> bool:
    """Whether every piece is counted once: the named ranks' coordinates (a, b) = divmod(r, nb); dense's
    pieces are its b coordinates, norms has one piece."""
    named = {r for r in ranks if 0 <= r < na * nb}
    pieces = range(nb) if group == "dense" else [0]
    held = [sum(1 for r in named if (r % nb if group == "dense" else 0) == j) for j in pieces]
    return all(h == 1 for h in held)


def _plan(group, ranks, over=("a", "b")):
    return plan("p", AXES, overrides=(ov("clip_norm", "reduce", group, ("a", "b")),
                                     ov("clip_norm", "count_on_ranks", group, over, ranks=tuple(map(const, ranks)))))


def _clip(report):
    return next(o for o in report.obligations if o.name == "SC clip_norm")


CASES = [("norms", (0,), 2, 2), ("norms", (3,), 2, 2), ("norms", (0, 1), 2, 2), ("norms", (1, 2), 1, 3),
         ("dense", (0, 1), 2, 2), ("dense", (0, 3), 2, 2), ("dense", (2, 3), 2, 2), ("dense", (0, 2), 2, 2),
         ("dense", (0, 1, 2), 3, 1), ("dense", (1, 2), 1, 3), ("dense", (0, 1, 2), 1, 3), ("dense", (5, 0, 4), 2, 3),
         ("dense", (1, 2, 3), 2, 3)]


@pytest.mark.parametrize("group,ranks,na,nb", CASES)
def test_counts_over_two_axes_agree_with_the_simulator_and_by_hand(group, ranks, na, nb):
    _, p = _plan(group, ranks)
    spec, _ = _plan(group, ranks)
    sizes = {"a": na, "b": nb, "m": 1}
    clip = _clip(check_plan(SESSION, spec, p, sizes))
    right = by_hand(group, ranks, na, nb)
    assert clip.verdict is (Verdict.PROVED if right else Verdict.REFUTED), (clip.verdict, clip.counterexample)
    found = set()
    for s in range(6):
        found |= simulator.norm_violations(p, sizes, random.Random(s))
    assert (("clip",) in found) == (not right), found
    if not right:  # the replayed piece is held by a number of named ranks other than one, counted here by hand
        cex = clip.counterexample
        piece = dict(cex.devices)["piece"]
        j = int(piece.split("b=")[1].rstrip(")")) if group == "dense" else 0
        held = sum(1 for r in set(ranks) if r < na * nb and (r % nb if group == "dense" else 0) == j)
        assert held != 1 and f"grad-norm² = {held} on every rank" in cex.equation, cex.equation


@pytest.mark.parametrize("group,ranks", [("norms", (0,)), ("norms", (0, 1)), ("dense", (0, 1)), ("dense", (1,)),
                                         ("norms", (2,))])
def test_unpinned_the_set_is_read_at_every_size(group, ranks):
    """ranks (0) of a replicated group is right at every size (the duplicate filter over both axes); any fixed
    set of a sharded group misses a piece at some size; ranks (2) names no rank where a·b < 3."""
    spec, p = _plan(group, ranks)
    clip = _clip(check_plan(SESSION, spec, p, {}))
    right = all(by_hand(group, ranks, na, nb) for na, nb in product(range(1, 5), repeat=2))
    assert clip.verdict is (Verdict.PROVED if right else Verdict.REFUTED), clip
    if not right:
        sizes = dict(clip.counterexample.sizes)
        assert not by_hand(group, ranks, sizes["a"], sizes["b"])  # the witness's sizes are wrong by hand too
        found = set()
        for s in range(6):
            found |= simulator.norm_violations(p, {"a": sizes["a"], "b": sizes["b"], "m": 1}, random.Random(s))
        assert ("clip",) in found


def test_three_axes_read_first_axis_most_significant():
    """Over (a, c, b) with a = c = b = 2, rank 5 is (a 1, c 0, b 1): dense's pieces b = 0 and 1 held by ranks 0
    and 5 once each (right); ranks 0 and 2 are (0, 0, 0) and (0, 1, 0): b = 0 twice, b = 1 never."""
    axes = {"a": ("data", "R,R,R,R"), "c": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")}
    for ranks, right in [((0, 5), True), ((0, 2), False)]:
        spec, p = plan("p", axes, overrides=(ov("clip_norm", "reduce", "dense", ("a", "c", "b")),
                                             ov("clip_norm", "count_on_ranks", "dense", ("a", "c", "b"),
                                                ranks=tuple(map(const, ranks)))))
        sizes = {"a": 2, "c": 2, "b": 2, "m": 1}
        clip = _clip(check_plan(SESSION, spec, p, sizes))
        assert clip.verdict is (Verdict.PROVED if right else Verdict.REFUTED)
        found = set().union(*(simulator.norm_violations(p, sizes, random.Random(s)) for s in range(6)))
        assert (("clip",) in found) == (not right)


@pytest.mark.parametrize("overrides,code", [
    ((ov("clip_norm", "count_on_ranks", "dense", ("a", "a"), ranks=(const(0),)),), "PL506"),
    ((ov("clip_norm", "reduce", "dense", ("b",)),
      ov("clip_norm", "count_on_ranks", "dense", ("a", "b"), ranks=(const(0),))), "PL170"),
    ((ov("clip_norm", "reduce", "norms", ("a", "b")), ov("clip_norm", "rank0_only", "norms", ("a",)),
      ov("clip_norm", "count_on_ranks", "norms", ("a", "b"), ranks=(const(0),))), "PL260"),
    ((ov("clip_norm", "reduce", "norms", ("a", "b")), ov("clip_norm", "average", "norms", ("a", "b")),
      ov("clip_norm", "count_on_ranks", "norms", ("a", "b"), ranks=(const(0),))), "PL129"),
])
def test_statements_the_step_cannot_read_are_located_errors(overrides, code):
    spec, p = plan("p", AXES, overrides=overrides)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {"a": 2, "b": 2, "m": 1})
    assert e.value.diagnostics[0].code == code, e.value.diagnostics


def run(args):
    out, err = io.StringIO(), io.StringIO()
    return main(args, out, err), out.getvalue(), err.getvalue()


SPEC = """from std.data import ddp
from std.tensor import megatron_tp

model {
  transformer {
    hidden = 4096
    layers = 32
    heads = 32
    ffn = 14336
    vocab = 128256
  }
  seq = 4096
  microbatch = 1
}

mesh {
  dp = 2
  tp = 4
}

plan p {
  dp: ddp
  tp: megatron_tp
  override clip_norm[dense]: reduce over (dp, tp)
  override clip_norm[dense]: count_on_ranks over (dp, tp) ranks (RANKS)
}
"""


def test_a_rank_past_the_group_and_fmt(tmp_path):
    f = tmp_path / "c.place"
    f.write_text(SPEC.replace("RANKS", "0, 8"))
    rc, _, err = run(["check", str(f)])
    assert rc == 2 and f"{f}:25:3: error:" in err and "[PL191]" in err and "of 8 ranks" in err, err
    f.write_text(SPEC.replace("RANKS", "0,1,2 ,3"))
    rc, out, _ = run(["fmt", str(f)])
    assert rc == 0 and "count_on_ranks over (dp, tp) ranks (0, 1, 2, 3)\n" in out
    rc, out, err = run(["check", str(f), "--set", "dp=2", "--set", "tp=4"])
    assert rc == 0 and "PROVED" in out, out + err  # ranks 0..3 are dp rank 0's four tensor pieces
    rc, out, err = run(["check", str(f)])
    assert rc == 1 and "refuted SC clip_norm" in out and "named ranks" in out, out + err
