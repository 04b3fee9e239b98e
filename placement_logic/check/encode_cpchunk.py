"""The obligation of chunked (local) attention under context parallelism (check.cpchunk): ``GI layout[chunk]``.

Where the model states an attention chunk (``attention { chunk = C }``) and the plan has a context axis: on every
rank of the context group and every query it holds, the keys the ranks let in are exactly the single-device
chunked mask's, k ≤ p in p's chunk of C global positions. Decided exactly at the declared sizes (c, C, N = seq; a
pinned size first) by check.cpchunk.difference; the z3 negation pins the context axes at those sizes (the scope
"all sizes with cp = ...") and is sat exactly where a pair differs. The replay names the query and the key, their
ranks and slots, and what each side computes. Nothing moves otherwise than derived: the costs are the derived
ones (the FLOPs count each query's chunk, costs.window).
"""

from __future__ import annotations

import z3

from ..diagnostics import NO_SPAN
from . import cpchunk, cpwindow
from .report import Counterexample

NAME = "GI layout[chunk]"


def obligations(plan, context: tuple[str, ...], ctx, plan_span, obligation) -> list:
    cm = cpchunk.model(plan, context)
    if cm is None:
        return []
    from .rules import GRADIENT_INTEGRITY

    span = cm.span if cm.span != NO_SPAN else cm.chunk_span
    what = (f"each query of the context group ({', '.join(cm.context)}) attends exactly the keys of its own chunk of C "
            f"global positions at or before it, ⌊k/C⌋ = ⌊p/C⌋ and k ≤ p (the ranks: {cpchunk.DOES[cm.verb]}; the "
            f"inputs {cm.layout})")
    at = cpwindow.declared(plan, cm, ctx.bindings, ctx.pinned, cm.chunk, "the chunk")
    why = (at if isinstance(at, str) else
           f"the chunks are decided on the contiguous and zigzag layouts, not on {cm.layout}"
           if cm.layout not in cpwindow.LAYOUTS else
           "a sliding window beside the chunks is not decided" if cm.windowed else
           cpwindow.ulysses(plan, context, cm.verb))
    if why is not None:
        return [obligation(NAME, GRADIENT_INTEGRITY, span, what, lambda env: ([], lambda m: {}),
                           lambda w: None, unknown=f"not decided: {why}")]
    sizes, size, n = at
    c = 1
    for v in sizes.values():
        c *= v
    note = (f"decided at the declared sizes: {', '.join(f'{a} = {v}' for a, v in sizes.items())}, chunk C = {size}, "
            f"sequence N = {n} (every query and key)",)
    found = cpchunk.difference(cm.verb, cm.layout, c, n, size)

    def negation(env):
        cons = [env.fix(a, v) for a, v in sizes.items()] + [z3.BoolVal(found is not None, env.sess.ctx)]
        return cons, lambda model: {"sizes": env.size_values(model)}

    return [obligation(NAME, GRADIENT_INTEGRITY, span, what, negation,
                       lambda wit: replay(ctx, cm, wit, sizes, size, n), notes=note)]


def replay(ctx, cm, wit: dict, at: dict, size: int, n: int) -> Counterexample | None:
    """The first pair the ranks let in otherwise than one device, recomputed at the witness's sizes (the declared
    context sizes ``at`` only)."""
    sizes = wit["sizes"]
    if any(sizes.get(a) != v for a, v in at.items()):
        return None
    c = cpwindow.group(sizes, cm.context, n)
    d = cpchunk.difference(cm.verb, cm.layout, c, n, size) if c is not None else None
    if d is None:
        return None
    p, k = d["query"], d["key"]
    yes = "lets it in" if d["computed"] else "leaves it out"
    want = "in" if k <= p and k // size == p // size else "out"
    eq = (f"query {p} (rank {d['q_rank']}, slot {d['q_slot']}) and key {k} (rank {d['k_rank']}, slot {d['k_slot']}): "
          f"the ranks' mask {yes}, single-device key {k} is {want} of the query's chunk (chunk ⌊p/C⌋ = {p // size}, "
          f"⌊k/C⌋ = {k // size}; slot chunks {d['q_slot'] // size} and {d['k_slot'] // size}; C = {size})")
    stmt = f"override layout[causal_mask]: {cm.verb} at line {cm.span.line}"
    diag = (f"the attention output of position {p} sums another set of values than one device's: the root cause is "
            f"chunked attention under context parallelism, {cpchunk.DOES[cm.verb]} ({stmt}), not the chunks of the "
            "global positions",
            "every layer after the attention, the loss and so every gradient of the step are computed from it")
    values = (("sequence", f"N = {n} positions in 2c = {2 * c} blocks of {n // (2 * c)}, the inputs {cm.layout}"),
              ("chunk", f"C = {size}: a query p attends the keys k ≤ p with ⌊k/C⌋ = ⌊p/C⌋"))
    devices = ((f"rank {d['q_rank']}", "the query's"), (f"rank {d['k_rank']}", "the key's"))
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, diag, ctx.command(sizes))
