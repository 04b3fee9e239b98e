"""Pipeline stages: first and last stage memory against schedule simulations and hand counts.

The schedule simulator below writes out, for every stage, the order of forward and backward
passes each schedule runs (GPipe: all forwards then all backwards; 1F1B: p − r − 1 warm-up
forwards on stage r, then one forward and one backward in turn; Megatron-LM's interleaved
1F1B: 2·(p − r − 1) + (v − 1)·p warm-up forwards over the chunks in Megatron's order), runs
the stages together step by step to check the orders respect every data dependency, and
counts, pass by pass, the chunk-microbatches whose activations are alive. Parameter counts
come from a list of the model's tensors assigned to stages by hand. Nothing here uses the
engine's formulas.
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import sympy

from placement_logic import costs, ir
from placement_logic.costreport import build, jsonout, markdown, text
from placement_logic.costs.activations import Layout, activations, in_flight, interior_in_flight, interior_stage
from placement_logic.costs.sizes import shape_of
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string
from tests.cost_corpus import model

# --------------------------------------------------------------------------- the simulator


def _forward_order(p: int, m: int, v: int) -> list[tuple[int, int]]:
    """Megatron's order of (microbatch, chunk) forwards on every stage: groups of p microbatches."""
    out = []
    for k in range(m * v):
        group, within = divmod(k, p * v)
        out.append((group * p + within % p, within // p))
    return out


def schedule_orders(kind: str, p: int, m: int, v: int = 1) -> list[list[tuple[str, int, int]]]:
    """Per stage, the list of passes ("F" | "B", microbatch, chunk) the schedule runs."""
    stages = []
    for r in range(p):
        if kind == "gpipe":
            stages.append([("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)])
            continue
        if kind == "1f1b":
            fwd = [(i, 0) for i in range(m)]
            bwd = list(fwd)
            warm = min(p - r - 1, m)
        else:
            fwd = _forward_order(p, m, v)
            bwd = [(i, v - 1 - ch) for i, ch in fwd]  # backwards visit the chunks in reverse
            warm = min(2 * (p - r - 1) + (v - 1) * p, m * v)
        ops = [("F",) + x for x in fwd[:warm]]
        f, b = warm, 0
        while f < len(fwd):
            ops += [("F",) + fwd[f], ("B",) + bwd[b]]
            f, b = f + 1, b + 1
        ops += [("B",) + x for x in bwd[b:]]
        stages.append(ops)
    return stages


def _depends(op, r: int, p: int, v: int):
    kind, mb, ch = op
    if kind == "F":
        if r > 0:
            return [(r - 1, ("F", mb, ch))]
        return [(p - 1, ("F", mb, ch - 1))] if ch > 0 else []
    own = [(r, ("F", mb, ch))]
    if r < p - 1:
        return own + [(r + 1, ("B", mb, ch))]
    return own + ([(0, ("B", mb, ch + 1))] if ch < v - 1 else [])


def run_and_count(orders, p: int, v: int):
    """Run the stages together (each takes its next pass once its inputs exist) and count.

    Returns per stage the most chunk-microbatches alive, the most microbatches alive in chunk
    0 and in chunk v − 1. Fails when the orders deadlock or a pass is missing or repeated.
    """
    done: set = set()
    pos = [0] * p
    while any(pos[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            if pos[r] < len(orders[r]):
                op = orders[r][pos[r]]
                if all(dep in done for dep in _depends(op, r, p, v)):
                    done.add((r, op))
                    pos[r] += 1
                    progressed = True
        assert progressed, "the schedule deadlocks"
    counts = []
    m = 1 + max(mb for ops in orders for _, mb, _ in ops)
    every = sorted((kind, mb, ch) for kind in "BF" for mb in range(m) for ch in range(v))
    for ops in orders:
        assert sorted(ops) == every, "a pass is missing or repeated"
        alive = chunk0 = last = 0
        most = [0, 0, 0]
        for kind, _, ch in ops:
            d = 1 if kind == "F" else -1
            alive += d
            chunk0 += d if ch == 0 else 0
            last += d if ch == v - 1 else 0
            most = [max(most[0], alive), max(most[1], chunk0), max(most[2], last)]
        assert alive == 0
        counts.append(most)
    return counts


def test_simulator_counts_known_cases():
    # 1F1B with 4 stages and 8 microbatches: 4, 3, 2, 1 in flight (Narayanan et al. 2021)
    assert [c_[0] for c_ in run_and_count(schedule_orders("1f1b", 4, 8), 4, 1)] == [4, 3, 2, 1]
    # GPipe keeps every microbatch
    assert [c_[0] for c_ in run_and_count(schedule_orders("gpipe", 3, 5), 3, 1)] == [5, 5, 5]
    # interleaved, p = 2, v = 2, m = 4: stage 0 warms up with 4 forwards, then one more
    assert run_and_count(schedule_orders("interleaved", 2, 4, 2), 2, 2)[0][0] == 5


# --------------------------------------------------------------------------- engine vs simulator

m_ = symbol("m")


def _shape_and_layout(kind: ir.ScheduleKind, p: int, v: int = 1, U: int = 1):
    tr = ir.TransformerShape(hidden=ir.Sym("h"), layers=ir.Sym("L"), heads=ir.Sym("a"), kv_heads=ir.Sym("a"),
                        ffn=ir.Sym("f"), vocab=ir.Sym("V"))
    sh = shape_of(model(None, seq=ir.Sym("s"), mb=ir.Sym("b"), m=ir.Sym("m"), transformer=tr))
    lay = Layout(t=sympy.Integer(1), c=sympy.Integer(1), p=sympy.Integer(p), v=sympy.Integer(v),
                 U=sympy.Integer(U), schedule=kind, sp=False, recompute=ir.Recompute.NONE, flash=False)
    return sh, lay


def _engine(kind: ir.ScheduleKind, p: int, m: int, v: int = 1, U: int = 1):
    sh, lay = _shape_and_layout(kind, p, v, U)
    fl = in_flight(sh, lay)
    sub = {m_: m}
    return {stage: (f.chunks.subs(sub), f.embedding.subs(sub), f.output.subs(sub), f.layers_per_chunk)
            for stage, f in fl.items()}


GRID_1F1B = [(p, m) for p in (2, 3, 4, 5) for m in range(1, 3 * p + 1)]  # m < p included
GRID_INTERLEAVED = [(p, m, v) for p in (2, 3, 4, 5) for v in (1, 2, 3, 4) for m in (p, 2 * p, 3 * p)]


@pytest.mark.parametrize("p,m", GRID_1F1B)
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_in_flight_matches_simulation(kind, p, m):
    sim = run_and_count(schedule_orders(kind, p, m), p, 1)
    eng = _engine(ir.ScheduleKind.GPIPE if kind == "gpipe" else ir.ScheduleKind.ONE_F_ONE_B, p, m)
    L = symbol("L")
    first, last = eng["first"], eng["last"]
    assert first[0] == sim[0][0] and last[0] == sim[-1][0]
    assert first[1] == sim[0][1]  # embedding masks: the first stage's microbatches
    assert last[2] == sim[-1][2]  # output layer: the last stage's microbatches
    assert first[3] == last[3] == L / p


@pytest.mark.parametrize("p,m,v", GRID_INTERLEAVED)
def test_interleaved_in_flight_matches_simulation(p, m, v):
    sim = run_and_count(schedule_orders("interleaved", p, m, v), p, v)
    eng = _engine(ir.ScheduleKind.INTERLEAVED, p, m, v)
    first, last = eng["first"], eng["last"]
    assert (first[0], first[1]) == (sim[0][0], sim[0][1])
    assert (last[0], last[2]) == (sim[-1][0], sim[-1][2])
    assert first[3] == symbol("L") / (p * v)


def _interior(kind: ir.ScheduleKind, p: int, m: int, v: int = 1):
    """The engine's (chunks, embedding, output, layers per chunk) of every interior stage 1 … p − 2."""
    sh, lay = _shape_and_layout(kind, p, v)
    sub = {m_: m}
    out = []
    for r in range(1, p - 1):
        f = interior_in_flight(sh, lay, sympy.Integer(r))
        out.append((f.chunks.subs(sub), f.embedding, f.output, f.layers_per_chunk))
    return out


@pytest.mark.parametrize("p,m", GRID_1F1B)
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_interior_in_flight_matches_simulation(kind, p, m):
    """Every stage between the first and the last: the simulator's count, no embedding mask and no
    output layer (1F1B stage r keeps min(p − r, m), GPipe m)."""
    sim = run_and_count(schedule_orders(kind, p, m), p, 1)
    eng = _interior(ir.ScheduleKind.GPIPE if kind == "gpipe" else ir.ScheduleKind.ONE_F_ONE_B, p, m)
    assert [e[0] for e in eng] == [c_[0] for c_ in sim[1:-1]]
    assert all(e[1] == e[2] == 0 and e[3] == symbol("L") / p for e in eng)


@pytest.mark.parametrize("p,m,v", GRID_INTERLEAVED)
def test_interior_interleaved_in_flight_matches_simulation(p, m, v):
    sim = run_and_count(schedule_orders("interleaved", p, m, v), p, v)
    eng = _interior(ir.ScheduleKind.INTERLEAVED, p, m, v)
    assert [e[0] for e in eng] == [c_[0] for c_ in sim[1:-1]]
    assert all(e[1] == e[2] == 0 and e[3] == symbol("L") / (p * v) for e in eng)


def test_the_interior_formula_gives_the_edge_stages_counts_at_its_ends():
    """At r = 0 and r = p − 1 the interior formula's chunk count is the first and the last stage's
    (the same schedule order; only the embedding and output terms are the edges' own)."""
    for kind, v in ((ir.ScheduleKind.GPIPE, 1), (ir.ScheduleKind.ONE_F_ONE_B, 1), (ir.ScheduleKind.INTERLEAVED, 2)):
        for p in (2, 3, 4):
            sh, lay = _shape_and_layout(kind, p, v)
            edges = in_flight(sh, lay)
            sub = {m_: 3 * p}
            assert interior_in_flight(sh, lay, sympy.Integer(0)).chunks.subs(sub) == edges["first"].chunks.subs(sub)
            assert interior_in_flight(sh, lay, sympy.Integer(p - 1)).chunks.subs(sub) == edges["last"].chunks.subs(sub)


def test_an_interior_stage_keeps_its_layers_only():
    sh, lay = _shape_and_layout(ir.ScheduleKind.ONE_F_ONE_B, 4, 1)
    st = interior_stage(sh, lay, sympy.Integer(1))
    acts = activations(sh, lay)
    assert st.embedding == st.output == 0
    assert sympy.simplify(st.total - st.in_flight.chunks * (symbol("L") / 4) * acts.per_layer) == 0


@pytest.mark.parametrize("U", [1, 2, 4, 8])
def test_zeropp_keeps_the_interleaved_in_flight(U):
    assert _engine(ir.ScheduleKind.ZEROPP, 4, 8, 2, U) == _engine(ir.ScheduleKind.INTERLEAVED, 4, 8, 2)


# --------------------------------------------------------------------------- published formulas

s, b, h, a, t, p, L, V, k = (symbol(n) for n in "s b h a t p L V k".split())


def _symbolic(kind, sp=True, v=1, t_=t):
    # Korthikanti et al.'s shape: multi-head attention, an ungated MLP of width 4h
    tr = ir.TransformerShape(hidden=ir.Sym("h"), layers=ir.Sym("L"), heads=ir.Sym("a"), kv_heads=ir.Sym("a"),
                        ffn=ir.Op("*", (ir.const(4), ir.Sym("h"))), vocab=ir.Sym("V"))
    sh = shape_of(model(None, seq=ir.Sym("s"), mb=ir.Sym("b"), m=ir.Sym("m"), transformer=tr))
    lay = Layout(t=t_, c=sympy.Integer(1), p=p, v=sympy.Integer(v), U=sympy.Integer(1), schedule=kind, sp=sp,
                 recompute=ir.Recompute.NONE, flash=False)
    return activations(sh, lay)


def test_korthikanti_first_stage_1f1b():
    """Korthikanti et al. 2022, §4.3: with p microbatches of L/p layers in flight the first
    stage holds s·b·h·L·(34/t + 5·a·s/(h·t)), plus the embedding dropout masks s·b·h·p/t."""
    first = _symbolic(ir.ScheduleKind.ONE_F_ONE_B).stages[0]
    sub = {m_: p + k}  # any m ≥ p
    layers = first.layers.subs(sub)
    assert sympy.simplify(layers - s * b * h * L * (34 / t + 5 * a * s / (h * t))) == 0
    assert sympy.simplify(first.embedding.subs(sub) - s * b * h * p / t) == 0


@pytest.mark.parametrize("v", [1, 2, 3, 4])
def test_megatron_interleaved_factor(v):
    """Narayanan et al. 2021 / Korthikanti et al. 2022: interleaving multiplies the first
    stage's activation memory by 1 + (p − 1)/(p·v) once m·v ≥ (v + 1)·p − 1."""
    inter = _symbolic(ir.ScheduleKind.INTERLEAVED, v=v).stages[0]
    plain = _symbolic(ir.ScheduleKind.ONE_F_ONE_B).stages[0]
    sub = {m_: 2 * p + k}
    ratio = sympy.simplify(inter.layers.subs(sub) / plain.layers.subs(sub))
    assert sympy.simplify(ratio - (1 + (p - 1) / (p * v))) == 0


def test_korthikanti_output_layer_with_sequence_parallelism():
    """The last stage's output layer, per microbatch: 4·s·b·h/t·(1 + V/h) (Korthikanti §4.3)."""
    last = _symbolic(ir.ScheduleKind.ONE_F_ONE_B).stages[1]
    assert last.in_flight.output == 1
    assert sympy.simplify(last.output - 4 * s * b * h / t * (1 + V / h)) == 0


def test_logits_divided_by_t_without_sequence_parallelism():
    last = _symbolic(ir.ScheduleKind.ONE_F_ONE_B, sp=False).stages[1]
    # norm and projection inputs are whole on every tensor rank; the fp32 logits are V/t
    assert sympy.simplify(last.output - (4 * s * b * h + 4 * s * b * V / t)) == 0


# --------------------------------------------------------------------------- hand counts on a small model

SMALL = dict(h=16, L=8, a=4, f=64, V=100, s=32, b=2)


def small_spec(schedule: str, pp: int, m: int, *, V=100, tied=False, extra_mesh="", extra_plan="",
               imports="") -> str:
    sched = {"gpipe": "gpipe", "1f1b": "one_f_one_b", "interleaved": "interleaved_1f1b(v = 2)"}[schedule]
    name = sched.split("(")[0]
    return f"""from std.pipeline import {name}
{imports}
model {{
  transformer {{
    hidden = {SMALL['h']}
    layers = {SMALL['L']}
    heads = {SMALL['a']}
    ffn = {SMALL['f']}
    vocab = {V}
    tied_embeddings = {'true' if tied else 'false'}
  }}
  seq = {SMALL['s']}
  microbatch = {SMALL['b']}
  microbatches = {m}
}}
mesh {{
  pp = {pp}
{extra_mesh}
}}
plan p {{
  pp: {sched}
{extra_plan}
}}
"""


def tensors(V: int, tied: bool) -> list[tuple[str, int, int | None]]:
    """(name, elements, layer index or None) for the small model: layernorm, biases, plain MLP."""
    h, L, f = SMALL["h"], SMALL["L"], SMALL["f"]
    out = [("embedding", V * h, None)]
    for i in range(L):
        out += [(f"{i}.ln1.weight", h, i), (f"{i}.ln1.bias", h, i)]
        for w in "qkvo":
            out += [(f"{i}.{w}.weight", h * h, i), (f"{i}.{w}.bias", h, i)]
        out += [(f"{i}.ln2.weight", h, i), (f"{i}.ln2.bias", h, i)]
        out += [(f"{i}.fc1.weight", h * f, i), (f"{i}.fc1.bias", f, i), (f"{i}.fc2.weight", f * h, i),
                (f"{i}.fc2.bias", h, i)]
    out += [("final_norm.weight", h, None), ("final_norm.bias", h, None)]
    out.append(("head (copy of the embedding)" if tied else "head", V * h, None))
    return out


def stage_elements(pp: int, V: int, tied: bool) -> list[int]:
    """Elements each stage holds: L/pp contiguous layers; embedding first, norm and head last."""
    per = [0] * pp
    for name, n, layer in tensors(V, tied):
        if layer is not None:
            per[layer // (SMALL["L"] // pp)] += n
        elif name == "embedding":
            per[0] += n
        else:
            per[-1] += n
    return per


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("tied", [False, True])
def test_stage_parameters_by_hand(pp, tied):
    spec = load_string(small_spec("1f1b", pp, 8, tied=tied), "<stages>")
    r = build(spec).plans[0]
    per = stage_elements(pp, 100, tied)
    first, last = r.stages
    assert (first.stage, last.stage) == ("first", "last")
    for st, n in ((first, per[0]), (last, per[-1])):
        assert st.device["params"].exact == 2 * n
        assert st.device["grads"].exact == 2 * n
        assert st.device["optimizer"].exact == 12 * n
    assert r.device["params"].exact == 2 * max(per[0], per[-1])
    # every stage together: Ψ, plus the copy of a tied embedding
    psi = costs.derive(spec.plans[0]).shape.psi
    assert sum(per) == psi + (100 * SMALL["h"] if tied else 0)


def test_stage_parameters_divided_by_the_other_axes():
    spec = load_string(small_spec("1f1b", 2, 8, extra_mesh="  dp = 4", extra_plan="  dp: zero1",
                                  imports="from std.data import zero1"), "<stages-dp>")
    first, last = build(spec).plans[0].stages
    per = stage_elements(2, 100, False)
    assert first.device["params"].exact == 2 * per[0] and first.device["optimizer"].exact == Fraction(12 * per[0], 4)
    assert last.device["optimizer"].exact == Fraction(12 * per[-1], 4)


def _per_layer_bytes() -> int:
    s_, b_, h_, a_ = SMALL["s"], SMALL["b"], SMALL["h"], SMALL["a"]
    return s_ * b_ * h_ * 34 + 5 * a_ * s_ * s_ * b_  # Korthikanti Table 2, no parallelism


def _output_bytes(V: int) -> int:
    s_, b_, h_ = SMALL["s"], SMALL["b"], SMALL["h"]
    return 2 * s_ * b_ * h_ + 2 * s_ * b_ * h_ + 4 * s_ * b_ * V  # norm input, projection input, fp32 logits


@pytest.mark.parametrize("schedule,pp,m", [("1f1b", 4, 8), ("1f1b", 4, 2), ("gpipe", 2, 3), ("interleaved", 2, 4),
                                           ("interleaved", 4, 4), ("interleaved", 4, 8)])
def test_stage_activations_by_hand(schedule, pp, m):
    v = 2 if schedule == "interleaved" else 1
    spec = load_string(small_spec(schedule, pp, m), "<stages-act>")
    first, last = build(spec).plans[0].stages
    counts = run_and_count(schedule_orders(schedule, pp, m, v), pp, v)
    layers_per_chunk = Fraction(SMALL["L"], pp * v)
    mask = SMALL["s"] * SMALL["b"] * SMALL["h"]  # one byte per element
    want_first = counts[0][0] * layers_per_chunk * _per_layer_bytes() + counts[0][1] * mask
    want_last = counts[-1][0] * layers_per_chunk * _per_layer_bytes() + counts[-1][2] * _output_bytes(100)
    assert first.device["activations"].exact == want_first
    assert last.device["activations"].exact == want_last
    assert first.in_flight["layer_microbatches"].exact == counts[0][0] * layers_per_chunk


def test_peak_is_the_larger_stage_and_named():
    # few layers per stage and a large vocabulary: the logits make the last stage the peak
    big_vocab = build(load_string(small_spec("1f1b", 2, 2, V=100_000), "<v>")).plans[0]
    small_vocab = build(load_string(small_spec("1f1b", 4, 8), "<s>")).plans[0]
    for r, want in ((big_vocab, "last"), (small_vocab, "first")):
        totals = {st.stage: st.device["total"].exact for st in r.stages}
        assert r.peak_stage == want and max(totals, key=totals.get) == want
        assert r.device["total"].exact == max(totals.values())
        assert f"the {want} stage decides the peak" in " ".join(r.notes)


def test_memory_query_is_the_peak_over_stages():
    text_ = small_spec("1f1b", 2, 2, V=100_000) + 'assert "fits": memory(p) <= 1 GB\n'
    spec = load_string(text_, "<q>")
    r = build(spec)
    totals = [st.device["total"].exact for st in r.plans[0].stages]
    assert r.questions[0].left.exact == max(totals)
    pp2 = {symbol("pp"): 2}
    assert costs.query_value(spec, ir.Query("memory", "p")).xreplace(pp2) == max(totals)
    # one state: the largest of that term over the stages
    params = [st.device["params"].exact for st in r.plans[0].stages]
    assert costs.query_value(spec, ir.Query("memory", "p", "params")).xreplace(pp2) == max(params)
    model_state = [sum(st.device[x].exact for x in ("params", "grads", "optimizer")) for st in r.plans[0].stages]
    assert costs.query_value(spec, ir.Query("model_state", "p")).xreplace(pp2) == max(model_state)


def test_json_stages_keys():
    out = json.loads(jsonout.render(build(load_string(small_spec("interleaved", 4, 8), "<j>"))))
    mem = out["plans"][0]["memory"]
    assert [st["stage"] for st in mem["stages"]] == ["first", "last"]
    for st in mem["stages"]:
        assert set(st["device"]) == {"params", "optimizer", "grads", "activations", "transient", "total"}
        assert set(st["device"]["total"]) >= {"bytes", "exact", "formula", "latex"}
    assert mem["peak_stage"] == "first"
    assert mem["device"]["total"]["exact"] == max(st["device"]["total"]["exact"] for st in mem["stages"])
    assert out["schema_version"] == 2 and out["plans"][0]["plan"] == "p"


def test_renderers_show_both_stages():
    r = build(load_string(small_spec("1f1b", 4, 8), "<r>"))
    t = text.render(r)
    assert "first stage" in t and "last stage" in t and "peak on the first pipeline stage" in t
    md = markdown.render(r)
    assert "| memory term | device (max over stages) | first stage | last stage | host |" in md


def test_no_pipeline_has_no_stages():
    spec = load_string(small_spec("1f1b", 2, 8).replace("  pp: one_f_one_b", "  pp: ddp").replace(
        "from std.pipeline import one_f_one_b", "from std.data import ddp"), "<np>")
    r = build(spec).plans[0]
    assert r.stages == () and r.peak_stage is None
    assert "stages" not in jsonout.to_json(build(spec))["plans"][0]["memory"]


def test_without_a_shape_every_stage_holds_psi_over_p():
    spec = load_string("""from std.pipeline import one_f_one_b
let psi = 1000
model { params = psi }
mesh { pp = 4 }
plan p { pp: one_f_one_b }
""", "<ns>")
    r = build(spec).plans[0]
    assert r.stages == () and r.device["params"].exact == 2 * 1000 / 4
    assert any("every stage is taken to hold Ψ/p" in n for n in r.notes)


def test_interleaved_with_microbatches_not_a_multiple_of_the_stages_is_noted():
    for m in (2, 6):  # fewer than the stages, or not a multiple of them
        r = build(load_string(small_spec("interleaved", 4, m), "<few>")).plans[0]
        assert any("the interleaved schedule needs a multiple of the stages" in n for n in r.notes)
    r = build(load_string(small_spec("interleaved", 4, 8), "<ok>")).plans[0]
    assert not any("needs a multiple" in n for n in r.notes)


def test_llama_3d_first_stage_interleaved():
    """Llama-2-70B, t = 8 with sequence parallelism, p = 4, v = 2, m = 64, selective
    recomputation: the first stage keeps L·(1 + (p − 1)/(p·v)) = 110 layer-microbatches of
    35.5·s·b·h/t bytes each (10h whole + Q 2h, K and V 2h·kv/a each with kv/a = 1/8, the
    projection input 2h, and a SwiGLU MLP's 6f with f = 3.5h: 10 + 2 + 0.5 + 2 + 21), and
    2p = 8 embedding masks of s·b·h/t bytes."""
    from placement_logic.frontend.loader import load_spec

    r = build(load_spec("examples/llama70b_3d.place"), plans=["megatron_3d"]).plans[0]
    first = r.stages[0]
    sbh = 4096 * 1 * 8192
    assert first.in_flight["layer_microbatches"].exact == 110
    assert first.device["activations"].exact == 110 * 71 * sbh // 16 + 8 * sbh // 8


def test_mixtral_stages_divide_only_experts_by_the_expert_axis():
    """Mixtral-8x7B on (dp 4, ep 8, tp 2, pp 4): per layer the attention (q, o: h·h; k, v:
    h·kv·h/a) is split over tp; the router h·E and two RMSNorms h stay whole on every tp rank (as
    PyTorch and Megatron-LM keep them); the 8 SwiGLU experts 3·h·f each are divided by ep and tp.
    The first stage adds the embedding V·h, the last the head (both split over tp) and a norm (whole)."""
    from placement_logic.frontend.loader import load_spec

    h, L, a, kv, f, V, E = 4096, 32, 32, 8, 14336, 32000, 8
    dp, ep, tp, pp = 4, 8, 2, 4
    dense = 2 * h * h + 2 * h * (kv * h // a)
    whole = h * E + 2 * h
    experts = E * 3 * h * f
    r = build(load_spec("examples/mixtral_4d.place"), plans=["moe_4d"]).plans[0]
    first, last = r.stages
    layers = L // pp
    want_first = Fraction(V * h + layers * dense, tp) + layers * whole + Fraction(layers * experts, ep * tp)
    want_last = Fraction(V * h + layers * dense, tp) + h + layers * whole + Fraction(layers * experts, ep * tp)
    assert first.device["params"].exact == 2 * want_first
    assert last.device["params"].exact == 2 * want_last
    # ZeRO-1 (a distributed optimizer): the non-expert state over the whole data group dp × ep (their
    # replicas on the expert axis are data-parallel replicas), the experts' over dp, their expert-data axis
    non_expert = Fraction(V * h + layers * dense, tp) + layers * whole
    assert first.device["optimizer"].exact == 12 * (non_expert / (dp * ep) + Fraction(layers * experts, ep * tp * dp))


def test_a_pipeline_axis_of_size_one_is_noted():
    r = build(load_string(small_spec("1f1b", 1, 4), "<p1>")).plans[0]
    assert any("the pipeline axis has size 1" in n for n in r.notes)


def test_latex_shows_both_stages_and_compiles(tmp_path):
    import shutil
    import subprocess

    from placement_logic.costreport import latex
    from tests.test_cost_cli import check_latex

    out = latex.render(build(load_string(small_spec("interleaved", 4, 8), "<tex>")))
    check_latex(out)
    assert r"M^{\mathrm{first}}_{\mathrm{total}}" in out and r"M^{\mathrm{last}}_{\mathrm{total}}" in out
    assert "peak stage & first" in out
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex not installed")
    (tmp_path / "r.tex").write_text(out)
    res = subprocess.run(["pdflatex", "-interaction=nonstopmode", "r.tex"], cwd=tmp_path, capture_output=True)
    assert res.returncode == 0
