"""The obligation of sliding-window attention under context parallelism (check.cpwindow): ``GI layout[window]``.

Where the model states a window (``attention { window = W }``) and the plan has a context axis: on every rank
of the context group and every query it holds, the keys the ranks let in are exactly the single-device window's,
0 ≤ p − k < W on global positions. Decided exactly at the declared sizes (c, W, N = seq; a pinned size first) by
check.cpwindow.difference; the z3 negation pins the context axes at those sizes and is sat exactly where a pair
differs. The replay names the query and the key, their ranks and slots, and what each side computes.
Nothing moves otherwise than derived: the costs are the derived ones.
"""

from __future__ import annotations

from math import prod

import z3

from ..diagnostics import NO_SPAN, Span
from . import cpwindow, cpwindow_packs
from . import encode_cplayout_packs as packs
from .report import Counterexample

NAME = "GI layout[window]"


def obligations(plan, context: tuple[str, ...], ctx, plan_span: Span, obligation) -> list:
    wm = cpwindow.model(plan, context)
    if wm is None:
        return []
    at = cpwindow.declared(plan, wm, ctx.bindings, ctx.pinned)
    span = wm.span if wm.span != NO_SPAN else wm.window_span
    what = (f"each query of the context group ({', '.join(wm.context)}) attends exactly the keys of its sliding window "
            f"on the global positions, 0 ≤ p − k < W, in its own document (the ranks: {cpwindow.DOES[wm.verb]}; the "
            f"inputs {wm.layout})")
    known = wm.layout in cpwindow.LAYOUTS + cpwindow_packs.PACKED
    why = (at if isinstance(at, str) else f"the window is not decided on the inputs' layout {wm.layout}" if not known
           else "chunks beside the window (attention { chunk = C }) are not decided"
           if plan.model.attention_chunk is not None else cpwindow.ulysses(plan, wm.context, wm.verb))
    if why is not None:
        return undecided(NAME, span, what, why, obligation)
    sizes, w, n = at
    found, why = decide(wm, prod(sizes.values()), n, w)
    if why is not None:
        return undecided(NAME, span, what, why, obligation)
    return decided(NAME, span, what, sizes, found, f"window W = {w}, sequence N = {n} (every query and key"
                   + (", every pack of documents)" if packed(wm) else ")"),
                   lambda wit: replay(ctx, wm, wit, sizes, w, n), obligation)


def undecided(name: str, span: Span, what: str, why: str, obligation) -> list:
    """The mask's obligation left unknown: ``why`` it is not decided."""
    from .rules import GRADIENT_INTEGRITY

    return [obligation(name, GRADIENT_INTEGRITY, span, what, lambda env: ([], lambda m: {}),
                       lambda w: None, unknown=f"not decided: {why}")]


def decided(name: str, span: Span, what: str, sizes: dict, found: dict | None, lengths: str, replay, obligation) -> list:
    """The mask's obligation decided at the declared context ``sizes`` (``lengths``: the rest of the note): the z3
    negation pins the context axes there and is sat exactly where ``found`` names a pair that differs."""
    from .rules import GRADIENT_INTEGRITY

    note = (f"decided at the declared sizes: {', '.join(f'{a} = {v}' for a, v in sizes.items())}, {lengths}",)

    def negation(env):
        cons = [env.fix(a, v) for a, v in sizes.items()] + [z3.BoolVal(found is not None, env.sess.ctx)]
        return cons, lambda model: {"sizes": env.size_values(model)}

    return [obligation(name, GRADIENT_INTEGRITY, span, what, negation, replay, notes=note)]


def packed(wm) -> bool:
    """Whether the decision ranges over packs of documents (check.cpwindow_packs)."""
    return wm.layout in cpwindow_packs.PACKED or wm.verb == cpwindow_packs.ACROSS


def decide(wm, c: int, n: int, w: int) -> tuple[dict | None, str | None]:
    """(the first pair that differs, why undecided): check.cpwindow on one sequence, check.cpwindow_packs on packs."""
    if packed(wm):
        return cpwindow_packs.decide(wm.verb, wm.layout, c, n, w)
    return cpwindow.difference(wm.verb, wm.layout, c, n, w), None


def group_at(wit: dict, at: dict, context: tuple[str, ...], n: int) -> tuple[dict, int] | None:
    """(the witness's sizes, the context group's size c) where the witness keeps the declared context sizes ``at``
    (the lengths, the sequence and the decision are theirs) and cuts the sequence into 2c blocks; else None."""
    sizes = wit["sizes"]
    if any(sizes.get(a) != v for a, v in at.items()):
        return None
    c = cpwindow.group(sizes, context, n)
    return None if c is None else (sizes, c)


def counterexample(ctx, sizes: dict, d: dict, single: str, cause: str, values: tuple) -> Counterexample:
    """The replay of the pair ``d`` the ranks' mask lets in otherwise than one device: ``single``, what one device
    does with the key; ``cause``, the root cause (what the ranks do instead of the single-device mask)."""
    p, k = d["query"], d["key"]
    eq = (f"query {p} (rank {d['q_rank']}, slot {d['q_slot']}) and key {k} (rank {d['k_rank']}, slot {d['k_slot']}): "
          f"the ranks' mask {'lets it in' if d['computed'] else 'leaves it out'}, {single}")
    diag = (f"the attention output of position {p} sums another set of values than one device's: the root cause is "
            f"{cause}", "every layer after the attention, the loss and so every gradient of the step are computed from it")
    devices = ((f"rank {d['q_rank']}", "the query's"), (f"rank {d['k_rank']}", "the key's"))
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, diag, ctx.command(sizes))


def replay(ctx, wm, wit: dict, at: dict, w: int, n: int) -> Counterexample | None:
    """The first pair the ranks let in otherwise than one device, recomputed at the witness's sizes (the declared
    context sizes ``at`` only: the window, the sequence and the decision are theirs)."""
    got = group_at(wit, at, wm.context, n)
    d = decide(wm, got[1], n, w)[0] if got is not None else None
    if d is None:
        return None
    sizes, c = got
    p, k = d["query"], d["key"]
    other = "pack" in d and packs.doc_of(d["pack"], c, p) != packs.doc_of(d["pack"], c, k)
    want = "in another document, out" if other else "in" if 0 <= p - k < w else "out"
    stmt = f"override layout[causal_mask]: {wm.verb} at line {wm.span.line}" if wm.verb else "derived"
    values = (("sequence", f"N = {n} positions in 2c = {2 * c} chunks of {n // (2 * c)}, the inputs {wm.layout}"),
              ("window", f"W = {w}: a query p attends the keys k with 0 ≤ p − k < W"))
    if "pack" in d:
        values += (("pack", f"{packs.describe(d['pack'], c)}; query {p} in document {packs.doc_of(d['pack'], c, p)}, "
                            f"key {k} in document {packs.doc_of(d['pack'], c, k)}"),)
    return counterexample(ctx, sizes, d, f"single-device key {k} is {want} of the window (p − k = {p - k}, "
                          f"slot(p) − slot(k) = {d['q_slot'] - d['k_slot']}, W = {w})",
                          f"the sliding window under context parallelism, {cpwindow.DOES[wm.verb]} ({stmt}), not the "
                          "window on the global positions", values)
