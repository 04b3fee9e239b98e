"""The MoE dispatch and combine all-to-alls on every axis role (data, context, tensor with and without
sequence parallelism, sequence, pipeline, expert) and under parallel folding (``group experts { role =
{...} }``): the checker against a brute-force oracle written from the placements (tests/simulator_moe.py:
which experts and which tokens each rank holds, the all-to-alls and the expert's shards run on the whole
mesh), on hand-derived and generated plans, and the replayed counterexample of a pass over a tensor axis
whose ranks hold the same tokens."""

from __future__ import annotations

import pytest
import simulator_moe
from handcases import violations_at_every_size
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs
from tiers import examples

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
A, G = "activations", "activation_grads"
KEYS = {f"GI {A}[experts]": ("act", "experts"), f"GI {G}[experts]": ("grad", "experts")}
ACT, GRAD = KEYS[f"GI {A}[experts]"], KEYS[f"GI {G}[experts]"]
TEXT = """from std.data import ddp
from std.tensor import megatron_tp, megatron_sp
from std.expert import expert_parallel
from std.context import context_parallel
from std.pipeline import one_f_one_b
strategy seq = sequence(S, S, S, S)
strategy whole_tp = tensor(R, R, R, R)
model {{
  transformer {{ hidden = 64  layers = 4  heads = 4  ffn = 128  vocab = 128  experts = 8  top_k = 2 }}
  seq = 16
{fold}}}
mesh {{ {mesh} }}
plan p {{
{body}}}
"""
# the strategy of each axis (its name: the role it plays, sp: Megatron TP with sequence parallelism)
STRATEGY = {"dp": "ddp", "ep": "expert_parallel", "tp": "megatron_tp", "sp": "megatron_sp", "sq": "seq",
            "cp": "context_parallel", "pp": "one_f_one_b", "wt": "whole_tp"}


def _spec(axes, fold=None, stmts=()):
    f = f"  group experts {{ role = {{{', '.join(f'{a}: {r}' for a, r in fold.items())}}} }}\n" if fold else ""
    body = "".join(f"  {a}: {STRATEGY[a]}\n" for a in axes) + "".join(f"  override {s}\n" for s in stmts)
    spec = load_string(TEXT.format(fold=f, mesh="  ".join(f"{a} = 2" for a in axes), body=body))
    return spec, spec.plan("p")


def verdicts(spec, p) -> dict[tuple, Verdict]:
    return {KEYS[o.name]: o.verdict for o in check_plan(SESSION, spec, p, {}).obligations if o.name in KEYS}


def simulated(p, values=(1, 2, 3)) -> set:
    return violations_at_every_size(simulator_moe.violations, p, values)


def both(*axes):
    return (f"{A}[experts]: dispatch over ({', '.join(axes)})", f"{A}[experts]: combine over ({', '.join(axes)})",
            f"{G}[experts]: combine over ({', '.join(axes)})", f"{G}[experts]: dispatch over ({', '.join(axes)})")


HAND = [
    # Megatron TP without sequence parallelism splits the experts and replicates the tokens: a pass
    # over it gives its ranks different tokens, whose shards the all-reduce sums
    (("tp", "ep"), None, both("tp", "ep"), {ACT, GRAD}),
    (("tp", "ep"), None, both("tp", "ep")[:2], {ACT}),
    (("tp", "ep"), None, both("tp", "tp", "ep"), ()),  # two passes over tp: back in place before the experts
    (("tp", "ep"), None, (), ()),
    # with sequence parallelism each rank holds its own tokens and the shards are gathered: a round trip is harmless
    (("sp", "ep"), None, both("sp", "ep"), ()),
    (("sq", "ep"), None, both("sq", "ep"), ()),
    (("sp", "ep"), None, both("sp", "ep")[:1], {ACT}),
    # the tensor axis holds whole layers: every rank the same token and the same whole expert
    (("wt", "ep"), None, both("wt", "ep"), ()),
    (("cp", "ep"), None, both("cp", "ep"), ()),
    (("dp", "ep"), None, both("dp", "ep"), ()),
    (("pp", "ep"), None, both("pp", "ep"), {ACT, GRAD}),
    (("pp", "ep"), None, both("pp", "pp", "ep"), ()),
    # folding (Megatron folds only a sequence-parallel tensor axis, PL133): the tensor axis an expert axis
    # of the experts, or a data axis of theirs
    (("sp", "dp"), {"sp": "expert"}, (), ()),
    (("sp", "dp"), {"sp": "expert"}, both("dp", "sp"), ()),
    (("sp", "dp"), {"sp": "expert"}, both("dp", "sp")[:1], {ACT}),
    (("sp", "dp"), {"dp": "expert"}, both("dp", "sp"), ()),
    (("sp", "dp"), {"dp": "expert", "sp": "data"}, both("dp", "sp"), ()),
    (("sp", "dp", "ep"), {"dp": "tensor"}, both("dp", "ep"), ()),
    (("tp", "dp", "ep"), {"dp": "tensor"}, both("tp", "ep")[:2], {ACT}),
]


@pytest.mark.parametrize("axes,fold,stmts,expected", HAND)
def test_hand_cases_checker_and_oracle(axes, fold, stmts, expected):
    spec, p = _spec(axes, fold, stmts)
    assert simulated(p) == set(expected)
    v = verdicts(spec, p)
    assert set(v) == set(KEYS.values())
    assert {k for k, x in v.items() if x is Verdict.REFUTED} == set(expected)
    assert all(x is Verdict.PROVED for k, x in v.items() if k not in expected)


@hs.composite
def role_plans(draw):
    tensor = draw(hs.sampled_from(("tp", "tp", "sp", "sq", "wt")))
    chosen = draw(hs.sets(hs.sampled_from(("dp", "ep", "cp", "pp")), min_size=1, max_size=2))
    chosen |= {tensor} if draw(hs.integers(0, 3)) else set()
    assume(len(chosen) > 1)
    axes = tuple(a for a in ("pp", "dp", "cp", tensor, "ep") if a in chosen)
    fold = {a: draw(hs.sampled_from(("data", "tensor", "expert"))) for a in axes
            if a != "pp" and draw(hs.booleans())} if draw(hs.booleans()) else None
    lists = hs.lists(hs.sampled_from(axes), max_size=3).map(lambda xs: ", ".join(xs))
    stmt = hs.builds(lambda t, v, a: f"{t}[experts]: {v} over ({a})", hs.sampled_from((A, G)),
                     hs.sampled_from(("dispatch", "combine")), lists)
    stmts = draw(hs.lists(stmt, max_size=3))
    if draw(hs.booleans()):  # a round trip: the dispatch and the combine over the same axes
        t = draw(hs.sampled_from((A, G)))
        group = ", ".join(sorted(draw(hs.sets(hs.sampled_from(axes), min_size=1))))
        stmts += [f"{t}[experts]: dispatch over ({group})", f"{t}[experts]: combine over ({group})"]
    return axes, fold, tuple(stmts)


@settings(max_examples=examples(60), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(role_plans())
def test_checker_agrees_with_the_oracle_on_every_role(generated):
    axes, fold, stmts = generated
    try:
        spec, p = _spec(axes, fold, stmts)
        v = verdicts(spec, p)
    except DiagnosticError:
        assume(False)  # a folding or statement the language rejects (no expert axis, a pipeline role, ...)
    assume(v)
    found = simulated(p, (1, 2) if len(axes) > 2 else (1, 2, 3))
    bad = [(k, x.word) for k, x in v.items() if (x is Verdict.REFUTED) != (k in found)]
    assert not bad, (bad, axes, fold, stmts)


def test_refutation_replays_different_tokens_summed_over_tensor_ranks():
    spec, p = _spec(("tp", "ep"), None, both("tp", "ep")[:2])
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == f"GI {A}[experts]")
    cex = ob.counterexample
    # tp = 2: every rank holds 1 (block 0) and 1001 (block 1); the dispatch leaves rank 0 [1, 1] and
    # rank 1 [1001, 1001]; shards 2 and 3 all-reduced: 2 + 3003 = 3005 in both blocks, sent back by the
    # combine; single-device: (2 + 3) · 1 = 5 and 5 · 1001 = 5005
    assert "on rank 0 of tp = [3005, 3005], single-device = [5, 5005]" in cex.equation
    assert "tensor" in cex.diagnosis[0] and "dispatch all-to-all" in cex.diagnosis[0] and "over (tp, ep)" in cex.diagnosis[0]
    assert dict(cex.sizes)["tp"] == 2
