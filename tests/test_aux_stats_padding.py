"""The aux load-balancing loss's statistics beyond their groups (check.auxstats): the routing fractions f
and the mean probabilities P over groups of their own (``loss[aux]: probs_per_* over (AXES)``) and the
padded positions counted (``loss[aux]: stats_count_padding``).

Each case's verdict is derived by hand (f and P over different groups compute the grouping of their
union at equal real-token counts, which the plans stating them state with ``tokens: equal``; padding counted departs from any objective, which counts real tokens) and compared with the
checker's ``GI aux_stats`` and with the concrete simulator (tests/simulator_auxstats.py: every position
of the batch, padded ones included, random routings, each cell's f and P taken from its own groups,
with no use of the union); a refutation's replayed values are recomputed by the simulator on the
routing the counterexample describes."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest
import simulator_auxstats as sim
from test_aux_stats import _collectives, _cost_refused, spec_text, stats
from test_aux_stats_split import simulated as _simulated

from placement_logic.check.run import check_spec
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI aux_stats"
PAD = "  override loss[aux]: stats_count_padding\n"
ALL = "dp, ep, cp, tp"


def probs(verb: str, axes: str) -> str:
    return f"  override loss[aux]: {verb} over ({axes})\n"


EQ = "  override tokens: equal\n"  # every shard as many real tokens: the cells' mean of a factor is the gathered one

# name -> (objective, statements, whether the path computes the objective: by hand, as in test_aux_stats; f and P
# over groups of their own compute their union's loss at equal counts, stated here, and at free counts do not:
# test_aux_stats_split)
CASES = {
    # Megatron-LM#1561: global counts, each rank's own probabilities, the mean over the ranks: the global loss
    "global_f_local_p": ("global_batch", stats("stats_per_step", ALL) + probs("probs_per_sequence", "") + EQ, True),
    "global_f_step_p_microbatch": ("global_batch", stats("stats_per_step", ALL)
                                   + probs("probs_per_microbatch", "") + EQ, True),
    # f over the ranks per microbatch, P over the microbatches per rank: the union is the step
    "global_crossed": ("global_batch", stats("stats_per_microbatch", ALL) + probs("probs_per_step", "") + EQ, True),
    "global_f_no_ep": ("global_batch", stats("stats_per_step", "dp, cp, tp") + probs("probs_per_sequence", ""), False),
    "micro_f_over_dp": ("per_microbatch", stats("stats_per_microbatch", "dp, cp, tp")
                        + probs("probs_per_microbatch", "cp, tp"), False),
    "micro_p_over_dp": ("per_microbatch", probs("probs_per_microbatch", "dp, cp, tp"), False),
    "micro_p_local": ("per_microbatch", probs("probs_per_sequence", "") + EQ, True),
    "seq_p_local": ("per_sequence", probs("probs_per_sequence", "") + EQ, True),
    "seq_p_microbatch": ("per_sequence", probs("probs_per_microbatch", "cp, tp"), False),  # P of the pack
    "pad_micro": ("per_microbatch", PAD, False),
    "pad_global": ("global_batch", stats("stats_per_step", ALL) + PAD, False),
    "pad_and_tp_only": ("per_microbatch", stats("stats_per_microbatch", "tp") + PAD, False),
    # P over (ep, tp) per microbatch and f over the whole step, counts free: a short cell's tokens weigh more in
    # the cells' mean of P than in the pooled P (the simulator: one cell of one real token, the others of two)
    "split_free_counts": ("global_batch", probs("probs_per_microbatch", "ep, tp"), False),
    "split_free_counts_seq": ("per_sequence", probs("probs_per_sequence", ""), False),
}


def _spec(name: str, sequences: int = 2):
    scope, body, _ = CASES[name]
    return scope, load_string(spec_text(scope, {name: body}, sequences=sequences), "auxstats.place")


def _ob(spec, name: str):
    return next(o for o in check_spec(spec, [name], timeout=20).plans[0].obligations if o.name == NAME)


@pytest.mark.parametrize("name", list(CASES))
def test_the_verdict_agrees_with_the_simulator_and_by_hand(name):
    scope, spec = _spec(name)
    ok = CASES[name][2]
    assert _simulated(spec.plan(name), scope) is (not ok), name
    ob = _ob(spec, name)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), name
    if not ok:
        assert ob.counterexample is not None and ob.counterexample.diagnosis


def _replayed(ob, plan, scope: str, sequences: int = 2, experts: int = 8, top_k: int = 2):
    """The counterexample's two values, and the simulator's on the routing it describes (one real token
    per shard and, where the path counts padding, one padded position beside it)."""
    cx = ob.counterexample
    got, want = (Fraction(x) for x in re.match(r"aux on this path = ([0-9/]+) .* gives ([0-9/]+)$", cx.equation).groups())
    routing = dict(cx.values)["routing"]
    if split := re.search(r"at (\w+)=0 hold one real token", routing):  # unequal counts (test_aux_stats_split)
        layout = sim.uneven_along(split.group(1))
        flat = lambda c: (c, tuple(Fraction(1, top_k) if i in c else Fraction(0) for i in range(experts)))  # noqa: E731
        routed = [(t, flat(tuple(range(top_k)) if layout(t["rank"], t["mb"], t["seq"])[0] == 1
                           else tuple(range(1, top_k + 1)))) for t in sim.tokens(plan, dict(cx.sizes), sequences,
                                                                                   layout=layout)]
        return (got, want), sim.path_and_objective(plan, scope, routed, experts, top_k)
    found = re.search(r"tokens at (\w+)=0", routing)
    dim = found.group(1) if found else None
    assert dim is not None or "every padded position" in routing, routing
    c0, c1 = tuple(range(top_k)), tuple(range(1, top_k + 1))
    routed = []
    for t in sim.tokens(plan, dict(cx.sizes), sequences, padding=True, real=1, pads=1):
        if dim is None:
            chosen = c1 if t["pad"] else c0
        else:
            at = {"microbatches": t["mb"], "sequences": t["seq"]}.get(dim, t["rank"].get(dim))
            chosen = c0 if at == 0 else c1
        routed.append((t, (chosen, tuple(Fraction(1, top_k) if i in chosen else Fraction(0) for i in range(experts)))))
    return (got, want), sim.path_and_objective(plan, scope, routed, experts, top_k)


@pytest.mark.parametrize("name", [n for n, (_, _, ok) in CASES.items() if not ok])
def test_the_replayed_values_are_the_simulators(name):
    scope, spec = _spec(name)
    ob = _ob(spec, name)
    stated, simulated = _replayed(ob, spec.plan(name), scope)
    assert stated == simulated and stated[0] != stated[1]


def test_the_padding_finding_names_the_padding_and_each_dimension():
    scope, spec = _spec("pad_and_tp_only")
    diagnosis = " ".join(_ob(spec, "pad_and_tp_only").counterexample.diagnosis)
    assert "padded positions" in diagnosis and "not gathered over cp" in diagnosis


def test_a_lone_factor_gathered_is_named():
    scope, spec = _spec("micro_f_over_dp")
    diagnosis = " ".join(_ob(spec, "micro_f_over_dp").counterexample.diagnosis)
    assert "gathered over dp" in diagnosis and "f alone" in diagnosis


def test_padding_with_every_token_on_every_expert_changes_nothing():
    """With k = E every position, padded or not, routes to every expert: the value is 1 whatever is counted."""
    text = spec_text("per_microbatch", {"p": PAD}, experts=2, top_k=2)
    spec = load_string(text, "auxstats.place")
    assert _ob(spec, "p").verdict is Verdict.PROVED
    assert not _simulated(spec.plan("p"), "per_microbatch", experts=2, top_k=2)


@pytest.mark.parametrize("body,code", [
    ("  override loss[aux]: stats_count_padding over (dp)\n", "PL122"),
    ("  override loss[aux]: probs_per_step\n", "PL122"),
    ("  override loss[aux]: probs_per_step over (pp)\n", "PL215"),
    ("  override loss[aux]: probs_per_step over (cp, cp)\n", "PL215"),
    ("  override loss[z]: stats_count_padding\n", "PL213"),
])
def test_a_statement_no_step_reads_is_refused_by_check_and_cost(body, code):
    text = spec_text("per_sequence", {"p": body}, axes=("dp", "ep", "cp", "pp")).replace(
        "    aux = per_microbatch_mean\n", "    aux = per_microbatch_mean\n    z = global_mean\n")
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxstats.place")
    assert exc.value.diagnostics[0].code == code, exc.value.diagnostics[0].message
    assert _cost_refused(text) == code


def test_padding_without_an_objective_is_refused():
    text = spec_text(None, {"p": PAD})
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxstats.place")
    assert exc.value.diagnostics[0].code == "PL214"
    assert _cost_refused(text) == "PL214"


def test_the_new_statements_round_trip_through_fmt():
    from placement_logic.frontend.canonical import format_source

    text = spec_text("per_sequence", {"p": "  override loss[aux] :probs_per_step over(dp,cp)\n"
                                           "  override  loss[aux]:stats_count_padding\n"})
    out = format_source(text, "auxstats.place")
    assert "  override loss[aux]: probs_per_step over (dp, cp)\n  override loss[aux]: stats_count_padding\n" in out
    assert format_source(out, "auxstats.place") == out
    spec = load_string(out, "auxstats.place")
    got = [(o.target, o.group, o.verb, o.axes) for o in spec.plan("p").overrides]
    assert got == [("loss", "aux", "probs_per_step", ("dp", "cp")), ("loss", "aux", "stats_count_padding", None)]


def test_the_probabilities_all_reduce_is_priced_beside_the_counts():
    """P over dp (size 2) of its own: one more all-reduce of E = 8 fp32 values per MoE layer (8) and
    microbatch (4); the counts keep theirs over (cp, tp); padding moves no bytes."""
    body = probs("probs_per_microbatch", "dp") + PAD
    found = [c for c in _collectives(spec_text("per_microbatch", {"p": body}), "p") if "aux loss" in c["rule"]]
    by_axes = {tuple(c["axes"]): c for c in found}
    assert set(by_axes) == {("cp", "tp"), ("dp",)}
    c = by_axes[("dp",)]
    assert c["kind"] == "all_reduce" and c["count"] == 8 * 4 and "probabilities" in c["payload"]
    assert Fraction(c["bytes_per_device"]) == Fraction(2 * (2 - 1), 2) * 8 * 4 * 32  # the ring: 2(n-1)/n


SCOPES = ("global_batch", "per_microbatch", "per_sequence")
VERBS = ("per_sequence", "per_microbatch", "per_step")


def _random_case(rng: random.Random):
    axes = tuple(a for a in ("dp", "ep", "cp", "tp") if rng.random() < 0.7) or ("dp",)
    sp = rng.random() < 0.6
    token = [a for a in axes if a != "tp" or sp]
    body = ""
    for prefix in ("stats_", "probs_"):
        if rng.random() < 0.7:
            chosen = [a for a in token if rng.random() < 0.5]
            body += stats(prefix + rng.choice(VERBS), ", ".join(chosen))
    if rng.random() < 0.25:
        body += PAD
    return axes, sp, rng.choice(SCOPES), body, rng.choice((1, 2))


@pytest.mark.parametrize("seed", range(12))
def test_random_statements_agree_with_the_simulator(seed):
    rng = random.Random(100 + seed)
    axes, sp, scope, body, sequences = _random_case(rng)
    spec = load_string(spec_text(scope, {"p": body}, sequences=sequences, sp=sp, axes=axes), "auxstats.place")
    ob = _ob(spec, "p")
    bad = _simulated(spec.plan("p"), scope, sequences=sequences)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (axes, sp, scope, body, sequences)
    if bad:
        stated, simulated = _replayed(ob, spec.plan("p"), scope, sequences)
        assert stated == simulated and stated[0] != stated[1]
