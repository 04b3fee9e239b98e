"""A false-proof hunt: the balancing loss's statistics, the MoE capacity step, Ulysses' head split, chunked
attention and the context-parallel layouts, and a loss term on some ranks, two to five of them in one plan on
a random mesh of data / expert / context / tensor (sequence-parallel or not) / pipeline axes with DDP, ZeRO or
FSDP data modes, written as a user writes them (the DSL, loaded and resolved).

For every generated plan the checker (symbolic sizes, or the declared ones where a decision fixes them) and the
independent simulator of each construct present must agree:

- ``GI aux_stats``: tests/simulator_auxstats.py (padded, uneven and random layouts) or, with packed rows,
  tests/simulator_auxpacked.py, every axis and the microbatches at 1 and 2;
- ``GI capacity`` / ``GI capacity dropped``: tests/simulator_capacity.py / simulator_capdrop.py (random router
  calls; the step is per call, the mesh plays no part);
- ``GI heads[...]``: tests/simulator_heads.py at every Ulysses group the sequence splits into (2..12) and every
  tensor size 1..3 dividing the heads (each tensor rank's heads, its kv heads or a copy of one);
- ``GI layout[chunk]``: the chunk simulator of tests/simulator_cpwindow.py at the declared context size;
- ``GI layout[ITEM]``: tests/simulator_cp.py ``layout_violations`` (cplayout, cpshort) at every size 1..3;
- ``GI loss[aux] grads[router]``: tests/simulator_losses.py ``term_violations`` at every size 1..3, 1..2
  microbatches.

A violation a simulator finds is never behind a proof (refuted or unknown); a refutation is confirmed by the
simulator at some size (or replayed at its counterexample's); a located diagnostic (PL506 and other input
errors) is an answer. ``SAMPLE`` seeds run in the quick tier, ``SWEEP`` in the slow one."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import pytest
import simulator_auxpacked
import simulator_auxstats
import simulator_capacity
import simulator_capdrop
import simulator_cp
import simulator_cpwindow
import simulator_heads
import simulator_losses

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
STRATEGY = {"dp": ("std.data", ("ddp", "zero1", "zero2", "zero3", "fsdp_full_shard")),
            "ep": ("std.expert", ("expert_parallel",)), "cp": ("std.context", ("context_parallel",)),
            "tp": ("std.tensor", ("megatron_sp", "megatron_tp")), "pp": ("std.pipeline", ("one_f_one_b",))}
SCOPES = ("global_batch", "per_microbatch", "per_sequence")
PER = ("per_sequence", "per_microbatch", "per_step")
LAYOUTS = ("zigzag", "contiguous", "zigzag_per_document", "ptrr", "pad_to_chunks", "truncate_to_chunks",
           "cut_unequal")
ITEMS = ("labels", "loss_mask", "position_ids", "causal_mask")
RULES = ("uneven", "chunk", "floor")
SLOT = {"drops_zeroed": "zero", "dropped_uninitialised": "stale", "dropped_weighted": "hidden"}
WEIGHTS = {"renormalise_kept": "kept", "renormalise_dropped": "chosen"}


def _over(axes) -> str:
    return f" over ({', '.join(axes)})"


def _aux_statements(rng: random.Random, token: list[str], packed: bool) -> list[str]:
    """The balancing loss's statements: the groups of f (and of P), padding, equal weights, the capacity map;
    with packed rows the row and the length weighting (the packed simulator reads those alone)."""
    pick = lambda: [a for a in token if rng.random() < 0.5]  # noqa: E731
    out = []
    if rng.random() < 0.7:
        verbs = PER + (("per_row",) if packed else ())
        out.append(f"stats_{rng.choice(verbs)}{_over(pick())}")
    if packed:
        return out + (["stats_length_weighted"] if rng.random() < 0.4 else [])
    if rng.random() < 0.4:
        out.append(f"probs_{rng.choice(PER)}{_over(pick())}")
    for verb, p in (("stats_count_padding", 0.25), ("stats_after_capacity", 0.25), ("stats_capacity_padded", 0.1),
                    ("stats_equal_microbatch_weights", 0.15)):
        if rng.random() < p:
            out.append(verb)
    if rng.random() < 0.25 and token:
        out.append(f"stats_equal_cell_weights{_over(pick() or [rng.choice(token)])}")
    return out


def _ranks(rng: random.Random, axes: list[str]) -> str:
    if len(axes) == 1 and rng.random() < 0.3:
        return f"{axes[0]} - 1"
    return str(rng.randint(0, 1))  # the declared sizes are 2: rank 2 is out of range there (PL191)


def draw(seed: int) -> tuple[str, dict]:
    """A spec's text and what the simulators need to read it (the objective, the model's numbers)."""
    rng = random.Random(seed)
    families = set(rng.sample(("aux", "capacity", "dropped", "heads", "chunk", "layout", "ranks"), rng.randint(2, 4)))
    if "capacity" in families and "dropped" in families:
        families.discard(rng.choice(("capacity", "dropped")))
    names = [a for a in ("dp", "ep", "cp", "tp", "pp") if rng.random() < 0.5]
    if families & {"heads", "chunk", "layout"} and "cp" not in names:
        names.append("cp")
    names = [a for a in ("dp", "ep", "cp", "tp", "pp") if a in names] or ["dp"]
    sp = "tp" in names and rng.random() < 0.6
    strategy = {a: ("megatron_sp" if sp else "megatron_tp") if a == "tp" else rng.choice(STRATEGY[a][1])
                for a in names}
    heads = rng.choice((4, 6, 8, 12, 20, 28)) if "heads" in families else 12
    kv = rng.choice([d for d in range(1, heads + 1) if heads % d == 0]) if "heads" in families else heads
    experts, top_k = rng.choice(((8, 2), (4, 1), (4, 2), (6, 2), (2, 1))) if families & {"capacity", "dropped"} \
        else (8, 2)
    cf = rng.choice(("1", "3/2", "1/2", "2")) if families & {"capacity", "dropped"} or rng.random() < 0.3 else None
    renorm = "dropped" in families and rng.random() < 0.5
    chunk = rng.choice((3, 4, 5, 8)) if "chunk" in families else None
    seq = 24 if chunk else 4096
    sequences = rng.choice((1, 2))
    scope = rng.choice(SCOPES) if "aux" in families or rng.random() < 0.3 else None
    packed = scope is not None and rng.random() < 0.25
    token = [a for a in names if a in ("dp", "ep", "cp") or (a == "tp" and sp)]
    stmts = [f"loss[aux]: {s}" for s in (_aux_statements(rng, token, packed) if "aux" in families else [])]
    if stmts and not packed and rng.random() < 0.25:  # every shard as many real tokens (simulator_auxstats)
        stmts.append("tokens: equal")
    if "capacity" in families:
        stmts.append(f"capacity: {rng.choice(('counts_padding', 'masks_padding'))}")
    if "dropped" in families:
        said = [v for v in (rng.choice((*SLOT, None)), rng.choice((*WEIGHTS, None))) if v]
        stmts += [f"capacity: {v}" for v in said or ["dropped_weighted"]]
    if "heads" in families:
        stmts += ["activations[context]: all_to_all over (cp)", "activation_grads[context]: all_to_all over (cp)"]
        rules = [(g, r) for g, r in (("forward", rng.choice((None, *RULES))), ("backward", rng.choice((None, *RULES))),
                                     ("kv", rng.choice((None, "repeat", "split")))) if r]
        stmts += [f"heads[{g}]: {r}" for g, r in rules] or ["heads: uneven"]
    if "chunk" in families or ("layout" in families and rng.random() < 0.5):
        stmts.append(f"layout: {rng.choice(('contiguous', 'zigzag'))}")
    if "chunk" in families and rng.random() < 0.8:
        stmts.append(f"layout[causal_mask]: {rng.choice(('chunk_dropped', 'chunk_local', 'chunk_on_diagonal'))}")
    if "layout" in families:  # a cut of short documents is stated beside the padded cut alone (PL286)
        verbs = LAYOUTS[:4] if "chunk" in families or rng.random() < 0.5 else LAYOUTS[2:3] + LAYOUTS[4:]
        items = rng.sample(("inputs",) + ITEMS, rng.randint(1, 2))
        stmts = [s for s in stmts if not s.startswith("layout:") or verbs[0] == "zigzag"]
        stmts += [f"layout[{item}]: {rng.choice(verbs)}" for item in items]
    if "ranks" in families:
        axes = rng.sample(names, min(len(names), rng.randint(1, 2)))
        verb = rng.choice(("on_ranks", "divide_on_ranks"))
        by = f" by {rng.choice(('2', names[0]))}" if verb == "divide_on_ranks" else ""
        stmts.append(f"loss[aux]: {verb}{_over(axes)} ranks ({_ranks(rng, axes)}){by}")
    rng.shuffle(stmts)
    text = _text(names, strategy, stmts, heads=heads, kv=kv, experts=experts, top_k=top_k, cf=cf, renorm=renorm,
                 seq=seq, sequences=sequences, chunk=chunk, scope=scope, packed=packed)
    return text, {"scope": scope, "packed": packed, "sequences": sequences, "heads": heads, "kv": kv,
                  "experts": experts, "top_k": top_k, "cf": Fraction(cf) if cf else None, "renorm": renorm,
                  "seq": seq, "chunk": chunk, "stmts": stmts}


def _text(names, strategy, stmts, *, heads, kv, experts, top_k, cf, renorm, seq, sequences, chunk, scope,
          packed) -> str:
    imports = "".join(f"from {STRATEGY[a][0]} import {strategy[a]}\n" for a in names)
    shape = (f"    hidden = {128 * heads}\n    layers = 12\n    heads = {heads}\n    kv_heads = {kv}\n"
             f"    ffn = 1024\n    vocab = 32000\n    experts = {experts}\n    top_k = {top_k}\n"
             + (f"    capacity_factor = {cf}\n" if cf else "") + ("    drop_renormalise\n" if renorm else ""))
    losses = "  losses {\n    aux = per_microbatch_mean\n" + (f"    aux_stats = {scope}\n" if scope else "") \
        + ("    aux_packed = true\n" if packed else "") + "  }\n"
    attention = f"  attention {{\n    chunk = {chunk}\n  }}\n" if chunk else ""
    mesh = "".join(f"  {a} = {3 if a == 'cp' and chunk else 2}\n" for a in names)
    body = "".join(f"  {a}: {strategy[a]}\n" for a in names) + "".join(f"  override {s}\n" for s in stmts)
    return (f"{imports}\nmodel {{\n  transformer {{\n{shape}  }}\n  seq = {seq}\n  microbatch = {sequences}\n"
            f"  microbatches = 4\n{attention}{losses}}}\n\nmesh {{\n{mesh}}}\n\nplan p {{\n{body}}}\n")


def generated(seed: int, tries: int = 30):
    """The first draw of the seed's stream the checker accepts, with its report and the draw's numbers (a draw
    answered by a located diagnostic is skipped: PL506, PL264, PL275, PL286 ... are answers)."""
    for k in range(tries):
        text, info = draw(seed * 1000 + k)
        try:
            spec = load_string(text, "hunt.place")
            return spec.plans[0], check_plan(SESSION, spec, spec.plans[0], {}), info
        except DiagnosticError:
            continue
    pytest.skip("no accepted draw")


def _every(p: ir.Plan, most: int) -> list[dict]:
    return [dict(zip(p.mesh.names, s)) for s in product(range(1, most + 1), repeat=len(p.mesh.names))]


def _aux(p: ir.Plan, info: dict) -> bool:
    scope, e, k, rng = info["scope"], info["experts"], info["top_k"], random.Random(0)
    if info["packed"]:
        # the rows of a microbatch (documents' real lengths): as many as the model's microbatch holds sequences
        packs = [rows[:info["sequences"]] for rows in ([[1, 3], [2, 2]], [[4], [4]], [[1, 1, 2], [3, 1]])]
        return any(simulator_auxpacked.differs(p, scope, {**at, "microbatches": m}, pk, e, k, rng, tries=2)
                   for pk in packs for at in _every(p, 2) for m in (1, 2))
    layouts = simulator_auxstats.admissible_layouts(p, rng)
    for at, m in product(_every(p, 2), (1, 2)):
        full = set(at.values()) | {m} == {2}  # every layout where each dimension has two shards
        for layout in layouts if full else layouts[:1]:
            if simulator_auxstats.differs(p, scope, {**at, "microbatches": m}, info["sequences"], e, k, rng, tries=2,
                                          layout=layout):
                return True
    return False


def _capacity(p: ir.Plan, info: dict) -> bool:
    counts = any(o.target == "capacity" and o.verb == "counts_padding" for o in p.overrides)
    return counts and simulator_capacity.differs(info["experts"], info["top_k"], info["cf"], seed=1) is not None


def _dropped(p: ir.Plan, info: dict) -> bool:
    verbs = [o.verb for o in p.overrides if o.target == "capacity"]
    slot = next((SLOT[v] for v in verbs if v in SLOT), "zero")
    weights = next((WEIGHTS[v] for v in verbs if v in WEIGHTS), "kept" if info["renorm"] else "none")
    return simulator_capdrop.differs(info["experts"], info["top_k"], info["cf"], slot, weights, info["renorm"],
                                     seed=3) is not None


def _rule(p: ir.Plan, group: str, default: str) -> str:
    # a statement for every group is the forward's and the backward's rule (the kv heads take repeat / split)
    stated = [o.verb for o in p.overrides if o.target == "heads" and o.group in (group, None if group != "kv" else group)]
    return stated[-1] if stated else default


def _heads(p: ir.Plan, info: dict, groups=None, tps=None) -> bool:
    """Ulysses' all-to-alls at every group the sequence splits into and every tensor size dividing the heads:
    each tensor rank holds heads / t query heads and kv / t kv heads, or one copy where t does not divide kv."""
    h, kv, tensor = info["heads"], info["kv"], "tp" in p.mesh.names
    fwd = _rule(p, "forward", "uneven")
    bwd, kvr = _rule(p, "backward", fwd), _rule(p, "kv", "repeat")
    groups = groups or [g for g in range(2, 13) if info["seq"] % g == 0]
    for t in tps or ((1, 2, 3) if tensor else (1,)):
        if h % t:
            continue  # the model's shapes never take it
        if any(not simulator_heads.run(h // t, kv // t if kv % t == 0 else 1, g, fwd, bwd, kvr) for g in groups):
            return True
    return False


def _chunk(p: ir.Plan, info: dict) -> bool:
    verb = next((o.verb for o in reversed(p.overrides) if o.target == "layout" and o.verb.startswith("chunk_")), None)
    layout = next((o.verb for o in reversed(p.overrides) if o.target == "layout" and o.group is None), "contiguous")
    return bool(simulator_cpwindow.chunk_differing(verb, layout, 3, info["seq"], info["chunk"]))


def _layouts(p: ir.Plan, sizes: list[dict]) -> set:
    found: set = set()
    for at in sizes:
        found |= simulator_cp.layout_violations(p, at)
    return found


def _term(p: ir.Plan, sizes: list[dict]) -> bool:
    rng = random.Random(3)
    return any(("term", "aux", "router") in simulator_losses.term_violations(p, {**at, "microbatches": m}, rng, {})
               for at in sizes for m in (1, 2) for _ in range(2))


def _layout_disagreement(p: ir.Plan, mine: list, found: set) -> str | None:
    """Item by item: a wrong position id or causal mask changes the attention output, every wrong item the loss
    term (tests/test_check_cplayout.py ``observed``); an output the simulator finds wrong (``found``: at every
    small size) is never behind proofs of both the position ids and the causal mask, and their refutation is
    seen in the output."""
    attention = [o for o in mine if o.name in ("GI layout[position_ids]", "GI layout[causal_mask]")]
    if "output" in found and all(o.verdict is Verdict.PROVED for o in attention):
        return "false proof: the simulator finds the attention output wrong, the position ids and mask proved"
    for o in attention:
        if o.verdict is Verdict.REFUTED and "output" not in found:
            cex = dict(o.counterexample.sizes) if o.counterexample else {}
            at = {a: n for a, n in cex.items() if a in p.mesh.names}
            if at.keys() != set(p.mesh.names) or "output" not in _layouts(p, [at]):
                return f"{o.name} refuted, the simulator finds every output right (counterexample at {at})"
    return None


def disagreement(p: ir.Plan, report, info: dict) -> str | None:
    """The first disagreement between the checker's verdicts and the simulators', or None."""
    obs = {o.name: o for o in report.obligations}
    small = _every(p, 3)
    checks = []
    if "GI aux_stats" in obs:
        checks.append((["GI aux_stats"], lambda at=None: _aux(p, info)))
    if "GI capacity" in obs:
        checks.append((["GI capacity"], lambda at=None: _capacity(p, info)))
    if "GI capacity dropped" in obs:
        checks.append((["GI capacity dropped"], lambda at=None: _dropped(p, info)))
    heads = [n for n in obs if n.startswith("GI heads[")]
    if heads:
        checks.append((heads, lambda at=None: _heads(p, info, *((([at["cp"]], [at.get("tp", 1)]) if at else ())))))
    if "GI layout[chunk]" in obs:
        checks.append((["GI layout[chunk]"], lambda at=None: _chunk(p, info)))
    items = [f"GI layout[{i}]" for i in ITEMS if f"GI layout[{i}]" in obs]
    found = _layouts(p, small) if items else set()  # at every small size, once (the slowest simulator here)
    if items:
        checks.append((items, lambda at=None: bool(_layouts(p, [at]) if at else found)))
    if "GI loss[aux] grads[router]" in obs:
        checks.append((["GI loss[aux] grads[router]"], lambda at=None: _term(p, [at] if at else small)))
    if items:
        wrong = _layout_disagreement(p, [obs[n] for n in items], found)
        if wrong:
            return wrong
    for names, simulated in checks:
        mine = [obs[n] for n in names]
        wrong = simulated()
        if wrong and all(o.verdict is Verdict.PROVED for o in mine):
            return f"false proof: the simulator finds {names} violated, the checker proves them"
        refuted = [o for o in mine if o.verdict is Verdict.REFUTED]
        if refuted and not wrong:
            cex = refuted[0].counterexample
            at = {a: n for a, n in dict(cex.sizes).items() if a in p.mesh.names} if cex else {}
            if not (cex and at and at.keys() == set(p.mesh.names) and simulated(at)):
                return f"{refuted[0].name} refuted, no simulator finds a violation (counterexample at {at})"
    return None


SAMPLE = (4, 16, 23, 29)  # fast draws: the statistics, capacity, the head split, layouts, chunks under Ulysses
SWEEP = [s for s in range(400) if s not in SAMPLE]


@pytest.mark.parametrize("seed", SAMPLE)
def test_hunt_sample(seed):
    p, report, info = generated(seed)
    assert disagreement(p, report, info) is None, info["stmts"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP)
def test_hunt(seed):
    p, report, info = generated(seed)
    assert disagreement(p, report, info) is None, info["stmts"]


def _ulysses_local_chunks_right(layout: str, c: int, n: int, size: int) -> bool:
    """The chunks cut on the local slots after Ulysses' all-to-all: every rank holds the whole sequence (its heads),
    the ranks' blocks concatenated in rank order; each query's keys k ≤ p of its slot chunk against its global chunk."""
    buffer = [pos for block in simulator_cpwindow.holds(layout, c, n) for pos in block]
    slot = {pos: i for i, pos in enumerate(buffer)}
    return all((slot[k] // size == slot[p] // size) == (k // size == p // size)
               for p in range(n) for k in range(p + 1))


@pytest.mark.parametrize("verb", ["chunk_local", "chunk_on_diagonal"])
def test_a_chunk_mask_under_ulysses_is_not_refuted_on_the_ring(verb):
    """Found by the hunt (seeds 11, 13: a head split beside chunked attention): under Ulysses' all-to-all over cp the
    ranks attend the whole sequence of their heads, so the ring's blocks and slots the chunk decision replays do not
    exist; with contiguous inputs the local buffer is the sequence itself and a mask cut on its slots (or on the
    rank's one block) is the single device's, which the checker refuted. A stated behaviour is unknown there now,
    naming the all-to-all; the derived mask stays proved, and without the all-to-all the ring's refutation stands."""
    assert _ulysses_local_chunks_right("contiguous", 3, 24, 5)
    assert not _ulysses_local_chunks_right("zigzag", 3, 24, 5)  # slots out of the global order: not decided either
    a2a = ["activations[context]: all_to_all over (cp)", "activation_grads[context]: all_to_all over (cp)"]
    for stmts, want in (([f"layout[causal_mask]: {verb}"] + a2a, Verdict.UNKNOWN), (a2a, Verdict.PROVED),
                        ([f"layout[causal_mask]: {verb}"], Verdict.REFUTED)):
        text = _text(["dp", "cp"], {"dp": "ddp", "cp": "context_parallel"}, ["layout: contiguous"] + stmts, heads=12,
                     kv=12, experts=8, top_k=2, cf=None, renorm=False, seq=24, sequences=1, chunk=5, scope=None,
                     packed=False)
        spec = load_string(text, "ulysses_chunk.place")
        ob = next(o for o in check_plan(SESSION, spec, spec.plans[0], {}).obligations if o.name == "GI layout[chunk]")
        assert ob.verdict is want, (stmts, ob.verdict)
        if want is Verdict.UNKNOWN:
            assert "Ulysses all-to-all" in ob.reason and verb in ob.reason
        if want is Verdict.REFUTED:  # the ring simulator sees it at the declared cp = 3
            assert simulator_cpwindow.chunk_differing(verb, "contiguous", 3, 24, 5)
