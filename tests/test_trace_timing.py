"""Time around the optimizer step in a traced script (``lift_timing``): an update after every micro-step of an
accumulation (``optimizer: step_every_microbatch``) and gradient buffers never cleared between steps
(``grads: no_zero_grad``).

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json: two optimizer steps of one backward
each) by hand: each edit states, per optimizer step, whether its first backward found the gradient buffers still
holding a gradient, the pattern written out in the test; the slow ones run examples/traced/accum_step_every.py and
ddp_no_zero_grad.py (and their ``--fixed`` siblings) and require each verdict at the script line named.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift
from placement_logic.trace.lift_timing import WHAT

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
BACKWARD, STEP = 28, 29  # examples/traced/ddp_summed.py: loss.backward(), opt.step()


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


def stored() -> dict:
    return json.loads(STORED.read_text())


def _names(trace: dict) -> list[str]:
    return [p["name"] for p in trace["ranks"][0]["steps"][0]["optimizer"]["params"]]


def _carried(trace: dict, flags: list, names: list[str] | None = None, ranks=None) -> dict:
    """Step i's first backward found the buffers holding a gradient where ``flags[i]`` (of ``names``, default every
    parameter); None: no buffer read. With more flags than steps, earlier copies of the first steps are put first
    (their collectives left to the originals, renumbered after them)."""
    every = _names(trace)
    for r, part in enumerate(trace["ranks"]):
        extra = len(flags) - len(part["steps"])
        if extra > 0:
            copies = [copy.deepcopy(part["steps"][i % len(part["steps"])]) for i in range(extra)]
            for s in part["steps"]:
                s["step"] += extra
            for c in part["collectives"]:
                if isinstance(c.get("step"), int):
                    c["step"] += extra
            for i, s in enumerate(copies):
                s["step"] = i
            part["steps"][:0] = copies
        if ranks is not None and r not in ranks:
            continue
        for s, f in zip(part["steps"], flags):
            s["grads_before"] = {"carried": f, "names": (names or every) if f else []}
    return trace


def _spec(tmp_path, lifted) -> Path:
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    return spec


def test_buffers_never_cleared_are_no_zero_grad_at_the_first_uncleared_backward(tmp_path):
    """Three steps, cleared before the first only: from the second on every update reads the earlier steps' sum.
    Lifted at the second step's backward, and refuted by the checker's own two-step replay."""
    lifted = lift(_carried(stored(), [False, True, True]))
    assert "  override grads: no_zero_grad  # observed: the gradient buffers never cleared between optimizer " \
        f"steps (no zero_grad); examples/traced/ddp_summed.py:{BACKWARD}" in lifted.text
    assert "step_every_microbatch" not in lifted.text and "microbatches" not in lifted.text
    assert not [u for u in lifted.unliftable if u.what == WHAT]
    status, out, _ = run(["check", str(_spec(tmp_path, lifted))])
    assert status == 1 and "refuted GI grads[dense] across steps" in out, out


def test_buffers_cleared_every_second_step_are_one_accumulation_stepped_every_micro_step(tmp_path):
    """Four steps of one backward each, the buffers cleared before steps 1 and 3 (1-based) and carried into 2 and 4:
    windows of 2 optimizer steps, one accumulation of 2 microbatches updated after each (at opt.step())."""
    lifted = lift(_carried(stored(), [False, True, False, True]))
    assert "  microbatches = 2  # optimizer steps of one backward pass each" in lifted.text
    assert "  override optimizer: step_every_microbatch  # observed: an optimizer step after each of the 2 backward " \
        f"passes between two clears of the gradients; examples/traced/ddp_summed.py:{STEP}" in lifted.text
    assert "no_zero_grad" not in lifted.text
    status, out, _ = run(["check", str(_spec(tmp_path, lifted))])
    assert status == 1 and "refuted GI grads[dense] update over microbatches" in out, out


def test_a_last_window_cut_short_is_read_with_the_others():
    """Windows of 3 steps: cleared, carried, carried, cleared, carried (the trace ends inside the second)."""
    lifted = lift(_carried(stored(), [False, True, True, False, True]))
    assert "  microbatches = 3  #" in lifted.text and "step_every_microbatch" in lifted.text


def test_buffers_always_cleared_state_nothing():
    lifted = lift(_carried(stored(), [False, False]))
    assert "no_zero_grad" not in lifted.text and "step_every_microbatch" not in lifted.text
    assert not [u for u in lifted.unliftable if u.what == WHAT]


@pytest.mark.parametrize("flags,phrase", [
    ([False, True, False, False, True], "windows of 2, 1, 2 steps"),  # a window of one step between windows of two
    ([False, True, True, False, True, False], "windows of 3, 2, 1 steps"),
    ([True, False, True], "windows of none"),  # carried into the very first step, then cleared
])
def test_irregular_clearing_is_named_never_lifted(flags, phrase, tmp_path):
    lifted = lift(_carried(stored(), flags))
    found = [u for u in lifted.unliftable if u.what == WHAT]
    assert found and phrase in found[0].reason, [u.reason for u in lifted.unliftable]
    assert "step_every_microbatch" not in lifted.text and "no_zero_grad" not in lifted.text
    status, out, _ = run(["check", str(_spec(tmp_path, lifted))])
    assert "proved for all" not in out and f'unobserved "{WHAT}' in lifted.text


def test_a_window_of_several_backward_passes_per_step_is_named():
    trace = _carried(stored(), [False, True, False, True])
    for part in trace["ranks"]:
        for s in part["steps"]:
            s["losses"] = s["losses"] * 2
            s["nll"] = s["nll"] * 2
    found = [u for u in lift(trace).unliftable if u.what == WHAT]
    assert found and "several backward passes in a step" in found[0].reason


def test_unread_buffers_are_named():
    """No parameter of a module seen in forward: whether the buffers were cleared is not observed."""
    lifted = lift(_carried(stored(), [False, None]))
    found = [u for u in lifted.unliftable if u.what == WHAT]
    assert found and "not observed" in found[0].reason and "no_zero_grad" not in lifted.text


def test_ranks_that_clear_at_other_steps_are_named():
    trace = _carried(stored(), [False, False])
    _carried(trace, [False, True], ranks={1})
    found = [u for u in lift(trace).unliftable if u.what == WHAT]
    assert found and "rank 1 clears its gradient buffers at other steps than rank 0" in found[0].reason


def test_some_parameters_never_cleared_outside_whole_groups_are_named():
    """The stored plan has one group (dense); two of its 36 parameters carried are no group of it."""
    trace = stored()
    lifted = lift(_carried(trace, [False, True], names=_names(trace)[:2]))
    found = [u for u in lifted.unliftable if u.what == WHAT]
    assert found and "2 of 36 parameters never cleared" in found[0].reason
    assert "no_zero_grad" not in lifted.text


def test_within_a_window_some_parameters_cleared_is_named():
    trace = stored()
    lifted = lift(_carried(trace, [False, True, False, True], names=_names(trace)[1:]))
    found = [u for u in lifted.unliftable if u.what == WHAT]
    assert found and "1 of 36 parameters cleared within the accumulation window" in found[0].reason
    assert "step_every_microbatch" not in lifted.text


def test_a_trace_of_an_earlier_recorder_is_noted():
    lifted = lift(stored())
    assert any("not in this trace (an earlier recorder)" in n for n in lifted.notes)
    assert not [u for u in lifted.unliftable if u.what == WHAT]


def test_bad_grads_before_is_pl612(tmp_path):
    trace = _carried(stored(), [False, True])
    trace["ranks"][0]["steps"][1]["grads_before"]["carried"] = "yes"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and "grads_before.carried" in err


@pytest.mark.torch
def test_recorder_reads_cleared_and_carried_buffers():
    """A linear layer: no gradient yet (None), a backward's gradient (nonzero), zero_grad(set_to_none=False)
    (zeros): carried only in the second case, named by the name given."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_grads import grads_before

    layer = torch.nn.Linear(2, 1)
    names = {id(layer.weight): "w", id(layer.bias): "b"}
    assert grads_before([layer], names) == {"carried": False, "names": []}
    layer(torch.ones(1, 2)).sum().backward()  # d/db = 1, d/dw = 1 1: nonzero
    assert grads_before([layer], names) == {"carried": True, "names": ["b", "w"]}
    layer.zero_grad(set_to_none=False)
    assert grads_before([layer], names) == {"carried": False, "names": []}
    assert grads_before([torch.nn.ReLU()], names)["carried"] is None  # no parameter read




@pytest.mark.torch
def test_recorder_reads_the_buffers_of_weights_held_as_attributes():
    """PyTorch's DDP over tensor-parallel modules takes the weights out of ``parameters()`` and sets, before each
    forward, a tensor computed from each local parameter on the module in its place: the buffer read is that
    parameter's (found through the autograd graph), named by its storage; a frozen attribute is not a weight."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_grads import grads_before, weights

    layer = torch.nn.Linear(2, 1)
    local_w, local_b = layer.weight, layer.bias
    del layer.weight, layer.bias
    layer.weight, layer.bias = local_w.view(1, 2), local_b.view(1)  # non-leaf attributes over the parameters
    layer.frozen = torch.ones(3)  # no gradient: never read
    assert list(layer.parameters(recurse=False)) == []
    assert {id(p) for p in weights([layer])} == {id(local_w), id(local_b)}
    storage = lambda: {(local_w.data_ptr(), (1, 2), (2, 1)): "fc.weight"}  # noqa: E731
    assert grads_before([layer], {}, storage) == {"carried": False, "names": []}
    torch.nn.functional.linear(torch.ones(1, 2), layer.weight, layer.bias).sum().backward()
    assert grads_before([layer], {}, storage) == {"carried": True, "names": ["<unnamed>", "fc.weight"]}
    local_w.grad = None
    local_b.grad.zero_()
    assert grads_before([layer], {}, storage) == {"carried": False, "names": []}
# --------------------------------------------------------------------------- slow: the examples


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,args,status,finding", [
    ("accum_step_every.py", [], 1, ("opt.step()  # the bug", "GI grads[dense] update over microbatches")),
    ("accum_step_every.py", ["--fixed"], 0, None),
    ("ddp_no_zero_grad.py", [], 1, ("    loss.backward()", "GI grads[dense] across steps")),
    ("ddp_no_zero_grad.py", ["--fixed"], 0, None),
], ids=["step_every", "step_every_fixed", "no_zero_grad", "no_zero_grad_fixed"])
def test_traced_timing_example(script, args, status, finding, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *args])
    assert got == status, out + err
    assert "[PL614]" not in err
    text = spec.read_text()
    if finding is None:
        assert "proved for all mesh sizes" in out
        assert "step_every_microbatch" not in text and ": no_zero_grad" not in text
    else:
        code, root = finding
        line = _line(script, code)
        assert f"examples/traced/{script}:{line}: refuted {root}:" in out, out
        statement = "override optimizer: step_every_microbatch" if "step_every" in script else \
            "override grads: no_zero_grad"
        assert f"  {statement}  # observed: " in text and f"examples/traced/{script}:{line}\n" in text
