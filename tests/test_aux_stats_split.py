"""The aux load-balancing loss with f and P gathered over groups of their own (``loss[aux]: probs_per_* over
(AXES)``) at unequal real-token counts per shard (check.encode_auxcells.split_dims).

A path that takes each cell's (the tokens sharing f's group and P's) E · Σ f_i P_i and averages the cells with
equal weights computes the loss of the union of the two groupings only where the cells hold equal numbers of real
tokens: over a dimension only f gathers, the mean of the cells' own P is the pooled P exactly when the counts agree.
So such a path is refuted where the counts are free and proved where the plan states them equal (``override
tokens: equal``: every device and microbatch as many tokens, none padded). Each verdict is compared with the
concrete simulator (tests/simulator_auxstats.py), which lays the tokens out shard by shard under every layout the
plan admits (even, uneven along each dimension, random counts; only full shards under ``tokens: equal``) and
computes both values by brute force on random routings, with no use of the union; a refutation's replayed values
are recomputed by the simulator on the counts and routing its counterexample describes."""

from __future__ import annotations

import random
import re
from fractions import Fraction
from itertools import product

import pytest
import simulator_auxstats as sim
from test_aux_stats import spec_text, stats

from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI aux_stats"
ALL = "dp, ep, cp, tp"
EQ = "  override tokens: equal\n"


def probs(verb: str, axes: str) -> str:
    return f"  override loss[aux]: {verb} over ({axes})\n"


# name -> (objective, statements): each computes the union's loss, which is the objective's grouping, at equal
# counts (by hand: test_aux_stats_padding), and departs where one factor is local over a dimension of two or more
# whose shards may hold unequal real-token counts
CASES = {
    # Megatron-LM#1561: global counts, each rank's own probabilities
    "global_f_local_p": ("global_batch", stats("stats_per_step", ALL) + probs("probs_per_sequence", "")),
    "global_f_step_p_microbatch": ("global_batch", stats("stats_per_step", ALL) + probs("probs_per_microbatch", "")),
    # f over the ranks per microbatch, P over the microbatches per rank: f local over the microbatches
    "global_crossed": ("global_batch", stats("stats_per_microbatch", ALL) + probs("probs_per_step", "")),
    "micro_p_local": ("per_microbatch", probs("probs_per_sequence", "")),
    "seq_p_local": ("per_sequence", probs("probs_per_sequence", "")),  # P of each context/tensor shard
    "seq_f_local": ("per_sequence", stats("stats_per_sequence", "") + probs("probs_per_sequence", "cp, tp")),
}


def _spec(name: str, extra: str = "", sequences: int = 2):
    scope, body = CASES[name]
    return scope, load_string(spec_text(scope, {name: body + extra}, sequences=sequences), "split.place")


def _ob(spec, name: str):
    return next(o for o in check_spec(spec, [name], timeout=20).plans[0].obligations if o.name == NAME)


def simulated(plan, scope: str, sequences: int = 2, experts: int = 8, top_k: int = 2) -> bool:
    """Whether the simulator finds sizes (each axis 1 or 2), a layout the plan admits and a routing where the
    path's value differs from the objective's."""
    rng = random.Random(0)
    axes = plan.mesh.names
    layouts = sim.admissible_layouts(plan, rng)
    for combo in product((1, 2), repeat=len(axes) + 1):
        sizes = dict(zip(axes, combo[:-1])) | {"microbatches": combo[-1]}
        # the even layout at every size; the others where each dimension has two shards
        for layout in (layouts if set(combo) == {2} else layouts[:1]):
            if sim.differs(plan, scope, sizes, sequences, experts, top_k, rng, tries=2, layout=layout):
                return True
    return False


@pytest.mark.parametrize("name", list(CASES))
def test_free_counts_refute_and_equal_counts_prove(name):
    scope, spec = _spec(name)
    assert simulated(spec.plan(name), scope), name
    ob = _ob(spec, name)
    assert ob.verdict is Verdict.REFUTED, name
    assert ob.counterexample is not None and "as many real tokens" in " ".join(ob.counterexample.diagnosis)
    scope, fixed = _spec(name, EQ)
    assert not simulated(fixed.plan(name), scope), name
    assert _ob(fixed, name).verdict is Verdict.PROVED, name


def _replayed(ob, plan, scope: str, sequences: int = 2, experts: int = 8, top_k: int = 2):
    """The counterexample's two values, and the simulator's on the layout and routing it describes: the shards at
    0 of its dimension one real token (and a padded position) routed to 0..k-1, the others two routed to 1..k."""
    cx = ob.counterexample
    got, want = (Fraction(x) for x in re.match(r"aux on this path = ([0-9/]+) .* gives ([0-9/]+)$", cx.equation).groups())
    dim = re.search(r"at (\w+)=0 hold one real token", dict(cx.values)["routing"]).group(1)
    c0, c1 = tuple(range(top_k)), tuple(range(1, top_k + 1))
    flat = lambda c: (c, tuple(Fraction(1, top_k) if i in c else Fraction(0) for i in range(experts)))  # noqa: E731
    layout = sim.uneven_along(dim)
    routed = [(t, flat(c0 if layout(t["rank"], t["mb"], t["seq"])[0] == 1 else c1))
              for t in sim.tokens(plan, dict(cx.sizes), sequences, layout=layout)]
    return (got, want), sim.path_and_objective(plan, scope, routed, experts, top_k)


@pytest.mark.parametrize("name", list(CASES))
def test_the_replayed_values_are_the_simulators(name):
    scope, spec = _spec(name)
    stated, simulated_values = _replayed(_ob(spec, name), spec.plan(name), scope)
    assert stated == simulated_values and stated[0] != stated[1]


def test_one_sequence_per_microbatch_leaves_the_sequences_nothing_to_split():
    """f over the sequences of a microbatch, P over each sequence alone: with one sequence per microbatch the two
    groups are one, whatever the counts."""
    text = spec_text("per_microbatch", {"p": probs("probs_per_sequence", "cp, tp")}, sequences=1)
    spec = load_string(text, "split.place")
    assert _ob(spec, "p").verdict is Verdict.PROVED
    assert not simulated(spec.plan("p"), "per_microbatch", sequences=1)
    text = spec_text("per_microbatch", {"p": probs("probs_per_sequence", "cp, tp")}, sequences=2)
    spec = load_string(text, "split.place")
    ob = _ob(spec, "p")
    assert ob.verdict is Verdict.REFUTED and simulated(spec.plan("p"), "per_microbatch", sequences=2)
    assert "sequences=0" in dict(ob.counterexample.values)["routing"]


def test_global_counts_local_probabilities_by_hand():
    """Two data-parallel cells, one real token on experts 0, 1 and two on experts 1, 2 (E = 8, k = 2, probability
    1/2 on each chosen): f = (1/6, 3/6, 2/6), the cells' P (1/2, 1/2, 0) and (0, 1/2, 1/2) with mean (1/4, 1/2, 1/4),
    so the path gives 8 · (1/24 + 1/4 + 1/12) = 3 where the pooled P = f gives 8 · 14/36 = 28/9."""
    spec = load_string(spec_text("global_batch", {"p": stats("stats_per_step", "dp") + probs("probs_per_sequence", "")},
                                 sequences=1, axes=("dp",)),
                       "split.place")
    plan = spec.plan("p")
    flat = lambda c: (c, tuple(Fraction(1, 2) if i in c else Fraction(0) for i in range(8)))  # noqa: E731
    toks = sim.tokens(plan, {"dp": 2, "microbatches": 1}, 1, layout=lambda r, mb, s: (1, 1) if r["dp"] == 0 else (2, 0))
    routed = [(t, flat((0, 1) if t["rank"]["dp"] == 0 else (1, 2))) for t in toks]
    assert sim.path_and_objective(plan, "global_batch", routed, 8, 2) == (3, Fraction(28, 9))
    ob = _ob(spec, "p")
    assert ob.verdict is Verdict.REFUTED
    assert ob.counterexample.equation.startswith("aux on this path = 3 ") and ob.counterexample.equation.endswith("28/9")


def test_equal_counts_make_equal_call_weights_the_pooled_ones():
    """``stats_equal_cell_weights`` departs only where the calls' counts differ: under ``tokens: equal`` it is
    the pooled value (proved), the simulator agreeing on the layouts the plan admits."""
    body = stats("stats_per_step", ALL) + "  override loss[aux]: stats_equal_cell_weights over (dp, ep)\n"
    for extra, bad in (("", True), (EQ, False)):
        spec = load_string(spec_text("global_batch", {"p": body + extra}), "split.place")
        assert simulated(spec.plan("p"), "global_batch") is bad
        assert _ob(spec, "p").verdict is (Verdict.REFUTED if bad else Verdict.PROVED)


def test_no_padding_leaves_counting_it_nothing_to_count():
    """``stats_count_padding`` departs wherever a batch is padded; ``tokens: equal`` states that none is (the
    simulator's admissible layout then holds no padded position)."""
    body = "  override loss[aux]: stats_count_padding\n"
    for extra, bad in (("", True), (EQ, False)):
        spec = load_string(spec_text("per_microbatch", {"p": body + extra}), "split.place")
        assert simulated(spec.plan("p"), "per_microbatch") is bad
        assert _ob(spec, "p").verdict is (Verdict.REFUTED if bad else Verdict.PROVED)


SCOPES = ("global_batch", "per_microbatch", "per_sequence")
VERBS = ("per_sequence", "per_microbatch", "per_step")


def _random_case(rng: random.Random):
    """A plan with f's and P's statements over random axes, or (half the cases) f as the objective's and P over a
    part of the objective's groups, and whether it states equal counts."""
    axes = tuple(a for a in ("dp", "ep", "cp", "tp") if rng.random() < 0.6) or ("cp",)
    sp = rng.random() < 0.6
    scope = rng.choice(SCOPES)
    token = [a for a in axes if a != "tp" or sp]
    split = [a for a in token if a in ("cp", "tp")]
    pick = lambda among: ", ".join(a for a in among if rng.random() < 0.5)  # noqa: E731
    if rng.random() < 0.5:  # the union is the objective's grouping: only the counts can part them
        verbs = VERBS[:{"global_batch": 3, "per_microbatch": 2, "per_sequence": 1}[scope]]
        body = probs("probs_" + rng.choice(verbs), pick(token if scope == "global_batch" else split))
    else:
        body = stats("stats_" + rng.choice(VERBS), pick(token)) if rng.random() < 0.7 else ""
        body += probs("probs_" + rng.choice(VERBS), pick(token))
    return axes, sp, scope, body + (EQ if rng.random() < 0.4 else ""), rng.choice((1, 2))


@pytest.mark.parametrize("seed", range(14))
def test_random_split_statistics_agree_with_the_simulator(seed):
    rng = random.Random(100 + seed)
    axes, sp, scope, body, sequences = _random_case(rng)
    spec = load_string(spec_text(scope, {"p": body}, sequences=sequences, sp=sp, axes=axes), "split.place")
    ob = _ob(spec, "p")
    bad = simulated(spec.plan("p"), scope, sequences=sequences)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (axes, sp, scope, body, sequences)
    if bad and "hold one real token" in dict(ob.counterexample.values)["routing"]:
        stated, simulated_values = _replayed(ob, spec.plan("p"), scope, sequences)
        assert stated == simulated_values and stated[0] != stated[1]
