"""The costs of context parallelism's attention exchange as a plan states it (``ir.actflow``
region ``context``).

The derived schedule (``ir.collectives``, docs/costs.md) passes the key/value blocks around the
ring of each context group: c − 1 point-to-point steps per layer per microbatch in forward, and in
backward c − 1 steps for the key/value blocks again plus c − 1 for their gradients, which travel
with them and arrive summed at the rank that owns the block (the reduce-scatter of dK, dV). A
stated slot replaces its share: the forward exchange (``fwd_entry``), the backward exchange
(``bwd_exit``) or the gradients' ring (``bwd_entry``), each one ring of g − 1 steps over the group g
of every pass it names (no ring over no axis); ``no_reduce`` removes the gradients' ring, and
``reduce_copy`` moves the same bytes as derived. Ulysses (``all_to_all``) replaces the exchange by two
all-to-alls per layer per microbatch and pass (q, k, v before the attention, its output after it: in
backward their gradients), each moving (g − 1)/g of the rank's heads of them; the key/value gradients
come back with the inverse all-to-all, so no ring of theirs remains.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from .buffers import Collective, Kind, Payload, PayloadTensor, Phase, link_of
from .nodes import Const, Op, State, Sym
from .overrides import OverrideTarget, OverrideVerb
from .ulysses_split import payload

RULE = "context parallel"
PHASE = {"fwd_entry": Phase.FORWARD, "bwd_exit": Phase.BACKWARD, "bwd_entry": Phase.BACKWARD}
WHAT = {"fwd_entry": "ring-pass K,V blocks", "bwd_exit": "ring-pass K,V blocks again in backward",
        "bwd_entry": "ring-pass the K,V gradients to their owners"}


def _ring(axes: tuple[str, ...]):
    prod = Sym(axes[0]) if len(axes) == 1 else Op("*", tuple(Sym(a) for a in axes))
    return Op("-", (prod, Const(Fraction(1))))


def _times(x, per):
    return x if isinstance(per, Const) and per.value == 1 else Op("*", (x, per))


def passes(axes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """A written axis list as collectives (rings here, ir.actflow's steps too): a repeated axis starts another one."""
    out: list[list[str]] = []
    for a in axes:
        if not out or a in out[-1]:
            out.append([])
        out[-1].append(a)
    return [tuple(p) for p in out]


def adjust(plan, out: list, flow, per) -> list:
    """``out`` (the schedule so far) with every stated slot of ``flow`` (an ``ir.actflow.Flow``) in
    place of its derived ring."""
    mesh = plan.mesh.names
    pay = Payload(PayloadTensor.KV, (), "one key/value block (2·s/cp·b·h·kv_heads/heads)")
    for name, slot in flow.slots:
        if not slot.verb:
            continue
        phase = PHASE[name]
        share = _times(_ring(flow.tensor), per)
        for i, c in enumerate(out):
            if c.kind is Kind.P2P and c.phase is phase and c.axes == flow.tensor and c.rule.startswith(RULE):
                out[i] = replace(c, count=Op("-", (c.count, share)))
                break
        if slot.verb == OverrideVerb.ALL_TO_ALL:  # Ulysses
            if name != "bwd_entry":
                out += _ulysses(plan, slot, name, per)
            continue
        axes = [s.axes for s in slot.steps if s.axes]
        if any(s.kind == "copy" for s in slot.steps):  # ir.actflow.COPY: the derived bytes, moved on a copy
            axes = [s.axes for s in slot.steps]
        for p in (q for a in axes for q in passes(a)):
            group = tuple(a for a in mesh if a in p)
            out.append(Collective(Kind.P2P, State.ACTIVATIONS, group, link_of(plan, group), phase,
                                  _times(_ring(group), per), pay,
                                  f"override {'activations' if name == 'fwd_entry' else 'activation_grads'}[context] "
                                  f"(line {slot.span.line}): {WHAT[name]} over ({', '.join(group)})"))
    return out


def _head_rule(plan, name: str) -> str | None:
    """The head split a stated ``heads[...]`` gives the direction's all-to-alls (None: none stated, even)."""
    pair = "forward" if name == "fwd_entry" else "backward"
    stated = [o for o in plan.overrides if o.target == OverrideTarget.HEADS and o.group != "kv"]
    if not stated:
        return None
    own = [o for o in stated if o.group in (None, pair)]
    fwd = [o for o in stated if o.group in (None, "forward")]
    got = own or (fwd if pair == "backward" else [])
    return str(got[-1].verb) if got else OverrideVerb.UNEVEN.value


def _ulysses(plan, slot, name: str, per) -> list:
    rule = _head_rule(plan, name)
    if rule is None:
        ulysses = Payload(PayloadTensor.ULYSSES, (), "q, k, v and the attention output of the rank's heads "
                          "(s/cp·b·h·(2 + 2·kv_heads/heads)/tp)")
    else:
        kv = [o for o in plan.overrides if o.target == OverrideTarget.HEADS and o.group == "kv"]
        kv_rule = str(kv[-1].verb) if kv else OverrideVerb.REPEAT.value
        ulysses = Payload(payload(rule, kv_rule), (), f"q, k, v and the attention output of the largest rank's share "
                          f"of the heads split {rule} (kv heads: {kv_rule}): its query and kv heads from each of the g − 1 "
                          f"others (ir.ulysses_split)")
    target = OverrideTarget.ACTIVATIONS if name == "fwd_entry" else OverrideTarget.ACTIVATION_GRADS
    out = []
    for s in slot.steps:
        group = tuple(a for a in plan.mesh.names if a in s.axes)
        if group:
            out.append(Collective(Kind.ALL_TO_ALL, State.ACTIVATIONS, group, link_of(plan, group), PHASE[name], per,
                                  ulysses, f"override {target}[context] (line {slot.span.line}): Ulysses all-to-alls "
                                  f"before and after the attention over ({', '.join(group)})"))
    return out
