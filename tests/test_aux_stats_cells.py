"""The aux load-balancing loss's statistics over router calls of unequal real-token counts and after a
capacity step (check.encode_auxcells): ``loss[aux]: stats_equal_cell_weights``, ``stats_after_capacity``,
``stats_capacity_padded``.

Each verdict is derived by hand (equal weights over two or more router calls depart from the pooled
objective once the calls' real-token counts differ; dropping departs where capacity_factor · k < E; padding
to capacity departs whenever k < E) and compared with the checker's ``GI aux_stats`` and with the concrete
simulator (tests/simulator_auxstats.py: every position of the batch, padding spread evenly and unevenly,
random routings, each call's capacity map built token by token); a refutation's replayed values are
recomputed by the simulator on the routing the counterexample describes."""

from __future__ import annotations

import random
import re
from fractions import Fraction
from itertools import product

import pytest
import simulator_auxstats as sim
from test_aux_stats import _collectives, _cost_refused, spec_text, stats

from placement_logic.check.run import check_spec
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI aux_stats"
EQUAL_MB = "  override loss[aux]: stats_equal_microbatch_weights\n"


def equal(axes: str) -> str:
    return f"  override loss[aux]: stats_equal_cell_weights over ({axes})\n"

DROP = "  override loss[aux]: stats_after_capacity\n"
PADDED = "  override loss[aux]: stats_capacity_padded\n"
ALL = "dp, ep, cp, tp"


def text_of(scope, plans, capacity_factor=None, **kw) -> str:
    text = spec_text(scope, plans, **kw)
    if capacity_factor is not None:
        text = text.replace("    top_k = ", f"    capacity_factor = {capacity_factor}\n    top_k = ", 1)
    return text


# name -> (objective, statements, capacity factor, whether the path computes the objective: by hand)
CASES = {
    # the pooled combination (counts summed, then divided) is the objective's at any counts
    "global_pooled": ("global_batch", stats("stats_per_step", ALL), None, True),
    "micro_pooled": ("per_microbatch", "", None, True),
    # Megatron-LM#7197: the step's microbatches weighted equally
    "global_equal_mb": ("global_batch", stats("stats_per_step", ALL) + EQUAL_MB, None, False),
    "global_equal_dp": ("global_batch", stats("stats_per_step", ALL) + equal("dp, ep"), None, False),
    "micro_equal_cp": ("per_microbatch", equal("cp"), None, False),  # the cp parts of a microbatch
    "seq_equal": ("per_sequence", equal("cp, tp"), None, False),  # the parts of a sequence
    "micro_equal_dp_only": ("per_microbatch", stats("stats_per_microbatch", "dp") + equal("dp"), None, False),
    # Megatron-LM#1513, #1617: f from the post-capacity map
    "micro_drop": ("per_microbatch", DROP, None, False),
    "seq_drop": ("per_sequence", DROP, "3/2", False),
    "global_padded": ("global_batch", PADDED, None, False),
    "seq_padded_big_factor": ("per_sequence", PADDED, "4", False),  # no drop, but the columns are filled
    "micro_drop_and_equal": ("per_microbatch", DROP + equal("cp, tp"), None, False),
}


def _spec(name: str, **kw):
    scope, body, cf, _ = CASES[name]
    return scope, load_string(text_of(scope, {name: body}, cf, **kw), "auxcells.place")


def _ob(spec, name: str):
    return next(o for o in check_spec(spec, [name], timeout=20).plans[0].obligations if o.name == NAME)


def _simulated(plan, scope: str, sequences: int = 2, experts: int = 8, top_k: int = 2) -> bool:
    """Whether the simulator finds sizes (each axis 1 or 2), a padding layout (even or uneven) and a routing
    where the path's value differs from the objective's."""
    rng = random.Random(0)
    axes = plan.mesh.names
    for combo in product((1, 2), repeat=len(axes) + 1):
        sizes = dict(zip(axes, combo[:-1])) | {"microbatches": combo[-1]}
        for layout in (None, sim.uneven_layout):
            if sim.differs(plan, scope, sizes, sequences, experts, top_k, rng, tries=2, layout=layout):
                return True
    return False


@pytest.mark.parametrize("name", list(CASES))
def test_the_verdict_agrees_with_the_simulator_and_by_hand(name):
    scope, spec = _spec(name)
    ok = CASES[name][3]
    assert _simulated(spec.plan(name), scope) is (not ok), name
    ob = _ob(spec, name)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (name, ob.unknown)
    if not ok:
        assert ob.counterexample is not None and ob.counterexample.diagnosis


def _replayed(ob, plan, scope: str, sequences: int = 2, experts: int = 8, top_k: int = 2):
    """The counterexample's two values, and the simulator's on the routing and layout it describes."""
    cx = ob.counterexample
    got, want = (Fraction(x) for x in re.match(r"aux on this path = ([0-9/]+) .* gives ([0-9/]+)$", cx.equation).groups())
    routing = dict(cx.values)["routing"]
    uneven = re.search(r"router calls at (\w+)=0 hold one real token", routing)
    c0, c1 = tuple(range(top_k)), tuple(range(1, top_k + 1))
    flat = lambda c: (c, tuple(Fraction(1, top_k) if i in c else Fraction(0) for i in range(experts)))  # noqa: E731
    if uneven:
        dim = uneven.group(1)
        at = lambda rank, mb, seq: {"microbatches": mb}.get(dim, rank.get(dim))  # noqa: E731
        toks = sim.tokens(plan, dict(cx.sizes), sequences,
                          layout=lambda rank, mb, seq: (1, 1) if at(rank, mb, seq) == 0 else (2, 0))
        routed = [(t, flat(c0 if at(t["rank"], t["mb"], t["seq"]) == 0 else c1)) for t in toks]
    elif grouped := re.search(r"tokens at (\w+)=0 choose", routing):  # a grouping's witness (test_aux_stats_padding)
        dim = grouped.group(1)
        routed = []
        for t in sim.tokens(plan, dict(cx.sizes), sequences, padding=True, real=1, pads=1):
            at = {"microbatches": t["mb"], "sequences": t["seq"]}.get(dim, t["rank"].get(dim))
            routed.append((t, flat(c0 if at == 0 else c1)))
    elif "every padded position" in routing:
        routed = [(t, flat(c1 if t["pad"] else c0))
                  for t in sim.tokens(plan, dict(cx.sizes), sequences, padding=True, real=1, pads=1)]
    else:
        per = int(re.search(r"(\d+) token\(s\) per shard", routing).group(1))
        w = [2 if i < top_k else 1 for i in range(experts)]
        tok = (c0, tuple(Fraction(x, sum(w)) for x in w))
        routed = [(t, tok) for t in sim.tokens(plan, dict(cx.sizes), sequences, real=per, padding=False)]
    return (got, want), sim.path_and_objective(plan, scope, routed, experts, top_k)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c[3]])
def test_the_replayed_values_are_the_simulators(name):
    scope, spec = _spec(name)
    ob = _ob(spec, name)
    stated, simulated = _replayed(ob, spec.plan(name), scope)
    assert stated == simulated and stated[0] != stated[1]


def test_equal_weights_by_hand():
    """Two calls, one with a real token on expert 0 and one with two on expert 1 (E = 2, k = 1, probability 1
    on the chosen expert): pooled f = P = (1/3, 2/3), aux = 2 · 5/9 = 10/9; equal weights f = P = (1/2, 1/2),
    aux = 1. The simulator's two combinations give these numbers."""
    t = [{"rank": {"dp": r}, "mb": 0, "seq": 0, "pos": (0, i), "pad": False} for r, i in ((0, 0), (1, 0), (1, 1))]
    routed = [(t[0], ((0,), (Fraction(1), Fraction(0))))] + [(x, ((1,), (Fraction(0), Fraction(1)))) for x in t[1:]]
    args = ("stats_per_step", ("dp",), "stats_per_step", ("dp",), 2, 1)
    assert sim.cell_loss(routed, *args) == Fraction(10, 9)
    assert sim.cell_loss(routed, *args, equal={"dp"}) == 1


def test_capacity_by_hand():
    """One call of 4 tokens all choosing expert 0 of E = 2 (k = 1, probabilities (3/4, 1/4)), capacity factor 1:
    C = 2. Top-k: f = (1, 0), aux = 2 · 3/4 = 3/2; dropped: f = (1/2, 0), aux = 3/4; padded: f = (1/2, 1/2),
    aux = 2 · (3/8 + 1/8) = 1."""
    t = [{"rank": {}, "mb": 0, "seq": 0, "pos": (0, i), "pad": False} for i in range(4)]
    routed = [(x, ((0,), (Fraction(3, 4), Fraction(1, 4)))) for x in t]
    args = ("stats_per_step", (), "stats_per_step", (), 2, 1)
    assert sim.cell_loss(routed, *args) == Fraction(3, 2)
    assert sim.cell_loss(routed, *args, capacity=("drop", 1)) == Fraction(3, 4)
    assert sim.cell_loss(routed, *args, capacity=("pad", 1)) == 1


def test_the_findings_name_each_cause():
    scope, spec = _spec("micro_drop_and_equal")
    diagnosis = " ".join(_ob(spec, "micro_drop_and_equal").counterexample.diagnosis)
    assert "equal weights" in diagnosis and "capacity step" in diagnosis
    scope, spec = _spec("global_padded")
    assert "padded to capacity" in " ".join(_ob(spec, "global_padded").counterexample.diagnosis)


def test_padding_to_capacity_with_every_expert_chosen_changes_nothing():
    """k = E: every token marks every expert already; the padded map is the top-k map."""
    text = text_of("per_microbatch", {"p": PADDED}, experts=2, top_k=2)
    spec = load_string(text, "auxcells.place")
    assert _ob(spec, "p").verdict is Verdict.PROVED
    assert not _simulated(spec.plan("p"), "per_microbatch", experts=2, top_k=2)


def test_a_capacity_factor_bound_by_a_let_is_read_through_it():
    """capacity_factor = cf: cf = 4 = E/k drops nothing (PL265); cf = 3 drops (refuted)."""
    for cf, code in (("4", "PL265"), ("3", None)):
        text = text_of("per_microbatch", {"p": DROP}, "cf").replace("model {", f"let cf = {cf}\n\nmodel {{", 1)
        if code:
            with pytest.raises(DiagnosticError) as exc:
                load_string(text, "auxcells.place")
            assert exc.value.diagnostics[0].code == code
        else:
            assert _ob(load_string(text, "auxcells.place"), "p").verdict is Verdict.REFUTED


@pytest.mark.parametrize("body,cf,axes,code", [
    (EQUAL_MB.replace("\n", " over (dp)\n"), None, ("dp", "ep", "cp", "tp"), "PL122"),
    ("  override loss[aux]: stats_equal_cell_weights\n", None, ("dp", "ep", "cp", "tp"), "PL122"),
    (DROP.replace("\n", " over (dp)\n"), None, ("dp", "ep", "cp", "tp"), "PL122"),
    (equal("pp"), None, ("dp", "ep", "cp", "pp"), "PL215"),  # a pipeline axis splits no tokens
    (equal("dp"), None, ("dp", "ep"), "PL264"),  # per_microbatch: dp's calls are never combined
    (EQUAL_MB, None, ("dp", "ep", "cp", "tp"), "PL264"),  # per_microbatch: microbatches never combined
    (equal(""), None, ("dp", "ep", "cp", "tp"), "PL264"),
    (stats("stats_per_microbatch", "") + equal("cp"), None, ("dp", "ep", "cp", "tp"), "PL264"),
    (DROP, "4", ("dp", "ep", "cp", "tp"), "PL265"),  # 4 · 2 >= 8
    (DROP, "5", ("dp", "ep", "cp", "tp"), "PL265"),
])
def test_a_statement_that_changes_nothing_is_refused_by_check_and_cost(body, cf, axes, code):
    text = text_of("per_microbatch", {"p": body}, cf, axes=axes)
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxcells.place")
    assert exc.value.diagnostics[0].code == code, exc.value.diagnostics[0].message
    assert _cost_refused(text) == code


def test_equal_weights_over_the_microbatches_alone_is_accepted():
    """stats_per_step over (): the step's microbatches on one device are the calls gathered."""
    text = text_of("global_batch", {"p": stats("stats_per_step", "") + EQUAL_MB}, axes=("dp", "ep"))
    assert _ob(load_string(text, "auxcells.place"), "p").verdict is Verdict.REFUTED


def test_without_an_objective_they_are_refused():
    for body in (equal("cp"), EQUAL_MB, DROP, PADDED):
        text = text_of(None, {"p": body})
        with pytest.raises(DiagnosticError) as exc:
            load_string(text, "auxcells.place")
        assert exc.value.diagnostics[0].code == "PL214"


def test_the_new_statements_round_trip_through_fmt():
    from placement_logic.frontend.canonical import format_source

    text = text_of("global_batch", {"p": "  override loss[aux] :stats_equal_cell_weights over(cp,tp)\n"
                                          "  override loss[aux]:stats_equal_microbatch_weights\n"
                                          "  override  loss[aux]:stats_after_capacity\n"
                                          "  override loss[aux]:  stats_capacity_padded\n"})
    out = format_source(text, "auxcells.place")
    assert ("  override loss[aux]: stats_equal_cell_weights over (cp, tp)\n"
            "  override loss[aux]: stats_equal_microbatch_weights\n  override loss[aux]: stats_after_capacity\n"
            "  override loss[aux]: stats_capacity_padded\n") in out
    assert format_source(out, "auxcells.place") == out
    got = [(o.target, o.group, o.verb, o.axes) for o in load_string(out, "auxcells.place").plan("p").overrides]
    assert got == [("loss", "aux", "stats_equal_cell_weights", ("cp", "tp"))] + [
        ("loss", "aux", v, None) for v in ("stats_equal_microbatch_weights", "stats_after_capacity",
                                           "stats_capacity_padded")]


def test_no_bytes_move_for_them():
    """The statistics' all-reduces are those of the plan without the statements: weights and a capacity map
    are computed on values every rank already holds."""
    base = [c for c in _collectives(text_of("per_microbatch", {"p": ""}), "p")]
    for body in (equal("cp, tp"), DROP, PADDED, equal("cp") + PADDED):
        assert [c for c in _collectives(text_of("per_microbatch", {"p": body}), "p")] == base


def _random_case(rng: random.Random):
    """Axes, sequence parallelism, an objective and statements; equal weights are drawn mostly over dimensions
    the path gathers (the stated axes, or the objective's split axes where none is stated) so that most cases
    are accepted, and now and then over any token axis (refused with PL264 where the path does not gather it)."""
    axes = tuple(a for a in ("dp", "ep", "cp", "tp") if rng.random() < 0.7) or ("dp",)
    sp = rng.random() < 0.6
    token = [a for a in axes if a != "tp" or sp]
    scope = rng.choice(("global_batch", "per_microbatch", "per_sequence"))
    verb = rng.choice(("per_sequence", "per_microbatch", "per_step"))
    stated = [a for a in token if rng.random() < 0.6]
    body = stats("stats_" + verb, ", ".join(stated)) if rng.random() < 0.6 else ""
    if body:
        gathered, steps = stated, verb == "per_step"
    else:
        gathered = token if scope == "global_batch" else [a for a in token if a in ("cp", "tp")]
        steps = scope == "global_batch"
    pool = gathered if rng.random() < 0.8 else token
    body += rng.choice(("", DROP, PADDED))
    if rng.random() < 0.7:
        picked = [a for a in pool if rng.random() < 0.6]
        body += EQUAL_MB if steps and (not picked or rng.random() < 0.4) else equal(", ".join(picked))
    return axes, sp, scope, body


@pytest.mark.parametrize("seed", range(16))
def test_random_statements_agree_with_the_simulator(seed):
    axes, sp, scope, body = _random_case(random.Random(300 + seed))
    text = text_of(scope, {"p": body}, random.Random(seed).choice((None, "1", "3/2")), sp=sp, axes=axes)
    try:
        spec = load_string(text, "auxcells.place")
    except DiagnosticError as e:  # equal weights over calls the path does not combine: refused, as by hand
        assert e.diagnostics[0].code == "PL264" and "stats_equal_" in body
        return
    ob = _ob(spec, "p")
    bad = _simulated(spec.plan("p"), scope)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (axes, sp, scope, body)
    if bad:
        stated, simulated = _replayed(ob, spec.plan("p"), scope)
        assert stated == simulated and stated[0] != stated[1]
