"""The simulator's gradient integrity (tests/simulator.py): one step of a parameter group's gradient on every
device, with random token counts and exact ``Fraction`` contributions, the plan's reductions, loss weights,
accumulation and divisor, against the single-device reference Σ s / T (``gi_ok``)."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from itertools import product

from simulator_plan import (
    COMPLETE,
    HEADS,
    MB,
    PARTIAL,
    SHARDED,
    SPLIT,
    TIE,
    _allreduce,
    _allreduce_copies,
    _last_for,
    _overrides,
    _prod,
    _value,
    axis_type,
    head_copies,
    reductions,
    token_axes,
)

from placement_logic import ir


def _ignored(plan: ir.Plan, count: dict, rng: random.Random) -> dict:
    """The ignored tokens (label -100) of each piece that the plan's count includes (tokens: count_ignored):
    0 to 2 per piece, one at least in the first; none where the count is of the labelled tokens only."""
    if not _overrides(plan, "tokens", "count_ignored", None):
        return {}
    ignored = {key: rng.randint(0, 2) for key in count}
    first = next(iter(ignored))
    ignored[first] = max(1, ignored[first])
    return ignored


def _ignored_terms(plan: ir.Plan, count: dict, rng: random.Random) -> dict:
    """The ignored tokens of each piece whose loss terms the loss sums (tokens: ignored_in_loss: no ignore_index,
    no loss mask): 0 to 2 per piece, one at least in the first; none where the cross entropy ignores them."""
    if not _overrides(plan, "tokens", "ignored_in_loss", None):
        return {}
    terms = {key: rng.randint(0, 2) for key in count}
    first = next(iter(terms))
    terms[first] = max(1, terms[first])
    return terms


# an ignored token's term's gradient contribution (its softmax, label -100 matching no word): far larger than the
# drawn contributions (|s| <= 4), so no normaliser (a count with the ignored tokens too) can compensate it
IGNORED_TERM = Fraction(10 ** 6)


def _clamped(plan: ir.Plan) -> bool:
    """Whether each microbatch's local count is clamped to >= 1 before it is summed and reduced: a piece may
    then hold no token."""
    return bool(_overrides(plan, "tokens", "clamp_before_reduce", None))


def _draw_counts(plan: ir.Plan, tokens: list[str], sizes: dict[str, int], rng: random.Random) -> dict:
    """The token count of each piece ((token coordinates, microbatch)): varying only along the token axes and
    microbatches, all one drawn value where the plan states equal counts; the step holds a token."""
    equal = bool(_overrides(plan, "tokens", "equal", None))
    clamp = _clamped(plan)
    count: dict = {}
    c0 = rng.randint(1, 3)
    for tc in product(*[range(sizes[a]) for a in tokens]):
        for mu in range(sizes[MB]):
            count[(tc, mu)] = c0 if equal else rng.randint(0 if clamp else 1, 3)
    if clamp and not equal and len(count) >= 2 and rng.random() < 0.5:
        # an empty piece beside a full one, the case a clamp changes (drawn at random it is rare on small meshes)
        first, second = list(count)[:2]
        count[first], count[second] = 0, max(count[second], 1)
    if not any(count.values()):  # the step holds a token
        count[next(iter(count))] = 1
    return count


def _divisor(plan: ir.Plan, group: str, sizes: dict[str, int], bindings: dict, loss: str, tokens: list[str]):
    """What the accumulated gradient is divided by: the group's ``grads: divide``, else the loss's (the token
    ranks for a per-device mean, and the microbatches too for a per-microbatch one), else 1."""
    div_o = _last_for(plan, "grads", "divide", group)
    if div_o is not None:
        return _value(div_o.by, sizes, plan, bindings)
    if loss == "per_device_mean":
        return _prod(sizes[a] for a in tokens)
    if loss == "per_microbatch_mean":
        return _prod(sizes[a] for a in tokens) * sizes[MB]
    return Fraction(1)


def _accumulated(plan: ir.Plan, group: str, bufs: list[dict], devices: list, sizes: dict[str, int], bindings: dict,
                 loss: str, tokens: list[str]) -> tuple[dict, Fraction] | None:
    """(each device's gradient accumulated over the microbatches' reduced buffers, its divisor); None where the
    step's microbatches are not whole rounds of the nested schedule the plan states."""
    m = sizes[MB]
    acc_o = _last_for(plan, "grads", "no_accumulation_buffer", group)
    final = ({d: sum((b[d] for b in bufs), Fraction(0)) for d in devices} if acc_o is None else dict(bufs[-1]))
    # nested accumulation: the step's m microbatches as m / M rounds of a pipeline schedule of M
    nest = _overrides(plan, "accumulation", None, None)
    if not nest:
        return final, _divisor(plan, group, sizes, bindings, loss, tokens)
    per_round = _value(nest[-1].by, sizes, plan, bindings)
    if per_round.denominator != 1 or m % int(per_round):
        return None
    ranks = _prod(sizes[a] for a in tokens)
    if nest[-1].verb == "rescaled_every_round":
        M = int(per_round)
        rounds = m // M
        final = {d: Fraction(0) for d in devices}
        for r in range(rounds):  # add this round's microbatches (each loss / rounds), then scale the buffer
            final = {d: final[d] + sum((bufs[r * M + j][d] for j in range(M)), Fraction(0)) / rounds for d in devices}
            final = {d: v / M for d, v in final.items()}
        return final, ranks
    if nest[-1].verb == "outer_undivided":
        return final, ranks * per_round  # the schedule divides by M; the rounds are summed
    if nest[-1].verb == "inner_undivided":
        return final, ranks * Fraction(m) / per_round  # the microbatches summed; / the rounds
    return final, _divisor(plan, group, sizes, bindings, loss, tokens)


def _gathered(plan: ir.Plan, tokens: list[str]) -> tuple[list[str], list[str]]:
    """(the axes a loss computed on the gathered sequence is gathered over (loss: on_gathered_sequence), the
    other token axes)."""
    said = _overrides(plan, "loss", "on_gathered_sequence", None)
    gathered = list(dict.fromkeys(said[-1].axes or ())) if said else []
    return gathered, [a for a in tokens if a not in gathered]


def _loss_path(plan: ir.Plan) -> str:
    """The main loss's normalisation (loss[TERM] is a loss term's path: term_ok; on_gathered_sequence says where
    the loss is computed, not how it is normalised)."""
    said = [o for o in _overrides(plan, "loss", None, None) if o.verb != "on_gathered_sequence"]
    return said[-1].verb if said else "global_mean"


def _whole_count(count: dict, dev: tuple, pos: dict[str, int], tokens: list[str], gathered: list[str],
                 n: dict[str, int], u: int) -> Fraction:
    """Under a loss gathered over ``gathered``: device ``dev``'s count of microbatch u is the sum of the counts of
    every rank that shares its coordinates on the other token axes (the whole sequence)."""
    coords = {a: dev[pos[a]] for a in tokens}
    whole = Fraction(0)
    for other in product(*[range(n[a]) for a in gathered]):
        moved = {**coords, **dict(zip(gathered, other))}
        whole += count[(tuple(moved[a] for a in coords), u)]
    return whole


def _routed(dev: tuple, complete: list[str], pos: dict[str, int], n: dict[str, int]) -> list[tuple]:
    """The devices whose tokens reach ``dev``'s element: ``dev`` with its coordinate on each complete axis
    replaced by every rank of that axis (a routed expert receives tokens from every rank of its axis)."""
    out = []
    for extra in product(*[range(n[a]) for a in complete]):
        src = list(dev)
        for a, c in zip(complete, extra):
            src[pos[a]] = c
        out.append(tuple(src))
    return out


def _reduced(plan: ir.Plan, bufs: list[dict], k: Counter, pos: dict[str, int], joint, n: dict[str, int]) -> list[dict]:
    """Each microbatch's buffers after the plan's all-reduces of the group's gradient, axis by axis: k[a] over the
    axis, then one over each group of n/K consecutive ranks holding one kv head (of the axis, or of the joint
    index) where the schedule reduces over the copies."""
    import simulator_kvproduct as kvp

    for a in pos:
        for _ in range(k[a]):
            bufs = [_allreduce(b, pos[a]) for b in bufs]
        bufs = kvp.reduce_copies(bufs, a, k, pos, joint, n, lambda b, a=a: _allreduce_copies(
            b, pos[a], n[a] // int(plan.model.transformer.kv_heads.value)))
    return bufs


def gi_ok(plan: ir.Plan, group: str, sizes: dict[str, int], rng: random.Random, bindings: dict) -> bool:
    axes = list(plan.mesh.names)
    n = {a: sizes[a] for a in axes}
    m = sizes[MB]
    types = {a: axis_type(plan, group, a) for a in axes}
    copies = {a: c for a in axes if (c := head_copies(plan, group, a, n[a])) is not None}
    import simulator_kvproduct as kvp  # kv heads copied over several tensor axes: the joint index

    joint = kvp.layout(plan, group, n)
    copies = kvp.off_layout(copies, joint)
    types.update(dict.fromkeys(list(copies) + list(kvp.axes(joint)), HEADS))
    k = reductions(plan, group)
    tokens = token_axes(plan)
    devices = list(product(*[range(n[a]) for a in axes]))
    pos = {a: i for i, a in enumerate(axes)}
    clamp = _clamped(plan)
    # ε added to each microbatch's local count before it is summed and reduced; single-device training adds it once
    eps_o = _overrides(plan, "tokens", "eps_before_reduce", None)
    eps = _value(eps_o[-1].by, sizes, plan, bindings) if eps_o else Fraction(0)

    count = _draw_counts(plan, tokens, sizes, rng)
    # a loss computed on the sequence gathered over these axes: each of their ranks counts every rank's tokens there
    gathered, own_tokens = _gathered(plan, tokens)
    ignored = _ignored(plan, count, rng)
    terms = _ignored_terms(plan, count, rng)

    def tcoord(dev) -> tuple:
        return tuple(dev[pos[a]] for a in tokens)

    total_tokens = sum(count.values())

    # the element a device holds: its coordinates on sharded (and complete) axes; on a heads axis the
    # element its copy group holds (rank // copies)
    elem_axes = [a for a in axes if types[a] in (SHARDED, COMPLETE, HEADS)]

    own_axes = kvp.off_axes(elem_axes, joint)

    def elem(dev) -> tuple:  # over several copy axes: the head their joint index names
        return tuple(dev[pos[a]] // copies[a] if a in copies else dev[pos[a]] for a in own_axes) \
            + kvp.head_key(dev, pos, joint, n)

    # true per-source contributions: vary along partial, split, tie and complete axes; not along invariant ones;
    # on a heads axis each rank's own query heads are a source of their own
    src_axes = [a for a in axes if types[a] in (PARTIAL, SPLIT, TIE, COMPLETE, HEADS)]
    contrib: dict = {}

    def source(dev, mu) -> tuple:
        return (elem(dev), tuple(dev[pos[a]] for a in src_axes), mu)

    added: dict = {}  # the ignored tokens' terms each (element, source) adds where the loss sums them

    def draw(key: tuple, dev) -> Fraction:
        if key not in contrib:
            held = all(not (types[a] == TIE and 0 < dev[pos[a]] < n[a] - 1) for a in axes)
            holds = held and count[(tcoord(dev), key[2])] > 0  # a piece without a token contributes nothing
            contrib[key] = Fraction(rng.randint(-4, 4), rng.randint(1, 3)) if holds else Fraction(0)
            added[key] = IGNORED_TERM * terms.get((tcoord(dev), key[2]), 0) if held else 0
        return contrib[key]

    # every (element, source) pair: a routed expert receives tokens from every rank of its axis
    complete_axes = [a for a in axes if types[a] == COMPLETE]
    for dev in devices:
        for mu in range(m):
            for src in _routed(dev, complete_axes, pos, n):
                draw((elem(dev), tuple(src[pos[a]] for a in src_axes), mu), src)

    # loss weights
    loss = _loss_path(plan)
    tok_o = _overrides(plan, "tokens", "reduce", None)
    norm_axes = list(tok_o[-1].axes or ()) if tok_o else own_tokens

    # global mean: the device's count accumulated over microbatches, all-reduced over each listed axis in turn
    def counted(c: int, key: tuple) -> Fraction:
        return (max(c, 1) if clamp else c) + eps + ignored.get(key, 0)

    def local_count(dev, u) -> Fraction:
        """The count of the tokens the device's loss covers in microbatch u (the whole sequence's when gathered)."""
        return (_whole_count(count, dev, pos, tokens, gathered, n, u) if gathered
                else counted(count[(tcoord(dev), u)], (tcoord(dev), u)))

    reduced = {d: sum(local_count(d, u) for u in range(m)) for d in devices}
    for a in norm_axes:
        reduced = _allreduce(reduced, pos[a])

    def normaliser(dev, mu) -> Fraction:
        if loss == "sum":
            return Fraction(1)
        if loss == "per_microbatch_mean":
            key = (tcoord(dev), mu)
            return Fraction(local_count(dev, mu) if clamp or ignored or gathered else count[key])
        if loss == "per_device_mean":
            return Fraction(sum(local_count(dev, u) for u in range(m)))
        return Fraction(reduced[tuple(dev)])

    # local gradient of each device and microbatch (buffer position: the element it holds)
    def local(dev, mu) -> Fraction:
        out = Fraction(0)
        for src in _routed(dev, complete_axes, pos, n):  # tokens routed from that rank to this rank's expert
            key = (elem(dev), tuple(src[pos[a]] for a in src_axes), mu)
            out += (contrib[key] + added.get(key, 0)) / normaliser(src, mu)
        return out

    bufs = _reduced(plan, [{dev: local(dev, mu) for dev in devices} for mu in range(m)], k, pos, joint, n)
    accumulated = _accumulated(plan, group, bufs, devices, sizes, bindings, loss, own_tokens)
    if accumulated is None:
        return True  # no such configuration: the microbatches are not whole rounds
    final, div = accumulated
    if div == 0:
        return False
    return _matches_reference(final, div, contrib, elem, devices, 1 if loss == "sum" else total_tokens + eps)


def _matches_reference(final: dict, div: Fraction, contrib: dict, elem, devices: list, target: Fraction) -> bool:
    """Whether every device's gradient is the reference Σ s / T of its element (each true contribution once)."""
    ref: dict = {}
    for (e, _, _), s in contrib.items():
        ref[e] = ref.get(e, Fraction(0)) + s
    return all(final[d] / div == ref[elem(d)] / target for d in devices)
