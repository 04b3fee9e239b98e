"""The MoE combine after the capacity step, on concrete router calls, written from docs/semantics.md ("The
capacity step's dropped pairs") without the checker's code: the kept pairs from simulator_capacity.dispatch,
the layer's output built as a sympy expression in the gate weights and differentiated symbolically, in the
gate weights and in the router's logits (the gate weights their softmax over the token's chosen experts).
A path departs where a token's output or its logits' gradient differs.

A call is a list of tokens, each (padded?, gate weights over the E experts, the experts it chose); the gate
weights of a token's chosen experts sum to 1. Token t has hidden state x_t = t + 1 and expert i computes
(i + 2)·x; the loss is the sum of the outputs. ``slot``: what a dropped pair's row holds (zero, a stale value,
the hidden state); ``renormalise``: none, over the kept experts, or over every chosen one.
"""

from __future__ import annotations

import random
from fractions import Fraction

import simulator_capacity as cap
import sympy

STALE = 37  # any nonzero value left in an uninitialised buffer


def layer(call: list, experts: int, top_k: int, factor: Fraction, slot: str, renormalise: str, stale=STALE):
    """Per token: (output, {dropped expert: d loss / d its gate weight}, {chosen expert: d loss / d its router
    logit}), exact; the gate weights are the softmax of the chosen experts' logits."""
    kept = cap.dispatch(call, experts, top_k, factor, False)
    out = []
    for t, (_, weights, chosen) in enumerate(call):
        g = {i: sympy.Symbol(f"g_{t}_{i}") for i in chosen}
        x = sympy.Integer(t + 1)
        mine = [i for i in chosen if (t, i) in kept]
        lost = [i for i in chosen if (t, i) not in kept]
        if renormalise == "kept" and mine:
            scale = sum(g[i] for i in mine)
        elif renormalise == "chosen":
            scale = sum(g.values())
        else:
            scale = sympy.Integer(1)
        fill = {"zero": 0, "stale": stale, "hidden": x}[slot]
        y = x + sum(g[i] / scale * (i + 2) * x for i in mine) + sum(g[i] * fill for i in lost)
        at = {g[i]: sympy.Rational(weights[i].numerator, weights[i].denominator) for i in chosen}
        # the router's logits l: g = softmax over the chosen experts = e_i / Σ e with e = exp(l), so
        # ∂/∂l_i = e_i ∂/∂e_i, evaluated at e = g (any positive e of those ratios)
        e = {i: sympy.Symbol(f"e_{t}_{i}", positive=True) for i in chosen}
        y_e = y.subs({g[i]: e[i] / sum(e.values()) for i in chosen})
        at_e = {e[i]: at[g[i]] for i in chosen}
        out.append((_frac(y.subs(at)), {i: _frac(sympy.diff(y, g[i]).subs(at)) for i in lost},
                    {i: _frac((e[i] * sympy.diff(y_e, e[i])).subs(at_e)) for i in chosen}))
    return out


def _frac(v) -> Fraction:
    r = sympy.Rational(v)
    return Fraction(int(r.p), int(r.q))


def objective(call, experts, top_k, factor, renormalises: bool):
    return layer(call, experts, top_k, factor, "zero", "kept" if renormalises else "none")


def calls(experts: int, top_k: int, seed: int = 0, tries: int = 30, longest: int = 5):
    """Random calls of real tokens, their gate weights normalised over their k choices; then calls of
    N tokens all choosing experts 0..k-1 with distinct scores, N of 2 to 10 (every expert crowded)."""
    rng = random.Random(seed)
    for _ in range(tries):
        call = []
        for _ in range(rng.randint(1, longest)):
            chosen = tuple(sorted(rng.sample(range(experts), top_k)))
            w = [rng.randint(1, 5) for _ in chosen]
            call.append((False, tuple(Fraction(w[chosen.index(i)], sum(w)) if i in chosen else Fraction(0)
                                      for i in range(experts)), chosen))
        yield call
    for n in range(2, 11):
        call = []
        for _ in range(n):
            w = [rng.randint(1, 9) for _ in range(top_k)]
            call.append((False, tuple(Fraction(w[i], sum(w)) if i < top_k else Fraction(0) for i in range(experts)),
                         tuple(range(top_k))))
        yield call


def differs(experts, top_k, factor, slot, renormalise, renormalises, seed=0):
    """A call on which the path's outputs or dropped gate gradients differ from the objective's, or None."""
    for call in calls(experts, top_k, seed):
        got, want = layer(call, experts, top_k, factor, slot, renormalise), objective(call, experts, top_k, factor,
                                                                                      renormalises)
        if any(a[0] != b[0] or a[2] != b[2] for a, b in zip(got, want)):  # the output, or what reaches the router
            return call
    return None
