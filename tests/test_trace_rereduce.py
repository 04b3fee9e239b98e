"""An accumulating gradient buffer all-reduced again after every micro-step in a traced script (``lift_rereduce``):
a sum written back in place (``grads: reduce_summed_every_microbatch``) and a copy reduced into a separate
accumulator (``grads: reduce_accumulated_every_microbatch``).

The fast tests edit the stored DDP trace (tests/data/traces/ddp_summed.json) by hand: its second step becomes two
micro-steps (two losses), its bucket all-reduce the first of two all-reduces issued after backward, one per
micro-step, each with what the recorder reads (the calls each input went through, the micro-steps whose buffers it
was read from, whether the second backward found the buffers holding the first's gradient), the pattern written
out in each test. The checker's own replay is the oracle of the verdicts (refuted at the lifted line). The slow
ones run examples/traced/accum_allreduce_summed.py and accum_allreduce_copy.py (and their ``--fixed`` siblings) and
require each verdict at the script line named.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace.lift import lift
from placement_logic.trace.lift_rereduce import WHAT

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
LINE = 29  # the frame given to the edited all-reduces (examples/traced/ddp_summed.py)
SUMMED = "override grads: reduce_summed_every_microbatch"
COPIED = "override grads: reduce_accumulated_every_microbatch"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


def _two_micro_steps(in_place: bool, read_earlier: bool = True, between: list | None = (True,),
                     scales: list[dict] | None = None, op: str = "sum", new_recorder: bool = True) -> dict:
    """The stored trace, its last step two micro-steps: the bucket all-reduce (call 6) issued after the first
    backward, a second one (call 7) after the second. ``in_place``: call 7's input went through call 6 (the buffer
    itself reduced); ``read_earlier``: call 7 read the buffer the first backward wrote (grads_read [0, 1]) or only the
    second's ([1]); ``between``: the step's grads_between (None: not recorded); ``scales``: each gradient's."""
    trace = json.loads(STORED.read_text())
    for part in trace["ranks"]:
        step = part["steps"][-1]
        step["losses"] = step["losses"] * 2
        step["nll"] = step["nll"] * 2
        step["grads_before"] = {"carried": False, "names": []}
        if between is not None:
            step["grads_between"] = list(between)
        calls = {c["seq"]: c for c in part["collectives"]}
        first = calls[6]
        frame = [{"file": "examples/traced/ddp_summed.py", "line": LINE, "function": "<module>", "code": "x"}]
        first.update(phase="after_backward", micro=0, inputs_reduced=[], stack=frame, op=op)
        second = dict(first, seq=7, micro=1, inputs_reduced=[6] if in_place else [])
        if new_recorder:
            first["grads_read"] = [0]
            second["grads_read"] = [0, 1] if read_earlier else [1]
        part["collectives"].append(second)
        for p in step["optimizer"]["params"]:
            p["grad"]["collectives"] = [6, 7]
            p["grad"]["scales"] = list(scales or [])
    return trace


def _at_world(micro: int) -> dict:
    """``p.grad /= world`` on micro-step ``micro`` (0-based), world 2."""
    return {"factor": "1/2", "at": {"file": "examples/traced/ddp_summed.py", "line": LINE, "code": "x"},
            "micro": micro}


def _spec(tmp_path, lifted) -> Path:
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    return spec


def _named(lifted) -> list[str]:
    return [u.reason for u in lifted.unliftable if u.what.startswith(WHAT)]


def _override_line(text: str, statement: str) -> int:
    return next(i for i, x in enumerate(text.splitlines(), 1) if x.startswith(f"  {statement}"))


def test_a_sum_in_place_on_every_micro_step_is_reduce_summed_every_microbatch(tmp_path):
    """Call 7 reduces the buffer call 6 wrote back (in place), the second backward added into it (carried), a sum,
    the division by the world size after the last reduction: buf = 2·S_1 + S_2 at two ranks."""
    lifted = lift(_two_micro_steps(in_place=True, scales=[_at_world(1)]))
    assert f"  {SUMMED}  # observed: the accumulating gradient buffers all-reduced with a sum in place after each " \
        f"of the 2 backward passes; examples/traced/ddp_summed.py:{LINE}" in lifted.text, lifted.text
    assert "reduce_every_microbatch" not in lifted.text and "reduced on more than one" not in str(lifted.unliftable)
    assert not _named(lifted)
    status, out, _ = run(["check", str(_spec(tmp_path, lifted))])
    line = _override_line(lifted.text, SUMMED)
    assert status == 1 and f"lifted.place:{line}:3: refuted GI grads[dense] over microbatches" in out, out


def test_a_copy_reduced_on_every_micro_step_is_reduce_accumulated_every_microbatch(tmp_path):
    """Call 7 reads a copy of the buffer holding both micro-steps (grads_read [0, 1], no earlier call in its input),
    each copy divided by the world size: micro-step 1 counted twice."""
    lifted = lift(_two_micro_steps(in_place=False, scales=[_at_world(0), _at_world(1)]))
    assert f"  {COPIED}  # observed: a copy of the accumulating gradient buffers all-reduced and added into a " \
        f"separate accumulator after each of the 2 backward passes; examples/traced/ddp_summed.py:{LINE}" \
        in lifted.text, lifted.text
    assert "reduce_every_microbatch" not in lifted.text and not _named(lifted)
    status, out, _ = run(["check", str(_spec(tmp_path, lifted))])
    line = _override_line(lifted.text, COPIED)
    assert status == 1 and f"lifted.place:{line}:3: refuted GI grads[dense] over microbatches" in out, out


def test_a_mean_of_a_copy_is_counted_again_too():
    """The reduction is linear: an average over the group does not undo the repetition (no division needed)."""
    lifted = lift(_two_micro_steps(in_place=False, op="avg"))
    assert f"  {COPIED}  #" in lifted.text


def test_buffers_cleared_between_micro_steps_reduce_the_new_gradient_only():
    """The second backward found the buffers cleared (p.grad = None after the copy): each call reads the new
    micro-step's gradient, one reduction of the sum (reduce_every_microbatch, the derivation's own)."""
    lifted = lift(_two_micro_steps(in_place=False, between=[False], scales=[_at_world(0), _at_world(1)]))
    assert SUMMED not in lifted.text and COPIED not in lifted.text and not _named(lifted)
    assert "  override grads: reduce_every_microbatch  #" in lifted.text
    fresh = lift(_two_micro_steps(in_place=False, read_earlier=False, scales=[_at_world(0), _at_world(1)]))
    assert COPIED not in fresh.text and "  override grads: reduce_every_microbatch  #" in fresh.text


def test_an_average_in_place_stays_reduce_every_microbatch():
    """DDP without no_sync done by hand: each in-place reduction divided by the world size on its micro-step (1/2 ·
    sum over 2 ranks = a mean) leaves the earlier, equal part as it is."""
    lifted = lift(_two_micro_steps(in_place=True, scales=[_at_world(0), _at_world(1)]))
    assert SUMMED not in lifted.text and "  override grads: reduce_every_microbatch  #" in lifted.text


@pytest.mark.parametrize("kwargs,phrase", [
    ({"in_place": True, "between": None}, "whether the buffers were cleared before that backward is not observed"),
    ({"in_place": False, "between": [None]}, "whether the buffers were cleared before that backward is not observed"),
    ({"in_place": True, "scales": [_at_world(0)]}, "scaled between the reductions"),
], ids=["sum_unread", "copy_unread", "scaled_between"])
def test_ambiguous_patterns_are_named_never_proved(kwargs, phrase, tmp_path):
    lifted = lift(_two_micro_steps(**kwargs))
    found = _named(lifted)
    assert found and phrase in found[0], [u.reason for u in lifted.unliftable]
    assert SUMMED not in lifted.text and COPIED not in lifted.text
    assert "  override grads: reduce_every_microbatch" not in lifted.text
    status, out, _ = run(["check", str(_spec(tmp_path, lifted))])
    assert status != 0 and "proved for all" not in out and f'unobserved "{WHAT}' in lifted.text


def test_three_micro_steps_cleared_before_one_only_are_named():
    trace = _two_micro_steps(in_place=True)
    for part in trace["ranks"]:
        step = part["steps"][-1]
        step["losses"] = step["losses"][:1] * 3
        step["nll"] = step["nll"][:1] * 3
        step["grads_between"] = [True, False]
        third = dict(next(c for c in part["collectives"] if c["seq"] == 7), seq=8, micro=2, inputs_reduced=[6, 7],
                     grads_read=[0, 1, 2])
        part["collectives"].append(third)
        for p in step["optimizer"]["params"]:
            p["grad"]["collectives"] = [6, 7, 8]
    found = _named(lift(trace))
    assert found and "cleared before some micro-steps' backward and not others" in found[0]


def test_in_place_on_one_call_and_a_copy_on_the_next_is_named():
    """Three micro-steps: call 7 reduces the buffer call 6 wrote back, call 8 a copy (no earlier call in its input)."""
    trace = _two_micro_steps(in_place=True)
    for part in trace["ranks"]:
        step = part["steps"][-1]
        step["losses"] = step["losses"][:1] * 3
        step["nll"] = step["nll"][:1] * 3
        step["grads_between"] = [True, True]
        third = dict(next(c for c in part["collectives"] if c["seq"] == 7), seq=8, micro=2, inputs_reduced=[],
                     grads_read=[0, 1, 2])
        part["collectives"].append(third)
        for p in step["optimizer"]["params"]:
            p["grad"]["collectives"] = [6, 7, 8]
    found = _named(lift(trace))
    assert found and "in place on some micro-steps and through a copy on others" in found[0]


def test_some_gradients_summed_in_place_and_the_others_once_are_named():
    """18 of the 36 gradients go through both calls; the others through call 6 only (one reduction, micro-step 1):
    one plan reduces its buffer one way."""
    trace = _two_micro_steps(in_place=True)
    for part in trace["ranks"]:
        for i, p in enumerate(part["steps"][-1]["optimizer"]["params"]):
            if i % 2:
                p["grad"]["collectives"] = [6]
    lifted = lift(trace)
    assert SUMMED not in lifted.text
    assert any("18 of 36 reduced gradients" in u.reason for u in lifted.unliftable if u.what == WHAT), \
        [u.reason for u in lifted.unliftable]


def test_a_trace_of_an_earlier_recorder_keeps_the_earlier_reading():
    """No grads_read: the calls are read as before (a sum of the accumulated buffer in place: two reductions,
    named by the accumulation's own check)."""
    lifted = lift(_two_micro_steps(in_place=True, new_recorder=False, between=None))
    assert SUMMED not in lifted.text and not _named(lifted)
    assert any("reduced on more than one" in u.reason for u in lifted.unliftable)


def test_bad_grads_between_is_pl612(tmp_path):
    trace = _two_micro_steps(in_place=True)
    trace["ranks"][0]["steps"][-1]["grads_between"] = ["yes"]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    status, _, err = run(["lift", str(path)])
    assert status == 2 and "[PL612]" in err and "grads_between" in err


@pytest.mark.torch
def test_recorder_tags_the_buffers_each_backward_wrote():
    """Two backward passes into one linear layer's buffers: each tag names its backward; a collective's record
    issued after backward lists them (grads_read), one issued in backward does not get the field."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_events import Events
    from placement_logic.trace.recorder_grads import GRADS_EVENT, inputs_read, tag_grads

    class Tags(Events):
        def __init__(self):
            self.events, self.alive = {}, {}

    tags, layer = Tags(), torch.nn.Linear(2, 1)
    for micro in range(2):
        layer(torch.ones(1, 2)).sum().backward()
        tag_grads(tags, [layer], micro)
    held = tags._events_of(layer.weight.grad)
    assert (GRADS_EVENT, 0) in held and (GRADS_EVENT, 1) in held
    rec: dict = {}
    inputs_read(rec, held + [("collective", 5)], "after_backward")
    assert rec == {"inputs_reduced": [5], "grads_read": [0, 1]}
    rec = {}
    inputs_read(rec, held, "backward")
    assert rec == {"inputs_reduced": []}


# --------------------------------------------------------------------------- slow: the examples


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,args,status,finding", [
    ("accum_allreduce_summed.py", [], 1, ("dist.all_reduce(p.grad)  # the bug", SUMMED)),
    ("accum_allreduce_summed.py", ["--fixed"], 0, None),
    ("accum_allreduce_copy.py", [], 1, ("dist.all_reduce(g)  # the bug", COPIED)),
    ("accum_allreduce_copy.py", ["--fixed"], 0, None),
], ids=["summed", "summed_fixed", "copied", "copied_fixed"])
def test_traced_rereduce_example(script, args, status, finding, tmp_path, monkeypatch):
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
        assert SUMMED not in text and COPIED not in text
    else:
        code, statement = finding
        line = _line(script, code)
        assert f"examples/traced/{script}:{line}: refuted GI grads[dense] over microbatches:" in out, out
        assert f"  {statement}  # observed: " in text and f"examples/traced/{script}:{line}\n" in text
