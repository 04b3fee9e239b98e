"""Per-sequence loss terms under context parallelism (check/seqterms.py, ``tokens[T]: per_sequence_local |
per_sequence_gathered over (CP)``): the checker's verdicts against the concrete simulator whose ranks hold slices
of concrete sequences (tests/simulator_seqterms.py), hand-derived slice weights, input errors and fmt."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator_seqterms as sim

from placement_logic.check import seqterms
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)

SPEC = """from std.data import ddp
from std.context import context_parallel
let m = 2
model {{
  params = 1e9
  microbatches = m
  losses {{ kl = {objective} }}
}}
mesh {{ dp = 2  cp = 2 }}
plan p {{
  dp: ddp
  cp: context_parallel
  {lines}
}}
"""


def _check(objective: str, lines: list[str], pins: dict | None = None):
    spec = load_string(SPEC.format(objective=objective, lines="\n  ".join(lines)), "s.place")
    report = check_plan(SESSION, spec, spec.plans[0], pins or {})
    return {o.name: o for o in report.obligations if o.name.startswith("GI loss[kl]")}


def test_slices_and_their_weights_by_hand():
    # 3 tokens on 2 ranks: slices (2, 1); 4 on 3: (2, 1, 1); 4 on 2: (2, 2)
    assert seqterms.slices(3, 2) == (2, 1) and seqterms.slices(4, 3) == (2, 1, 1) and seqterms.slices(4, 2) == (2, 2)
    # the sequence's mean weighs each token 1/3; the slice means 1/2, 1/2 (slice of 2) and 1/1 (slice of 1)
    ow, pw = seqterms.local_weights(3, 2)
    assert ow == [Fraction(1, 3)] * 3 and pw == [Fraction(1, 2), Fraction(1, 2), Fraction(1)]


def test_the_simulator_on_hand_computed_slices():
    sizes = {"dp": 1, "cp": 2, "microbatches": 1}
    # one sequence of 3 tokens with gradients (1, 0, 0), cut (2, 1): its token mean's gradient is 1/3
    cells, grads = {(0, 0): [3]}, {((0, 0), 0, t): Fraction(int(t == 0)) for t in range(3)}
    assert sim.objective_value("per_sequence_mean", cells, grads) == Fraction(1, 3)
    cuts = {(0, 0): [[[0, 1], [2]]]}
    # gathered: (1/3) on rank 0 + 0 on rank 1, one sequence counted: 1/3
    assert sim.path_value_cp("per_sequence_mean", "per_sequence_mean", sizes, cells, grads, cuts, "gathered",
                             None) == Fraction(1, 3)
    # local, the slices counted as sequences (count over dp and cp: 2): the first slice's mean 1/2, averaged: 1/4
    assert sim.path_value_cp("per_sequence_mean", "per_sequence_mean", sizes, cells, grads, cuts, "local",
                             ("dp", "cp")) == Fraction(1, 4)
    # equal slices (2, 2) of 4 tokens (1, 0, 0, 0): (1/2 + 0) / 2 = 1/4 = the token mean 1/4
    cells, grads = {(0, 0): [4]}, {((0, 0), 0, t): Fraction(int(t == 0)) for t in range(4)}
    assert sim.path_value_cp("per_sequence_mean", "per_sequence_mean", sizes, cells, grads, {(0, 0): [[[0, 1], [2, 3]]]},
                             "local", ("dp", "cp")) == Fraction(1, 4) == sim.objective_value("per_sequence_mean", cells,
                                                                                            grads)
    # zigzag of 5 tokens on 2 ranks: chunks of 2 of the padded 8, rank 0 chunks 0 and 3 (tokens 0, 1), rank 1 chunks
    # 1 and 2 (tokens 2, 3, 4)
    assert sim.cut(5, 2, _Zigzag()) == [[0, 1], [2, 3, 4]]


class _Zigzag(random.Random):
    def random(self):  # the layout branch of ``sim.cut``
        return 0.0


@pytest.mark.parametrize("objective,lines,want", [
    # a token mean per sequence, the length unstated: unknown, naming the fact
    ("per_sequence_mean", [], Verdict.UNKNOWN),
    # the whole sequence's length, gathered over cp: the ranks' parts sum to the sequence's mean
    ("per_sequence_mean", ["override tokens[kl]: per_sequence_gathered over (cp)"], Verdict.PROVED),
    # each rank's slice mean, averaged as if the slices were sequences: unequal slices part it from the mean
    ("per_sequence_mean", ["override tokens[kl]: per_sequence_local over (cp)",
                           "override tokens[kl]: reduce over (dp, cp)"], Verdict.REFUTED),
    # a token sum per sequence: the slices' sums add up to it whatever their lengths, no length to state
    ("per_sequence_sum", [], Verdict.PROVED),
    # the count summed over cp as well: every sequence counted cp times
    ("per_sequence_sum", ["override tokens[kl]: reduce over (dp, cp)"], Verdict.REFUTED),
])
def test_verdicts_by_hand(objective, lines, want):
    got = _check(objective, lines)
    assert {o.verdict for o in got.values()} == {want}, got
    if want is Verdict.UNKNOWN:
        assert all("per_sequence_gathered over (cp)" in o.reason for o in got.values())


def test_the_local_counterexample_replays_in_the_simulator():
    o = _check("per_sequence_mean", ["override tokens[kl]: per_sequence_local over (cp)"])["GI loss[kl] grads[dense]"]
    assert o.verdict is Verdict.REFUTED
    sizes = dict(o.counterexample.sizes)
    cp = sizes["cp"]
    assert cp >= 2 and f"slices of lengths {seqterms.slices(cp + 1, cp)}" in dict(o.counterexample.values)["sequence"]
    # the counterexample's sequence of cp + 1 tokens, its last token's gradient 1, in the simulator: the objective's
    # 1/(cp + 1) against the last slice's mean 1/1 averaged over cp slices: 1/cp
    n = cp + 1
    cells = {(r, u): [n] for r in range(sizes["dp"]) for u in range(sizes["microbatches"])}
    grads = {(c, 0, t): Fraction(int(c == (0, 0) and t == n - 1)) for c in cells for t in range(n)}
    bounds = [0]
    for k in seqterms.slices(n, cp):
        bounds.append(bounds[-1] + k)
    cuts = {c: [[list(range(bounds[r], bounds[r + 1])) for r in range(cp)]] for c in cells}
    want = sim.objective_value("per_sequence_mean", cells, grads)
    got = sim.path_value_cp("per_sequence_mean", "per_sequence_mean", {**sizes, "cp": cp}, cells, grads, cuts, "local",
                            ("dp", "cp"))
    assert want != got


# (objective, path verb or None, length statement or None, tokens[kl] reduce axes or None)
GENERATED = [(o, p, ln, ax) for o in ("per_sequence_mean", "per_sequence_sum") for p in (None, "per_microbatch_mean")
             for ln in (None, "local", "gathered") for ax in (None, ("dp", "cp"))]


def _lines(path, length, axes):
    out = [f"override loss[kl]: {path}", "override tokens[kl]: equal"] if path else []
    if length:
        out.append(f"override tokens[kl]: per_sequence_{length} over (cp)")
    if axes:
        out.append(f"override tokens[kl]: reduce over ({', '.join(axes)})")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("cp", (1, 2, 3))
@pytest.mark.parametrize("case", GENERATED, ids=[str(i) for i in range(len(GENERATED))])
def test_generated_plans_agree_with_the_simulator(case, cp):
    obj, path, length, axes = case
    if axes and path:  # the per-microbatch path takes no global count to reduce (PL506)
        return
    mean = seqterms.inner_mean(obj, path or obj)
    if length and not mean:  # a token sum per sequence divides by no length: the statement changes nothing
        with pytest.raises(Exception) as e:
            _check(obj, _lines(path, length, axes))
        assert "PL506" in str(e.value.diagnostics)
        return
    got = _check(obj, _lines(path, length, axes), {"cp": cp})
    verdicts = {o.verdict for o in got.values()}
    if mean and length is None:
        assert verdicts == {Verdict.UNKNOWN}
        return
    rng = random.Random(17)
    found = any(sim.violation_cp(obj, path or obj, {"dp": dp, "cp": cp, "microbatches": mb}, length or "gathered",
                                 axes, bool(path), rng, tries=12) for dp, mb in product((1, 2, 3), (1, 2)))
    assert verdicts == {Verdict.REFUTED if found else Verdict.PROVED}, (case, cp, verdicts)


@pytest.mark.parametrize("objective,line,code,words", [
    ("per_sequence_mean", "override tokens[kl]: per_sequence_local over (dp)", "PL122", "not a context axis"),
    ("per_sequence_mean", "override tokens[kl]: per_sequence_gathered", "PL122", "needs 'over"),
    ("per_sequence_sum", "override tokens[kl]: per_sequence_local over (cp)", "PL506", "divides no sequence by its length"),
])
def test_input_errors_are_located_diagnostics(tmp_path, capsys, objective, line, code, words):
    f = tmp_path / "s.place"
    f.write_text(SPEC.format(objective=objective, lines=line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err and "Traceback" not in err and err.startswith(f"{f}:")


@pytest.mark.parametrize("line,verb", [("override tokens[kl]:per_sequence_local   over(cp)", "per_sequence_local"),
                                       ("override tokens[kl]: per_sequence_gathered over ( cp )", "per_sequence_gathered")])
def test_fmt_round_trips_the_length_statements(line, verb):
    # one statement per spec: two naming the same context axis are PL291
    src = SPEC.format(objective="per_sequence_mean", lines=line)
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    strip = [(o.target, o.group, o.verb, o.axes) for o in a.plans[0].overrides]
    assert strip == [(o.target, o.group, o.verb, o.axes) for o in b.plans[0].overrides] == [("tokens", "kl", verb, ("cp",))]


def test_which_paths_divide_a_sequence_by_its_length():
    # a token mean per sequence: the per-sequence mean, and a per_sequence_mean term's values on a local or summed path
    assert seqterms.inner_mean("per_sequence_mean", "per_sequence_mean")
    assert all(seqterms.inner_mean("per_sequence_mean", p) for p in ("per_microbatch_mean", "per_device_mean", "sum"))
    # a token sum per sequence, or a per-token mean (another family): no length
    assert not seqterms.inner_mean("per_sequence_sum", "per_microbatch_mean")
    assert not seqterms.inner_mean("per_sequence_mean", "global_mean")
    assert not seqterms.inner_mean("global_mean", "per_sequence_sum")
