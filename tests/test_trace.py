"""``placement trace`` and ``placement lift``: a training script's real step, lifted and checked.

Fast tests read stored traces (tests/data/traces/: a DDP script and a data x pipeline one). The slow ones run the scripts of
examples/traced/ on 2 or 4 CPU processes: every correct script is proved, every buggy one
refuted at the script line that issued (or should have issued) the collective, and each
lifted spec matches its golden file. The property: for every library plan (examples/library)
that ``placement measure`` realises, and for variants of them, tracing the realisation and lifting
it gives a plan with the same costs and the same checker verdicts as the plan it realised, or
the lift reports the calls it cannot express, as listed per plan in LIBRARY_REPORTED.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import re
from pathlib import Path

import pytest
from golden import check_golden

from placement_logic.cli import main
from placement_logic.trace.lift import lift
from placement_logic.trace.schema import VERSION, load_trace

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
# examples/traced/pipeline_dp.py on 4 processes: 2 replicas of a 2-stage pipeline, 1F1B order
STORED_PIPELINE = ROOT / "tests" / "data" / "traces" / "pipeline_dp.json"
GOLDEN = ROOT / "tests" / "golden" / "traced"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(script: str, text: str) -> int:
    """The line of examples/traced/SCRIPT that contains ``text``."""
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


def stored() -> dict:
    return json.loads(STORED.read_text())


def stored_pipeline() -> dict:
    return json.loads(STORED_PIPELINE.read_text())


# --------------------------------------------------------------------------- fast: stored trace


def test_lift_stored_trace(monkeypatch):
    monkeypatch.chdir(ROOT)
    status, out, err = run(["lift", str(STORED.relative_to(ROOT))])
    assert status == 0, err
    assert "dp: ddp" in out
    # DDP's default averaging is gone (the hook sums): the divisor is 1 where a per-device mean needs dp
    line = _line("ddp_summed.py", "work = dist.all_reduce(bucket.buffer()")
    assert f"override grads: divide by 1  # examples/traced/ddp_summed.py:{line}" in out
    check_golden(GOLDEN / "stored_ddp_summed.place", out)


def test_lifted_stored_trace_is_refuted_by_check(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    spec.write_text(lift(stored()).text)
    status, out, _ = run(["check", str(spec)])
    assert status == 1
    assert "refuted GI grads[dense] normalisation" in out
    status, out, _ = run(["cost", str(spec)])
    assert status == 0 and "traced" in out


def _accumulated(trace: dict, k: int, divided: bool) -> dict:
    """The stored trace as if each step ran ``k`` backward passes (each loss divided by k or not)."""
    for part in trace["ranks"]:
        for st in part["steps"]:
            if st.get("losses"):
                one = dict(st["losses"][0], value=st["losses"][0]["value"] / (k if divided else 1))
                st["losses"] = [one] * k
                st["nll"] = [st["nll"][0]] * k
    return trace


def test_accumulation_is_lifted_as_microbatches():
    """k backward passes per optimizer step: ``microbatches = k``; a loss divided by k keeps the hook's divisor,
    a loss not divided by k is k times too large, stated over k at the loss line."""
    divided = lift(_accumulated(stored(), 2, True))
    assert "  microbatches = 2  # backward passes accumulated into each optimizer step" in divided.text
    assert "override grads: divide by 1  #" in divided.text
    assert not [u for u in divided.unliftable if u.what == "backward"]
    summed = lift(_accumulated(stored(), 2, False)).text
    line = _line("ddp_summed.py", "loss = F.cross_entropy(")
    assert f"override grads: divide by 1 / dp  # examples/traced/ddp_summed.py:{line}" in summed


def _every_micro_step(trace: dict, scale: str | None, fresh: bool = False) -> dict:
    """The stored trace as if its last step ran two backward passes, each all-reducing the accumulated
    gradient (DDP without no_sync) or, ``fresh``, the new micro-step's gradient only, each reduction scaled by
    ``scale`` (DDP's 1/world) or not (a summing hook)."""
    trace = _accumulated(trace, 2, True)
    for part in trace["ranks"]:
        st = part["steps"][-1]
        nxt = 1 + max(c["seq"] for c in part["collectives"] + part["unrecognised"])
        again = {}
        for c in list(part["collectives"]):
            if c["step"] == st["step"] and c["kind"] == "all_reduce":
                c["micro"] = 1
                again[c["seq"]] = dict(c, seq=nxt, micro=0, inputs_reduced=[])
                c["inputs_reduced"] = [] if fresh else [nxt]
                nxt += 1
        part["collectives"] += list(again.values())
        for prm in st["optimizer"]["params"]:
            g = prm["grad"]
            g["collectives"] = [again[x]["seq"] for x in g["collectives"] if x in again] + g["collectives"]
            at = {"file": "examples/traced/ddp_summed.py", "line": 1, "code": ""}
            g["scales"] = [] if scale is None else [{"factor": scale, "at": at, "micro": m} for m in (0, 1)]
    return trace


def test_averaging_reduction_on_every_micro_step_is_reduce_every_microbatch(tmp_path):
    """An average of the accumulated buffer on every micro-step is one reduction of the summed gradient (the
    earlier part is equal on every rank): lifted as reduce_every_microbatch, proved, costed with m all-reduces."""
    lifted = lift(_every_micro_step(stored(), "1/2"))
    assert not lifted.unliftable, lifted.unliftable
    assert "  override grads: reduce_every_microbatch  # observed: the gradients all-reduced after each of the 2" \
        in lifted.text
    assert "override grads: divide by" not in lifted.text and "reduce over" not in lifted.text
    spec = tmp_path / "every.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    assert status == 0 and "PROVED" in out
    status, out, _ = run(["cost", str(spec), "--format", "json"])
    colls = [c for c in json.loads(out)["plans"][0]["communication"]["collectives"] if c["phase"] == "grad_sync"]
    assert [(c["kind"], c["count"]) for c in colls] == [("all_reduce", 2)], colls


def test_summing_reduction_of_each_fresh_gradient_is_one_reduction():
    """A sum of each micro-step's own gradient (its input carried no earlier reduction) is linear: one reduction
    of the summed gradient, made m times; the hook's missing division is still what the checker refutes."""
    lifted = lift(_every_micro_step(stored(), None, fresh=True))
    assert not lifted.unliftable, lifted.unliftable
    assert "override grads: reduce_every_microbatch" in lifted.text
    assert "override grads: divide by 1  #" in lifted.text


def test_summing_reduction_on_every_micro_step_is_reported():
    """A sum of the accumulated buffer on every micro-step counts the first micro-step's part world times: no
    plan states it, so it is reported at the backward, never lifted as one reduction."""
    lifted = lift(_every_micro_step(stored(), None))
    assert "reduce_every_microbatch" not in lifted.text
    [item] = [u for u in lifted.unliftable if u.what == "backward"]
    assert "not each an average over its group" in item.reason


def test_lift_json_format(monkeypatch):
    monkeypatch.chdir(ROOT)
    status, out, _ = run(["lift", str(STORED), "--format", "json"])
    data = json.loads(out)
    assert status == 0 and data["plan"] == "traced" and data["not_lifted"] == []
    assert data["spec"].startswith("# Lifted by `placement lift`")
    assert sum(len(v) for v in data["groups"].values()) == 36  # every parameter tensor of examples/traced/tiny.py
    # Ψ of tiny.py by hand: embedding V*h; per block two norms (weight, bias), four h x h linears with
    # bias, h -> 4h and 4h -> h with biases; the final norm; the head h*V without bias
    v, h, layers = 64, 32, 2
    block = 2 * 2 * h + 4 * (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    assert f"params = {v * h + layers * block + 2 * h + h * v}" in data["spec"]


def test_a_view_keeps_the_histories_of_its_own_regions():
    """A gradient viewed out of a bucket carries the reductions of its own elements, not those of the rest of the
    bucket; an accumulation into it and a copy out of the bucket still take what they read."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_events import Events

    class Regions(Events):
        def __init__(self):
            self.events, self.alive, self.phase = {}, {}, "backward"

    e = Regions()
    bucket = torch.zeros(8)
    e._add(bucket[:4], ("collective", 1))  # the first parameter's reduction
    second = bucket[4:].view(2, 2)
    e._follow("view", (bucket[4:], [2, 2]), {}, second)
    assert e._events_of(second) == []
    first = bucket[:4].view(2, 2)
    e._follow("view", (bucket[:4], [2, 2]), {}, first)
    assert e._events_of(first) == [("collective", 1)]
    fresh = torch.ones(4)
    e._add(fresh, ("collective", 2))
    e._follow("add_", (bucket[4:], fresh), {}, bucket[4:])
    assert e._events_of(bucket[4:]) == [("collective", 2)]
    whole = bucket.clone()
    e._follow("clone", (bucket,), {}, whole)
    assert sorted(e._events_of(whole)) == [("collective", 1), ("collective", 2)]


def test_every_collective_is_attributed_to_the_parameters_it_carried():
    trace = stored()
    step = trace["ranks"][0]["steps"][-1]
    hook = [c for c in trace["ranks"][0]["collectives"] if c["step"] == step["step"] and c["kind"] == "all_reduce"]
    line = _line("ddp_summed.py", "work = dist.all_reduce(bucket.buffer()")
    assert hook and all(c["stack"][0]["line"] == line for c in hook)  # the hook's all_reduce, not DDP's internals
    carried = {s for p in step["optimizer"]["params"] for s in p["grad"]["collectives"]}
    assert carried == {c["seq"] for c in hook}


@pytest.mark.parametrize("edit,phrase", [
    (lambda t: t.update(schema="other"), "not a placement trace"),
    (lambda t: t.update(version=VERSION + 1), "trace schema version"),
    (lambda t: t["ranks"].pop(), "one entry per rank"),
    (lambda t: t["ranks"][0].pop("steps"), "missing steps"),
])
def test_bad_trace_is_pl612(tmp_path, edit, phrase):
    trace = stored()
    edit(trace)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and phrase in err and "Traceback" not in err


def test_malformed_records_are_pl612_not_a_traceback(tmp_path):
    trace = stored()
    for part in trace["ranks"]:
        for s in part["steps"]:
            for p in s.get("optimizer", {}).get("params", []):
                p["shape"] = "wide"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and "does not fit the schema" in err and "Traceback" not in err


def test_not_json_is_pl612(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{\n  nope")
    status, _, err = run(["lift", str(path)])
    assert status == 2 and re.search(r"t\.json:2:\d+: error: not JSON.*\[PL612\]", err)


def test_unliftable_calls_are_reported_never_dropped(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    trace = stored()
    step_no = trace["ranks"][0]["steps"][-1]["step"]
    for part in trace["ranks"]:
        calls = [c for c in part["collectives"] if c["step"] == step_no and c["kind"] == "all_reduce"]
        calls[0]["kind"] = "all_to_all"
        part["unrecognised"].append({"seq": 999, "op": "c10d.mystery_", "phase": "backward",
                                     "stack": [{"file": "examples/traced/ddp_summed.py", "line": 27,
                                                "function": "<module>", "code": "loss.backward()"}]})
    other = next(c for c in trace["ranks"][1]["collectives"] if c["step"] == step_no and c["kind"] == "broadcast")
    other["ranks"] = [0]  # a group that leaves the caller out
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, out, err = run(["lift", str(path)])
    assert status == 1 and "plan traced" in out
    lines = [line for line in err.splitlines() if "[PL614]" in line]
    assert len(lines) == 3, err
    line = _line("ddp_summed.py", "work = dist.all_reduce(bucket.buffer()")
    assert any(re.match(rf"examples/traced/ddp_summed\.py:{line}:1: error: not lifted: all_to_all .*call \d+, ranks 0, 1\)",
                        x) for x in lines), lines
    assert any("c10d.mystery_ (call 999, ranks 0, 1)" in x and "does not recognise" in x for x in lines)
    assert any("rank 1)" in x and "no set of mesh axes" in x for x in lines)
    assert f"{line} |" in err  # the script line is shown


def test_trace_without_optimizer_step_is_reported(tmp_path):
    trace = stored()
    for part in trace["ranks"]:
        for s in part["steps"]:
            s.pop("optimizer", None)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 1 and "no optimizer step was recorded" in err


@pytest.mark.parametrize("argv,phrase", [
    (["trace", "--nproc", "1", "--", "python", "examples/traced/ddp.py"], "--nproc 1: expected 2 to 8"),
    (["trace", "--nproc", "9", "--", "python", "examples/traced/ddp.py"], "--nproc 9: expected 2 to 8"),
    (["trace", "--nproc", "2", "--", "python"], "expected '-- python SCRIPT.py ARGS...'"),
    (["trace", "--nproc", "2", "--", "python", "no_such_script.py"], "no script no_such_script.py"),
])
def test_trace_usage_errors_are_pl611(argv, phrase, monkeypatch):
    monkeypatch.chdir(ROOT)
    status, _, err = run(argv)
    assert status == 2 and "[PL611]" in err and phrase in err


def test_trace_without_torch_is_pl601(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.chdir(ROOT)
    status, _, err = run(["trace", "--nproc", "2", "--", "python", "examples/traced/ddp.py"])
    assert status == 2 and "[PL601]" in err and "placement trace needs PyTorch" in err

# --------------------------------------------------------------------------- fast: a stored pipeline trace


def _tiny_params() -> int:
    """Ψ of examples/traced/tiny.py by hand (the whole model: both stages together)."""
    v, h, layers = 64, 32, 2
    block = 2 * 2 * h + 4 * (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    return v * h + layers * block + 2 * h + h * v


def test_pipeline_with_data_axis_is_lifted(tmp_path, monkeypatch):
    """pipeline_dp.py read by hand: ranks r and r + 1 (r even) are stages 0 and 1 of one replica, so the ranks
    factor as dp = 2 (rank // 2) x pp = 2 (rank % 2); stage 0 sends two microbatches' activations (line of
    dist.send); the last stage sends the first gradient back before it receives the second microbatch (1F1B);
    each stage's gradients are all-reduced over the replicas and divided by their number: ddp."""
    monkeypatch.chdir(ROOT)
    lifted = lift(stored_pipeline())
    assert not lifted.unliftable, lifted.unliftable
    send = _line("pipeline_dp.py", "dist.send(h.detach()")
    reduce = _line("pipeline_dp.py", "dist.all_reduce(p.grad")
    loss = _line("pipeline_dp.py", "loss = F.cross_entropy(")
    expected_plan = (
        "plan traced {\n"
        f"  dp: ddp  # examples/traced/pipeline_dp.py:{reduce}\n"
        f"  pp: one_f_one_b  # examples/traced/pipeline_dp.py:{send}\n"
        f"  override loss: per_device_mean  # examples/traced/pipeline_dp.py:{loss}\n"
        "  override tokens: equal  # observed: every rank held the same number of tokens, no padding; "
        f"examples/traced/pipeline_dp.py:{loss}\n"
        "}\n")
    assert lifted.text.endswith(expected_plan), lifted.text
    assert "from std.data import ddp\nfrom std.pipeline import one_f_one_b\n" in lifted.text
    assert f"  params = {_tiny_params()}\n  microbatches = 2  #" in lifted.text
    assert "  dp = 2  # data\n  pp = 2  # pipeline\n" in lifted.text
    assert "    optimizer = 8  # AdamW" in lifted.text  # two fp32 moments per element
    # the stages' parameters: stage 0 the embedding and a block, stage 1 a block, the final norm and the head
    names = [n for members in lifted.groups.values() for n in members]
    assert len(names) == 36 and sum(n.startswith("stage0.") for n in names) == 1 + 16
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    assert status == 0 and "PROVED" in out
    status, out, err = run(["cost", str(spec), "--format", "json"])
    assert status == 0, err
    comm = json.loads(out)["plans"][0]["communication"]
    assert "pp" in json.dumps(comm) and "dp" in json.dumps(comm)


def _p2p(part: dict, step: int) -> list[dict]:
    return [c for c in part["collectives"] if c["step"] == step and c["kind"] in ("send", "recv")]


def test_pipeline_schedule_is_read_from_the_order_of_calls():
    """The last stage's gradient sends moved after every activation receive: every stage moves all the activations
    first, GPipe; with one microbatch (the second send of stage 0 and its matching calls removed) the two
    schedules coincide and the assumption is stated."""
    trace = stored_pipeline()
    step = trace["ranks"][0]["steps"][-1]["step"]
    for part in trace["ranks"][1::2]:
        calls = _p2p(part, step)
        part["collectives"] = [c for c in part["collectives"] if c not in calls] + \
            [c for c in calls if c["kind"] == "recv"] + [c for c in calls if c["kind"] == "send"]
    gpipe = lift(copy.deepcopy(trace))
    assert not gpipe.unliftable and "  pp: gpipe  #" in gpipe.text and "from std.pipeline import gpipe" in gpipe.text
    assert any("before any gradient: lifted as gpipe" in n for n in gpipe.notes)
    for part in trace["ranks"]:
        calls = _p2p(part, step)
        keep = {id(calls[0]), id(next(c for c in calls if c["kind"] != calls[0]["kind"]))}
        part["collectives"] = [c for c in part["collectives"] if c not in calls or id(c) in keep]
    one = lift(trace)
    assert "  pp: gpipe  #" in one.text and "  microbatches = 1  #" in one.text
    assert any("one microbatch, for which GPipe and 1F1B run the same order" in n for n in one.notes), one.notes


def test_send_outside_the_pipeline_axis_is_reported(tmp_path, monkeypatch):
    """A send from rank 0 to rank 3 (another replica's other stage) lies along no single axis: reported at its line
    with its rank and call number, never dropped; the rest is still lifted."""
    monkeypatch.chdir(ROOT)
    trace = stored_pipeline()
    step = trace["ranks"][0]["steps"][-1]["step"]
    odd = next(c for c in _p2p(trace["ranks"][0], step) if c["kind"] == "send")
    odd["ranks"] = [0, 3]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, out, err = run(["lift", str(path)])
    assert status == 1 and "pp: one_f_one_b" in out
    line = _line("pipeline_dp.py", "dist.send(h.detach()")
    assert re.search(rf"examples/traced/pipeline_dp\.py:{line}:1: error: not lifted: send \(c10d\.send\) "
                     rf"\(call {odd['seq']}, rank 0\): a send between ranks \[0, 3\], which are not neighbouring "
                     r"stages along the pipeline axis pp", err), err


def test_last_stage_sending_back_in_forward_is_not_lifted_as_a_pipeline():
    """A send from the last stage towards the first while it still runs forward carries activations of a later model
    chunk (an interleaved schedule): every send and recv is reported, none dropped, and no pipeline axis is lifted."""
    trace = stored_pipeline()
    step = trace["ranks"][0]["steps"][-1]["step"]
    for part in trace["ranks"][1::2]:
        next(c for c in _p2p(part, step) if c["kind"] == "send")["phase"] = "forward"
    lifted = lift(trace)
    reported = [u for u in lifted.unliftable if u.what.startswith(("send", "recv"))]
    assert {u.what.split()[0] for u in reported} == {"send", "recv"}
    assert all("interleaved, virtual-stage schedules are not lifted" in u.reason for u in reported)
    # every point-to-point call of every rank is covered by a report
    calls = {(r["rank"], c["seq"]) for r in trace["ranks"] for c in r["collectives"] if c["kind"] in ("send", "recv")}
    covered = {(r, seq) for u in reported for r in u.ranks for seq in u.calls
               if any(c["seq"] == seq and c["kind"] in ("send", "recv") for c in trace["ranks"][r]["collectives"])}
    assert calls <= covered
    assert "pp: " not in lifted.text


def test_sends_outside_the_lifted_step_are_reported():
    """Sends and recvs in an earlier step only: the step lifted has no pipeline, and the earlier calls are reported."""
    trace = stored_pipeline()
    step = trace["ranks"][0]["steps"][-1]["step"]
    for part in trace["ranks"]:
        part["collectives"] = [c for c in part["collectives"] if c not in _p2p(part, step)]
    lifted = lift(trace)
    reported = [u for u in lifted.unliftable if u.what.startswith(("send", "recv"))]
    assert reported and all("has no send or recv, so no pipeline axis is recognised" in u.reason for u in reported)
    assert "pp: " not in lifted.text


def test_gradient_reduced_across_stages_is_reported():
    """A gradient all-reduced over the stages (a tied embedding's copies): not lifted as a pipeline reduction."""
    trace = stored_pipeline()
    for rank in (0, 2):  # stage 0 of both replicas, each with the last stage of its own
        part = trace["ranks"][rank]
        step = part["steps"][-1]
        seq = max(c["seq"] for c in part["collectives"]) + 1
        part["collectives"].append(dict(next(c for c in part["collectives"] if c["step"] == step["step"]
                                             and c["kind"] == "all_reduce"), seq=seq, ranks=[rank, rank + 1]))
        embed = step["optimizer"]["params"][0]
        embed["grad"]["collectives"].append(seq)
    lifted = lift(trace)
    assert [u.what for u in lifted.unliftable] == [f"the gradient of {embed['name']} on stage 0"]
    assert "reduced across the pipeline stages over pp" in lifted.unliftable[0].reason


def _tied(times: int, stages=(0, 1)) -> dict:
    """The stored pipeline trace with the last stage's head made equal to the first stage's embedding before the
    first update (a tied embedding, [vocab, hidden] on both), each copy's gradient all-reduced ``times`` times over
    the pair of stages of its replica (pp is the inner axis: ranks 2i and 2i + 1)."""
    trace = stored_pipeline()
    first = trace["ranks"][0]["steps"][0]["optimizer"]["params"]
    embed = next(p for p in first if p["shape"] == [64, 32])  # nn.Embedding(64, 32): vocab x hidden
    for part in trace["ranks"]:
        rank = part["rank"]
        stage = rank % 2
        for step in part["steps"]:
            mine = next(p for p in step["optimizer"]["params"] if p["shape"] == [64, 32])  # Linear(32, 64) on stage 1
            if stage == 1 and step is part["steps"][0]:
                mine["checksum"] = embed["checksum"]
            if stage not in stages:
                continue
            for _ in range(times):
                seq = max(c["seq"] for c in part["collectives"]) + 1
                model = next(c for c in part["collectives"] if c["step"] == step["step"] and c["kind"] == "all_reduce")
                part["collectives"].append(dict(model, seq=seq, ranks=[rank - stage, rank - stage + 1]))
                mine["grad"]["collectives"].append(seq)
    return trace


@pytest.mark.parametrize("times,line,verdict", [
    (0, "  override embedding: tie_reduce over ()", "REFUTED"),  # each stage updates its copy with its own part
    (1, None, "PROVED"),  # Megatron's embedding group
    (2, "  override embedding: tie_reduce over (pp, pp)", "REFUTED"),
])
def test_weights_tied_across_stages_are_lifted(times, line, verdict, tmp_path):
    """A weight tied across the first and last stage is the model's tied embedding (`tied_embeddings = true`); its
    copies' gradients summed once over the stages are what the derivation does, never or twice the override the
    checker refutes (GI grads[embedding] over pp), at the optimizer step or at the extra reduction."""
    lifted = lift(_tied(times))
    assert not lifted.unliftable, lifted.unliftable
    assert "  tied_embeddings = true  # observed: " in lifted.text
    overrides = [x for x in lifted.text.splitlines() if x.startswith("  override embedding")]
    assert [x.split("  #")[0] for x in overrides] == ([line] if line else [])
    if times == 0:
        assert overrides[0].endswith(f"examples/traced/pipeline_dp.py:{_line('pipeline_dp.py', 'opt.step()')}")
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    assert out.rstrip().endswith(verdict) and status == (0 if verdict == "PROVED" else 1), out
    if verdict == "REFUTED":
        assert "root cause: GI grads[embedding] over pp" in out


def test_a_tie_whose_copies_are_reduced_differently_is_named():
    """Only the last stage's copy all-reduced over the stages (the first stage's never): no plan states it."""
    tied = [u for u in lift(_tied(1, stages=(1,))).unliftable if "tied across the stages" in u.reason]
    assert len(tied) == 1 and "reduced across the stages 0 and 1 times" in tied[0].reason, tied


def test_zero_matrices_equal_on_two_stages_are_no_tie():
    """Two matrices of zeros (zero-initialised adapters) are equal without being one weight: no tie is lifted."""
    import hashlib

    trace = _tied(0)
    for part in trace["ranks"]:
        for step in part["steps"]:
            for p in step["optimizer"]["params"]:
                if p["shape"] == [64, 32] and step is part["steps"][0]:
                    p["checksum"] = hashlib.sha1(bytes(64 * 32 * 4)).hexdigest()[:16]  # the recorder's checksum
    lifted = lift(trace)
    assert "tied_embeddings" not in lifted.text and "tie_reduce" not in lifted.text


def test_a_tie_with_clipping_is_named():
    """A clipped step: whether the norm counts the tied weight once or twice is not read, so the tie is named."""
    trace = _tied(1)
    for part in trace["ranks"]:
        for step in part["steps"]:
            for p in step["optimizer"]["params"]:
                p["grad"]["dynamic_scales"] = ["after_backward"]
    found = [u for u in lift(trace).unliftable if u.what == "a weight tied across the pipeline stages"]
    assert found and "clipped" in found[0].reason


def _every_rank_a_loss(trace: dict) -> dict:
    """The stored pipeline trace as if every rank computed the last stage's loss (each exchanging with its
    neighbour in forward and backward): the pattern of ring attention over a context axis."""
    by_rank = {part["rank"]: part for part in trace["ranks"]}
    for part in trace["ranks"]:
        last = by_rank[part["rank"] | 1]  # the last stage of the same replica (pp is the inner axis)
        for st in part["steps"]:
            twin = next(s for s in last["steps"] if s["step"] == st["step"])
            st["losses"], st["nll"] = copy.deepcopy(twin.get("losses", [])), copy.deepcopy(twin.get("nll", []))
    return trace


def test_exchange_between_ranks_that_all_compute_a_loss_is_a_context_axis():
    """Sends and recvs in forward and backward along an axis whose every rank computes a loss: no pipeline
    (no rank waits for another's activations to compute its loss) but ring attention, lifted as a context axis."""
    lifted = lift(_every_rank_a_loss(stored_pipeline()))
    assert not [u for u in lifted.unliftable if u.what.startswith(("send", "recv"))], lifted.unliftable
    assert re.search(r"^  cp = 2  # context$", lifted.text, re.M), lifted.text
    assert re.search(r"^  cp: context_parallel  #", lifted.text, re.M), lifted.text
    assert "from std.context import context_parallel" in lifted.text
    assert "gpipe" not in lifted.text and "one_f_one_b" not in lifted.text


def test_forward_only_exchange_between_ranks_that_all_compute_a_loss_is_reported():
    """Without the backward exchange the pattern is neither a pipeline nor ring attention: reported."""
    trace = _every_rank_a_loss(stored_pipeline())
    for part in trace["ranks"]:
        part["collectives"] = [c for c in part["collectives"]
                               if not (c["kind"] in ("send", "recv") and c["phase"] not in ("forward", "setup"))]
    lifted = lift(trace)
    reported = [u for u in lifted.unliftable if u.what.startswith(("send", "recv"))]
    assert reported and all("every rank along the axis of the sends computes a loss" in u.reason for u in reported)
    assert "context_parallel" not in lifted.text


@pytest.mark.torch
def test_optimizer_tensor_over_a_module_parameter_is_named_by_it():
    """An optimizer tensor that is not the module's parameter object but lies over its storage (DDP over
    tensor-parallel shards: the optimizer steps the local shards, the modules hold DTensors over them) is named
    by it; a flat buffer over no module's storage stays unnamed."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder import Recorder

    rec = Recorder(0, 1)
    lin = torch.nn.Linear(3, 2)
    rec.modules[id(lin)] = lin
    held = torch.nn.Parameter(lin.weight.detach())  # another object over the same storage
    names = rec._param_names()
    assert id(held) not in names
    assert rec._name_of(held, names, rec._storage_names(), "<unnamed 0>") == "weight"
    flat = torch.nn.Parameter(torch.zeros(8))
    assert rec._name_of(flat, names, rec._storage_names(), "<unnamed 1>") == "<unnamed 1>"
    part = torch.nn.Parameter(lin.weight.detach().view(-1)[:3])  # the same storage, another shape: not the weight
    assert rec._name_of(part, names, rec._storage_names(), "<unnamed 2>") == "<unnamed 2>"


def test_stage_without_optimizer_step_is_reported():
    trace = stored_pipeline()
    for part in trace["ranks"][1::2]:
        part["steps"][-1].pop("optimizer")
    lifted = lift(trace)
    assert any(u.what == "stage 1 of pp" and "never stepped an optimizer" in u.reason for u in lifted.unliftable)


# --------------------------------------------------------------------------- slow: the examples


EXAMPLES = [
    # script, processes, exit status, (text of the script line of the finding, obligation) or None
    ("ddp.py", 2, 0, None),
    ("manual.py", 2, 0, None),
    ("fsdp.py", 2, 0, None),
    ("tp_sp.py", 2, 0, None),
    ("tokens.py", 4, 0, None),
    ("ddp_summed.py", 2, 1, ("work = dist.all_reduce(bucket.buffer()", "GI grads[dense] normalisation")),
    ("ddp_twice.py", 2, 1, ("loss.backward()", "GI grads[dense] over dp")),
    ("fsdp_clip_local.py", 2, 1, ("g.mul_(coef)", "SC clip_norm")),
    ("tp_sp_norms.py", 2, 1, ("opt.step()", "GI grads[norm] over tp")),
    ("tokens_axis.py", 4, 1, ("dist.all_reduce(tokens", "GI grads[dense] normalisation")),
    ("accum.py", 2, 0, None),
    ("accum_summed.py", 2, 1, ("loss = F.cross_entropy(", "GI grads[dense] normalisation")),
    ("pipeline.py", 2, 0, None),
    ("pipeline_dp.py", 4, 0, None),
    ("pipeline_clip_local.py", 2, 1, ("torch.nn.utils.clip_grad_norm_(", "SC clip_norm")),
    ("accum_every_sync.py", 2, 0, None),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,nproc,status,finding", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_traced_example(script, nproc, status, finding, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", str(nproc), "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}"])
    assert got == status, out + err
    assert "[PL614]" not in err
    if finding is None:
        assert "proved for all mesh sizes" in out
    else:
        text, root = finding
        line = _line(script, text)
        assert f"examples/traced/{script}:{line}: refuted {root}:" in out, out
    check_golden(GOLDEN / script.replace(".py", ".place"), spec.read_text())


@pytest.mark.slow
@pytest.mark.torch
def test_pipeline_is_lifted_from_its_sends(monkeypatch):
    """pipeline.py by hand: stage 0 (rank 0) sends two microbatches forward at the dist.send line and receives both
    gradients before the last stage sends any (GPipe); the squared norm is all-reduced over the two stages."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    status, out, err = run(["trace", "--nproc", "2", "--check", "--", "python", "examples/traced/pipeline.py"])
    assert status == 0 and "[PL614]" not in err, out + err
    send = _line("pipeline.py", "dist.send(h.detach(), dst=1)")
    assert f"  pp: gpipe  # examples/traced/pipeline.py:{send}" in out
    assert "override clip_norm" not in out and "proved for all mesh sizes" in out


@pytest.mark.slow
@pytest.mark.torch
def test_accumulation_synchronised_every_micro_step_is_proved(monkeypatch):
    """DDP without no_sync: an averaging all-reduce after every backward, lifted as reduce_every_microbatch at
    the backward line, proved, and costed with one all-reduce per microbatch."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    status, out, err = run(["trace", "--nproc", "2", "--check", "--", "python", "examples/traced/accum_every_sync.py"])
    assert status == 0 and "[PL614]" not in err, out + err
    line = _line("accum_every_sync.py", "loss.backward()")
    assert "  override grads: reduce_every_microbatch  # observed: the gradients all-reduced after each of the 2 " \
        f"backward passes; examples/traced/accum_every_sync.py:{line}" in out, out
    assert "proved for all mesh sizes" in out


@pytest.mark.slow
@pytest.mark.torch
def test_trace_file_then_lift(tmp_path, monkeypatch):
    """`trace -o` writes the trace; `lift` reads it; what it lifts is what `trace --check` checks."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    path = tmp_path / "manual.json"
    status, _, err = run(["trace", "--nproc", "2", "-o", str(path), "--", "python", "examples/traced/manual.py"])
    assert status == 0, err
    trace = load_trace(str(path))
    assert trace["world"] == 2 and [r["rank"] for r in trace["ranks"]] == [0, 1]
    # hand-written: each gradient all-reduced once over the world, then divided by it (dist.all_reduce's op: sum)
    params = trace["ranks"][0]["steps"][-1]["optimizer"]["params"]
    line = _line("manual.py", "p.grad /= world")
    for p in params:
        assert len(p["grad"]["collectives"]) == 1
        assert p["grad"]["scales"] == [{"factor": "1/2", "at": {"file": "examples/traced/manual.py", "line": line,
                                                                "code": "p.grad /= world"}, "micro": 0}]
    status, out, err = run(["lift", str(path)])
    assert status == 0 and "  dp: ddp" in out and "override grads" not in out


@pytest.mark.slow
@pytest.mark.torch
def test_failing_script_is_pl613_at_its_line(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    script = tmp_path / "bad.py"
    script.write_text("import os\n\nif os.environ['RANK'] == '1':\n    raise ValueError('rank one fails')\n")
    monkeypatch.chdir(tmp_path)
    status, _, err = run(["trace", "--nproc", "2", "--", "python", "bad.py"])
    assert status == 2 and "[PL613]" in err
    assert re.search(r"bad\.py:4:1: error: rank 1 of the traced script failed: ValueError: rank one fails", err), err


RANK_DEPENDENT = """\
import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = tiny.build()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = tiny.batch(rank, 0)
F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
    if rank == 0:
        p.grad /= world
opt.step()
"""


@pytest.mark.slow
@pytest.mark.torch
def test_ranks_that_disagree_on_a_divisor_are_divide_rank0_only(tmp_path, monkeypatch):
    """Rank 0 alone divides by the world size: lifted as `divide_rank0_only over (dp) by 2` at the division (the
    plan's programs read as rank 1 runs them) and refuted there, never proved."""
    pytest.importorskip("torch")
    (tmp_path / "tiny.py").write_text((ROOT / "examples" / "traced" / "tiny.py").read_text())
    (tmp_path / "ranks.py").write_text(RANK_DEPENDENT)
    monkeypatch.chdir(tmp_path)
    status, out, err = run(["trace", "--nproc", "2", "--check", "--", "python", "ranks.py"])
    assert status == 1 and "[PL614]" not in err, out + err
    assert "  override grads: divide_rank0_only over (dp) by 2" in out, out
    assert re.search(r"ranks\.py:15: refuted SC update\[dense\]: ", out), out


# --------------------------------------------------------------------------- slow: the property

TP_SPEC = """\
from std.data import zero3
from std.tensor import megatron_tp, megatron_sp
model {
  transformer {
    hidden = 4096
    layers = 32
    heads = 32
    ffn = 16384
    vocab = 50304
  }
  seq = 2048
  microbatch = 4
}
mesh { dp = 4  tp = 8 }
plan fsdp_sp { dp: zero3  tp: megatron_sp }
"""
TP_ONLY = TP_SPEC.replace("mesh { dp = 4  tp = 8 }", "mesh { tp = 8 }").replace(
    "plan fsdp_sp { dp: zero3  tp: megatron_sp }", "plan tp { tp: megatron_tp }")
DDP_DIVIDED = (ROOT / "examples/library/ddp.place").read_text().replace(
    "plan ddp {\n  dp: ddp\n}", "plan ddp_divided {\n  dp: ddp\n  override grads: divide by dp\n}")

ZERO1_NO_REGATHER = (ROOT / "examples/library/zero1.place").read_text().replace(
    "plan zero1 {\n  dp: zero1\n}", "plan zero1_stale {\n  dp: zero1\n  override params: no_regather\n}")

GPIPE = (ROOT / "examples/library/gpipe.place").read_text()
assert "mesh {\n  dp = 2\n  pp = 4\n}" in GPIPE and "  dp: ddp\n  pp: gpipe\n" in GPIPE
# two stages (and two replicas) so that a trace runs on 2 (4) processes
GPIPE_PP = GPIPE.replace("mesh {\n  dp = 2\n  pp = 4\n}", "mesh {\n  pp = 2\n}").replace("  dp: ddp\n", "")
GPIPE_DP_PP = GPIPE.replace("mesh {\n  dp = 2\n  pp = 4\n}", "mesh {\n  dp = 2\n  pp = 2\n}")
ONE_F_ONE_B_CLIPPED = GPIPE_DP_PP.replace("import gpipe", "import one_f_one_b").replace(
    "plan gpipe {\n  dp: ddp\n  pp: gpipe\n}",
    "plan one_f_one_b {\n  dp: ddp\n  pp: one_f_one_b\n  override clip_norm: reduce over (pp)\n}")

REALISED = [
    # (spec text, plan, its bindings as the lifted spec should read them)
    ((ROOT / "examples/library/ddp.place").read_text(), "ddp", "dp: ddp"),
    ((ROOT / "examples/library/zero3.place").read_text(), "zero3", "dp: zero3"),
    (DDP_DIVIDED, "ddp_divided", "dp: ddp\n  override grads: divide by dp"),
    ((ROOT / "examples/library/zero1.place").read_text(), "zero1", "dp: zero1"),
    (ZERO1_NO_REGATHER, "zero1_stale", "dp: zero1\n  override params: no_regather"),
    ((ROOT / "examples/library/hybrid_shard.place").read_text(), "hybrid_shard", "[node, gpu]: hybrid_shard"),
    (TP_ONLY, "tp", "tp: megatron_tp"),
    (TP_SPEC, "fsdp_sp", "dp: zero3\n  tp: megatron_sp"),
    # torch.distributed.pipelining schedules (tests/trace/run_pipeline_realisation.py)
    (GPIPE_PP, "gpipe", "pp: gpipe"),
    (GPIPE_DP_PP, "gpipe", "dp: ddp\n  pp: gpipe"),
    (ONE_F_ONE_B_CLIPPED, "one_f_one_b", "dp: ddp\n  pp: one_f_one_b\n  override clip_norm: reduce over (pp)"),
]


def _realised_trace(text: str, plan_name: str, tmp_path: Path) -> dict:
    from placement_logic.frontend.loader import load_string
    from placement_logic.measure.job import Job
    from placement_logic.measure.realise import Realisation, realise
    from placement_logic.measure.session import mesh_sizes, run_bindings
    from placement_logic.measure.shape import scale_down
    from placement_logic.trace.launch import run_traced

    spec = load_string(text, "realised.place")
    plan = spec.plan(plan_name)
    sizes = mesh_sizes(plan, None)
    bindings = run_bindings(spec, sizes)
    r = realise(plan, sizes, bindings)
    assert isinstance(r, Realisation), r
    shape = scale_down(plan, bindings, sizes, r.tensor_axis, r.stages, r.chunks)
    job = tmp_path / "job.pkl"
    job.write_bytes(pickle.dumps(Job("job0", r, shape, 2)))
    script = "run_pipeline_realisation.py" if r.pipeline_axis else "run_realisation.py"
    return run_traced(["python", f"tests/trace/{script}", str(job)], r.world)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("text,plan,bindings", REALISED,
                         ids=[r[1] + ("_dp" if "dp: " in r[2] and "pp: " in r[2] else "") for r in REALISED])
def test_lifting_a_realised_plan_gives_it_back(text, plan, bindings, tmp_path, monkeypatch):
    """Same model, same mesh: the lifted plan costs what the original costs and gets its verdicts."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    trace = _realised_trace(text, plan, tmp_path)
    lifted = lift(trace)
    if plan.startswith("zero1"):
        # measure's ZeRO-1 ranks step one flat buffer that no module holds: reported, not guessed
        assert [u.what for u in lifted.unliftable] == ["1 of 1 optimizer parameters"], lifted.unliftable
        assert "not held by any module" in lifted.unliftable[0].reason
        return
    assert not lifted.unliftable, lifted.unliftable
    body = [line for line in lifted.text.splitlines() if not line.startswith("from std.")]
    both = tmp_path / "both.place"
    both.write_text("from std.data import ddp, zero1, zero3, hybrid_shard\nfrom std.tensor import megatron_tp, megatron_sp\n"
                    "from std.pipeline import gpipe, one_f_one_b\n"
                    + "\n".join(body) + f"\nplan original {{\n  {bindings}\n}}\n")
    status, out, err = run(["cost", str(both), "--format", "json"])
    assert status == 0, err
    plans = {p["plan"]: p for p in json.loads(out)["plans"]}
    for part in ("memory", "communication"):
        assert plans["traced"][part] == plans["original"][part], part
    status, out, err = run(["check", str(both), "--format", "json", "--timeout", "60"])
    report = json.loads(out)

    def verdicts(name):
        p = next(p for p in report["plans"] if p["plan"] == name)
        return {o["name"]: o["verdict"] for o in p["obligations"]}

    assert verdicts("traced") == verdicts("original")
    expected = copy.deepcopy(verdicts("original"))
    assert ("refuted" in expected.values()) == (plan in ("ddp_divided", "zero1_stale"))


def test_stored_trace_is_current_schema():
    assert load_trace(str(STORED))["version"] == VERSION
    assert load_trace(str(STORED_PIPELINE))["version"] == VERSION


@pytest.mark.slow
@pytest.mark.torch
def test_interleaved_realisation_is_reported_not_lifted(tmp_path, monkeypatch):
    """ScheduleInterleaved1F1B (2 model chunks per rank): the last rank sends its first chunk's activations back
    to rank 0 while still running forward. Not a chain of stages: every send and recv is reported, none lifted."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    text = GPIPE_PP.replace("import gpipe", "import interleaved_1f1b").replace("pp: gpipe", "pp: interleaved_1f1b(v = 2)")
    lifted = lift(_realised_trace(text, "gpipe", tmp_path))
    reported = [u for u in lifted.unliftable if u.what.startswith(("send", "recv"))]
    assert {u.what.split()[0] for u in reported} == {"send", "recv"}, lifted.unliftable
    assert all("interleaved, virtual-stage schedules are not lifted" in u.reason for u in reported)
    assert "interleaved" not in lifted.text and "one_f_one_b" not in lifted.text



# --------------------------------------------------------------------------- the property over the library

LIBRARY = ROOT / "examples" / "library"


def _library_realisations() -> dict[str, tuple[Path, int]]:
    """Every plan of examples/library/*.place that ``placement measure`` realises: plan -> (file, processes)."""
    from placement_logic.frontend.loader import load_string
    from placement_logic.measure.realise import Realisation, realise
    from placement_logic.measure.session import mesh_sizes, run_bindings

    out = {}
    for path in sorted(LIBRARY.glob("*.place")):
        spec = load_string(path.read_text(), str(path))
        for plan in spec.plans:
            sizes = mesh_sizes(plan, None)
            r = realise(plan, sizes, run_bindings(spec, sizes))
            if isinstance(r, Realisation):
                out[plan.name] = (path, r.world)
    return out


# the lift of these realisations reports what it cannot lift (and lifts no plan that silently differs):
# plan -> [(the start of each reported item, a phrase of its reason)], and why
LIBRARY_REPORTED = {
    "zero1": ([("1 of 1 optimizer parameters", "not held by any module")],
              "measure's ZeRO-1 ranks step one flat buffer that no module holds"),
    "zero2": ([("1 of 1 optimizer parameters", "not held by any module")],
              "the same flat buffer as ZeRO-1 (its gradient averaged on every accumulated backward pass, which is "
              "one reduction of the summed gradient)"),
    "interleaved_1f1b": ([("send", "interleaved, virtual-stage schedules are not lifted"),
                          ("recv", "interleaved, virtual-stage schedules are not lifted"),
                          ("the optimizer over", "step different parameters"),
                   ("the loss normalisation", "no cross-entropy")],
                         "two model chunks per rank: the last stage sends back to the first in forward (the stages, "
                         "not lifted as a pipeline, step different parameters along the axis)"),
    "zeropp_dp": ([("send", "interleaved, virtual-stage schedules are not lifted"),
                   ("recv", "interleaved, virtual-stage schedules are not lifted"),
                   ("the optimizer over", "step different parameters"),
                   ("the loss normalisation", "no cross-entropy")],
                  "two model chunks per rank (v = 2), breadth first: the last stage sends back to the first in "
                  "forward, as interleaved_1f1b"),
    "zeropp_zero1": ([("send", "interleaved, virtual-stage schedules are not lifted"),
                      ("recv", "interleaved, virtual-stage schedules are not lifted"),
                      ("the loss normalisation", "no cross-entropy"),
                      ("1 of 1 optimizer parameters", "not held by any module"),
                      ("the loss over a gathered sequence", "is not observed")],
                     "as zeropp_dp, and the ZeRO-1 flat buffer over the second data axis that no module holds; the "
                     "loss, on the last stage, is not seen on rank 0 when the pipeline is not lifted (so neither is "
                     "whether it reads the second data axis's all-gather)"),
    "expert_parallel": ([("all_to_all", "all_to_all is not lifted")],
                        "tokens dispatched to the experts by all_to_all: no expert axis is lifted"),
}
LIBRARY_ROUND_TRIP = {"ddp", "zero3", "fsdp_full_shard", "fsdp_shard_grad_op", "hybrid_shard", "gpipe", "one_f_one_b",
                      "context_parallel", "megatron_tp", "megatron_sp", "full_recompute", "selective_recompute"}
# plans whose realisation is another library strategy's: the lift names that one, whose costs differ from the
# plan's only in the wording of what is gathered: plan -> (the lifted binding, (the plan's words, the lift's), why)
LIBRARY_LIFTED_AS = {
    "fsdp_full_shard": ("dp: zero3", ("one block at a time", "one layer at a time"),
                        "measure realises zero3 and fsdp_full_shard alike, as fully_shard(reshard_after_forward=True): "
                        "the trace cannot tell them apart; both are data(S*, S, S, R), zero3 gathering by layer, "
                        "fsdp_full_shard by block, which a model of parameter counts prices alike"),
}


def test_every_realised_library_plan_is_classified():
    """A library plan that becomes realisable fails here until it is either round-tripped or its report expected."""
    realised = set(_library_realisations())
    assert not LIBRARY_ROUND_TRIP & set(LIBRARY_REPORTED)
    assert realised == LIBRARY_ROUND_TRIP | set(LIBRARY_REPORTED), (
        sorted(realised - LIBRARY_ROUND_TRIP - set(LIBRARY_REPORTED)),
        sorted(LIBRARY_ROUND_TRIP | set(LIBRARY_REPORTED) - realised))


def _merged_imports(*texts: str) -> list[str]:
    """The ``from std.M import ...`` lines of every text, one line per module."""
    names: dict[str, set[str]] = {}
    for text in texts:
        for m in re.finditer(r"^from (std\.\w+) import (.+)$", text, re.M):
            names.setdefault(m.group(1), set()).update(n.strip() for n in m.group(2).split(","))
    return [f"from {mod} import {', '.join(sorted(ns))}" for mod, ns in sorted(names.items())]


def _same_costs_and_verdicts(lifted_text: str, original_text: str, plan: str, tmp_path: Path,
                             wording: tuple[str, str] | None = None) -> dict:
    """The lifted plan next to the original's bindings on the lifted model and mesh: costs and verdicts equal
    (``wording``: the original's phrase for what is gathered, read as the lift's)."""
    body = re.search(rf"^plan {plan} \{{\n(.*?)^\}}", original_text, re.M | re.S).group(1)
    both = tmp_path / "both.place"
    both.write_text("\n".join(_merged_imports(lifted_text, original_text)) + "\n"
                    + "\n".join(x for x in lifted_text.splitlines() if not x.startswith("from std."))
                    + f"\nplan original {{\n{body}}}\n")
    status, out, err = run(["cost", str(both), "--format", "json"])
    assert status == 0, err
    if wording is not None:
        assert wording[0] in out
        out = out.replace(wording[0], wording[1])
    plans = {p["plan"]: p for p in json.loads(out)["plans"]}
    for part in ("memory", "communication"):
        assert plans["traced"][part] == plans["original"][part], part
    status, out, err = run(["check", str(both), "--format", "json", "--timeout", "60"])
    report = json.loads(out)

    def verdicts(name):
        p = next(p for p in report["plans"] if p["plan"] == name)
        return {o["name"]: o["verdict"] for o in p["obligations"]}

    assert verdicts("traced") == verdicts("original")
    return verdicts("original")


LIBRARY_PLANS = sorted(LIBRARY_ROUND_TRIP | set(LIBRARY_REPORTED))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("plan", LIBRARY_PLANS)
def test_every_realised_library_plan_round_trips_or_is_reported(plan, tmp_path, monkeypatch):
    """Each library plan ``placement measure`` realises, traced as realised and lifted: the lift costs what the
    plan costs and gets its verdicts, or it reports exactly the calls named in LIBRARY_REPORTED."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    path, _world = _library_realisations()[plan]
    text = path.read_text()
    lifted = lift(_realised_trace(text, plan, tmp_path))
    if plan in LIBRARY_REPORTED:
        expected, _why = LIBRARY_REPORTED[plan]
        got = sorted({(u.what.split()[0], u.reason) for u in lifted.unliftable})
        assert lifted.unliftable, f"{plan}: expected reports, the lift reported nothing"
        for u in lifted.unliftable:
            assert any(u.what.startswith(w) and phrase in u.reason for w, phrase in expected), (plan, u.what, u.reason)
        for w, phrase in expected:
            assert any(u.what.startswith(w) and phrase in u.reason for u in lifted.unliftable), (plan, w, phrase, got)
        return
    assert not lifted.unliftable, lifted.unliftable
    wording = None
    if plan in LIBRARY_LIFTED_AS:
        binding, wording, _why = LIBRARY_LIFTED_AS[plan]
        assert re.search(rf"^  {re.escape(binding)}  #", lifted.text, re.M), lifted.text
    verdicts = _same_costs_and_verdicts(lifted.text, text, plan, tmp_path, wording)
    assert "refuted" not in verdicts.values(), verdicts


def test_check_of_a_script_with_no_training_step_stops_at_what_is_missing():
    import io

    from placement_logic.commands.trace import check_trace

    trace = stored()
    for part in trace["ranks"]:
        part["steps"] = []
    out, err = io.StringIO(), io.StringIO()
    status = check_trace(trace, out, err, timeout=10)
    # the PL614 line names what is missing; no cascade about a plan that was never lifted
    assert status == 2 and "no optimizer step was recorded" in err.getvalue(), err.getvalue()
    assert "nothing to check" in err.getvalue() and "PL302" not in err.getvalue() and out.getvalue() == ""
