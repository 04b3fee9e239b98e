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
from ..ir.overrides import OverrideTarget, OverrideVerb
from .report import Counterexample

TEXT = {"fwd_entry": "the key/value exchange before the attention (ring or all-gather)",
        "bwd_exit": "the key/value exchange again in backward (the attention backward reads every block)",
        "bwd_entry": "the reduce-scatter of the key/value gradients to the ranks that own their blocks",
        "attend": "the local attention", "attend_back": "the local attention backward"}


def _ulysses(slot) -> bool:
    return slot.verb == OverrideVerb.ALL_TO_ALL


def _a2a(t, ctx: bool, inverse: bool):
    """An all-to-all over an axis: on a context axis sequence shards (all heads) -> head shards (the whole
    sequence), and its inverse back; over any other axis it mixes the samples (or heads) of different ranks.
    A second pass the same way does not undo the first: it splits the heads each rank now holds again and
    stacks their positions along the sequence (W)."""
    if not ctx or t[0] != ("H" if inverse else "S"):
        return ("W", 0)
    return ("S" if inverse else "H", t[1])


def typed(flow: af.Flow, axes: tuple[str, ...], direction: str, coll, Typed):
    """``coll`` and ``Typed``: check.actflow's collective rule and result class (no import cycle)."""
    slots = dict(flow.slots)
    derived = af.derived_slots("context", flow.tensor, flow.sp)
    entry = "fwd_entry" if direction == "forward" else "bwd_exit"
    ulysses = _ulysses(slots[entry])
    if ulysses:  # the all-to-all, the attention on whole sequences of the rank's heads, the inverse all-to-all
        plan = [(entry, None), ("attend" if direction == "forward" else "attend_back", {"H": "H"}), (entry, "inverse")]
        plan += [("bwd_entry", None)] if direction == "backward" else []
    else:
        plan = ([("fwd_entry", None), ("attend", {"R": "S"})] if direction == "forward" else
                [("bwd_exit", None), ("attend_back", {"R": "P"}), ("bwd_entry", None)])

    def run(slots_):
        cur = {a: (("S", 0) if a in flow.tensor else ("V", 0)) for a in axes}
        out = []
        for stage, op in plan:
            if isinstance(op, dict):
                cur = {a: ((op.get(t[0], "W"), t[1]) if a in flow.tensor else (t if t[0] == "V" else ("W", 0)))
                       for a, t in cur.items()}
                cur = {a: (("W", 0) if t[0] == "W" else t) for a, t in cur.items()}
            else:
                steps = slots_[stage].steps
                for s in (reversed(steps) if op == "inverse" else steps):
                    for a in s.axes:
                        if a in cur:
                            cur[a] = _a2a(cur[a], a in flow.tensor, op == "inverse") if s.kind == af.ALL_TO_ALL else coll(cur[a], s.kind)
            out.append((stage, dict(cur)))
        return out

    got = run(slots)
    needed = {a: ("S" if a in flow.tensor else "V") for a in axes}
    final = got[-1][1]
    bad = tuple(a for a in axes if final[a] != (needed[a], 0))
    cause = []
    for a in bad:
        if ulysses:  # the first stage that leaves the axis wrong (the attention's: the all-to-all before it)
            stage = plan[next((i for i, (_, g) in enumerate(got) if g[a][0] == "W"), len(got) - 1)][0]
            stage = stage if stage in slots else entry
        else:
            ref = run(derived)
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
    if _ulysses(slots["fwd_entry" if direction == "forward" else "bwd_exit"]):
        return _run_ulysses(flow, direction, axis, n, apply)
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


def _all_to_all(slot, axis: str, n: int, ranks: list, inverse: bool = False) -> list:
    """Every all-to-all of ``slot`` over ``axis`` on the ranks' lists: rank r's list split into n chunks,
    chunk c sent to rank c, each rank's chunks concatenated in the order of their senders."""
    steps = [s for s in slot.steps if s.kind == af.ALL_TO_ALL and axis in s.axes]
    if len(steps) > 1:  # a second pass splits the one head each rank then holds n ways: no layout (W)
        return [None] * n
    for _ in (reversed(steps) if inverse else steps):
        if any(r is None or len(r) % n for r in ranks):
            return [None] * n
        k = len(ranks[0]) // n
        ranks = [[x for src in ranks for x in src[c * k:(c + 1) * k]] for c in range(n)]
    return ranks


def _run_ulysses(flow: af.Flow, direction: str, axis: str, n: int, apply):
    """Ulysses along ``axis``: n heads; on a context axis rank r holds position r of one sample, every head
    (head h of position i: q = q_i + 10h, ...); along any other axis rank r holds its own one-position
    sample r. The all-to-all gives each rank what it holds of one head per chunk, the local attention
    runs over the whole list it holds, the inverse all-to-all sends each result back."""
    slots = dict(flow.slots)
    entry = "fwd_entry" if direction == "forward" else "bwd_exit"
    q, k, v, dy = _numbers(n)
    heads = lambda xs, i: [xs[i] + 10 * h for h in range(n)]  # noqa: E731
    ctx_axis = axis in flow.tensor

    def attend(lists, f, total):  # every position of a rank's list against the sum over its whole list
        return [None if r is None else f(r, total(r)) for r in lists]

    hq, hk, hv = ([heads(xs, r) for r in range(n)] for xs in (q, k, v))  # each built once: O(n²) numbers
    if direction == "forward":
        held = _all_to_all(slots[entry], axis, n, [list(zip(hq[r], hk[r], hv[r])) for r in range(n)])
        held = attend(held, lambda r, kv: [qi * kv for qi, _, _ in r],
                      lambda r: sum((kj * vj for _, kj, vj in r), Fraction(0)))
        got = _all_to_all(slots[entry], axis, n, held, inverse=True)
        if ctx_axis:
            kv = [sum((hk[j][h] * hv[j][h] for j in range(n)), Fraction(0)) for h in range(n)]
            want = [[hq[r][h] * kv[h] for h in range(n)] for r in range(n)]
        else:
            want = [[a * b * c for a, b, c in zip(hq[r], hk[r], hv[r])] for r in range(n)]
    else:
        hg = [[a * b for a, b in zip(heads(dy, i), hq[i])] for i in range(n)]
        held = _all_to_all(slots[entry], axis, n, [list(zip(hk[r], hg[r])) for r in range(n)])
        held = attend(held, lambda r, gs: [kj * gs for kj, _ in r], lambda r: sum((gi for _, gi in r), Fraction(0)))
        got = apply(slots["bwd_entry"], axis, _all_to_all(slots[entry], axis, n, held, inverse=True))
        if ctx_axis:
            gs = [sum((hg[i][h] for i in range(n)), Fraction(0)) for h in range(n)]
            want = [[hk[r][h] * gs[h] for h in range(n)] for r in range(n)]
        else:
            want = [[a * b for a, b in zip(hk[r], hg[r])] for r in range(n)]
    show = lambda xs: "[" + ", ".join(str(x) for x in xs) + "]"  # noqa: E731
    where = "position j on rank j" if ctx_axis else "rank r's own one-position sample r"
    inputs = {f"q ({where}; head h adds 10h)": show(q), "k": show(k), "v": show(v)}
    if direction == "backward":
        inputs["dy"] = show(dy)
    return got, want, inputs


def counterexample(ctx, ty, sizes, axis, r, got, want, inputs, stage, span, show, axes_of) -> Counterexample:
    fwd = ty.direction == "forward"
    what = "attention output y = q·Σ k·v" if fwd else "value gradient dv = k·Σ dy·q"
    eq = f"{what} on rank {r} of {axis} = {show(got[r])}, single-device = {show(want[r])}"
    slot = dict(ty.flow.slots).get(stage)
    if slot is not None and slot.verb:
        target = OverrideTarget.ACTIVATIONS if stage == "fwd_entry" else OverrideTarget.ACTIVATION_GRADS
        over = "" if not slot.steps and not slot.axes else f" over ({', '.join(axes_of(slot))})"
        how = f"override {target}[context]: {slot.verb}{over} at line {span.line}"
        if slot.verb == OverrideVerb.REDUCE_COPY:
            how += ": the gradients are summed into a copy and each rank keeps its own queries' contributions"
        text = (f"Ulysses' all-to-all before the attention{' backward' if stage == 'bwd_exit' else ''} (sequence "
                "shards to head shards) and its inverse after it" if slot.verb == OverrideVerb.ALL_TO_ALL else TEXT[stage])
        cause = f"{text} ({how})"
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
