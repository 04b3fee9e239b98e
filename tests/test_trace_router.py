"""The MoE router's choice on the tensor ranks as `placement trace` lifts it (trace/lift_router.py): its noise
drawn per rank (``router: vary over (tp)``), its input the row-parallel partial sums (``input_partial``), or as
derived (a note).

The fast tests call ``router_lines`` on a hand-made step of 2 tensor ranks (or 2 data × 2 tensor ranks): each
rank's router call with the checksums the recorder writes (the input's exact checksum, its linear checksums Σ x
and Σ x·w and Σ |x|, the top-k's indices and values, the sampled decisions' results) chosen by hand, and the forward all-reduces' input
checksums; the reading each must give follows from the definition (equal inputs and choices: same; equal inputs,
other choices or other samples: vary; inputs whose linear checksums sum over the ranks to an all-reduce's:
partial). The slow ones run examples/traced/moe_router_jitter.py on 2 ranks: the gate noise from a per-rank seed
refuted ``GI router`` at the noise draw, from one seed proved, the router on the partial sums refuted at the
router's line; and examples/traced/moe_router_sampled.py: a second expert sampled from a per-rank seed refuted at
the multinomial, from one seed proved.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift_layout import Unliftable, _Layout
from placement_logic.trace.lift_router import router_lines
from placement_logic.trace.lift_step import Axes, Step

ROOT = Path(__file__).resolve().parent.parent
NOISE = {"file": "examples/traced/moe_router_jitter.py", "line": 63, "function": "forward", "code": "noise"}
LINEAR = {"file": "examples/traced/moe_router_jitter.py", "line": 62, "function": "forward", "code": "router"}
TOPK = {"file": "examples/traced/moe_router_jitter.py", "line": 65, "function": "forward", "code": "topk"}
SAMPLE = {"file": "examples/traced/moe_router_sampled.py", "line": 63, "function": "forward", "code": "multinomial"}


def _call(sha: str, lin: tuple[float, float], chosen: str, gates: str, noise: bool = True) -> dict:
    """A router call of 8 rows, 4 experts, top-2, an input of 8 × 16 elements."""
    e = {"width": 4, "rows": 8, "colsum": [2.0] * 4, "counts": [4] * 4, "top_k": 2, "micro": 0, "stack": [TOPK],
         "input": {"sha": sha, "lin": list(lin), "abs": 10.0, "numel": 128, "stack": [LINEAR]},
         "chosen": chosen, "gates": gates, "choice_stack": [TOPK]}
    if noise:
        e["noise_stack"] = [NOISE]
    return e


def _reduce(seq: int, ranks: list[int], sums: tuple[float, float]) -> dict:
    """A forward all-reduce (sum) of 128 elements over ``ranks``, its input's linear checksums."""
    return {"seq": seq, "step": 0, "phase": "forward", "kind": "all_reduce", "ranks": ranks, "numel": 128, "op": "sum",
            "micro": 0, "sums": [*sums, 10.0], "stack": [LINEAR]}


def _step(calls: dict[int, list[dict]], colls: dict[int, list[dict]] | None = None, dp: bool = False,
          items: list | None = None) -> tuple[Step, Axes]:
    """Ranks 0, 1 along tp (with ``dp``: ranks 0..3 on dp × tp, rank = 2·dp + tp), their step 0's router calls."""
    layout = _Layout(["dp", "tp"], [2, 2], [[0, 1], [2, 3]]) if dp else _Layout(["tp"], [2], [0, 1])
    ranks = {r: {"rank": r, "collectives": (colls or {}).get(r, []),
                 "steps": [{"step": 0, "router": c, "nll": [{"classes": 8}]}]} for r, c in calls.items()}
    st = Step({}, "", ranks, layout, True, {}, [], 0, {r: p["steps"][0] for r, p in ranks.items()}, {}, {},
              items=list(items or []))
    return st, Axes(None, None, [], [0], tp="tp")


def _lines(st, ax, sp=False):
    model, plan = router_lines(st, ax, sp, False)
    return model, [t for t, _ in plan], [f for _, f in plan]


def test_equal_inputs_and_choices_are_the_derivation():
    st, ax = _step({r: [_call("x", (1.0, 2.0), "c", "g")] for r in (0, 1)})
    model, plan, _ = _lines(st, ax)
    assert model == [] and plan == [] and not st.items
    assert any("router: same" in n for n in st.notes)


@pytest.mark.parametrize("chosen,gates", [("c1", "g"), ("c", "g1")], ids=["experts", "gate weights"])
def test_equal_inputs_other_choices_are_vary_at_the_noise_draw(chosen, gates):
    loss = Unliftable((0, 1), -1, "the loss over tp", "differ", ())
    head = Unliftable((0, 1), -1, "the output of head (Linear) over tp", "differ", ())
    other = Unliftable((0,), -1, "DTensor.from_local", "asserted", ())
    st, ax = _step({0: [_call("x", (1.0, 2.0), "c", "g")], 1: [_call("x", (1.0, 2.0), chosen, gates)]},
                   items=[loss, head, other])
    model, plan, frames = _lines(st, ax)
    assert plan == [plan[0]] and plan[0].startswith("  override router: vary over (tp)  # observed"), plan
    assert frames[0][0]["line"] == NOISE["line"]
    assert "  experts = 4  # the router's columns" in model and "  top_k = 2" in model
    assert "  hidden = 16  # the router's input width" in model and "  heads = 2" in model[3]
    assert st.items == [other]  # the losses and outputs that differ after the routing are its consequences


def test_vary_without_a_noise_draw_is_stated_at_the_topk():
    st, ax = _step({0: [_call("x", (1.0, 2.0), "c", "g", noise=False)],
                    1: [_call("x", (1.0, 2.0), "d", "g", noise=False)]})
    _, plan, frames = _lines(st, ax)
    assert plan[0].startswith("  override router: vary over (tp)") and frames[0][0]["line"] == TOPK["line"]


def test_inputs_summing_to_an_all_reduced_activation_are_input_partial():
    """Rank 0's input (1, 2), rank 1's (3, -1) in (Σ x, Σ x·w); the all-reduce's inputs (0.5, 4) and (3.5, -3):
    the all-reduced activation's (4, 1) = (1, 2) + (3, -1)."""
    colls = {0: [_reduce(5, [0, 1], (0.5, 4.0))], 1: [_reduce(5, [0, 1], (3.5, -3.0))]}
    st, ax = _step({0: [_call("x0", (1.0, 2.0), "c", "g")], 1: [_call("x1", (3.0, -1.0), "c", "g")]}, colls)
    _, plan, frames = _lines(st, ax)
    assert plan[0].startswith("  override router: input_partial over (tp)  # observed"), plan
    assert frames[0][0]["line"] == LINEAR["line"]


@pytest.mark.parametrize("sums,ranks,numel", [((3.5, -2.9), [0, 1], 128), ((3.5, -3.0), [0], 128),
                                              ((3.5, -3.0), [0, 1], 64)],
                         ids=["another sum", "another group", "another size"])
def test_inputs_that_differ_otherwise_are_a_router_call_named(sums, ranks, numel):
    """(4, 1.1) is not (4, 1) beyond 1e-5 of Σ |x| = 20; an all-reduce over rank 0 alone or of 64 elements is no
    activation of the tensor group of the router's size."""
    colls = {0: [_reduce(5, ranks, (0.5, 4.0))], 1: [_reduce(5, ranks, sums)]}
    for c in colls.values():
        c[0]["numel"] = numel
    st, ax = _step({0: [_call("x0", (1.0, 2.0), "c", "g")], 1: [_call("x1", (3.0, -1.0), "c", "g")]}, colls)
    model, plan, _ = _lines(st, ax)
    assert plan == [] and model == []
    assert [u for u in st.items if u.what == "a router call" and "its input differs" in u.reason]


@pytest.mark.parametrize("chosen,named", [("c", False), ("d", True)], ids=["same choice", "other choice"])
def test_a_call_whose_input_is_not_observed_is_read_by_its_choices(chosen, named):
    """No ``mm`` of the call's shape before its softmax (an ``input`` missing): equal choices are the derivation,
    different ones cannot be told apart (noise or input) and are named."""
    calls = {0: [_call("x", (1.0, 2.0), "c", "g")], 1: [_call("x", (1.0, 2.0), chosen, "g")]}
    for c in calls.values():
        del c[0]["input"]
    st, ax = _step(calls)
    _, plan, _ = _lines(st, ax)
    assert plan == []
    assert bool([u for u in st.items if "not observed" in u.reason]) is named
    assert any("router: same" in n for n in st.notes) is not named


def test_calls_not_paired_are_named():
    st, ax = _step({0: [_call("x", (1.0, 2.0), "c", "g")] * 2, 1: [_call("x", (1.0, 2.0), "c", "g")]})
    _, plan, _ = _lines(st, ax)
    assert plan == [] and [u for u in st.items if "not paired" in u.reason]


def test_noise_on_one_call_and_partial_sums_on_another_are_named():
    colls = {0: [_reduce(5, [0, 1], (1.0, 2.0))], 1: [_reduce(5, [0, 1], (3.0, -1.0))]}
    st, ax = _step({0: [_call("x", (1.0, 2.0), "c", "g"), _call("y0", (1.0, 2.0), "c", "g")],
                    1: [_call("x", (1.0, 2.0), "d", "g"), _call("y1", (3.0, -1.0), "c", "g")]}, colls)
    _, plan, _ = _lines(st, ax)
    assert plan == [] and [u for u in st.items if "cannot state both" in u.reason]


def test_each_tensor_group_of_a_data_axis_is_compared():
    """dp × tp = 2 × 2: the group {0, 1} routes alike, {2, 3} does not: vary over tp."""
    calls = {0: [_call("x", (1.0, 2.0), "c", "g")], 1: [_call("x", (1.0, 2.0), "c", "g")],
             2: [_call("z", (5.0, 2.0), "c", "g")], 3: [_call("z", (5.0, 2.0), "c", "h")]}
    st, ax = _step(calls, dp=True)
    _, plan, _ = _lines(st, ax)
    assert plan and plan[0].startswith("  override router: vary over (tp)")


@pytest.mark.parametrize("inputs,choices,named", [
    (("x", "x"), ("c", "d"), "equal on the ranks"),    # the same tokens (a gathered input), routed differently
    ((None, None), ("c", "d"), "not observed"),        # no input seen: same tokens or not, unknown
    (("x", "y"), ("c", "d"), None),                    # each rank's own tokens: different choices expected
    (("x", "x"), ("c", "c"), None),                    # the same tokens routed alike
], ids=["same-tokens-differ", "unobserved-differ", "own-tokens", "same-tokens-alike"])
def test_under_sequence_parallelism_the_same_tokens_must_route_alike(inputs, choices, named):
    calls = {r: [_call(inputs[r] or "x", (1.0, 2.0), choices[r], "g")] for r in (0, 1)}
    for r in (0, 1):
        if inputs[r] is None:
            del calls[r][0]["input"]
    st, ax = _step(calls)
    assert _lines(st, ax, sp=True)[1] == []
    if named is None:
        assert not st.items and any("sequence parallelism" in n for n in st.notes), st.items
    else:
        (item,) = st.items
        assert item.what == "a router call" and named in item.reason and "sequence parallelism" in item.reason


def test_no_tensor_axis_states_nothing():
    calls = {0: [_call("x", (1.0, 2.0), "c", "g")], 1: [_call("x", (1.0, 2.0), "d", "g")]}
    st, ax = _step(calls)
    ax.tp = None
    assert _lines(st, ax)[1] == [] and not st.notes and not st.items


def test_a_capacity_block_is_not_written_twice():
    st, ax = _step({0: [_call("x", (1.0, 2.0), "c", "g")], 1: [_call("x", (1.0, 2.0), "d", "g")]})
    model, plan = router_lines(st, ax, False, True)
    assert model == [] and plan


def _sampled(call: dict, *shas: str, op: str = "multinomial") -> dict:
    """``call`` with sampled decisions of these results (a multinomial draws one expert per row)."""
    call["sampled"] = [{"op": op, "sha": sha, "stack": [SAMPLE], **({"samples": 1} if op == "multinomial" else {})}
                       for sha in shas]
    return call


@pytest.mark.parametrize("samples,reading", [(("s", "s"), "same"), (("s", "t"), "vary")], ids=["alike", "apart"])
def test_a_sampled_second_expert_is_compared_between_the_tensor_ranks(samples, reading):
    """Equal inputs and equal top-1 choices on both ranks: the multinomial's samples decide. Equal: the derivation;
    different: vary over (tp) at the multinomial's line, the block's k the top-1 plus the one sample (1 + 1 = 2)."""
    calls = {r: [_sampled({**_call("x", (1.0, 2.0), "c", "g"), "top_k": 1}, samples[r])] for r in (0, 1)}
    st, ax = _step(calls)
    model, plan, frames = _lines(st, ax)
    if reading == "same":
        assert plan == [] and not st.items and any("router: same" in n for n in st.notes)
        return
    assert plan[0].startswith("  override router: vary over (tp)  # observed"), plan
    assert frames[0][0]["line"] == SAMPLE["line"] and "  top_k = 2" in model


def test_a_call_that_only_samples_is_a_router_call():
    """No ``topk`` (an argmax and a multinomial): the call is read by its samples all the same."""
    calls = {r: [_sampled(_call("x", (1.0, 2.0), "c", "g"), sha)] for r, sha in ((0, "s"), (1, "t"))}
    for c in calls.values():
        for key in ("chosen", "gates", "top_k"):
            del c[0][key]
    st, ax = _step(calls)
    model, plan, _ = _lines(st, ax)
    assert plan and plan[0].startswith("  override router: vary over (tp)") and "  top_k = 1" in model


@pytest.mark.parametrize("ops", [(("multinomial",), ()), (("multinomial",), ("bernoulli",))],
                         ids=["missing", "another op"])
def test_sampled_decisions_that_differ_in_kind_are_named(ops):
    calls = {r: [_sampled(_call("x", (1.0, 2.0), "c", "g"), *["s"] * len(ops[r]))] for r in (0, 1)}
    for r in (0, 1):
        for d, op in zip(calls[r][0]["sampled"], ops[r]):
            d["op"] = op
    st, ax = _step(calls)
    assert _lines(st, ax)[1] == []
    assert [u for u in st.items if u.what == "a router call" and "sampled routing decisions" in u.reason]


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_samples_that_differ_where_the_input_is_not_observed_or_the_tokens_are_the_same_are_named(sp):
    """Without sequence parallelism and no input observed: noise, samples or input cannot be told apart; under
    sequence parallelism with equal inputs (the same tokens): no statement holds it. Both named, no statement."""
    calls = {r: [_sampled(_call("x", (1.0, 2.0), "c", "g"), sha)] for r, sha in ((0, "s"), (1, "t"))}
    if not sp:
        for c in calls.values():
            del c[0]["input"]
    st, ax = _step(calls)
    assert _lines(st, ax, sp=sp)[1] == []
    (item,) = st.items
    assert item.what == "a router call" and ("sequence parallelism" in item.reason) is sp


@pytest.mark.parametrize("shas,sp,named", [(("s", "s"), False, False), (("s", "t"), False, True),
                                           (("s", "t"), True, False)], ids=["alike", "apart", "apart-sp"])
def test_a_draw_outside_every_router_call_is_compared_between_the_tensor_ranks(shas, sp, named):
    """A multinomial no router call's forward holds (``draws``): different on ranks holding the same tokens is
    named (PL614, a sampled choice); alike, nothing; under sequence parallelism the ranks hold other tokens."""
    st, ax = _step({r: [_call("x", (1.0, 2.0), "c", "g")] for r in (0, 1)})
    for r in (0, 1):
        st.ranks[r]["steps"][0]["draws"] = [{"op": "multinomial", "sha": shas[r], "micro": 0, "stack": [SAMPLE]}]
    _lines(st, ax, sp=sp)
    found = [u for u in st.items if u.what == "a sampled choice"]
    assert bool(found) is named
    if named:
        assert "multinomial" in found[0].reason and found[0].stack


@pytest.mark.parametrize("key,value", [
    ("router", [{"width": 4, "rows": 8, "colsum": [2.0] * 4, "sampled": [{"op": "multinomial", "stack": []}]}]),
    ("draws", [{"op": "multinomial", "sha": 3, "stack": []}])], ids=["sampled without sha", "draw sha not a string"])
def test_malformed_sampled_records_are_pl612(tmp_path, key, value):
    import json

    trace = json.loads((ROOT / "tests" / "data" / "traces" / "ddp_summed.json").read_text())
    trace["ranks"][0]["steps"][0][key] = value
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and key in err and "Traceback" not in err, err


@pytest.mark.torch
def test_the_recorder_reads_the_router_linears_input_and_the_noise():
    """The last mm of R × E output before the softmax gives the input (its linear checksums linear: those of a sum
    are the sum of theirs); a draw of R · E elements is the noise; a draw of another size is not."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from placement_logic.trace.recorder_router import linear_sums, note_router_input, note_router_op

    g = torch.Generator().manual_seed(0)
    a, b, w = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)
    scale = linear_sums(a)[2] + linear_sums(b)[2]  # a + b rounded to float32: within 1e-6 of Σ |x|
    assert all(abs(x + y - z) <= 1e-6 * scale for x, y, z in zip(linear_sums(a)[:2], linear_sums(b)[:2],
                                                                  linear_sums(a + b)[:2]))
    for draw, seen in ((torch.randn(8, 4, generator=g), True), (torch.randn(3, generator=g), False)):
        rec = SimpleNamespace(module_stack=[], micro_step=lambda: 0, step_record=lambda: {"step": 0})
        note_router_op(rec, "mm", (a, w), a @ w)
        note_router_op(rec, "mm", (a, torch.randn(16, 300, generator=g)), torch.zeros(8, 300))  # over 256 columns
        note_router_op(rec, "randn", (), draw)
        entry = {"rows": 8, "width": 4}
        note_router_input(rec, entry)
        assert entry["input"]["numel"] == 128 and entry["input"]["lin"] == linear_sums(a)[:2]
        assert ("noise_stack" in entry) is seen


@pytest.mark.torch
def test_the_recorder_reads_the_sampled_decisions_of_a_router_calls_forward():
    """After a router call's softmax (R = 8 rows, E = 4), in the forward of the module that ran it: a multinomial
    (also from a module it calls) and a coin of R draws are the call's sampled decisions, a draw of another size
    or a coin in a called module is not; once the module's forward ends, a multinomial is a draw of the step. Two
    generators of different seeds sample different experts (checked on the tensors themselves), so their records
    differ; one seed, equal."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from placement_logic.trace.recorder_modules import Modules
    from placement_logic.trace.recorder_router import note_router_input, note_router_op

    probs = torch.softmax(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)), -1)
    router, called = object(), object()

    def record(seed: int):
        step = {"step": 0}
        rec = SimpleNamespace(module_stack=[(id(router), None, 0)], micro_step=lambda: 0, step_record=lambda: step)
        entry = {"rows": 8, "width": 4}
        note_router_input(rec, entry)  # the softmax
        g = torch.Generator().manual_seed(seed)
        rec.module_stack.append((id(called), None, 0))
        sample = torch.multinomial(probs, 1, generator=g)
        note_router_op(rec, "multinomial", (probs, 1), sample)
        note_router_op(rec, "rand", (), torch.rand(8, generator=g))  # a coin per row, but in the called module
        Modules.pop_module(rec, called, None)
        note_router_op(rec, "rand", (), torch.rand(8, generator=g))  # a coin per row in the router's own forward
        note_router_op(rec, "rand", (), torch.rand(5, generator=g))  # another size: not the call's
        Modules.pop_module(rec, router, None)  # the router's forward returns
        note_router_op(rec, "multinomial", (probs, 1), torch.multinomial(probs, 1, generator=g))
        return entry, step, sample

    (e0, s0, x0), (e1, _, x1), (e2, _, x2) = record(1), record(1), record(2)
    assert [d["op"] for d in e0["sampled"]] == ["multinomial", "rand"] and e0["sampled"][0]["samples"] == 1
    assert [d["op"] for d in s0["draws"]] == ["multinomial"] and s0["draws"][0]["micro"] == 0
    assert torch.equal(x0, x1) and e0["sampled"] == e1["sampled"]
    assert not torch.equal(x0, x2) and e0["sampled"][0]["sha"] != e2["sampled"][0]["sha"]


def _verdict(model: list[str], plan: list[str]):
    """The GI router verdict of the stored tensor-parallel spec (tests/golden/traced/tp_rowwise.place) with the
    lifted transformer block and router line."""
    from placement_logic.check.run import check_spec
    from placement_logic.frontend.loader import load_string

    text = (ROOT / "tests" / "golden" / "traced" / "tp_rowwise.place").read_text()
    text = text.replace("  group bias {", "\n".join(f"  {m}" for m in model) + "\n  group bias {")
    head, _, _ = text.rstrip().rpartition("\n}")  # the plan's closing brace
    text = head + "\n" + "\n".join(plan) + "\n}\n"
    report = check_spec(load_string(text, "lifted.place"), ["traced"], timeout=20).plans[0]
    return next((o.verdict for o in report.obligations if o.name == "GI router"), None)


@pytest.mark.parametrize("partial", [False, True], ids=["vary", "input_partial"])
def test_the_lifted_statement_is_refuted_and_the_block_accepted(partial):
    """The lifted ``transformer`` block (heads = the tensor ranks, hidden 16, E = 4, k = 2) is a model the checker
    takes under megatron_tp; vary or input_partial over (tp) is refuted (two tensor ranks route apart)."""
    from placement_logic.outcome import Verdict

    colls = {0: [_reduce(5, [0, 1], (0.5, 4.0))], 1: [_reduce(5, [0, 1], (3.5, -3.0))]}
    calls = ({0: [_call("x0", (1.0, 2.0), "c", "g")], 1: [_call("x1", (3.0, -1.0), "c", "g")]} if partial else
             {0: [_call("x", (1.0, 2.0), "c", "g")], 1: [_call("x", (1.0, 2.0), "d", "g")]})
    st, ax = _step(calls, colls)
    model, plan, _ = _lines(st, ax)
    assert _verdict(model, plan) is Verdict.REFUTED


# --------------------------------------------------------------------------- slow: the example

def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(text: str) -> int:
    lines = (ROOT / "examples" / "traced" / "moe_router_jitter.py").read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status,verb,at", [
    ([], 1, "vary", "torch.randn(logits.shape, generator=self.noise)"),
    (["--shared-seed"], 0, None, None),
    (["--partial"], 1, "input_partial", "logits = self.router(partial if PARTIAL else h)")],
    ids=["per-rank seed", "shared seed", "partial sums"])
def test_the_router_of_the_example_is_lifted(argv, status, verb, at, tmp_path, monkeypatch):
    """Gate noise from a per-rank seed: vary over (tp), refuted GI router at the noise draw; from one seed: no
    statement, proved; the router on the row-parallel partial sums: input_partial over (tp), refuted at its line."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/moe_router_jitter.py", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    if verb is None:
        assert "override router" not in text and "router: same" in text, text
        assert "proved for all mesh sizes" in out and " refuted GI" not in out, out
        return
    where = _line(at)
    assert f"  override router: {verb} over (tp)  # observed" in text, text
    assert re.search(rf"override router: {verb} over \(tp\)  # observed.*moe_router_jitter\.py:{where}$", text, re.M)
    assert "    experts = 4  # the router's columns" in text and "    top_k = 2" in text, text
    assert f"examples/traced/moe_router_jitter.py:{where}: refuted GI router: " in out, out
    assert "the root cause is the MoE router's choice" in out, out


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,status", [([], 1), (["--shared-seed"], 0)], ids=["per-rank seed", "shared seed"])
def test_the_sampled_second_expert_of_the_example_is_lifted(argv, status, tmp_path, monkeypatch):
    """examples/traced/moe_router_sampled.py: the top-1 alike on both tensor ranks, the second expert sampled with
    torch.multinomial from a per-rank seed: vary over (tp) at the multinomial, refuted GI router (the top-1 alone
    agrees: read without the samples, router: same); from one seed: no statement, proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", "examples/traced/moe_router_sampled.py", *argv])
    assert got == status and "[PL614]" not in err, out + err
    text = spec.read_text()
    if status == 0:
        assert "override router" not in text and "router: same" in text, text
        assert "proved for all mesh sizes" in out and " refuted GI" not in out, out
        return
    lines = (ROOT / "examples" / "traced" / "moe_router_sampled.py").read_text().splitlines()
    where = next(i for i, x in enumerate(lines, 1) if "torch.multinomial(" in x)
    assert re.search(rf"override router: vary over \(tp\)  # observed.*moe_router_sampled\.py:{where}$", text, re.M)
    assert "    experts = 4  # the router's columns" in text and "    top_k = 2" in text, text
    assert f"examples/traced/moe_router_sampled.py:{where}: refuted GI router: " in out, out
