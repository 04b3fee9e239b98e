"""The vocabulary-parallel cross entropy's label smoothing and output z-loss (``losses {
label_smoothing = true  logit_z_loss = true }``, ``activations[loss]: reduce_smoothing | reduce_zloss``):
the checker against the independent simulator (tests/simulator_ce.py) on hand-derived and generated
plans, the replayed counterexamples (values derived by hand), the diagnostics, the costs and the
format round trip."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest
import simulator_ce
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import NO_SPAN, DiagnosticError
from placement_logic.ir import collectives
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
A = "activations"
KEYS = {"GI activations[loss]": ("act", "loss"), "GI activation_grads[loss]": ("grad", "loss")}
DP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
BOTH = ("label_smoothing", "logit_z_loss")


def _with(terms=BOTH, overrides=(), sp=False, axes=DP_TP):
    spec, p = plan("p", axes, sp=sp, overrides=tuple(overrides))
    model = replace(p.model, ce_terms=tuple((t, NO_SPAN) for t in terms))
    p = replace(p, model=model)
    return replace(spec, model=model, plans=(p,)), p


def verdicts(spec, p) -> dict:
    return {KEYS[o.name]: o.verdict for o in check_plan(SESSION, spec, p, {}).obligations if o.name in KEYS}


def simulated(p) -> set:
    found: set = set()
    for sizes in product((1, 2, 3), repeat=len(p.mesh.names)):
        found |= simulator_ce.violations(p, dict(zip(p.mesh.names, sizes)))
    return found


ACT, GRAD = ("act", "loss"), ("grad", "loss")
HAND = [
    (BOTH, (), False, set()),
    (BOTH, (), True, set()),
    (BOTH, [("reduce_smoothing", ("tp",)), ("reduce_zloss", ("tp",))], False, set()),
    # label smoothing's mean over the local slice (NVIDIA/Megatron-LM#737): the loss only
    (BOTH, [("reduce_smoothing", ())], False, {ACT}),
    (("label_smoothing",), [("reduce_smoothing", ())], True, {ACT}),
    # the sum of the logits counted once per tensor rank (gathered logits summed again), or over the world
    (BOTH, [("reduce_smoothing", ("tp", "tp"))], False, {ACT}),
    (BOTH, [("reduce_smoothing", ("dp", "tp"))], False, {ACT}),
    (BOTH, [("reduce_smoothing", ("dp",))], False, {ACT}),
    # the z-loss's lse from the local slice: the loss and its gradient 2·β·lse·p
    (BOTH, [("reduce_zloss", ())], False, {ACT, GRAD}),
    (("logit_z_loss",), [("reduce_zloss", ())], True, {ACT, GRAD}),
    (("logit_z_loss",), [("reduce_zloss", ("tp", "tp"))], False, {ACT, GRAD}),
    (("logit_z_loss",), [("reduce_zloss", ("dp", "tp"))], False, {ACT, GRAD}),
    # each rank its own max: the cross entropy breaks first, the z-loss's lse with it
    (("logit_z_loss",), [("reduce_max", ())], False, {ACT, GRAD}),
    # a larger max group is still one constant per tensor group
    (BOTH, [("reduce_max", ("dp", "tp"))], False, set()),
    # the target's logit alone: the loss only
    (BOTH, [("reduce_target", ())], False, {ACT}),
    # label smoothing's vocabulary size counted on the slice (NVIDIA/Megatron-LM#7464): its mean Σ z / V and the
    # gradient's α/V both read it
    (("label_smoothing",), [("smoothing_vocab", ())], False, {ACT, GRAD}),
    (BOTH, [("smoothing_vocab", ())], True, {ACT, GRAD}),
    (BOTH, [("smoothing_vocab", ("tp", "tp"))], False, {ACT, GRAD}),
    (BOTH, [("smoothing_vocab", ("dp", "tp"))], False, {ACT, GRAD}),
    (BOTH, [("smoothing_vocab", ("dp",))], False, {ACT, GRAD}),
    # Megatron-LM's local mean: the slice's sum over the slice's size (#7464 as reported), and its fix (#7466)
    (("label_smoothing",), [("reduce_smoothing", ()), ("smoothing_vocab", ())], False, {ACT, GRAD}),
    (("label_smoothing",), [("reduce_smoothing", ("tp",)), ("smoothing_vocab", ("tp",))], True, set()),
    (BOTH, [("smoothing_vocab", ("tp",))], False, set()),
]


@pytest.mark.parametrize("terms", [(), ("label_smoothing",), BOTH])
def test_each_ranks_own_max_breaks_the_loss_on_tp_alone(terms):
    """A max kept per rank (no MAX all-reduce over tp) shifts each block's exponentials by its own max: with
    tp alone (every device one sample) the sum over the blocks mixes the shifts. By hand, tp = 2, logits
    [1, 3 | 0, 1] (base 2; the blocks' maxima 3 and 1): the blocks' shifted sums 2^(-2) + 1 = 5/4 and
    2^(-1) + 1 = 3/2 add to 11/4, the whole vocabulary's shifted by 3 is 13/8; word 1's probability is read
    as 1/(11/4) = 4/11 on rank 0, single-device 8/13: both the loss and its gradient break. (The simulator's
    logits, before it held four tokens per sample, gave every block of sample 0 the same max, so a mesh of tp
    alone passed this plan.)"""
    spec, p = _with(terms, [ov(A, "reduce_max", "loss", ())], False, {"tp": DP_TP["tp"]})
    assert simulated(p) == {ACT, GRAD}
    assert {k for k, x in verdicts(spec, p).items() if x is Verdict.REFUTED} == {ACT, GRAD}


@pytest.mark.parametrize("terms,stated,sp,expected", HAND)
def test_hand_cases_checker_and_simulator(terms, stated, sp, expected):
    spec, p = _with(terms, [ov(A, v, "loss", a) for v, a in stated], sp)
    assert simulated(p) == expected
    v = verdicts(spec, p)
    assert set(v) == {ACT, GRAD}
    assert {k for k, x in v.items() if x is Verdict.REFUTED} == expected
    assert all(x is Verdict.PROVED for k, x in v.items() if k not in expected)


@hs.composite
def ce_plans(draw):
    axes = dict(DP_TP) if draw(hs.booleans()) else {"tp": DP_TP["tp"]}
    names = list(axes)
    terms = tuple(t for t in BOTH if draw(hs.booleans()))
    verbs = ("reduce_max", "reduce_target", "reduce_sumexp") + tuple(
        v for t, v in (("label_smoothing", "reduce_smoothing"), ("logit_z_loss", "reduce_zloss"),
                       ("label_smoothing", "smoothing_vocab")) if t in terms)
    cands = hs.builds(lambda v, a: ov(A, v, "loss", a), hs.sampled_from(verbs),
                      hs.lists(hs.sampled_from(names), max_size=2).map(tuple))
    return _with(terms, draw(hs.lists(cands, max_size=3)), draw(hs.booleans()), axes)


@settings(max_examples=examples(30), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(ce_plans())
def test_checker_agrees_with_the_simulator(generated):
    spec, p = generated
    v = verdicts(spec, p)
    found = simulated(p)
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, p.overrides, p.model.ce_terms, p.sequence_parallel)


def _obs(terms, stated):
    spec, p = _with(terms, [ov(A, v, "loss", a) for v, a in stated])
    return {o.name: o for o in check_plan(SESSION, spec, p, {}).obligations}


def test_smoothing_replay_local_mean():
    obs = _obs(("label_smoothing",), [("reduce_smoothing", ())])
    assert obs["GI activation_grads[loss]"].verdict is Verdict.PROVED
    cex = obs["GI activations[loss]"].counterexample
    # by hand: logits [0, 1] (word j on rank j), target 0; rank 0's sum of its slice is 0, over V = 2
    # words its mean is 0; the whole vocabulary's mean logit is (0 + 1)/2 = 1/2; 2^loss = (1 + 2)/1 = 3
    assert "on rank 0 of tp = [3, 0], single-device = [3, 1/2]" in cex.equation
    assert "label smoothing" in cex.diagnosis[0] and "reduce_smoothing over ()" in cex.diagnosis[0]
    assert "gradient" in cex.diagnosis[1] and "reads the softmax only" in cex.diagnosis[1]


def test_zloss_replay_local_lse():
    obs = _obs(("logit_z_loss",), [("reduce_zloss", ())])
    cex = obs["GI activations[loss]"].counterexample
    # by hand: the global max 1; rank 0's own sum 2^(0-1) = 1/2 gives 2^lse = 2^1 · 1/2 = 1, the whole
    # vocabulary's 2^0 + 2^1 = 3
    assert "on rank 0 of tp = [3, 1], single-device = [3, 3]" in cex.equation
    assert "z-loss's log-sum-exp" in cex.diagnosis[0] and "reduce_zloss over ()" in cex.diagnosis[0]
    grad = obs["GI activation_grads[loss]"].counterexample
    # the softmax entries of rank 0 are right (1/3 - 1 = -2/3), the lse is not
    assert "on rank 0 of tp = [-2/3, 1], single-device = [-2/3, 3]" in grad.equation


def test_vocab_replay_slice_size():
    obs = _obs(("label_smoothing",), [("smoothing_vocab", ())])
    cex = obs["GI activations[loss]"].counterexample
    assert dict(cex.sizes)["tp"] == 2
    # by hand: logits [0, 1] (word j on rank j), target 0; the sum of the logits all-reduced is 1, but rank 0
    # counts the V/t = 1 word of its slice: its mean logit 1/1 = 1 against the whole vocabulary's (0 + 1)/2 = 1/2
    assert "on rank 0 of tp = [3, 1], single-device = [3, 1/2]" in cex.equation
    assert "vocabulary size" in cex.diagnosis[0] and "smoothing_vocab over ()" in cex.diagnosis[0]
    assert "every gradient" in cex.diagnosis[1]
    grad = obs["GI activation_grads[loss]"].counterexample
    # the softmax entry of word 0 is right (2^0/(2^0 + 2^1) - 1 = -2/3), the uniform target 1/V is 1 not 1/2
    assert "on rank 0 of tp = [-2/3, 1], single-device = [-2/3, 1/2]" in grad.equation
    assert "uniform target" in grad.equation and "smoothing_vocab over ()" in grad.diagnosis[0]


def test_simulator_vocab_slice_by_size():
    # the simulator's blocks hold 2 words per tensor rank: V = 2t, the slice's count 2; they agree at t = 1 only
    _, p = _with(("label_smoothing",), [ov(A, "smoothing_vocab", "loss", ())])
    assert simulator_ce.violations(p, {"dp": 2, "tp": 1}) == set()
    assert simulator_ce.violations(p, {"dp": 1, "tp": 2}) == {ACT, GRAD}
    assert simulator_ce.violations(p, {"dp": 3, "tp": 3}) == {ACT, GRAD}
    # counted over dp as well: V·dp, wrong with one tensor rank too
    _, p = _with(("label_smoothing",), [ov(A, "smoothing_vocab", "loss", ("dp", "tp"))])
    assert simulator_ce.violations(p, {"dp": 2, "tp": 1}) == {ACT, GRAD}
    assert simulator_ce.violations(p, {"dp": 1, "tp": 3}) == set()


def test_vocab_replay_data_axis():
    obs = _obs(BOTH, [("smoothing_vocab", ("dp", "tp"))])
    cex = obs["GI activations[loss]"].counterexample
    assert dict(cex.sizes)["dp"] == 2
    # by hand: rank r's own sample has logits [0, r + 1] (both words on its one tensor rank); the count 2 summed
    # over the 2 data ranks is 4: rank 0's mean logit (0 + 1)/4 = 1/4 against 1/2; 2^lse = 1 + 2 = 3 is right
    assert "on rank 0 of dp = [3, 1/4, 3], single-device = [3, 1/2, 3]" in cex.equation


@pytest.mark.parametrize("terms,verb", [((), "reduce_smoothing"), (("label_smoothing",), "reduce_zloss"),
                                        (("logit_z_loss",), "reduce_smoothing"), ((), "smoothing_vocab"),
                                        (("logit_z_loss",), "smoothing_vocab")])
def test_unstated_term_is_pl253(terms, verb):
    spec, p = _with(terms, [ov(A, verb, "loss", ("tp",))])
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == "PL253" and "states no" in d.message


SRC = """from std.data import ddp
from std.tensor import megatron_tp

model {{
  transformer {{
    hidden = 1024
    layers = 4
    heads = 8
    ffn = 4096
    vocab = 32000
  }}
  seq = 2048
  microbatch = 1
  losses {{
{terms}  }}
}}

mesh {{
  dp = 2
  tp = 4
}}

plan p {{
  dp: ddp
  tp: megatron_tp
{lines}}}
"""


def _scalars(terms: str, lines: str = "") -> dict:
    from placement_logic.frontend.loader import load_string

    p = load_string(SRC.format(terms=terms, lines=lines)).plan("p")
    out: dict = {}
    for c in collectives.derive(p):
        if c.payload.tensor == "token_scalars":
            key = (c.kind.value, c.axes)
            out[key] = out.get(key, 0) + _num(c.count)
    return out


def _num(v):
    if isinstance(v, ir.Const):
        return v.value
    a = [_num(x) for x in v.args]
    return {"*": lambda: a[0] * a[1], "-": lambda: a[0] - a[1], "+": lambda: sum(a)}[v.op]()


def test_costs_one_more_all_reduce_per_term():
    # three fp32 values per token and microbatch (m = 1) for the cross entropy, one more per stated term
    assert _scalars("    label_smoothing = false\n") == {("all_reduce", ("tp",)): 3}
    assert _scalars("    label_smoothing = true\n") == {("all_reduce", ("tp",)): 4}
    assert _scalars("    label_smoothing = true\n    logit_z_loss = true\n") == {("all_reduce", ("tp",)): 5}
    # a stated slot moves its collective: the smoothing sum over the world, the z-loss's dropped
    moved = _scalars("    label_smoothing = true\n    logit_z_loss = true\n",
                     "  override activations[loss]: reduce_smoothing over (dp, tp)\n"
                     "  override activations[loss]: reduce_zloss over ()\n")
    assert moved == {("all_reduce", ("tp",)): 3, ("all_reduce", ("dp", "tp")): 1}
    # the vocabulary size moves no bytes: each rank knows the slice's and the whole vocabulary's size from the shapes
    for axes in ("()", "(tp)", "(dp, tp)"):
        assert _scalars("    label_smoothing = true\n", f"  override activations[loss]: smoothing_vocab over {axes}\n"
                        ) == {("all_reduce", ("tp",)): 4}


@pytest.mark.parametrize("stmt", ["override activations[loss]: reduce_smoothing over (tp)",
                                  "override activations[loss]: reduce_zloss over ()",
                                  "override activations[loss]: smoothing_vocab over ()"])
def test_format_round_trip(stmt):
    from placement_logic.frontend.canonical import format_source

    src = SRC.format(terms="    label_smoothing = true\n    logit_z_loss = true\n", lines=f"  {stmt}\n")
    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :  ").replace("(tp)", "( tp )")).replace(
        "label_smoothing = true", "label_smoothing=true")
    assert format_source(messy, "x.place") == src
