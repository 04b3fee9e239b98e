"""Ulysses' uneven head split (``override heads[PAIR]: uneven | chunk | floor``, ``heads[kv]: repeat |
split``; check.encode_ulysses_heads): the checker's verdicts against the independent simulator
(tests/simulator_heads.py: the all-to-alls run as all_to_all_single with the rule's split sizes, a linear
attention per head, every output and value gradient compared with the single device), the replayed
counterexamples with hand-derived numbers, the costs against a brute-force count of the heads each rank
receives, the diagnostics (PL276, PL277, PL197 lifted) and the format round trip."""

from __future__ import annotations

from fractions import Fraction

import pytest
import simulator_heads
import sympy

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
RULES = ("uneven", "chunk", "floor")


def _src(heads: int, kv: int, stmts: str, cp: int = 8, a2a: bool = True, tp: int = 0) -> str:
    if tp:
        return (_src(heads, kv, stmts, cp, a2a).replace("from std.data import ddp\n", "from std.data import ddp\n"
                "from std.tensor import megatron_tp\n").replace("  cp = ", f"  tp = {tp} @ intra_node\n  cp = ")
                .replace("  cp: context_parallel\n", "  tp: megatron_tp\n  cp: context_parallel\n"))
    body = ("  override activations[context]: all_to_all over (cp)\n"
            "  override activation_grads[context]: all_to_all over (cp)\n" if a2a else "") + stmts
    return (f"from std.context import context_parallel\nfrom std.data import ddp\n\n"
            f"model {{\n  transformer {{\n    hidden = {128 * heads}\n    layers = 4\n    heads = {heads}\n"
            f"    kv_heads = {kv}\n    ffn = 1024\n    vocab = 1024\n  }}\n  seq = 65536\n  microbatch = 1\n"
            f"  microbatches = 2\n}}\n\nmesh {{\n  dp = 2 @ inter_node\n  cp = {cp} @ intra_node\n}}\n\n"
            f"plan p {{\n  dp: ddp\n  cp: context_parallel\n{body}}}\n")


def _stmts(fwd: str | None, bwd: str | None, kv: str | None) -> str:
    out = ""
    for group, verb in (("forward", fwd), ("backward", bwd), ("kv", kv)):
        if verb:
            out += f"  override heads[{group}]: {verb}\n"
    return out


def _check(src: str, pinned: dict | None = None):
    spec = load_string(src, "x.place")
    report = check_plan(SESSION, spec, spec.plans[0], pinned or {})
    return {o.name: o for o in report.obligations if o.name.startswith("GI heads[")}


def _simulated_fails(h: int, kv: int, fwd: str, bwd: str, kv_rule: str, groups) -> bool:
    return any(not simulator_heads.run(h, kv, g, fwd, bwd, kv_rule) for g in groups)


# (heads, kv heads, forward, backward, kv): hand-picked, and the rules crossed on small head counts
CASES = [(28, 4, "uneven", "uneven", "repeat"), (28, 4, "floor", "floor", "repeat"), (20, 20, "uneven", "chunk", "repeat"),
         (12, 12, "uneven", "chunk", "repeat"), (32, 8, "uneven", "uneven", "split"), (32, 32, "chunk", "chunk", "split"),
         (7, 7, "uneven", "uneven", "repeat"), (7, 7, "chunk", "uneven", "repeat"), (6, 2, "chunk", "chunk", "split")]
CASES += [(h, h, f, b, "repeat") for h in (5, 6) for f in RULES for b in RULES if (f, b) != ("uneven", "uneven")]


@pytest.mark.parametrize("h,kv,fwd,bwd,kvr", CASES)
def test_checker_agrees_with_the_simulator_over_every_group(h, kv, fwd, bwd, kvr):
    """The checker quantifies over the Ulysses group's size (cp divides 65536: 2, 4, 8, ...); the simulator
    runs every such size up to past h (beyond h every rule gives rank r < h head r, so nothing new)."""
    obs = _check(_src(h, kv, _stmts(fwd, bwd, kvr)))
    assert set(obs) == {"GI heads[forward]", "GI heads[backward]", "GI heads[kv]"}
    assert all(o.verdict in (Verdict.PROVED, Verdict.REFUTED) for o in obs.values()), [(o.name, o.verdict, o.reason) for o in obs.values()]
    refuted = any(o.verdict is Verdict.REFUTED for o in obs.values())
    groups = [2 ** i for i in range(1, 8)]
    assert refuted == _simulated_fails(h, kv, fwd, bwd, kvr, groups)
    for o in obs.values():
        if o.verdict is Verdict.REFUTED and o.counterexample is not None:
            assert "root cause" in " ".join(o.counterexample.diagnosis)


@pytest.mark.parametrize("h,g", [(h, g) for h in range(1, 14) for g in range(2, 17)])
def test_the_rules_against_brute_force(h, g):
    """The checker's runs per rank (first head, count) against the simulator's all_to_all_single sizes."""
    from placement_logic.check.encode_ulysses_heads import split

    for rule in RULES:
        runs = split(rule, h, g)
        assert [n for _, n in runs] == simulator_heads.sizes(rule, h, g)
        assert all(runs[r + 1][0] == runs[r][0] + runs[r][1] for r in range(g - 1)) and runs[0][0] == 0


def test_floor_split_replays_the_dropped_heads():
    # 28 heads over cp = 8: floor gives 3 each, heads 24..27 on no rank; head 24 of position 0 alone:
    # y = q·Σ_p k·v over 8 positions with kv head 24 // 7 = 3: q = 0 + 2 + 240 = 242, k_p v_p = (2p + 31)(3p + 32)
    obs = _check(_src(28, 4, "  override heads: floor\n"), {"dp": 1, "cp": 8, "microbatches": 1})
    cex = obs["GI heads[forward]"].counterexample
    want = 242 * sum((2 * p + 31) * (3 * p + 32) for p in range(8))
    assert "head 24 = 0 (no rank attends head 24" in cex.equation and f"single-device = {want}" in cex.equation
    assert "[0..2, 3..5, 6..8, 9..11, 12..14, 15..17, 18..20, 21..23]" in cex.diagnosis[0] and "heads 24..27 are attended by no rank" in cex.diagnosis[0]


def test_backward_chunks_replay_the_moved_head():
    # 20 heads over 8: forward 3,3,3,3,2,2,2,2 (rank 4: heads 12, 13), backward chunks of 3 (rank 4: 12, 13, 14);
    # rank 4's third gradient head, 14, has no saved head; the first that differs is head 14 on rank 4
    obs = _check(_src(20, 20, _stmts("uneven", "chunk", None)), {"dp": 1, "cp": 8, "microbatches": 1})
    cex = obs["GI heads[backward]"].counterexample
    assert "head 14 on rank 4 = 0" in cex.equation
    want = (1 + 140) * sum((Fraction(s + 1, 2) + 140) * (s + 2 + 140) for s in range(8))
    assert f"single-device = {want}" in cex.equation
    assert obs["GI heads[forward]"].verdict is Verdict.PROVED


def test_split_kv_heads_replay_another_kv_head():
    # 32 heads, 8 kv over 16: rank 1 holds query heads 2, 3 and kv head 1 (not 0); head 2 read with kv head 1
    obs = _check(_src(32, 8, _stmts(None, None, "split"), cp=16), {"dp": 1, "cp": 16, "microbatches": 1})
    cex = obs["GI heads[kv]"].counterexample
    got = 22 * sum((2 * p + 11) * (3 * p + 12) for p in range(16))
    want = 22 * sum((2 * p + 1) * (3 * p + 2) for p in range(16))
    assert f"head 2 on rank 1 = {got} (read with kv head 1), single-device = {want} (kv head 0)" in cex.equation


def test_more_heads_than_the_split_is_decided_on_through_a_let():
    """A literal head count over 1024 is refused in resolution (PL114, tests/test_hostile_constructs.py); one a
    ``let`` gives reaches the checker, which leaves the three pairs unknown instead of walking every group size up
    to the heads (1025 > 1024), naming the count and the limit."""
    text = _src(28, 4, "  override heads: floor\n").replace("    heads = 28\n", "    heads = H\n")
    obs = _check(text.replace("model {", "let H = 1025\n\nmodel {"))
    assert set(obs) == {"GI heads[forward]", "GI heads[backward]", "GI heads[kv]"}
    for o in obs.values():
        assert o.verdict is Verdict.UNKNOWN and o.counterexample is None
        assert "the model's 1025 heads are more than the 1024" in o.reason
    with pytest.raises(DiagnosticError) as e:
        _check(text.replace("heads = H", "heads = 1025"))
    assert [d.code for d in e.value.diagnostics] == [Code.BAD_PROPERTY_VALUE]
    assert "at most 1024 heads" in e.value.diagnostics[0].message


@pytest.mark.parametrize("stmt,code", [("  override heads[kv]: uneven\n", Code.HEADS_RULE_GROUP),
                                       ("  override heads: repeat\n", Code.HEADS_RULE_GROUP),
                                       ("  override heads[forward]: split\n", Code.HEADS_RULE_GROUP)])
def test_rule_for_the_wrong_group(stmt, code):
    with pytest.raises(DiagnosticError) as e:
        _check(_src(28, 4, stmt))
    assert [d.code for d in e.value.diagnostics] == [code] and e.value.diagnostics[0].span.line == 28


def test_split_without_ulysses():
    with pytest.raises(DiagnosticError) as e:
        _check(_src(28, 4, "  override heads: uneven\n", a2a=False))
    assert [d.code for d in e.value.diagnostics] == [Code.HEADS_NO_ULYSSES]


def test_split_with_a_backward_all_to_all_only():
    """A head split with Ulysses in backward alone stays PL277, and the message says why."""
    text = _src(28, 4, "  override activation_grads[context]: all_to_all over (cp)\n  override heads: uneven\n", a2a=False)
    with pytest.raises(DiagnosticError) as e:
        _check(text)
    d = e.value.diagnostics[0]
    assert d.code == Code.HEADS_NO_ULYSSES and "only Ulysses all-to-all is in backward" in d.message and d.span.line == 27


def test_a_stated_split_lifts_pl197():
    with pytest.raises(DiagnosticError) as e:
        load_string(_src(28, 4, ""), "x.place")
    assert [d.code for d in e.value.diagnostics] == [Code.ULYSSES_HEADS]
    load_string(_src(28, 4, "  override heads: uneven\n"), "x.place")


def test_unknown_group():
    with pytest.raises(DiagnosticError) as e:
        load_string(_src(28, 4, "  override heads[q]: uneven\n"), "x.place")
    assert e.value.diagnostics[0].code == Code.BAD_OVERRIDE and "all-to-all pair 'q'" in e.value.diagnostics[0].message


def _largest_share(h: int, g: int, rule: str) -> int:
    """Brute force: the head-positions each rank receives from the others (one position each), the largest."""
    got = simulator_heads._a2a([[(p, j) for j in range(h)] for p in range(g)], simulator_heads.sizes(rule, h, g))
    return max(sum(1 for p, _ in got[r] if p != r) for r in range(g))


@pytest.mark.parametrize("h,cp,rule", [(28, 8, "uneven"), (20, 8, "chunk"), (20, 8, "uneven"), (7, 4, "uneven"),
                                       (28, 8, "floor"), (32, 8, "uneven"), (12, 8, "chunk")])
def test_costs_price_the_largest_rank(h, cp, rule):
    """Each Ulysses all-to-all sends the largest rank's share: the head-positions it receives from the other
    ranks (brute-forced by running the all-to-all), of q, k, v and the output, 2 bytes each, over the rank's
    65536/cp positions; the even price (g − 1)/g of the whole payload where cp divides the heads."""
    from placement_logic.costs import derive

    spec = load_string(_src(h, h, f"  override heads: {rule}\n", cp=cp), "x.place")
    a2a = [x for x in derive(spec.plans[0]).communication.collectives if x.collective.kind == "all_to_all"]
    assert len(a2a) == 2
    hidden = 128 * h  # 128 per head
    for x in a2a:
        per = x.bytes_per_device / x.count
        per = per.xreplace({s: cp for s in per.free_symbols if s.name == "cp"})
        # one position's share of the heads, times the positions of a rank, times the head width, 4 tensors, 2 bytes
        want = _largest_share(h, cp, rule) * (65536 // cp) * (hidden // h) * 4 * 2
        assert sympy.nsimplify(per) == want, (x.collective.phase, per, want)
        if h % cp == 0 and rule != "floor":
            assert want == Fraction(cp - 1, cp) * (65536 // cp) * hidden * 4 * 2


@pytest.mark.parametrize("stmt", ["override heads: uneven", "override heads[forward]: chunk",
                                  "override heads[backward]: floor", "override heads[kv]: split"])
def test_statements_format_round_trip(stmt):
    from placement_logic.frontend.canonical import format_source

    text = _src(28, 4, f"  {stmt}\n")
    load_string(text, "x.place")  # the canonical text loads
    assert format_source(text, "x.place") == text
    messy = text.replace(f"  {stmt}", "  " + stmt.replace(": ", " :   ").replace("[", "[ ").replace("]", " ]"))
    assert format_source(messy, "x.place") == text


def _a2a_forms(text: str) -> list:
    """Each Ulysses all-to-all's bytes per device per occurrence, as a function of the mesh sizes."""
    from placement_logic.costs import derive

    a2a = [x for x in derive(load_string(text, "x.place").plans[0]).communication.collectives
           if x.collective.kind == "all_to_all"]
    assert len(a2a) == 2
    forms = [x.bytes_per_device / x.count for x in a2a]
    return [lambda subs, f=f: f.xreplace({s: subs[s.name] for s in f.free_symbols}) for f in forms]


GQA = [(8, 2, 1), (12, 4, 1), (28, 4, 1), (32, 8, 2), (6, 3, 1), (16, 2, 4)]


@pytest.mark.parametrize("h,kv,tp", GQA)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kv_rule", ("repeat", "split"))
def test_gqa_costs_against_the_simulated_all_to_alls(h, kv, tp, rule, kv_rule):
    """Under GQA the k, v bytes are those of the kv heads each rank receives: the simulator runs both all-to-alls of
    a pair on tagged heads (one position per rank) and counts the head-slots through every rank; the cost is the
    largest rank's count times its 65536/cp positions, 128 per head, 2 bytes, at every cp from 2 past the heads."""
    text = _src(h, kv, _stmts(rule, rule, kv_rule), tp=tp)
    ht, kt = h // tp, (kv // tp if kv % tp == 0 else 1)
    forms = _a2a_forms(text)
    for g in range(2, ht + 3):
        want = max(simulator_heads.traffic(ht, kt, g, rule, kv_rule)) * Fraction(65536, g) * 128 * 2
        for form in forms:
            assert form({"cp": g, "tp": tp, "dp": 2}) == want, (g, want)


def _generated(seed: int) -> tuple[str, tuple]:
    """A random plan: heads and kv heads, the three rules (each stated or left derived), a data strategy and a
    layout of the context blocks stated beside them."""
    import random

    rng = random.Random(seed)
    h = rng.choice((5, 6, 7, 8, 12, 20, 28))
    kv = rng.choice([d for d in range(1, h + 1) if h % d == 0])
    fwd, bwd = rng.choice((None, *RULES)), rng.choice((None, *RULES))
    kvr = rng.choice((None, "repeat", "split"))
    data = rng.choice(("ddp", "zero1", "zero2", "zero3", "fsdp_full_shard"))
    layout = rng.choice(("", "  override layout[inputs]: zigzag\n  override layout[labels]: zigzag\n"))
    stmts = _stmts(fwd, bwd, kvr) or "  override heads: uneven\n"
    text = _src(h, kv, stmts + layout).replace("import ddp\n", f"import {data}\n").replace("dp: ddp\n", f"dp: {data}\n")
    f = fwd or "uneven"
    return text, (h, kv, f, bwd or (fwd or "uneven"), kvr or "repeat")


@pytest.mark.parametrize("seed", range(12))
def test_generated_plans_agree_with_the_simulator(seed):
    """Generated plans mixing the head rules with data strategies and layouts: the GI heads verdicts (each over every
    Ulysses size) against the simulator run at every power-of-two group."""
    text, (h, kv, f, b, kvr) = _generated(seed)
    obs = _check(text)
    assert set(obs) == {"GI heads[forward]", "GI heads[backward]", "GI heads[kv]"}, text
    assert all(o.verdict in (Verdict.PROVED, Verdict.REFUTED) for o in obs.values())
    refuted = any(o.verdict is Verdict.REFUTED for o in obs.values())
    assert refuted == _simulated_fails(h, kv, f, b, kvr, [2 ** i for i in range(1, 8)]), text
