"""What a traced step does beyond its gradient programs: layers left partial over the tensor axis, ties across
pipeline stages, overflow flags, RNG seeds, checkpoints, custom backward collectives, auxiliary losses, and
torch.distributed.pipelining's schedules.

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json) by hand, each edit an independent
statement of what the script did; the slow ones run the scripts of examples/traced/ and require each verdict
and the script line it names. Nothing the lift does not model is ever proved: it is named (PL614) and stated
in the lifted spec as `unobserved`, so `placement check` of that spec is unknown too.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest
from golden import check_golden

from placement_logic.cli import main
from placement_logic.trace.lift import lift
from placement_logic.trace.lift_activations import region_of
from placement_logic.trace.lift_facts import LOCAL_OVERFLOW

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
GOLDEN = ROOT / "tests" / "golden" / "traced"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(script: str, text: str, after: str | None = None) -> int:
    """The line of examples/traced/SCRIPT that contains ``text`` (the first after the line containing ``after``)."""
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    start = next(i for i, x in enumerate(lines) if after in x) if after else 0
    return next(i for i, x in enumerate(lines, 1) if i > start and text in x)


def stored() -> dict:
    return json.loads(STORED.read_text())


def _last(part: dict) -> dict:
    return part["steps"][-1]


FRAME = {"file": "examples/traced/ddp_summed.py", "line": 7, "function": "<module>", "code": "x"}


# --------------------------------------------------------------------------- fast: edited traces


def _tensor_parallel(trace: dict) -> dict:
    """The stored trace as if both ranks saw the same inputs and held different slices of every weight (the
    values before the first update differ): tensor parallelism written by hand over plain tensors."""
    inputs = _last(trace["ranks"][0])["inputs"]
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["inputs"] = copy.deepcopy(inputs)
    for st in trace["ranks"][1]["steps"]:
        for p in (st.get("optimizer") or {}).get("params", []):
            p["checksum"] = "slice-" + p["checksum"][6:]
    return trace


def test_equal_inputs_and_different_weights_make_a_tensor_axis():
    text = lift(_tensor_parallel(stored())).text
    assert "  d0 = 2  # tensor" in text or "  tp = 2  # tensor" in text
    assert "  tp: megatron_tp" in text and ": ddp" not in text


def _layers(trace: dict, fc2_output_equal: bool, fc2_reduced: bool, losses_equal: bool) -> dict:
    """Per-layer records: fc1 column-parallel (same input, different outputs), fc2 row-parallel (different inputs;
    its output equal on both ranks when reduced)."""
    trace = _tensor_parallel(trace)
    at = {"file": "examples/traced/tp_rowwise_unreduced.py", "line": 49, "code": "def forward(self, x):"}
    for part in trace["ranks"]:
        r = part["rank"]
        st = _last(part)
        seq = max(c["seq"] for c in part["collectives"]) + 1
        if fc2_reduced:
            part["collectives"].append(dict(next(c for c in part["collectives"] if c["kind"] == "all_reduce"),
                                            seq=seq, step=st["step"], phase="forward", module="fc2"))
        st["modules"] = [
            {"name": "fc1", "class": "ColumnLinear", "input": "x", "output": f"h{r}", "collectives": [],
             "stack": [FRAME]},
            {"name": "fc2", "class": "RowLinear", "input": f"h{r}", "output": "y" if fc2_output_equal else f"y{r}",
             "collectives": [seq] if fc2_reduced else [], "stack": [FRAME], "at": at}]
        # the same loss on both ranks, or rank 1's off by one
        st["losses"][0]["value"] = _last(trace["ranks"][0])["losses"][0]["value"] + (0 if losses_equal else r)
    return trace


def _named(trace: dict, name: str, cls: str) -> dict:
    for part in trace["ranks"]:
        m = _last(part)["modules"][1]
        m["name"], m["class"] = name, cls
    return trace


@pytest.mark.parametrize("name,cls,region", [
    ("fc2", "RowLinear", "mlp"),
    ("layers.3.mlp.down_proj", "RowParallelLinear", "mlp"),
    ("layers.0.self_attn.o_proj", "RowParallelLinear", "attention"),
    ("h.1.attn.c_proj", "Conv1D", "attention"),
])
def test_a_row_parallel_output_never_reduced_is_lifted_as_its_region_left_partial(name, cls, region, tmp_path):
    """The layer's region is read from its name; the plan then states the missing reduction (`reduce over ()`,
    the slot emptied) at the layer's forward, and the checker refutes that region's activations there."""
    lifted = lift(_named(_layers(stored(), fc2_output_equal=False, fc2_reduced=False, losses_equal=False), name, cls))
    assert not [u for u in lifted.unliftable if "output of" in u.what or "the loss over" in u.what], lifted.unliftable
    line = f"  override activations[{region}]: reduce over ()"
    assert line in lifted.text
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    at = next(i for i, x in enumerate(lifted.text.splitlines(), 1) if x.startswith(line))
    assert status == 1 and f"{spec}:{at}:3: refuted GI activations[{region}]" in out, out
    assert "examples/traced/tp_rowwise_unreduced.py:49" in lifted.text.splitlines()[at - 1]


def test_a_row_parallel_output_in_no_region_is_named_at_its_forward():
    """A layer whose name places it in no region (`block.proj`) is not guessed: reported at its forward."""
    lifted = lift(_named(_layers(stored(), False, False, False), "block.proj", "RowLinear"))
    found = [u for u in lifted.unliftable if u.what.startswith("the output of block.proj (RowLinear)")]
    assert len(found) == 1 and found[0].where == "examples/traced/tp_rowwise_unreduced.py:49", lifted.unliftable
    assert "never all-reduced" in found[0].reason and "activations[" not in lifted.text
    assert 'unobserved "the output of block.proj (RowLinear) over' in lifted.text


def test_regions_read_from_module_names():
    assert [region_of(n, c) for n, c in [
        ("blocks.0.mlp.fc1", "Linear"), ("model.layers.2.self_attn.qkv_proj", "Linear"), ("lm_head", "Linear"),
        ("transformer.h.0.mlp.c_proj", "Conv1D"), ("block.proj", "MyAttention"), ("block.proj", "Linear"),
        ("layers.0.feed_forward.w2", "Linear")]] == ["mlp", "attention", "head", "mlp", "attention", None, "mlp"]


def _column(trace: dict, grads_differ: bool, columns: int = 1, reduced: bool = False) -> dict:
    """Tensor parallelism with a layer before it: ``embed`` whole on both ranks (its initial values equal), then
    ``columns`` column-parallel layers (the same input, different outputs on the two ranks) in every step; the
    embedding's gradient differs between the ranks or not, reduced by the all-reduce (seq 6) or not."""
    trace = _tensor_parallel(trace)
    at = {"file": "examples/traced/tp_column.py", "line": 56, "code": "def forward(self, x):"}
    whole = trace["ranks"][0]["steps"][0]["optimizer"]["params"][0]["checksum"]
    for part in trace["ranks"]:
        r = part["rank"]
        for st, st0 in zip(part["steps"], trace["ranks"][0]["steps"]):
            st["losses"], st["nll"] = copy.deepcopy(st0["losses"]), copy.deepcopy(st0["nll"])  # equal losses
            emb = st["optimizer"]["params"][0]
            assert emb["name"] == "embed.weight"
            emb["checksum"] = whole
            emb["grad"]["collectives"] = [6] if reduced else []
            if grads_differ:
                emb["grad"]["checksum"] = f"differs-{r}"
            st["modules"] = [{"name": "embed", "class": "Embedding", "input": "x", "output": "e", "collectives": [],
                              "stack": [FRAME]}] + [
                {"name": f"blocks.{i}.mlp.fc1", "class": "ColumnLinear", "input": "e", "output": f"h{i}{r}",
                 "collectives": [], "stack": [FRAME], "at": at} for i in range(columns)]
    return trace


def test_a_column_parallel_input_gradient_never_reduced_is_lifted_as_no_reduce(tmp_path):
    lifted = lift(_column(stored(), grads_differ=True))
    line = "  override activation_grads[mlp]: no_reduce"
    assert line in lifted.text and not lifted.unliftable, lifted.unliftable
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    at = next(i for i, x in enumerate(lifted.text.splitlines(), 1) if x.startswith(line))
    assert status == 1 and f"{spec}:{at}:3: refuted GI activation_grads[mlp]" in out, out
    assert "examples/traced/tp_column.py:56" in lifted.text.splitlines()[at - 1]


@pytest.mark.parametrize("differ,columns,reduced", [(False, 1, False), (True, 1, True)])
def test_an_input_gradient_equal_or_reduced_is_not_blamed(differ, columns, reduced):
    """The embedding's gradient equal on the tensor ranks, or reduced over the axis: no input gradient is wrong."""
    lifted = lift(_column(stored(), differ, columns, reduced))
    assert "activation_grads" not in lifted.text and not [u for u in lifted.unliftable if "input gradient" in u.what]


def test_an_input_gradient_never_reduced_before_two_column_layers_is_named():
    """Which of two column-parallel layers lost its reduction is not read from the gradients: named, not lifted."""
    lifted = lift(_column(stored(), True, columns=2))
    found = [u.what for u in lifted.unliftable]
    assert found == ["the input gradient of blocks.0.mlp.fc1 (ColumnLinear), blocks.1.mlp.fc1 (ColumnLinear) over tp"]
    assert "activation_grads" not in lifted.text


def _scaler(trace: dict) -> dict:
    """GradScaler's unscale recorded on every rank (its found-inf flag set from the rank's own gradients)."""
    for part in trace["ranks"]:
        part["unmodelled"] = [{"what": LOCAL_OVERFLOW, "detail": "", "phase": "after_backward",
                               "step": _last(part)["step"], "stack": [FRAME]}]
    return trace


@pytest.mark.parametrize("edit,local", [
    (lambda t: t, False),  # DDP: every rank's gradients equal after the all-reduce, every rank decides alike
    (_tensor_parallel, True),  # weight slices: each rank checks its own, and nothing reduces the flag
    (lambda t: _flag(_tensor_parallel(t), 0.0), False),  # the flag all-reduced with MAX: override overflow
])
def test_a_local_overflow_check_is_lifted_where_the_gradients_differ_between_ranks(edit, local):
    """The found-inf flag never reduced over weight slices: each rank updates its loss scale from its own flag,
    `override loss_scale: local over (tp)` at the scaler's line; never dropped, never left to the plan's reduced
    flag."""
    lifted = lift(edit(_scaler(stored())))
    assert not [u for u in lifted.unliftable if u.what == LOCAL_OVERFLOW], lifted.unliftable
    stated = [x for x in lifted.text.splitlines() if "override loss_scale: local over (tp)" in x]
    assert bool(stated) == local, lifted.text
    if local:
        assert stated[0].endswith("examples/traced/ddp_summed.py:7"), stated
        assert "each rank also decides alone whether to skip the step" in lifted.text


def _custom_backward(trace: dict, op: str = "sum", carried: tuple = ()) -> dict:
    """A custom autograd function's backward all-reduces an activation gradient over the tensor axis."""
    trace = _tensor_parallel(trace)
    for part in trace["ranks"]:
        st = _last(part)
        part["collectives"].append({"seq": 901, "step": st["step"], "phase": "backward", "kind": "all_reduce",
                                    "ranks": [0, 1], "stack": [FRAME], "dtype": "float32", "bytes": 64, "numel": 16,
                                    "op": op, "api": "c10d.allreduce_", "carried": list(carried),
                                    "inputs_reduced": [], "custom_backward": "CopyToTensorRanks"})
        part["unmodelled"] = [{"what": "a collective (all_reduce) in the backward of the custom autograd function "
                               "CopyToTensorRanks", "detail": "not lifted", "phase": "backward", "step": st["step"],
                               "stack": [FRAME]}]
    return trace


@pytest.mark.parametrize("op,carried,named", [("sum", (), False), ("max", (), True),
                                              ("sum", ("embed.weight",), True)])
def test_a_custom_backward_sum_over_the_tensor_axis_is_the_input_gradient_reduction(op, carried, named):
    """Megatron's copy-to-tensor-parallel region (identity forward, all-reduce backward) is what megatron_tp
    derives: not reported. Another reduction there, or one of a parameter's gradient, is still named."""
    lifted = lift(_custom_backward(stored(), op, carried))
    found = [u for u in lifted.unliftable if "custom autograd function CopyToTensorRanks" in u.what]
    assert bool(found) == named
    assert ("input gradients all-reduced over tp in the backward of CopyToTensorRanks" in lifted.text) != named


@pytest.mark.parametrize("equal,reduced,losses_equal,named", [
    (True, True, True, None),
    (False, False, True, None),  # the losses equal: fc2's output is a legitimate shard
    (True, False, False, "the loss over tp"),  # fc2's output equal: not the layer left partial
    (False, True, False, "the loss over tp"),  # a collective over tp inside fc2 (a reduce-scatter leaves a shard)
])
def test_a_reduced_or_sharded_output_is_not_blamed(equal, reduced, losses_equal, named):
    """A layer reduced in its forward (its output equal, or a collective over the axis inside it), or ranks whose
    losses agree: no layer is blamed; different losses without a culprit layer are named at the loss."""
    lifted = lift(_layers(stored(), equal, reduced, losses_equal))
    found = [u.what for u in lifted.unliftable if "output of" in u.what or "the loss over" in u.what]
    assert found == ([named] if named else [])


def test_different_losses_without_a_culprit_layer_are_named_at_the_loss():
    trace = _layers(stored(), fc2_output_equal=True, fc2_reduced=False, losses_equal=False)
    for part in trace["ranks"]:
        _last(part)["modules"] = []
    found = [u for u in lift(trace).unliftable if u.what.startswith("the loss over")]
    assert len(found) == 1 and "different losses" in found[0].reason


def _flag(trace: dict, value: float, op: str = "max") -> dict:
    for part in trace["ranks"]:
        st = _last(part)
        part["collectives"].append({"seq": 900, "step": st["step"], "phase": "after_backward", "kind": "all_reduce",
                                    "ranks": [0, 1], "stack": [FRAME], "dtype": "float32", "bytes": 4, "numel": 1,
                                    "op": op, "api": "c10d.allreduce_", "carried": [], "inputs_reduced": [],
                                    "value_in": value, "value_out": value})
    return trace


def test_an_overflow_flag_reduced_with_max_is_lifted():
    lifted = lift(_flag(stored(), 0.0))
    assert "  override overflow: reduce over (dp)  # observed: a found-inf flag all-reduced with MAX; " \
        "examples/traced/ddp_summed.py:7" in lifted.text
    assert not lifted.unliftable
    assert "clip_norm" not in lifted.text  # a MAX flag is no clip norm


@pytest.mark.parametrize("value,op", [(3.5, "max"), (1.0, "min"), (2.0, "product")])
def test_another_nonlinear_reduction_is_reported(value, op):
    lifted = lift(_flag(stored(), value, op))
    assert [u.what for u in lifted.unliftable] == [f"an all-reduce {op.upper()} (c10d.allreduce_)"]
    assert "overflow" not in lifted.text.split("plan traced")[1].replace("no loss-scale overflow", "")


def test_unmodelled_calls_are_named_and_stated_unobserved(tmp_path):
    trace = stored()
    trace["ranks"][0]["unmodelled"] = [{"what": "torch.save", "detail": "checkpoint save and load are not lifted",
                                        "phase": "optimizer_done", "step": 1, "stack": [FRAME]}]
    lifted = lift(trace)
    assert [(u.what, u.where) for u in lifted.unliftable] == [("torch.save", "examples/traced/ddp_summed.py:7")]
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    assert 'unobserved "torch.save' in lifted.text and "PROVED" not in out and "not stated by the plan" in out


@pytest.mark.parametrize("seeds,initial,reported", [
    (["0", "0"], [1, 1], False),  # one seed on every rank (the model built identically)
    (["0", "1"], [1, 1], True),   # torch.manual_seed(rank)
    ([None, None], [5, 6], True),  # no manual_seed call, yet the generators start apart
])
def test_per_rank_seeds_are_named(seeds, initial, reported):
    trace = stored()
    for part, seed, init in zip(trace["ranks"], seeds, initial):
        part["seeds"] = [{"seed": seed, "step": -1, "stack": [FRAME]}] if seed is not None else []
        for st in part["steps"]:
            st["seed"] = init
    found = [u for u in lift(trace).unliftable if u.what == "per-rank RNG seeding"]
    assert bool(found) == reported
    if seeds[0] is not None and reported:
        assert found[0].where == "examples/traced/ddp_summed.py:7" and "rank 0: 0; rank 1: 1" in found[0].reason


@pytest.mark.parametrize("factor,reported", [(1.0, False), (0.5, False), (1 / 3, False), (1.0437, True)])
def test_a_loss_that_is_no_multiple_of_the_cross_entropy_is_named(factor, reported):
    """The loss value passed to backward over the cross-entropy's: a small fraction (a mean over micro-steps or
    ranks) is read as the loss multiplier; anything else means another term in the loss."""
    trace = stored()
    for part in trace["ranks"]:
        for st in part["steps"]:
            st["losses"][0]["value"] = st["nll"][0]["value"] * factor
    found = [u for u in lift(trace).unliftable if u.what == "an auxiliary loss"]
    assert bool(found) == reported


def test_a_second_cross_entropy_per_backward_is_named():
    trace = stored()
    for part in trace["ranks"]:
        st = _last(part)
        st["nll"].append(dict(st["nll"][0]))
    assert [u.what for u in lift(trace).unliftable] == ["an auxiliary loss"]


@pytest.mark.parametrize("key,value", [("unmodelled", [{"what": 3, "stack": []}]), ("seeds", [{"seed": "0"}])])
def test_malformed_new_records_are_pl612(tmp_path, key, value):
    trace = stored()
    trace["ranks"][0][key] = value
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and key in err


# --------------------------------------------------------------------------- slow: the examples

UNKNOWN = [
    # script, what is named, (text of its script line, the class whose block holds it)
    ("manual_custom_backward.py", "a collective (all_reduce) in the backward of the custom autograd function "
     "SyncGrads", ("dist.all_reduce(grad)", None)),
    ("manual_aux_loss.py", "an auxiliary loss", ("loss = F.cross_entropy(", None)),
    ("tp_from_local.py", "DTensor.from_local", ("out = DTensor.from_local(", None)),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,what,where", UNKNOWN, ids=[u[0] for u in UNKNOWN])
def test_what_the_lift_does_not_model_is_unknown_at_its_line(script, what, where, tmp_path, monkeypatch):
    """Exit 3 naming the fact at its script line, never proved nor refuted with another cause; `lift` then
    `check` is unknown too (the lifted spec states the fact as unobserved)."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    script, *argv = script.split()
    status, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                            "python", f"examples/traced/{script}", *argv])
    assert status == 3, out + err
    line = _line(script, *where)
    assert f"examples/traced/{script}:{line}:1: error: not lifted: {what} " in err, err
    assert "proved for all mesh sizes" not in out and "refuted" not in out.split("checking ")[0]
    assert f'unobserved "{what}' in spec.read_text()
    status, out, _ = run(["check", str(spec)])
    assert status == 3 and out.rstrip().endswith("UNKNOWN"), out


REFUTED = [
    # script, arguments, the refuted obligation, (text of its script line, the class whose block holds it)
    ("tp_rowwise_unreduced.py", [], "GI activations[mlp]", ("def forward(self, x):", "class RowLinear")),
    ("tp_column.py", ["--unreduced"], "GI activation_grads[mlp]", ("def forward(self, x):", "class ColumnLinear")),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,argv,obligation,where", REFUTED, ids=[r[0] for r in REFUTED])
def test_a_missing_tensor_axis_reduction_is_refuted_at_its_layer(script, argv, obligation, where, tmp_path,
                                                                  monkeypatch):
    """A row-parallel output never all-reduced in forward, a column-parallel input gradient never all-reduced in
    backward: lifted as the region's activation override and refuted at the layer's `def forward`, with that cause
    alone (no data axis, no gradient reduction blamed)."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    status, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                            "python", f"examples/traced/{script}", *argv])
    assert status == 1 and "[PL614]" not in err, out + err
    line = _line(script, *where)
    assert f"1 finding in examples/traced/{script}:" in out, out
    assert f"examples/traced/{script}:{line}: refuted {obligation}: " in out, out
    assert "dp" not in spec.read_text().split("mesh {")[1]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,argv,status,binding", [
    ("tp_rowwise.py", [], 0, "tp: megatron_tp"),
    ("tp_column.py", [], 0, "tp: megatron_tp"),
    ("manual_overflow.py", [], 0, "override overflow: reduce over (dp)"),
    ("ddp_gradscaler.py", [], 0, "dp: ddp"),
    ("ddp_gradscaler.py", ["--fsdp"], 0, "override overflow: reduce over (dp)"),
    ("pipeline_schedule.py", [], 0, "pp: gpipe"),
    ("pipeline_schedule.py", ["--1f1b"], 0, "pp: one_f_one_b"),
    ("pipeline_schedule.py", ["--unscaled"], 1, "override grads: divide by 1 / 2"),
])
def test_lifted_as_what_it_is(script, argv, status, binding, tmp_path, monkeypatch):
    """The row-parallel all-reduce a tensor-axis collective (attributed to fc2's forward), the overflow flag's
    reduction, pipelining's GPipe and 1F1B schedules; the schedule without its gradient scaling is refuted at the
    loss line (the microbatches' losses summed, not averaged)."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *argv])
    assert got == status and "[PL614]" not in err, out + err
    assert f"  {binding}" in out
    if status == 0:
        assert "proved for all mesh sizes" in out
        if not argv:
            check_golden(GOLDEN / script.replace(".py", ".place"), spec.read_text())
    else:
        line = _line(script, "return F.cross_entropy(")
        assert f"examples/traced/{script}:{line}: refuted GI grads[dense] normalisation:" in out, out
    if script in ("tp_rowwise.py", "tp_column.py"):
        assert "# note: tp: the outputs of fc2 all-reduced over tp in their forward (row-parallel)" in spec.read_text()
    if script == "tp_column.py":
        assert "# note: tp: the input gradients all-reduced over tp in the backward of CopyToTensorRanks " \
            "(column-parallel)" in spec.read_text()
