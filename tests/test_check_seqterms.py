"""Loss terms of the user's own and per-sequence normalisations (``losses { kl = per_sequence_mean }``,
check/seqterms.py): the checker's verdicts against the concrete per-sequence simulator on generated plans,
hand-derived weights for the family test, input errors, fmt and costs."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator_seqterms as sim
from corpus import ROOT

from placement_logic.check import seqterms
from placement_logic.check.run import check_plan, check_spec
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_spec, load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)

SPEC = """from std.data import ddp
from std.tensor import megatron_tp
let m = 2
model {{
  params = 1e9
  microbatches = m
  losses {{ {losses} }}
}}
mesh {{ {mesh} }}
plan p {{
  dp: ddp
  {tp}
  {lines}
}}
"""


def _spec(objective: str, lines: list[str], tp: bool = False, name: str = "kl"):
    src = SPEC.format(losses=f"{name} = {objective}", mesh="dp = 2  tp = 2" if tp else "dp = 2",
                      tp="tp: megatron_tp" if tp else "", lines="\n  ".join(lines))
    return load_string(src, "s.place")


# (objective, path verb or None, tokens[kl] reduce axes or None, divisor text or None, tokens[kl]: equal, with tp)
GENERATED = [
    (obj, path, axes, div, equal, tp)
    for obj in ("per_sequence_mean", "per_sequence_sum", "global_mean", "sum")
    for path in (None, "global_mean", "per_microbatch_mean", "per_device_mean", "sum", "per_sequence_mean",
                 "per_sequence_sum")
    for axes, div, equal, tp in ((None, None, False, False), (("dp",), None, False, True),
                                 (("dp", "tp"), None, False, True), (None, "dp*m", False, False),
                                 (None, None, True, False))
]


def _lines(path, axes, div, equal):
    out = [f"override loss[kl]: {path}"] if path else []
    if axes:
        out.append(f"override tokens[kl]: reduce over ({', '.join(axes)})")
    if div:
        out.append(f"override loss[kl]: divide by {div}")
    if equal:
        out.append("override tokens[kl]: equal")
    return out


def _divisor(div, sizes):
    if div is None:
        return None
    return Fraction(sizes["dp"] * (sizes["microbatches"] if "m" in div else 1))


def _simulated(obj, path, axes, div, equal, tp) -> dict | None:
    """The first sizes (dp, tp, microbatches in 1..3) where the simulator shows the path departing from the objective."""
    rng = random.Random(11)
    for dp, t, mb in product((1, 2, 3), (1, 2) if tp else (1,), (1, 2, 3)):
        sizes = {"dp": dp, "tp": t, "microbatches": mb}
        if sim.violation(obj, path or obj, sizes, axes, _divisor(div, sizes), equal, rng, tries=12):
            return sizes
    return None


@pytest.mark.slow
@pytest.mark.parametrize("case", GENERATED, ids=[str(i) for i in range(len(GENERATED))])
def test_generated_plans_agree_with_the_simulator(case):
    obj, path, axes, div, equal, tp = case
    try:
        spec = _spec(obj, _lines(path, axes, div, equal), tp)
        report = check_plan(SESSION, spec, spec.plans[0], {})
    except DiagnosticError as e:  # a statement the language refuses (changes nothing, wrong family of count)
        assert {d.code for d in e.diagnostics} <= {"PL506", "PL299"}, e.diagnostics
        return
    v = {o.name: o for o in report.obligations}["GI loss[kl] grads[dense]"]
    assert v.verdict is not Verdict.UNKNOWN, v
    found = _simulated(obj, path, axes, div, equal, tp)
    assert (v.verdict is Verdict.REFUTED) == (found is not None), (case, v.verdict, found)
    if v.verdict is Verdict.REFUTED:
        assert v.counterexample.diagnosis
        if not seqterms.mismatch(obj, path or obj):  # the solver's witness sizes show it in the simulator too
            sizes = dict(v.counterexample.sizes)
            sizes.setdefault("tp", 1)
            assert sim.violation(obj, path or obj, sizes, axes, _divisor(div, sizes), equal, random.Random(3))


# a few of the generated cases in the quick tier, each verdict derived by hand
QUICK = [
    # the global sequence count: the objective's own path
    ("per_sequence_mean", [], Verdict.PROVED),
    # each microbatch's own sequence count, averaged: 1/(S_cell·dp·m) ≠ 1/S when counts differ
    ("per_sequence_mean", ["override loss[kl]: per_microbatch_mean"], Verdict.REFUTED),
    # ... right when every device and microbatch holds as many sequences: S_cell·dp·m = S
    ("per_sequence_sum", ["override loss[kl]: per_microbatch_mean", "override tokens[kl]: equal"], Verdict.PROVED),
    # equal token counts say nothing about sequence counts
    ("per_sequence_mean", ["override loss[kl]: per_microbatch_mean", "override tokens: equal"], Verdict.REFUTED),
    # a per-token mean of a per-sequence term: another family
    ("per_sequence_mean", ["override loss[kl]: global_mean"], Verdict.REFUTED),
    # a user-named per-token term on the main loss's path
    ("global_mean", [], Verdict.PROVED),
    ("global_mean", ["override loss[kl]: per_sequence_mean"], Verdict.REFUTED),
]


@pytest.mark.parametrize("obj,lines,want", QUICK, ids=[str(i) for i in range(len(QUICK))])
def test_per_sequence_verdicts_by_hand(obj, lines, want):
    spec = _spec(obj, lines)
    report = check_plan(SESSION, spec, spec.plans[0], {})
    got = {o.name: o.verdict for o in report.obligations if o.name.startswith("GI loss[kl]")}
    assert got == {"GI loss[kl]": want, "GI loss[kl] grads[dense]": want}
    assert all(o.verdict is Verdict.PROVED for o in report.obligations if o.name.startswith("GI grads["))


@pytest.mark.parametrize("obj,path,pins", [
    # a per-token mean where the objective is a sum: Σ g / N ≠ Σ g once N ≥ 2 (proved before the path's count was read)
    ("sum", "global_mean", {}),
    # a sum where the objective is a mean, one device and one microbatch: Σ g ≠ Σ g / N for N ≥ 2 tokens
    ("global_mean", "sum", {"dp": 1, "microbatches": 1}),
    # the sequences' values summed where their mean is meant: Σ v ≠ Σ v / S for S ≥ 2 sequences
    ("per_sequence_mean", "sum", {"dp": 1, "microbatches": 1}),
])
def test_a_sum_path_takes_no_count_and_a_mean_path_takes_its_count(obj, path, pins):
    spec = _spec(obj, [f"override loss[kl]: {path}"])
    report = check_plan(SESSION, spec, spec.plans[0], pins)
    o = {r.name: r for r in report.obligations}["GI loss[kl] grads[dense]"]
    assert o.verdict is Verdict.REFUTED
    sizes = {**dict(o.counterexample.sizes), "tp": 1}
    assert sim.violation(obj, path, sizes, None, None, False, random.Random(5))


def test_family_weights_by_hand():
    # per_sequence_mean against global_mean on the steps (1, 3), (1, 3), (2), (1, 1):
    # objective 1/(L·S): 1/(1·2), 1/(3·2), 1/(2·1), 1/(1·2); path 1/N: 1/4, 1/4, 1/2, 1/2 -- ratios 2, 2/3, 1, 1
    ow, pw = seqterms.family_witness("per_sequence_mean", "global_mean")
    assert ow == [Fraction(1, 2), Fraction(1, 6), Fraction(1, 2), Fraction(1, 2)]
    assert pw == [Fraction(1, 4), Fraction(1, 4), Fraction(1, 2), Fraction(1, 2)]
    # every pair of families is separated; the same family never is
    for o, p in product(("global_mean", "sum", "per_sequence_mean", "per_sequence_sum"), repeat=2):
        if seqterms.mismatch(o, p):
            assert seqterms.family_witness(o, p) is not None, (o, p)
    assert seqterms.family_witness("per_sequence_sum", "per_microbatch_mean") is None


def test_family_witness_steps_are_violations_in_the_simulator():
    """The family test's steps, run in the simulator with one gradient on the token looked at: the path's
    gradient is not the objective's on some step (dp = 1, one microbatch)."""
    sizes = {"dp": 1, "microbatches": 1}
    for obj, path in (("per_sequence_mean", "global_mean"), ("global_mean", "per_sequence_sum"),
                      ("per_sequence_mean", "per_sequence_sum"), ("sum", "per_sequence_sum")):
        bad = 0
        for _, lens, n in seqterms.STEPS:
            cells = {(0, 0): list(lens)}
            i = lens.index(n)
            grads = {((0, 0), j, t): Fraction(int(j == i and t == 0)) for j, k in enumerate(lens) for t in range(k)}
            bad += sim.objective_value(obj, cells, grads) != sim.path_value(obj, path, sizes, cells, grads, None, None)
        assert bad, (obj, path)


def test_context_parallelism_leaves_a_per_sequence_term_unknown(tmp_path):
    src = SPEC.format(losses="kl = per_sequence_mean", mesh="dp = 2  cp = 2", tp="cp: ddp", lines="")
    src = src.replace("from std.data import ddp", "from std.data import ddp\nfrom std.context import context_parallel")
    src = src.replace("cp: ddp", "cp: context_parallel")
    spec = load_string(src, "s.place")
    report = check_plan(SESSION, spec, spec.plans[0], {})
    got = [o for o in report.obligations if o.name.startswith("GI loss[kl]")]
    assert got and all(o.verdict is Verdict.UNKNOWN for o in got)
    assert "sequence length a rank of (cp) divides" in got[0].reason and "per_sequence_gathered over (cp)" in got[0].reason


@pytest.mark.parametrize("losses,line,code,words", [
    ("router = global_mean", "", "PL289", "clashes"),
    ("main = sum", "", "PL289", "clashes"),
    ("aux_loss = global_mean", "", "PL289", "clashes"),
    ("lable_smoothing = true", "", "PL113", "did you mean 'label_smoothing'"),  # a flag: a misspelt key, not a term
    ("aux = per_sequence_mean", "", "PL289", "cannot take per_sequence_mean"),
    ("aux = per_microbatch_mean", "override loss[aux]: per_sequence_sum", "PL289", "computed from the router's statistics"),
    ("kl = global_mean", "override tokens[kl]: equal", "PL299", "normalised global_mean, per token"),
    ("kl = per_microbatch_mean", "override loss[kl]: per_sequence_mean", "PL299", "no sequences to count"),
    ("kl = global_mean", "override loss: per_sequence_mean", "PL299", "applies to a loss term"),
    ("kl = per_sequence_mean", "override tokens[kl]: equal", "PL506", "changes nothing"),
    ("kl = per_sequence_mean", "override loss[entropy]: sum", "PL186", "does not declare"),
])
def test_input_errors_are_located_diagnostics(tmp_path, capsys, losses, line, code, words):
    f = tmp_path / "s.place"
    f.write_text(SPEC.format(losses=losses, mesh="dp = 2", tp="", lines=line))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and words in err and "Traceback" not in err
    assert err.startswith(f"{f}:")


def test_fmt_round_trips_named_terms_and_per_sequence_statements():
    src = SPEC.format(losses="kl=global_mean   entropy  = per_sequence_mean  policy=per_sequence_sum", mesh="dp = 2",
                      tp="", lines="override loss[entropy]:per_microbatch_mean\n  override tokens[entropy]:  equal\n"
                                   "  override loss[policy]: per_sequence_sum\n  override tokens[policy]: reduce over (dp)")
    out = format_source(src, "s.place")
    assert format_source(out, "s.place") == out
    a, b = load_string(src, "s.place"), load_string(out, "s.place")
    assert [(t, o) for t, o, _ in a.model.loss_terms] == [(t, o) for t, o, _ in b.model.loss_terms] == [
        ("kl", "global_mean"), ("entropy", "per_sequence_mean"), ("policy", "per_sequence_sum")]
    strip = [(o.target, o.group, o.verb, o.axes) for o in a.plans[0].overrides]
    assert strip == [(o.target, o.group, o.verb, o.axes) for o in b.plans[0].overrides]
    assert ("tokens", "entropy", "equal", None) in strip


def test_named_terms_move_no_bytes(tmp_path, capsys):
    """Terms move no bytes: the cost report of a plan with named terms and per-sequence statements is the plan's
    without them, line for line (a term is a scale on gradients the plan reduces anyway)."""
    with_terms, without = tmp_path / "a.place", tmp_path / "b.place"
    with_terms.write_text(SPEC.format(losses="kl = per_sequence_mean  entropy = global_mean", mesh="dp = 2", tp="",
                                      lines="override loss[kl]: per_microbatch_mean\n  override tokens[kl]: equal"))
    without.write_text(SPEC.replace("  losses {{ {losses} }}\n", "").format(mesh="dp = 2", tp="", lines=""))
    outs = []
    for f in (with_terms, without):
        assert main(["cost", str(f)]) == 0
        outs.append(capsys.readouterr().out.replace(str(f), "F"))
    assert outs[0] == outs[1]


SEQ_SPECS = ["verl_seq_mean_token_mean_microbatch_count", "nemo_rl_vapo_nll_local_token_count",
             "verl_distill_token_mean_as_sequence_mean", "ulysses_seq_mean_over_slice_length",
             "cp_sample_mean_over_local_tokens"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SEQ_SPECS)
def test_bug_specs_are_refuted_and_their_fixes_proved(name):
    bug = check_spec(load_spec(ROOT / "examples" / "bugs" / f"{name}.place"), timeout=20)
    refuted = [o for o in bug.obligations if o.name.startswith("GI loss[") and o.verdict is Verdict.REFUTED]
    assert refuted and all(o.counterexample is not None for o in refuted)
    safe = check_spec(load_spec(ROOT / "examples" / "safe" / f"{name}.place"), timeout=20)
    assert all(o.verdict is Verdict.PROVED for o in safe.obligations if o.name.startswith("GI loss["))


def test_a_named_term_reaches_the_dense_like_groups_of_the_users_own():
    """A term of the user's own reaches the dense layers as the main loss does, a group declared like dense
    too; the per-microbatch path is refuted for each (a mean of local sequence means)."""
    src = SPEC.format(losses="kl = per_sequence_mean", mesh="dp = 2", tp="",
                      lines="override loss[kl]: per_microbatch_mean")
    src = src.replace("  microbatches = m\n", "  microbatches = m\n  group sinks {\n    count = 384\n    like = dense\n  }\n")
    spec = load_string(src, "s.place")
    report = check_plan(SESSION, spec, spec.plans[0], {})
    got = {o.name: o.verdict for o in report.obligations if o.name.startswith("GI loss[kl]")}
    assert got == {"GI loss[kl]": Verdict.REFUTED, "GI loss[kl] grads[dense]": Verdict.REFUTED,
                   "GI loss[kl] grads[sinks]": Verdict.REFUTED}
