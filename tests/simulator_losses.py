"""The simulator's loss terms (docs/semantics.md, "Loss terms"): one step of a loss term's
contributions to a parameter group it reaches, executed on every device with exact fractions,
against the objective the model states. Independent of the checker's code; it uses the step
helpers of ``simulator`` (axis types, the schedule's reductions, all-reduce)."""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

import simulator_termranks  # a term added or divided on some ranks only
from simulator import (
    COMPLETE,
    MB,
    PARTIAL,
    SHARDED,
    SPLIT,
    TIE,
    _allreduce,
    _prod,
    _value,
    axis_type,
    groups_of,
    reductions,
    token_axes,
)

from placement_logic import ir

# a term's own path (its normaliser); its other statements (a divisor, ranks, the aux term's routing statistics,
# checked by GI aux_stats) are no path
PATHS = ("per_microbatch_mean", "per_device_mean", "global_mean", "sum")
TERM_GROUPS = {"aux": ("router",), "z": ("router",), "mtp": ("embedding", "dense")}  # docs/semantics.md


def _divisor(plan: ir.Plan, mine: list, path: str, sizes: dict[str, int], tokens: list[str], bindings: dict):
    """What the term's summed gradient is divided by: its own ``loss[term]: divide``, else the path's
    (the token ranks for a per-device mean, and the microbatches too for a per-microbatch one), else 1."""
    div_o = [o for o in mine if o.target == "loss" and o.verb == "divide"]
    if div_o:
        return _value(div_o[-1].by, sizes, plan, bindings)
    if path == "per_device_mean":
        return _prod(sizes[a] for a in tokens)
    if path == "per_microbatch_mean":
        return _prod(sizes[a] for a in tokens) * sizes[MB]
    return Fraction(1)


def term_ok(plan: ir.Plan, term: str, group: str, sizes: dict[str, int], rng: random.Random, bindings: dict) -> bool:
    """One step of a loss term's contributions to ``group`` (docs/semantics.md, "Loss terms"): the
    group's reductions as the placements give them (no override), the term's path from its own
    ``loss[term]`` / ``tokens[term]`` overrides, against the objective the model states.
    ``per_microbatch_mean``: one value per device of the data and expert axes and microbatch (the
    context ranks each hold a part of it), the objective their mean; ``global_mean``: per token, the
    objective divided by the step's tokens; ``sum``: per token, summed."""
    from dataclasses import replace

    objective = {n: o for n, o, _ in plan.model.loss_terms}[term]
    mine = [o for o in plan.overrides if o.target in ("loss", "tokens") and o.group == term]
    base = replace(plan, overrides=())
    axes = list(plan.mesh.names)
    n = {a: sizes[a] for a in axes}
    m = sizes[MB]
    types = {a: axis_type(base, group, a) for a in axes}
    k = reductions(base, group)
    unit = objective == "per_microbatch_mean"
    tokens = [a for a in token_axes(plan) if not (unit and plan.role(a) is ir.Role.CONTEXT)]
    devices = list(product(*[range(n[a]) for a in axes]))
    pos = {a: i for i, a in enumerate(axes)}
    count = {(tc, mu): rng.randint(1, 3) for tc in product(*[range(n[a]) for a in tokens]) for mu in range(m)}

    def tcoord(dev) -> tuple:
        return tuple(dev[pos[a]] for a in tokens)

    elem_axes = [a for a in axes if types[a] in (SHARDED, COMPLETE)]
    src_axes = [a for a in axes if types[a] in (PARTIAL, SPLIT, TIE, COMPLETE)]

    def elem(dev) -> tuple:
        return tuple(dev[pos[a]] for a in elem_axes)

    contrib: dict = {}
    complete = [a for a in axes if types[a] == COMPLETE]
    for dev in devices:
        for mu in range(m):
            for extra in product(*[range(n[a]) for a in complete]):
                src = list(dev)
                for a, c in zip(complete, extra):
                    src[pos[a]] = c
                key = (elem(dev), tuple(src[pos[a]] for a in src_axes), mu)
                if key not in contrib:
                    holds = all(not (types[a] == TIE and 0 < src[pos[a]] < n[a] - 1) for a in axes)
                    contrib[key] = Fraction(rng.randint(-4, 4), rng.randint(1, 3)) if holds else Fraction(0)
    natural = {"per_microbatch_mean": "per_microbatch_mean", "global_mean": "global_mean", "sum": "sum"}[objective]
    path_o = [o for o in mine if o.target == "loss" and o.verb in PATHS]
    path = path_o[-1].verb if path_o else natural
    tok_o = [o for o in mine if o.target == "tokens"]
    reduced = {d: sum(count[(tcoord(d), u)] for u in range(m)) for d in devices}
    for a in (list(tok_o[-1].axes or ()) if tok_o else tokens):
        reduced = _allreduce(reduced, pos[a])

    def normaliser(dev, mu) -> Fraction:
        if path == "sum" or (path == "per_microbatch_mean" and unit):
            return Fraction(1)
        if path == "per_microbatch_mean":
            return Fraction(count[(tcoord(dev), mu)])
        if path == "per_device_mean":
            return Fraction(sum(count[(tcoord(dev), u)] for u in range(m)))
        return Fraction(reduced[tuple(dev)])

    def local(dev, mu) -> Fraction:
        out = Fraction(0)
        for extra in product(*[range(n[a]) for a in complete]):
            src = list(dev)
            for a, c in zip(complete, extra):
                src[pos[a]] = c
            src = tuple(src)
            out += contrib[(elem(dev), tuple(src[pos[a]] for a in src_axes), mu)] / normaliser(src, mu)
        return out

    weight = {dev: simulator_termranks.weight(plan, term, dict(zip(axes, dev)), sizes, bindings) for dev in devices}
    bufs = [{dev: local(dev, mu) * weight[dev] for dev in devices} for mu in range(m)]  # a term on some ranks
    for a in axes:
        for _ in range(k[a]):
            bufs = [_allreduce(b, pos[a]) for b in bufs]
    final = {d: sum((b[d] for b in bufs), Fraction(0)) for d in devices}
    div = _divisor(plan, mine, path, sizes, tokens, bindings)
    ref: dict = {}
    for (e, _, _), s in contrib.items():
        ref[e] = ref.get(e, Fraction(0)) + s
    target = (_prod(n[a] for a in tokens) * m if unit else Fraction(1) if objective == "sum"
              else Fraction(sum(count.values())))
    return all(final[d] / div == ref[elem(d)] / target for d in devices)


def term_violations(plan: ir.Plan, sizes: dict[str, int], rng: random.Random, bindings: dict) -> set:
    """("term", term, group) for every loss term's contribution to a group it reaches that is wrong."""
    present = groups_of(plan)
    return {("term", t, g) for t, _, _ in plan.model.loss_terms for g in TERM_GROUPS[t]
            if g in present and not term_ok(plan, t, g, sizes, rng, bindings)}
