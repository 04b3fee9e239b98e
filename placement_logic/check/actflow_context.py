"""Context parallelism's attention exchange (``ir.actflow`` region ``context``): its typing per
axis and the concrete replay of a refutation.

On a context axis each rank holds its own block of the sequence: its queries, keys and values (S).
The attention of its queries reads every key/value block, so the forward exchange (``fwd_entry``, a
ring or an all-gather) must make the blocks whole (S -> R) before the local attention, whose output
is the rank's own queries' (R -> S). In backward the exchange runs again (``bwd_exit``, S -> R), the
local attention backward gives every block's key/value gradient from the rank's own queries only (R ->
P), and the reduce-scatter (``bwd_entry``) sums them and returns each block's sum to its owner (P ->
S). The next operation needs S on a context axis and V (the rank's own samples) on every other; a
collective over another axis mixes different samples or heads (V -> W). The collectives change types
as in ``check.actflow``.

The replay (one sample of n positions, position i on rank i; a linear attention y_i = q_i · Σ_j
k_j v_j, so dv_j = k_j · Σ_i dy_i q_i): the forward exchanges the blocks k_j·v_j, the backward the
keys k_j and then the value-gradient contributions k_j · dy_r q_r of rank r.
"""

from __future__ import annotations

from fractions import Fraction

from ..ir import actflow as af
from ..ir.overrides import OverrideVerb
from .report import Counterexample

TEXT = {"fwd_entry": "the key/value exchange before the attention (ring or all-gather)",
        "bwd_exit": "the key/value exchange again in backward (the attention backward reads every block)",
        "bwd_entry": "the reduce-scatter of the key/value gradients to the ranks that own their blocks",
        "attend": "the local attention", "attend_back": "the local attention backward"}


def typed(flow: af.Flow, axes: tuple[str, ...], direction: str, coll, Typed):
    """``coll`` and ``Typed``: check.actflow's collective rule and result class (no import cycle)."""
    slots = dict(flow.slots)
    derived = af.derived_slots("context", flow.tensor, flow.sp)
    plan = ([("fwd_entry", None), ("attend", {"R": "S"})] if direction == "forward" else
            [("bwd_exit", None), ("attend_back", {"R": "P"}), ("bwd_entry", None)])

    def run(slots_):
        cur = {a: (("S", 0) if a in flow.tensor else ("V", 0)) for a in axes}
        out = []
        for stage, op in plan:
            if op is not None:
                cur = {a: ((op.get(t[0], "W"), t[1]) if a in flow.tensor else (t if t[0] == "V" else ("W", 0)))
                       for a, t in cur.items()}
                cur = {a: (("W", 0) if t[0] == "W" else t) for a, t in cur.items()}
            else:
                for s in slots_[stage].steps:
                    for a in s.axes:
                        if a in cur:
                            cur[a] = coll(cur[a], s.kind)
            out.append((stage, dict(cur)))
        return out

    got, ref = run(slots), run(derived)
    needed = {a: ("S" if a in flow.tensor else "V") for a in axes}
    final = got[-1][1]
    bad = tuple(a for a in axes if final[a] != (needed[a], 0))
    cause = []
    for a in bad:
        stage = next((s for (s, g), (_, r) in zip(got, ref) if g[a] != r[a]), got[-1][0])
        slot = slots.get(stage)
        cause.append((a, stage, slot.span if slot is not None else af.NO_SPAN))
    return Typed(flow, direction, tuple(final.items()), tuple(needed.items()), bad, tuple(cause))


def _numbers(n: int):
    q = [Fraction(i + 2) for i in range(n)]
    k = [Fraction(2 * i + 1) for i in range(n)]
    v = [Fraction(3 * i + 2) for i in range(n)]
    dy = [Fraction(i + 1, 2) for i in range(n)]
    return q, k, v, dy


def run(flow: af.Flow, direction: str, axis: str, n: int, apply):
    """(each rank's result, the single-device one, the inputs) along ``axis``; ``apply`` runs a slot's
    collectives over the axis on the ranks' lists (check.actflow_replay). Along a non-context axis rank
    r holds sample r, a sequence of one position with the same numbers as position r."""
    slots = dict(flow.slots)
    q, k, v, dy = _numbers(n)
    ctx_axis = axis in flow.tensor
    if direction == "forward":
        got = apply(slots["fwd_entry"], axis, [[k[r] * v[r]] for r in range(n)])
        got = [None if b is None else [q[r] * sum(b, Fraction(0))] for r, b in enumerate(got)]
        kv = sum((k[j] * v[j] for j in range(n)), Fraction(0))
        want = [[q[r] * (kv if ctx_axis else k[r] * v[r])] for r in range(n)]
    else:
        got = apply(slots["bwd_exit"], axis, [[k[r]] for r in range(n)])
        got = [None if b is None else [kj * dy[r] * q[r] for kj in b] for r, b in enumerate(got)]
        got = apply(slots["bwd_entry"], axis, got)
        s = sum((dy[i] * q[i] for i in range(n)), Fraction(0))
        want = [[k[r] * (s if ctx_axis else dy[r] * q[r])] for r in range(n)]
    show = lambda xs: "[" + ", ".join(str(x) for x in xs) + "]"  # noqa: E731
    where = "position j on rank j" if ctx_axis else "rank r's own one-position sample r"
    inputs = {f"q ({where})": show(q), "k": show(k), "v": show(v)}
    if direction == "backward":
        inputs["dy"] = show(dy)
    return got, want, inputs


def counterexample(ctx, ty, sizes, axis, r, got, want, inputs, stage, span, show, axes_of) -> Counterexample:
    fwd = ty.direction == "forward"
    what = "attention output y = q·Σ k·v" if fwd else "value gradient dv = k·Σ dy·q"
    eq = f"{what} on rank {r} of {axis} = {show(got[r])}, single-device = {show(want[r])}"
    slot = dict(ty.flow.slots).get(stage)
    if slot is not None and slot.verb:
        target = "activations" if stage == "fwd_entry" else "activation_grads"
        over = "" if not slot.steps and not slot.axes else f" over ({', '.join(axes_of(slot))})"
        how = f"override {target}[context]: {slot.verb}{over} at line {span.line}"
        if slot.verb == OverrideVerb.REDUCE_COPY:
            how += ": the gradients are summed into a copy and each rank keeps its own queries' contributions"
        cause = f"{TEXT[stage]} ({how})"
    else:
        cause = f"{TEXT.get(stage, stage)}, whose input an earlier stated exchange left wrong"
    kind = "context" if axis in ty.flow.tensor else "non-context"
    diag = (f"the attention's {'output' if fwd else 'key/value gradient'} over the {kind} axis {axis} is "
            f"{af.type_text(dict(ty.result)[axis])}; every query must meet every key/value block of its own "
            f"sequence, exchanged over exactly the context axes ({', '.join(ty.flow.tensor)}), and every block's "
            f"gradient be summed back to its owner; the root cause is {cause}",)
    diag += (("every layer after it, the loss and so every gradient of the step, are computed from it",) if fwd
             else ("every layer before it, and the weight gradients computed from it, receive the wrong gradient",))
    devices = ((f"rank {r}", f"{axis}={r}"),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, tuple(inputs.items()), eq, diag, ctx.command(sizes))
