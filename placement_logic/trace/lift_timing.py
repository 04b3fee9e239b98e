"""Time around the optimizer step: updates taken within an accumulation window, gradients never cleared (no torch).

Input: every rank's optimizer steps, each with ``grads_before`` (``recorder_grads``: whether the gradient buffers
still held a gradient at the step's first backward, and whose). Output: the accumulation window (the microbatches
of the lifted model) and the plan's lines, or what cannot be read (``Unliftable``, PL614).

- Never cleared: from the first step that finds a gradient in the buffers on, every step does (no ``zero_grad``,
  no ``p.grad = None``): each update reads the sum of every earlier step's gradient. Lifted as ``override
  grads: no_zero_grad`` (``grads[g]`` for each group whose parameters alone were carried) at the backward of the
  first step whose gradient was not cleared.
- Stepped within the window: the buffers are cleared every K >= 2 optimizer steps, each step one backward pass, the
  first of every window finding them cleared and the others not (``optimizer.step()`` inside the accumulation loop,
  ``zero_grad`` after it): the K steps are one accumulation of K microbatches whose update runs after every micro-step.
  Lifted as ``microbatches = K`` and ``override optimizer: step_every_microbatch`` at the ``optimizer.step()`` call.
- Anything else (buffers not read, cleared at irregular intervals, windows of several backward passes, ranks that
  disagree, some parameters carried and others not): named, never proved.

Traces of an earlier recorder carry no ``grads_before``: a note says the clearing was not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .lift_layout import Unliftable, _frames
from .lift_step import Step

WHAT = "the gradient buffers between optimizer steps"


@dataclass
class Timing:
    window: int = 0  # micro-steps of one accumulation stepped every micro-step (0: none)
    lines: list[tuple[str, list]] = field(default_factory=list)
    carried: set[str] = field(default_factory=set)  # the parameters a never-cleared buffer was read for
    frames: list[dict] = field(default_factory=list)
    first: int = 0  # the first optimizer step (from 1) whose backward found the buffers uncleared


def _pattern(steps: list[dict]) -> tuple[list, int]:
    """(carried flag of every optimizer step, or None where unread; the index of a step with no record)."""
    flags = []
    for i, s in enumerate(steps):
        g = s.get("grads_before")
        if g is None and s.get("losses"):
            return flags, i
        flags.append(None if g is None else g.get("carried"))
    return flags, -1


def _runs(flags: list[bool]) -> list[int] | None:
    """The lengths of the windows [cleared, carried, ..., carried]; None where a window does not start cleared."""
    runs: list[int] = []
    for f in flags:
        if not f:
            runs.append(1)
        elif not runs:
            return None
        else:
            runs[-1] += 1
    return runs


def read_timing(st: Step, pipelined: bool) -> Timing:
    """The window and the statements (their group left to ``timing_lines``); unreadable facts go to ``st.items``."""
    out = Timing()
    steps = {r: [s for s in part["steps"] if s.get("optimizer")] for r, part in st.ranks.items()}
    mine = steps[st.observer]
    if mine and all("grads_before" not in s for s in mine):
        st.notes.append("whether the gradients are cleared between optimizer steps is not in this trace (an earlier "
                        "recorder): not read")
        return out
    flags, missing = _pattern(mine)
    if missing >= 0 or None in flags:
        k = missing if missing >= 0 else flags.index(None)
        return _unknown(st, out, f"no gradient buffer was read before step {mine[k]['step']}'s first backward (no "
                        "weight of a module seen in forward): whether they were cleared since the previous "
                        "optimizer step is not observed", mine[k])
    for r, theirs in sorted(steps.items()):
        if _pattern(theirs)[0] != flags:
            return _unknown(st, out, f"rank {r} clears its gradient buffers at other steps than rank {st.observer}: "
                            "one plan does not state both", mine[-1], (st.observer, r))
    if not any(flags):
        return out
    first = flags.index(True)
    if all(flags[first:]):
        s = mine[first]
        out.carried = set(s["grads_before"].get("names") or [])
        out.frames = _frames([(s.get("losses") or [{}])[0].get("stack") or s["optimizer"].get("stack")], st.script)
        if pipelined:
            return _unknown(st, out, "gradient buffers never cleared between the optimizer steps of a pipeline "
                            "stage: not lifted per stage", s)
        out.first = first + 1
        return out
    runs = _runs(flags)
    k = runs[0] if runs else 0
    single = all(len(s.get("losses") or []) == 1 for s in mine)
    if not runs or k < 2 or not single or any(n != k for n in runs[:-1]) or runs[-1] > k or pipelined:
        shown = ", ".join(str(n) for n in runs or [])
        return _unknown(st, out, "gradient buffers cleared every few optimizer steps, not in windows of one "
                        f"backward pass per step of one length (windows of {shown or 'none'} steps"
                        f"{'' if single else ', several backward passes in a step'}"
                        f"{', a pipeline' if pipelined else ''}): which steps accumulate together is not lifted",
                        mine[first])
    s = mine[first]
    names = set(s["grads_before"].get("names") or [])
    every = {p["name"] for p in s["optimizer"].get("params", [])}
    if every - names:
        return _unknown(st, out, f"{len(every - names)} of {len(every)} parameters cleared within the accumulation "
                        "window while the others carry their gradient: which update reads which is not lifted", s)
    out.window = k
    st.notes.append(f"an optimizer step after each backward pass, the gradient buffers cleared every {k} steps: one "
                    f"accumulation of {k} microbatches stepped after every micro-step (lifted as microbatches = {k} "
                    "and optimizer: step_every_microbatch); the later updates of a window also read the earlier "
                    "micro-steps' gradients still in the buffers")
    out.lines.append((f"  override optimizer: step_every_microbatch  # observed: an optimizer step after each of the "
                      f"{k} backward passes between two clears of the gradients",
                      _frames([s["optimizer"].get("stack")], st.script)))
    return out


def _unknown(st: Step, out: Timing, reason: str, s: dict, ranks: tuple = ()) -> Timing:
    stack = (s.get("losses") or [{}])[0].get("stack") or (s.get("optimizer") or {}).get("stack") or []
    st.items.append(Unliftable(ranks or (st.observer,), -1, WHAT, reason, tuple(stack)))
    out.carried = set()
    return out


def timing_lines(st: Step, timing: Timing, named: dict[str, list[str]]) -> list[tuple[str, list]]:
    """The lines of ``timing``, the never-cleared buffers stated for the groups whose parameters they are: every
    group (no group), or each group all of whose parameters, and no other's, were carried."""
    if not timing.carried:
        return timing.lines
    held = {n for members in named.values() for n in members}
    why = "# observed: the gradient buffers never cleared between optimizer steps (no zero_grad)"
    whole = [g for g, members in named.items() if members and set(members) <= timing.carried]
    if not held <= timing.carried and timing.carried & held != {n for g in whole for n in named[g]}:
        st.items.append(Unliftable((st.observer,), -1, WHAT, f"{len(timing.carried & held)} of {len(held)} parameters "
                                   "never cleared, not whole groups of the lifted plan: not lifted",
                                   tuple(timing.frames)))
        return timing.lines
    st.notes.append(f"the gradient buffers still hold the earlier steps' gradients from optimizer step {timing.first} "
                    "on (never cleared): lifted as grads: no_zero_grad")
    if held <= timing.carried:
        return timing.lines + [(f"  override grads: no_zero_grad  {why}", timing.frames)]
    return timing.lines + [(f"  override grads[{g}]: no_zero_grad  {why}", timing.frames) for g in whole]
