"""The checker against the concrete simulator of the step semantics, on generated plans.

``tests/simulator.py`` executes one step of a plan on every device of small meshes (sizes
1-3 per axis, 1-2 microbatches) with random token counts and exact fractions, written from
docs/semantics.md without the checker's code. For every generated plan (random roles,
random modes per state per axis, random overrides) the checker's verdict of each condition
(for all sizes) must agree with the simulator: refuted exactly when some small mesh shows
the violation. Zero disagreements are allowed."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as hs
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
ROLES = ("data", "tensor", "context", "pipeline", "expert")
PARAM_MODES = ("R", "S", "S*", "O")  # M is a diagnostic (PL505) for params and optimizer state
GRAD_MODES = ("R", "S", "S*", "M", "O")
MAX_OVERRIDES = 2  # statements per generated plan


def checker_keys(report) -> dict[tuple, Verdict]:
    out = {}
    for o in report.obligations:
        name = o.name
        if name.startswith("GI grads[") and "] " not in name:
            out[("gi", name[len("GI grads["):-1])] = o.verdict
        elif name.startswith("SC params usable over "):
            out[("usable", name.rsplit(" ", 1)[1])] = o.verdict
        elif name.startswith("SC params gathered over "):
            out[("gathered", name.rsplit(" ", 1)[1])] = o.verdict
        elif name.startswith("SC optimizer step over "):
            out[("optimizer", name.rsplit(" ", 1)[1])] = o.verdict
        elif name == "SC params re-gather":
            out[("regather",)] = o.verdict
        elif name == "SC clip_norm":
            out[("clip",)] = o.verdict
        elif name == "SC overflow":
            out[("overflow",)] = o.verdict
        elif name.startswith("GI grads[") and name.endswith("] blocks"):
            out[("blocks", name[len("GI grads["):-len("] blocks")])] = o.verdict
        elif name.startswith("SC update["):
            out[("update", name[len("SC update["):-1])] = o.verdict
        elif name == "SC loss_scale":
            out[("loss_scale",)] = o.verdict
        elif name.startswith("GI loss[") and "] grads[" in name:
            term, group = name[len("GI loss["):-1].split("] grads[")
            out[("term", term, group)] = o.verdict
    return out


def simulated(p: ir.Plan, bindings: dict, seed: int) -> set:
    rng = random.Random(seed)
    found: set = set()
    names = p.mesh.names
    # on one axis up to 4 ranks: a statement naming rank 3 (count_on_ranks ranks (0, 3)) acts from a = 4 on
    for sizes in product((1, 2, 3, 4) if len(names) == 1 else (1, 2, 3), repeat=len(names)):
        for m in (1, 2):
            found |= simulator.violations(p, {**dict(zip(names, sizes)), "microbatches": m}, rng, bindings, trials=2)
    return found


@hs.composite
def plans(draw):
    k = draw(hs.integers(1, 2))
    names = ["a", "b"][:k]
    axes = {}
    for n in names:
        role = draw(hs.sampled_from(ROLES))
        modes = (draw(hs.sampled_from(PARAM_MODES)), draw(hs.sampled_from(PARAM_MODES)),
                 draw(hs.sampled_from(GRAD_MODES)), "R")
        axes[n] = (role, ",".join(modes))
    roles = [r for r, _ in axes.values()]
    sp = "tensor" in roles and draw(hs.booleans())
    axis_lists = hs.lists(hs.sampled_from(names), max_size=3).map(tuple)
    group = hs.sampled_from([None, "dense", "norms", "all"])
    candidates = hs.one_of(
        hs.builds(lambda g, a: ov("grads", "reduce", g, a), group, axis_lists),
        hs.builds(lambda g, a: ov("grads", "divide", g, by=ir.Sym(a)), group, hs.sampled_from(names)),
        hs.builds(lambda a: ov("tokens", "reduce", None, a), axis_lists),
        hs.just(ov("tokens", "equal")),
        hs.sampled_from([ov("loss", "per_device_mean"), ov("loss", "per_microbatch_mean"), ov("loss", "sum")]),
        hs.builds(lambda a: ov("loss", "on_gathered_sequence", None, a), axis_lists),  # context axes only, else PL292
        hs.builds(lambda g, a: ov("clip_norm", "reduce", g, a), group, axis_lists),
        hs.builds(lambda g: ov("clip_norm", "double_count", g), group),
        hs.builds(lambda g, a: ov("clip_norm", "dedupe", g, a), group, axis_lists),
        hs.builds(lambda g, a, v: ov("clip_norm", v, g, a), group, axis_lists, hs.sampled_from(["average", "max"])),
        hs.builds(lambda g: ov("clip_norm", "sqrt_before_reduce", g), group),
        hs.builds(lambda g, a: ov("clip_norm", "rank0_only", g, a), group, axis_lists),
        hs.just(ov("tokens", "clamp_before_reduce")),
        hs.just(ov("tokens", "count_ignored")),
        hs.just(ov("tokens", "ignored_in_loss")),
        hs.builds(lambda e: ov("tokens", "eps_before_reduce", by=ir.Const(e)),
                  hs.sampled_from([Fraction(1, 1000), Fraction(1, 2)])),
        hs.builds(lambda a: ov("overflow", "reduce", None, a), axis_lists),
        hs.builds(lambda g, a: ov("grads", "clip_rank0_only", g, a), group, axis_lists),
        hs.builds(lambda g, a, x: ov("grads", "divide_rank0_only", g, a, by=x), group, axis_lists,
                  hs.sampled_from([ir.Const(Fraction(2)), ir.Sym("a")])),
        hs.builds(lambda e: ov("clip_norm", "eps_before_reduce", by=ir.Const(e)),
                  hs.sampled_from([Fraction(1, 1000), Fraction(1, 2)])),
        hs.builds(lambda a: ov("loss_scale", "local", None, a), axis_lists),
        hs.builds(lambda a: ov("params", "gather", None, a), axis_lists),
        # a clip or a divisor on a set of one axis's ranks: sets the sizes 1-3 tell apart (a proper part of
        # the axis at a size up to 3 whenever one exists), and the last rank as an expression of the size
        hs.builds(lambda g, a, r, v, x: ov("grads", v, g, (a,), by=x if v == "divide_on_ranks" else None,
                                           ranks=tuple(ir.Const(Fraction(k)) for k in r) if r else
                                           (ir.Op("-", (ir.Sym(a), ir.Const(Fraction(1)))),)),
                  group, hs.sampled_from(names), hs.sampled_from([(0,), (1,), (2,), (0, 2), (1, 2), (0, 1), ()]),
                  hs.sampled_from(["clip_on_ranks", "divide_on_ranks"]),
                  hs.sampled_from([ir.Const(Fraction(2)), ir.Sym("a")])),
        # ... on a set of ranks of the process group over every axis (the first axis the most significant)
        hs.builds(lambda g, r, v: ov("grads", v, g, tuple(names), by=ir.Const(Fraction(2)) if v == "divide_on_ranks"
                                     else None, ranks=tuple(ir.Const(Fraction(k)) for k in r)),
                  group, hs.sampled_from([(1,), (2,), (0, 3), (1, 2, 3)]),
                  hs.sampled_from(["clip_on_ranks", "divide_on_ranks"])),
        # a group's squared norm counted on a set of one axis's ranks (check.rankcount)
        hs.builds(lambda g, a, r: ov("clip_norm", "count_on_ranks", g, (a,),
                                     ranks=tuple(ir.Const(Fraction(k)) for k in r) if r else
                                     (ir.Op("-", (ir.Sym(a), ir.Const(Fraction(1)))),)),
                  group, hs.sampled_from(names), hs.sampled_from([(0,), (1,), (2,), (0, 2), (1, 2), (0, 1), ()])),
        # ... on a set of ranks of the process group over every axis (the first axis the most significant)
        hs.builds(lambda g, r: ov("clip_norm", "count_on_ranks", g, tuple(names),
                                  ranks=tuple(ir.Const(Fraction(k)) for k in r)),
                  group, hs.sampled_from([(0,), (1,), (0, 1), (0, 3), (1, 2, 3)])),
        # consecutive groups of unequal sizes on one axis, their sum within the sizes 1-3 the simulator runs
        hs.builds(lambda t, g, a, s: ov(t, "reduce_groups", g if t == "grads" else None, (a,), sizes=s),
                  hs.sampled_from(["grads", "clip_norm"]), group, hs.sampled_from(names),
                  hs.sampled_from([(1, 1), (2, 1), (1, 2), (1, 1, 1)])),
        # the process groups of a list of rank sets on one axis, holding 2 or 3 ranks in all, in any order
        hs.builds(lambda t, g, a, s: ov(t, "reduce_sets", g if t == "grads" else None, (a,), sets=s),
                  hs.sampled_from(["grads", "clip_norm"]), group, hs.sampled_from(names),
                  hs.sampled_from([((1,), (0,)), ((0, 2), (1,)), ((2,), (1, 0)), ((0,), (2,), (1,))])),
        # a reduction run in blocks, strided or on the first ranks, and a divisor on all but the last rank (or
        # on it alone): so that two of them, or one beside another statement, meet in one plan
        hs.builds(lambda t, g, v, a, x: ov(t, v, g if t == "grads" else None, a, x),
                  hs.sampled_from(["grads", "clip_norm"]), group,
                  hs.sampled_from(["reduce_blocks", "reduce_strided", "reduce_first"]),
                  hs.lists(hs.sampled_from(names), min_size=1, max_size=2, unique=True).map(tuple),
                  hs.sampled_from([ir.Const(Fraction(1)), ir.Const(Fraction(2)), ir.Sym("a")])),
        hs.builds(lambda g, v, a, x: ov("grads", v, g, (a,), x), group,
                  hs.sampled_from(["divide_except_last", "divide_last_only"]), hs.sampled_from(names),
                  hs.sampled_from([ir.Const(Fraction(2)), ir.Sym("a")])),
    )
    overrides = tuple(draw(hs.lists(candidates, max_size=MAX_OVERRIDES)))
    return plan("p", axes, sp=sp, overrides=overrides)


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(plans(), hs.integers(0, 10**6))
@example(plan("p", {"a": ("data", "S*,S,S,R")}, overrides=(ov("params", "gather", None, ("a", "a")),)), 1)
@example(plan("p", {"a": ("data", "S*,S,S,R")}, overrides=(ov("params", "gather", None, ()),)), 2)
@example(plan("p", {"a": ("data", "R,S,S,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("overflow", "reduce", None, ("b",)),)), 3)
@example(plan("p", {"a": ("expert", "S,S,S,R")}, experts=4), 4)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("pipeline", "S,S,S,S")}, tied=True,
              overrides=(ov("embedding", "tie_reduce", None, ()),)), 5)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")}, sp=True,
              overrides=(ov("grads", "reduce", "norms", ("a",)),)), 6)
@example(plan("p", {"a": ("pipeline", "R,R,R,R")}, overrides=(ov("tokens", "reduce", None, ("a",)),)), 7)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("context", "R,R,R,R")},
              overrides=(ov("tokens", "clamp_before_reduce"),)), 8)
@example(plan("p", {"a": ("data", "R,R,R,R")},
              overrides=(ov("tokens", "eps_before_reduce", by=ir.Const(Fraction(1, 1000))),)), 10)
@example(plan("p", {"a": ("data", "R,S,S,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "rank0_only", "norms", ("a", "b")),)), 9)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("grads", "clip_rank0_only", "norms", ("b",)),)), 11)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "eps_before_reduce", by=ir.Const(Fraction(1, 1000))),)), 12)
@example(plan("p", {"a": ("data", "R,S,S,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("loss_scale", "local", None, ("a",)),)), 13)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "average", None, ("a", "b")),
                         ov("clip_norm", "eps_before_reduce", by=ir.Const(Fraction(1, 2))))), 14)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("data", "R,R,R,R")},
              overrides=(ov("grads", "reduce_blocks", "norms", ("b",), ir.Sym("a")),)), 15)
@example(plan("p", {"a": ("data", "R,S,S,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "reduce_blocks", None, ("a",), ir.Const(Fraction(2))),)), 16)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("pipeline", "S,S,S,S")},
              overrides=(ov("grads", "divide_except_last", None, ("b",), ir.Const(Fraction(2))),)), 17)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("grads", "reduce_strided", None, ("a",), ir.Const(Fraction(2))),)), 18)
@example(plan("p", {"a": ("data", "R,S,S,R"), "b": ("data", "R,R,R,R")},
              overrides=(ov("clip_norm", "reduce_first", None, ("a",), ir.Sym("b")),)), 19)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("pipeline", "S,S,S,S")},
              overrides=(ov("grads", "divide_on_ranks", None, ("b",), ir.Const(Fraction(2)),
                            ranks=(ir.Const(Fraction(1)), ir.Const(Fraction(2)))),)), 20)
@example(plan("p", {"a": ("data", "R,R,R,R")},
              overrides=(ov("grads", "clip_on_ranks", "norms", ("a",), ranks=(ir.Const(Fraction(0)),)),)), 21)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "count_on_ranks", "dense", ("b",), ranks=(ir.Const(Fraction(0)),
                                                                                 ir.Const(Fraction(2)))),)), 22)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "count_on_ranks", "norms", ("b",),
                            ranks=(ir.Op("-", (ir.Sym("b"), ir.Const(Fraction(1)))),)),)), 23)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("pipeline", "S,S,S,S")},
              overrides=(ov("grads", "divide_on_ranks", None, ("b", "a"), ir.Const(Fraction(2)),
                            ranks=(ir.Const(Fraction(1)), ir.Const(Fraction(2)))),)), 24)
@example(plan("p", {"a": ("data", "R,S,S,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "reduce_groups", None, ("a",), sizes=(2, 1)),)), 25)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("data", "R,R,R,R")},
              overrides=(ov("grads", "reduce_groups", "norms", ("b",), sizes=(1, 2)),)), 26)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("context", "R,R,R,R")},
              overrides=(ov("tokens", "count_ignored"), ov("tokens", "reduce", None, ("a", "b")))), 27)
@example(plan("p", {"a": ("data", "S,S,S,S"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("tokens", "ignored_in_loss"), ov("loss", "sum"))), 28)
@example(plan("p", {"a": ("data", "R,S,S,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "reduce_sets", None, ("a",), sets=((0, 2), (1,))),)), 29)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("data", "R,R,R,R")},
              overrides=(ov("grads", "reduce_sets", "norms", ("b",), sets=((2,), (1, 0))),)), 30)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("tensor", "S,S,S,S")},
              overrides=(ov("clip_norm", "reduce", "dense", ("a", "b")),
                         ov("clip_norm", "count_on_ranks", "dense", ("a", "b"),
                            ranks=(ir.Const(Fraction(0)), ir.Const(Fraction(3)))))), 31)
@example(plan("p", {"a": ("data", "R,R,R,R"), "b": ("context", "R,R,R,R")},
              overrides=(ov("loss", "on_gathered_sequence", None, ("b",)), ov("tokens", "reduce", None, ("a", "b")))), 32)
def test_checker_agrees_with_the_simulator(generated, seed):
    spec, p = generated
    try:
        report = check_plan(SESSION, spec, p, {})
    except DiagnosticError:
        assume(False)  # an input the checker rejects with a diagnostic (e.g. an override that changes nothing)
    verdicts = checker_keys(report)
    assert Verdict.UNKNOWN not in verdicts.values(), verdicts
    found = simulated(p, dict(spec.bindings), seed)
    disagreements = []
    for key, verdict in verdicts.items():
        refuted = verdict is Verdict.REFUTED
        if refuted != (key in found):
            disagreements.append((key, verdict.word, "simulator violated" if key in found else "simulator ok"))
    for key in found:
        assert key in verdicts, (key, "violated in the simulator, no such obligation in the checker")
    assert not disagreements, (disagreements, p.placements, p.overrides, p.sequence_parallel)


DDP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}
ZERO2_TP = {"dp": ("data", "R,S,S,R"), "tp": ("tensor", "S,S,S,S")}
CLIP_FILTER_CASES = [
    # (axes, overrides, whether the global norm is right, by hand: norms and biases are replicated
    # over tp, dense and embedding sharded there; under DDP every group is replicated over dp)
    (DDP_TP, (), True),  # the derived reduction over tp, with the duplicate filter for norms and biases
    (DDP_TP, (ov("clip_norm", "reduce", "norms", ("tp",)),), False),  # norms' copies summed: tp times
    (DDP_TP, (ov("clip_norm", "reduce", "norms", ("tp",)), ov("clip_norm", "dedupe", "norms", ("tp",))), True),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)),), False),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "dedupe", None, ("tp",))), True),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp",)), ov("clip_norm", "dedupe", "norms", ("tp",))), False),  # biases
    (DDP_TP, (ov("clip_norm", "reduce", None, ("dp", "tp")), ov("clip_norm", "dedupe", None, ("dp", "tp"))), True),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("dp", "tp")), ov("clip_norm", "dedupe", None, ("tp",))), False),
    (DDP_TP, (ov("clip_norm", "reduce", None, ("tp", "tp")), ov("clip_norm", "dedupe", None, ("tp",))), False),
    (ZERO2_TP, (ov("clip_norm", "reduce", None, ("dp", "tp")),), False),
    (ZERO2_TP, (ov("clip_norm", "reduce", None, ("dp", "tp")), ov("clip_norm", "dedupe", "all", ("tp",))), True),
]


@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("axes,overrides,ok", CLIP_FILTER_CASES)
def test_clip_filter_pinned_sizes_agree_with_simulator(axes, overrides, ok, tp):
    """A written clip-norm reduction is a plain sum and the duplicate filter a stated construct:
    with every size pinned (dp = 2, tp = 2, 3, 4), the checker's SC clip_norm, the simulator and the
    hand-derived answer agree."""
    spec, p = plan("p", axes, overrides=overrides)
    sizes = {"dp": 2, "tp": tp, "microbatches": 1}
    report = check_plan(SESSION, spec, p, sizes)
    verdict = checker_keys(report)[("clip",)]
    found = any(("clip",) in simulator.norm_violations(p, sizes, random.Random(seed)) for seed in range(8))
    assert found is (not ok)
    assert verdict is (Verdict.PROVED if ok else Verdict.REFUTED), report.obligations


def test_simulator_hand_cases():
    """The simulator alone, on cases whose answers are known by hand."""
    rng = random.Random(0)
    sizes = {"dp": 2, "microbatches": 2}
    _, ddp = plan("p", {"dp": ("data", "R,R,R,R")})
    assert simulator.violations(ddp, sizes, rng) == set()
    _, twice = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(ov("grads", "reduce", None, ("dp", "dp")),))
    assert ("gi", "dense") in simulator.violations(twice, sizes, rng)
    _, cancel = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(
        ov("grads", "reduce", None, ("dp", "dp")), ov("grads", "divide", None, by=ir.Sym("dp"))))
    assert not any(k[0] == "gi" for k in simulator.violations(cancel, sizes, rng))
    _, pdm = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(ov("loss", "per_device_mean"),))
    assert ("gi", "dense") in simulator.violations(pdm, sizes, rng, trials=5)
    _, packed = plan("p", {"dp": ("data", "R,R,R,R")}, overrides=(ov("loss", "per_device_mean"), ov("tokens", "equal")))
    assert not any(k[0] == "gi" for k in simulator.violations(packed, sizes, rng))
    _, sharded = plan("p", {"dp": ("data", "S,S,S,R")})
    assert ("usable", "dp") in simulator.violations(sharded, sizes, rng)
    _, mismatch = plan("p", {"dp": ("data", "R,R,S,R")})
    assert ("optimizer", "dp") in simulator.violations(mismatch, sizes, rng)
    assert Fraction(1, 2) + Fraction(1, 2) == 1


@pytest.mark.parametrize("overrides", [(ov("loss_scale", "local", None, ("a",)),),
                                       (ov("grads", "reduce", None, ()), ov("loss_scale", "local", None, ("a",)))])
def test_a_loss_scale_read_locally_over_expert_shards(overrides):
    """By hand: the experts' gradient is sharded over the expert axis a, so with the scale updated from each
    rank's own found-inf flag over a, an overflow in rank 0's experts alone halves rank 0's scale only, while
    single-device training halves it everywhere: SC loss_scale refuted, and the simulator finds it at a = 2
    and 3 for every seed (its random flags alone missed it on most seeds: a replicated group's flag, seen by
    every device, was set in most draws)."""
    spec, p = plan("p", {"a": ("expert", "R,R,R,R")}, overrides=overrides)
    assert checker_keys(check_plan(SESSION, spec, p, {}))[("loss_scale",)] is Verdict.REFUTED
    for a, seed in product((2, 3), range(6)):
        assert ("loss_scale",) in simulator.violations(p, {"a": a, "microbatches": 1}, random.Random(seed),
                                                        dict(spec.bindings), trials=1)


def test_a_clamped_token_count_on_a_pipeline_axis_halves_the_embedding_gradient():
    """By hand: on a pipeline of a = 1 stage with two microbatches holding 1 and 0 tokens, a count clamped
    to at least 1 per microbatch before it is summed gives a normaliser of 2 where the step holds 1 token, so
    every gradient (the embedding's too) is halved: GI refuted for the embedding, and the simulator finds it
    for every seed (its random counts alone held no empty microbatch for the embedding on most seeds)."""
    spec, p = plan("p", {"a": ("pipeline", "S,R,R,R")}, overrides=(ov("tokens", "clamp_before_reduce"),))
    keys = checker_keys(check_plan(SESSION, spec, p, {}))
    assert keys[("gi", "embedding")] is Verdict.REFUTED
    found = [("gi", "embedding") in simulator.violations(p, {"a": 1, "microbatches": 2}, random.Random(seed),
                                                          dict(spec.bindings), trials=4) for seed in range(8)]
    assert all(found)
