"""Checkpoint save, load and the RNG state restored, traced and lifted as ``override checkpoint`` statements
(``placement_logic/trace/lift_checkpoint.py``), so the checker decides them.

The fast tests give the stored DDP trace hand-written ``checkpoints`` records (each an independent statement of
what a script did: who saved which state to which file, who loaded it, whose RNG state was set) and state the
expected statement by hand; the strategy-dependent cases call the pass with the binding stated. The slow ones run
real scripts under tests/trace/ (modelled on public issues, each cited in its docstring) on gloo: the buggy
version refuted for its root cause at its script line, the fixed one proved.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift, read_step
from placement_logic.trace.lift_checkpoint import checkpoint_pass
from placement_logic.trace.lift_step import Axes, LiftRole

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
PIPELINE = ROOT / "tests" / "data" / "traces" / "pipeline_dp.json"
F = "/tmp/ckpt.pt"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def frame(line: int) -> dict:
    return {"file": "examples/traced/ddp_summed.py", "line": line, "function": "<module>", "code": "x"}


def rec(op: str, line: int, states=(), file: str = F, api: str | None = None, rng=(), held: int | None = 10) -> dict:
    """A record; a save holds 10 elements of each state, beside ``held`` (what the rank holds of each: 10, its
    own shard or replica; 5, so the save gathered more than it holds; None, not recorded)."""
    api = api or {"save": "torch.save", "load": "torch.load", "set_rng_state": "torch.set_rng_state",
                  "restore": "Module.load_state_dict"}[op]
    out = {"op": op, "api": api, "file": file, "states": list(states), "sharded": [], "rng": list(rng),
           "step": 1, "stack": [frame(line)]}
    if op == "save" and held is not None:
        out["elements"] = {s: 10 for s in states}
        out["held"] = {"params": held, "optimizer": held}
    return out


def traced(per_rank: dict[int, list[dict]], path: Path = STORED) -> dict:
    trace = json.loads(path.read_text())
    for part in trace["ranks"]:
        part["checkpoints"] = copy.deepcopy(per_rank.get(part["rank"], []))
    return trace


def resume_on_every_rank(file: str = F) -> list[dict]:
    """Load the file, put the model and the optimizer back."""
    return [rec("load", 40, ("params", "optimizer"), file), rec("restore", 41, ("params",)),
            rec("restore", 42, ("optimizer",), api="Optimizer.load_state_dict")]


def checkpoint_lines(text: str) -> list[str]:
    return [x.split("  #")[0].strip() for x in text.splitlines() if "override checkpoint" in x]


# --------------------------------------------------------------------------- fast: the stored DDP trace

def test_rank0_saving_replicas_is_the_derived_checkpoint():
    """DDP: parameters and optimizer state are replicas over dp, so rank 0 alone writing them is the derivation
    (their replica id 0), and every rank reading rank 0's file reads its own copy."""
    lifted = lift(traced({0: [rec("save", 30, ("params", "optimizer")), *resume_on_every_rank()],
                          1: resume_on_every_rank()}))
    assert checkpoint_lines(lifted.text) == ["override checkpoint: resume"]
    assert lifted.unliftable == []


def test_every_replica_written_is_save_from(tmp_path):
    """Every dp rank writes the replicated states: each element written twice (save_from), refuted."""
    both = [rec("save", 30, ("params", "optimizer"), file=f"/tmp/ckpt{r}.pt") for r in (0, 1)]
    lifted = lift(traced({0: [both[0], *resume_on_every_rank("/tmp/ckpt0.pt")],
                          1: [both[1], *resume_on_every_rank("/tmp/ckpt1.pt")]}))
    assert checkpoint_lines(lifted.text) == ["override checkpoint: resume", "override checkpoint: save_from over (dp)"]
    line = next(x for x in lifted.text.splitlines() if "save_from" in x)
    assert line.endswith("examples/traced/ddp_summed.py:30")
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    assert status == 1 and "refuted SC checkpoint save" in out, out


def test_optimizer_never_saved_or_never_loaded_is_skip_optimizer():
    """AdamW holds state (its moments): a checkpoint of the model alone, or an optimizer state saved and never put
    back, loses it; lifted at the save, respectively the load."""
    never_saved = lift(traced({0: [rec("save", 30, ("params",)), rec("load", 40, ("params",)),
                                   rec("restore", 41, ("params",))],
                               1: [rec("load", 40, ("params",)), rec("restore", 41, ("params",))]}))
    line = next(x for x in never_saved.text.splitlines() if "skip_optimizer" in x)
    assert line.endswith("ddp_summed.py:30")
    never_loaded = lift(traced({0: [rec("save", 30, ("params", "optimizer")), rec("load", 40, ("params", "optimizer")),
                                    rec("restore", 41, ("params",))],
                                1: [rec("load", 40, ("params", "optimizer")), rec("restore", 41, ("params",))]}))
    line = next(x for x in never_loaded.text.splitlines() if "skip_optimizer" in x)
    assert line.endswith("ddp_summed.py:40") and "never loaded back" in line


@pytest.mark.parametrize("per_rank,what,where", [
    # rank 1 alone writes (neither every rank nor rank 0 of dp)
    ({1: [rec("save", 30, ("params", "optimizer"))], 0: resume_on_every_rank(), }, "torch.save", 30),
    # a file no rank wrote in the run (a checkpoint from an earlier run): whose state it is is not observed
    ({0: resume_on_every_rank("/elsewhere.pt"), 1: resume_on_every_rank("/elsewhere.pt")}, "torch.load", 40),
    # a distributed checkpoint of an earlier run
    ({0: [rec("load", 40, ("params", "optimizer"), "/old", api="torch.distributed.checkpoint.load")],
      1: [rec("load", 40, ("params", "optimizer"), "/old", api="torch.distributed.checkpoint.load")]},
     "torch.distributed.checkpoint.load", 40),
    # a file object: no path
    ({0: [rec("save", 30, ("params", "optimizer"), file="")] + resume_on_every_rank(""),
      1: resume_on_every_rank("")}, "torch.load", 40),
    # loaded but the parameters never put back (not ZeRO-1: no plan states it)
    ({0: [rec("save", 30, ("params", "optimizer")), rec("load", 40, ("params", "optimizer")),
          rec("restore", 42, ("optimizer",), api="Optimizer.load_state_dict")],
      1: [rec("load", 40, ("params", "optimizer")), rec("restore", 42, ("optimizer",),
                                                        api="Optimizer.load_state_dict")]}, "torch.load", 40),
    # a checkpoint of no parameters at all
    ({0: [rec("save", 30, ("optimizer",))]}, "torch.save", 30),
    # an RNG state from no file the run wrote
    ({0: [rec("set_rng_state", 50, rng=("abc",))]}, "torch.set_rng_state", 50),
])
def test_what_no_statement_says_is_reported_at_its_line(per_rank, what, where, tmp_path):
    lifted = lift(traced(per_rank))
    assert (what, f"examples/traced/ddp_summed.py:{where}") in [(u.what, u.where) for u in lifted.unliftable]
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    assert f'unobserved "{what}' in lifted.text and "PROVED" not in out


def test_another_ranks_rng_state_where_the_seed_does_not_vary_is_a_note():
    """DDP derives one dropout seed on every dp rank: rank 1 restoring rank 0's RNG state is what the plan says."""
    r0 = [rec("save", 30, ("params", "optimizer")), rec("save", 31, ("rng",), file="/tmp/rng0.pt", rng=("s0",)),
          *resume_on_every_rank(), rec("load", 43, ("rng",), file="/tmp/rng0.pt", rng=("s0",)),
          rec("set_rng_state", 44, rng=("s0",))]
    r1 = [*resume_on_every_rank(), rec("load", 43, ("rng",), file="/tmp/rng0.pt", rng=("s0",)),
          rec("set_rng_state", 44, rng=("s0",))]
    lifted = lift(traced({0: r0, 1: r1}))
    assert checkpoint_lines(lifted.text) == ["override checkpoint: resume"]
    assert any("restores the RNG state rank 0 saved" in n for n in lifted.notes), lifted.notes
    assert lifted.unliftable == []


def test_a_checkpoint_under_a_pipeline_is_reported():
    lifted = lift(traced({r: [rec("save", 30, ("params", "optimizer"), file=f"/tmp/s{r}.pt")] for r in range(4)},
                         PIPELINE))
    assert any(u.what == "torch.save" and "pipeline" in u.reason for u in lifted.unliftable)
    assert "override checkpoint" not in lifted.text


@pytest.mark.parametrize("value", [[{"op": "save", "api": "torch.save", "file": F, "states": "params", "stack": []}],
                                   [{"op": "save", "file": F, "states": [], "stack": []}]])
def test_malformed_checkpoint_records_are_pl612(tmp_path, value):
    trace = traced({})
    trace["ranks"][0]["checkpoints"] = value
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and "checkpoints" in err


# --------------------------------------------------------------------------- fast: the strategy stated

def _pass(per_rank: dict, role: LiftRole, binding: str, whole_on_tp: bool = False, seed_vary=()) -> tuple:
    st = read_step(traced(per_rank), "traced")
    axis = "tp" if role is LiftRole.TENSOR else "dp"
    st.layout.names = [axis]  # the one axis, named as the lift names it
    ax = Axes(None, None, [], [0], roles={axis: role})
    lines = checkpoint_pass(st, ax, {axis: binding}, whole_on_tp, tuple(seed_vary))
    return [t.split("  #")[0].strip() for t, _ in lines], st


@pytest.mark.parametrize("binding,expect", [("zero3", ["override checkpoint: save_rank0 over (dp)"]),
                                            ("zero1", ["override checkpoint: save_rank0 over (dp)"]),
                                            ("ddp", [])])
def test_rank0_alone_saving_a_sharded_state_is_save_rank0(binding, expect):
    """ZeRO-1 shards the optimizer, ZeRO-3/FSDP the parameters too: rank 0 alone writing loses the other shards;
    under DDP (replicas) it is the derivation."""
    lines, st = _pass({0: [rec("save", 30, ("params", "optimizer")), *resume_on_every_rank()],
                       1: resume_on_every_rank()}, LiftRole.DATA, binding)
    assert lines == ["override checkpoint: resume", *expect]
    assert st.items == []


@pytest.mark.parametrize("held,reported", [(5, False), (None, True)])
def test_rank0_saving_a_gathered_copy_is_the_derivation(held, reported):
    """Rank 0 saving more elements than it holds saved a copy gathered from every rank (ZeroRedundancyOptimizer's
    consolidate_state_dict, a full state dict): every shard is written once. Without the counts: reported."""
    lines, st = _pass({0: [rec("save", 30, ("params", "optimizer"), held=held), *resume_on_every_rank()],
                       1: resume_on_every_rank()}, LiftRole.DATA, "zero3")
    assert lines == ["override checkpoint: resume"]  # no save_rank0: the derivation, or reported
    # unknown: the save, and rank 1's load of that file, reported at their lines
    assert [u.where for u in st.items] == (["examples/traced/ddp_summed.py:30", "examples/traced/ddp_summed.py:40"]
                                           if reported else [])
    assert reported or any("gathered from every rank" in n for n in st.notes)


def test_every_rank_reading_rank0s_file_of_shards_is_save_rank0_at_the_load():
    """Per-rank files (each rank its shards), but every rank reads rank 0's: only rank 0's shards survive."""
    saves = {r: rec("save", 30, ("params", "optimizer"), file=f"/tmp/s{r}.pt") for r in (0, 1)}
    lines, _ = _pass({0: [saves[0], *resume_on_every_rank("/tmp/s0.pt")],
                      1: [saves[1], *resume_on_every_rank("/tmp/s0.pt")]}, LiftRole.DATA, "zero3")
    assert lines == ["override checkpoint: resume", "override checkpoint: save_rank0 over (dp)"]
    fixed, _ = _pass({0: [saves[0], *resume_on_every_rank("/tmp/s0.pt")],
                      1: [saves[1], *resume_on_every_rank("/tmp/s1.pt")]}, LiftRole.DATA, "zero3")
    assert fixed == ["override checkpoint: resume"]
    # rank 0's file holds a gathered copy (more than rank 0 holds): every rank reads its part from it
    full = {r: rec("save", 30, ("params", "optimizer"), file=f"/tmp/s{r}.pt", held=5) for r in (0, 1)}
    gathered, _ = _pass({0: [full[0], *resume_on_every_rank("/tmp/s0.pt")],
                         1: [full[1], *resume_on_every_rank("/tmp/s0.pt")]}, LiftRole.DATA, "zero3")
    assert gathered == ["override checkpoint: resume"]


def test_zero1_resume_without_the_params_is_no_regather_after_load():
    saves = {r: rec("save", 30, ("optimizer",), file=f"/tmp/o{r}.pt") for r in (0, 1)}
    model = rec("save", 31, ("params",), file="/tmp/m.pt")

    def back(r):
        return [rec("load", 40, ("optimizer",), file=f"/tmp/o{r}.pt"),
                rec("restore", 42, ("optimizer",), api="Optimizer.load_state_dict")]
    lines, _ = _pass({0: [saves[0], model, *back(0)], 1: [saves[1], *back(1)]}, LiftRole.DATA, "zero1")
    assert lines == ["override checkpoint: resume", "override checkpoint: no_regather_after_load"]


@pytest.mark.parametrize("writers,whole,expect", [((0,), False, ["override checkpoint: save_rank0 over (tp)"]),
                                                  ((0, 1), False, []),
                                                  ((0, 1), True, ["override checkpoint: save_from over (tp)"])])
def test_a_tensor_axis_reads_split_and_whole_groups(writers, whole, expect):
    """On a tensor axis the split weights are shards and the whole groups (norms) replicas: rank 0 alone loses the
    split ones; every rank writes the whole ones twice (only where the plan has whole groups)."""
    per = {r: [rec("save", 30, ("params", "optimizer"), file=f"/tmp/t{r}.pt")] if r in writers else []
           for r in (0, 1)}
    for r in (0, 1):
        per[r] += resume_on_every_rank(f"/tmp/t{r if r in writers else 0}.pt")
    lines, _ = _pass(per, LiftRole.TENSOR, "megatron_sp", whole_on_tp=whole)
    assert lines == ["override checkpoint: resume", *expect]


@pytest.mark.parametrize("source,expect", [(0, ["override checkpoint: rng_shared"]), (None, [])])
def test_another_ranks_rng_state_where_the_seed_varies_is_rng_shared(source, expect):
    """Sequence parallelism: each tensor rank's own RNG stream; rank 1 restoring rank 0's is rng_shared."""
    per = {}
    for r in (0, 1):
        mine = f"/tmp/rng{r}.pt"
        read = f"/tmp/rng{r if source is None else source}.pt"
        per[r] = [rec("save", 30, ("params", "optimizer"), file=f"/tmp/t{r}.pt"),
                  rec("save", 31, ("rng",), file=mine, rng=(f"s{r}",)),
                  *resume_on_every_rank(f"/tmp/t{r}.pt"),
                  rec("load", 43, ("rng",), file=read, rng=(f"s{read[-4]}",)),
                  rec("set_rng_state", 44, rng=(f"s{read[-4]}",))]
    lines, st = _pass(per, LiftRole.TENSOR, "megatron_sp", seed_vary=("tp",))
    assert lines == ["override checkpoint: resume", *expect]
    assert st.items == []


def _drawing(trace: dict) -> dict:
    """Every rank draws a dropout mask in the step's forward (the recorder's ``dropouts``)."""
    for part in trace["ranks"]:
        part["dropouts"] = [{"p": 0.1, "input": "in", "output": f"out{part['rank']}", "step": 1,
                             "stack": [frame(20)]}]
    return trace


def _resume(before: str | None, after: str | None, rng_file: str | None = None, rng=()) -> list[dict]:
    """Load the checkpoint, generator states before the save and after the load; with ``rng_file``, then load an RNG
    state from it and set it."""
    out = resume_on_every_rank()
    for k, v in (("rng_before", before), ("rng_after", after)):
        if v is not None:
            out[0][k] = v
    if rng_file:
        out += [rec("load", 43, ("rng",), file=rng_file, rng=rng), rec("set_rng_state", 44, rng=rng)]
    return out


@pytest.mark.parametrize("after1,drops,expect", [
    # rank 1 resumes from "fresh" (its generator at the seed), not "g1" it held at the save: nothing restored
    ("fresh", True, ["override checkpoint: resume", "override checkpoint: rng_not_restored"]),
    # the same state after the load as before the save: restored (or nothing drew in between)
    ("g1", True, ["override checkpoint: resume"]),
    # no dropout in the step: the generator's state draws no mask the plan models
    ("fresh", False, ["override checkpoint: resume"]),
])
def test_a_resume_from_another_rng_state_is_rng_not_restored(after1, drops, expect, tmp_path):
    """huggingface/accelerate#4283: the RNG load skipped, the generator left at the fresh process's seed."""
    trace = traced({0: [rec("save", 30, ("params", "optimizer"), rng=()), *_resume("g0", "g0")],
                    1: _resume("g1", after1)})
    lifted = lift(_drawing(trace) if drops else trace)
    assert checkpoint_lines(lifted.text) == expect
    assert lifted.unliftable == []
    if "rng_not_restored" in expect[-1]:
        line = next(x for x in lifted.text.splitlines() if "rng_not_restored" in x)
        assert "ranks [1]" in line and line.endswith("examples/traced/ddp_summed.py:40")
        spec = tmp_path / "lifted.place"
        spec.write_text(lifted.text)
        status, out, _ = run(["check", str(spec)])
        assert status == 1 and "refuted SC checkpoint rng" in out, out


@pytest.mark.parametrize("r1,reason", [
    # no generator state before the save (a trace of an earlier recorder): not observed
    (_resume(None, "fresh"), "before the save is not observed"),
    (_resume("g1", None), "after the load is not observed"),
    # rank 1 sets, after the load, a state from its own earlier file that is not the one it held at the save
    ([rec("save", 29, ("rng",), file="/tmp/old1.pt", rng=("old",)),
      *_resume("g1", "old", "/tmp/old1.pt", ("old",))], "sets an RNG state other than"),
])
def test_an_rng_state_not_observed_or_of_no_known_origin_is_reported(r1, reason, tmp_path):
    trace = traced({0: [rec("save", 30, ("params", "optimizer")), *_resume("g0", "g0")], 1: r1})
    lifted = lift(_drawing(trace))
    assert [(u.what, u.where) for u in lifted.unliftable if reason in u.reason] == [
        ("torch.load", "examples/traced/ddp_summed.py:40")], lifted.unliftable
    assert "rng_not_restored" not in lifted.text
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    _, out, _ = run(["check", str(spec)])
    assert "PROVED" not in out


def test_another_ranks_rng_state_with_dropout_stays_rng_shared():
    """Rank 1 sets rank 0's saved state ("s0", not its own "g1"): rng_shared alone, not rng_not_restored."""
    per = {}
    for r in (0, 1):
        per[r] = [rec("save", 30, ("params", "optimizer"), file=f"/tmp/t{r}.pt"),
                  rec("save", 31, ("rng",), file=f"/tmp/rng{r}.pt", rng=(f"s{r}",)),
                  *resume_on_every_rank(f"/tmp/t{r}.pt"),
                  rec("load", 43, ("rng",), file="/tmp/rng0.pt", rng=("s0",)), rec("set_rng_state", 44, rng=("s0",))]
        per[r][2].update(rng_before=f"s{r}", rng_after="s0")
    st = read_step(_drawing(traced(per)), "traced")
    st.layout.names = ["tp"]
    lines = checkpoint_pass(st, Axes(None, None, [], [0], roles={"tp": LiftRole.TENSOR}), {"tp": "megatron_sp"},
                            False, ("tp",))
    assert [t.split("  #")[0].strip() for t, _ in lines] == ["override checkpoint: resume",
                                                             "override checkpoint: rng_shared"]
    assert st.items == []


# --------------------------------------------------------------------------- slow: real scripts

SCRIPTS = [
    # script and arguments, the lifted line, (the refuted obligation, the text of its script line) or None: proved
    ("tests/trace/ckpt_fsdp_rank0.py", "  override checkpoint: save_rank0 over (dp)",
     ("SC checkpoint save", "torch.save(state, where")),
    ("tests/trace/ckpt_fsdp_rank0.py --fixed", "  override checkpoint: resume", None),
    ("tests/trace/ckpt_fsdp_load_rank0.py", "  override checkpoint: save_rank0 over (dp)",
     ("SC checkpoint save", "loaded = torch.load(")),
    ("tests/trace/ckpt_fsdp_load_rank0.py --fixed", "  override checkpoint: resume", None),
    ("tests/trace/ckpt_sp_rng_rank0.py", "  override checkpoint: rng_shared",
     ("SC checkpoint rng", "torch.set_rng_state(")),
    ("tests/trace/ckpt_sp_rng_rank0.py --fixed", "  override checkpoint: resume", None),
    ("tests/trace/ckpt_zero1_local.py", "  override checkpoint: save_rank0 over (dp)",
     ("SC checkpoint save", "torch.save({")),
    ("tests/trace/ckpt_zero1_local.py --fixed", "  override checkpoint: resume", None),
    ("examples/traced/manual_checkpoint.py", "  override checkpoint: resume", None),
    ("examples/traced/manual_checkpoint.py --model-only", "  override checkpoint: skip_optimizer",
     ("SC checkpoint save", "state = torch.load(")),
    ("examples/traced/manual_checkpoint.py --rng-restored", "  override checkpoint: resume", None),
    ("examples/traced/manual_checkpoint.py --rng-not-restored", "  override checkpoint: rng_not_restored",
     ("SC checkpoint rng", "state = torch.load(")),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,lifted,refuted", SCRIPTS, ids=[s[0].split("/")[-1] + s[0][-8:] for s in SCRIPTS])
def test_checkpoints_are_lifted_and_decided(script, lifted, refuted, tmp_path, monkeypatch):
    """The buggy scripts refuted for their root cause alone (one finding) at the line that saves, loads or
    restores; the fixed ones proved. Nothing named unlifted (no PL614)."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    path, *argv = script.split()
    status, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                            "python", path, *argv])
    assert "[PL614]" not in err, out + err
    text = spec.read_text()
    assert lifted in text, text
    if refuted is None:
        assert status == 0 and "proved for all mesh sizes" in out, out + err
        assert [x for x in checkpoint_lines(text)] == ["override checkpoint: resume"], text
        return
    obligation, code = refuted
    line = next(i for i, x in enumerate((ROOT / path).read_text().splitlines(), 1) if code in x)
    assert status == 1, out + err
    assert f"1 finding in {path}:" in out, out
    assert f"{path}:{line}: refuted {obligation}: " in out, out
