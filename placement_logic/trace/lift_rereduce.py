"""An accumulating gradient buffer all-reduced again after every micro-step (no torch).

Input: the all-reduces of one gradient made once on every one of the m accumulated micro-steps, after backward,
with what the recorder read of them (``grads_read``: the micro-steps whose gradient buffers each call's input was
read from; ``inputs_reduced``: the earlier calls its input had gone through) and of the step (``grads_between``:
whether each later backward found the buffers still holding the previous micro-steps' gradient). Output: how the
calls reduce the accumulated gradient, and the plan's line for it.

- ``summed``: every call reduces the buffer in place (each one's input went through the previous call), with a sum
  and no scaling between the calls, and the buffer was never cleared between micro-steps: after micro-step k every
  rank holds n times what it held plus micro-step k's sum (``override grads: reduce_summed_every_microbatch``).
- ``copied``: every call reads a copy of the buffer (no call's input went through an earlier one) that still holds
  the earlier micro-steps' gradients (``grads_read`` names an earlier micro-step, the buffers never cleared), the
  result added into a separate accumulator the update reads: micro-step k counted m - k + 1 times whatever the op
  (``override grads: reduce_accumulated_every_microbatch``).
- ``unknown``: a call reads an earlier micro-step's buffer but whether the buffers were cleared in between is not
  observed, they were cleared on some micro-steps and not others, the calls mix in place and copies, or a sum in
  place is scaled between its calls: named (PL614), never proved.
- ``None``: no call reads an earlier micro-step's buffer, the buffers were cleared between every two micro-steps,
  or an in-place reduction averages (``lift_programs`` reads those: one reduction of the summed gradient).
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames

SUMMED, COPIED, UNKNOWN = "summed", "copied", "unknown"
WHAT = "an accumulating gradient buffer reduced on every micro-step"
VERBS = {SUMMED: ("reduce_summed_every_microbatch", "the accumulating gradient buffers all-reduced with a sum in "
                  "place"),
         COPIED: ("reduce_accumulated_every_microbatch", "a copy of the accumulating gradient buffers all-reduced "
                  "and added into a separate accumulator")}


def rereduced(cs: list[dict], micro: dict, between: list | None, scaled: set[int], averages: bool
              ) -> tuple[str, str] | None:
    """(``SUMMED`` | ``COPIED`` | ``UNKNOWN``, why) for the calls ``cs`` (one on each micro-step), or None
    (the module docstring). ``scaled``: the micro-steps with a constant scale on the gradient; ``averages``:
    the calls with their scales average over their group."""
    if any("grads_read" not in c for c in cs):
        return None  # issued in backward, or an earlier recorder: lift_programs reads them
    cs = sorted(cs, key=lambda c: micro.get(c["seq"], 0))
    later = [(k, c) for k, c in enumerate(cs) if k and any(j < k for j in c["grads_read"])]
    if not later:
        return None
    flags = list(between or [])
    read = [flags[k - 1] if k - 1 < len(flags) else None for k, _ in later]
    if None in read:
        k = later[read.index(None)][0]
        return UNKNOWN, (f"the call on micro-step {k + 1} reads a gradient buffer an earlier micro-step's backward "
                         "wrote, and whether the buffers were cleared before that backward is not observed")
    if not any(read):
        return None  # cleared before every backward: each call reads the new micro-step's gradient
    if not all(read):
        return UNKNOWN, ("the gradient buffers were cleared before some micro-steps' backward and not others: which "
                         "micro-steps each reduction carries is not lifted")
    seqs = [c["seq"] for c in cs]
    chained = [seqs[k - 1] in c.get("inputs_reduced", []) for k, c in enumerate(cs) if k]
    if all(chained):
        if averages:
            return None  # a mean written back leaves the earlier, equal part: reduce_every_microbatch
        if cs[0].get("op") == "sum" and not scaled & set(range(len(cs) - 1)):
            return SUMMED, ""
        return UNKNOWN, ("the accumulating buffer is reduced in place on every micro-step and scaled between the "
                         "reductions: what each micro-step's gradient is multiplied by is not lifted")
    if not any(chained) and not any(c.get("inputs_reduced") for c in cs):
        return COPIED, ""
    return UNKNOWN, ("the accumulating buffer is reduced in place on some micro-steps and through a copy on others: "
                     "not lifted")


def rereduce_lines(st, info: list[tuple], of: dict[str, dict[str, tuple]], accum: int) -> list[tuple[str, list]]:
    """The statement for the whole buffer where every reduced gradient is rereduced one way (``of``: kind ->
    parameter -> (why, the stack of its call)); else the gradients named (PL614)."""
    reduced = [e[0]["name"] for e in info if e[2]]
    for kind, stacks in of.items():
        if kind == UNKNOWN and stacks:
            name, (reason, stack) = next(iter(stacks.items()))
            more = f" and {len(stacks) - 1} more" if len(stacks) > 1 else ""
            st.items.append(Unliftable((st.observer,), -1, f"{WHAT} ({name}{more})", reason, tuple(stack)))
    lines = []
    for kind in (SUMMED, COPIED):
        stacks = of.get(kind) or {}
        if not stacks:
            continue
        verb, what = VERBS[kind]
        first = next(iter(stacks.values()))[1]
        if len(stacks) != len(reduced) or len([k for k in of if of[k]]) > 1:
            st.items.append(Unliftable((st.observer,), -1, WHAT, f"{len(stacks)} of {len(reduced)} reduced gradients "
                                       f"are {what} after every micro-step, the others otherwise: one plan reduces "
                                       "its gradient buffer one way", tuple(first)))
            continue
        st.notes.append(f"{what} after each of the {accum} backward passes: lifted as grads: {verb}")
        lines.append((f"  override grads: {verb}  # observed: {what} after each of the {accum} backward passes",
                      _frames([first], st.script)))
    return lines
