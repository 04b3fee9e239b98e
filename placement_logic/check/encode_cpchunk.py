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

from math import prod

from ..diagnostics import NO_SPAN
from . import cpchunk, cpwindow
from .encode_cpwindow import counterexample, decided, group_at, undecided
from .report import Counterexample

NAME = "GI layout[chunk]"


def obligations(plan, context: tuple[str, ...], ctx, plan_span, obligation) -> list:
    cm = cpchunk.model(plan, context)
    if cm is None:
        return []
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
        return undecided(NAME, span, what, why, obligation)
    sizes, size, n = at
    found = cpchunk.difference(cm.verb, cm.layout, prod(sizes.values()), n, size)
    return decided(NAME, span, what, sizes, found, f"chunk C = {size}, sequence N = {n} (every query and key)",
                   lambda wit: replay(ctx, cm, wit, sizes, size, n), obligation)


def replay(ctx, cm, wit: dict, at: dict, size: int, n: int) -> Counterexample | None:
    """The first pair the ranks let in otherwise than one device, recomputed at the witness's sizes (the declared
    context sizes ``at`` only)."""
    got = group_at(wit, at, cm.context, n)
    d = cpchunk.difference(cm.verb, cm.layout, got[1], n, size) if got is not None else None
    if d is None:
        return None
    sizes, c = got
    p, k = d["query"], d["key"]
    want = "in" if k <= p and k // size == p // size else "out"
    stmt = f"override layout[causal_mask]: {cm.verb} at line {cm.span.line}"
    values = (("sequence", f"N = {n} positions in 2c = {2 * c} blocks of {n // (2 * c)}, the inputs {cm.layout}"),
              ("chunk", f"C = {size}: a query p attends the keys k ≤ p with ⌊k/C⌋ = ⌊p/C⌋"))
    return counterexample(ctx, sizes, d, f"single-device key {k} is {want} of the query's chunk (chunk ⌊p/C⌋ = "
                          f"{p // size}, ⌊k/C⌋ = {k // size}; slot chunks {d['q_slot'] // size} and "
                          f"{d['k_slot'] // size}; C = {size})", f"chunked attention under context parallelism, "
                          f"{cpchunk.DOES[cm.verb]} ({stmt}), not the chunks of the global positions", values)
