"""What the capacity step's dropped (token, expert) pairs add to the MoE combine (docs/semantics.md, "Loss
terms", the capacity step), computed exactly on one concrete router call; the obligation is
check.encode_capdrop.

A token t chooses its k experts S_t with gate weights g_{t,i} that sum to 1 over S_t (the router's top-k
weights); the capacity step (check.encode_capacity) keeps K_t ⊆ S_t. The objective, single-device training
with the same capacity rule, combines

    y_t = x_t + Σ_{i ∈ K_t} w_{t,i} · E_i(x_t),   w_{t,i} = g_{t,i}, or g_{t,i} / Σ_{j ∈ K_t} g_{t,j} where the
                                                   model states ``drop_renormalise``,

so a dropped pair adds nothing and its gate weight g_{t,i} gets no gradient. A path states what its code does:
``dropped_uninitialised`` (the pair's slot of the unpermute buffer is never written: its gate weight times a
stale value), ``dropped_weighted`` (the combine buffer starts from the hidden states: its gate weight times
x_t), ``drops_zeroed`` (as derived); ``renormalise_kept`` (w over the kept experts) or ``renormalise_dropped``
(over all k chosen, the dropped too: g_{t,i} / Σ_{j ∈ S_t} g_{t,j}, which reads the dropped gate weights).

The replay's call: the fewest tokens N whose capacity C = ⌈cf·k·N/E⌉ < N, each choosing experts 0..k-1 with
gate weights ((2N−j), (N+j), N, …, N) / ((k+1)N) for token j (1 for k = 1): expert 0 keeps the earliest C
tokens and drops the last one, which expert 1 keeps (its highest score). Hidden state x_j = j + 1, expert i
a scaling E_i(x) = (i + 2)·x, the stale value 100; the loss L = Σ_t y_t, so ∂L/∂g is read off exactly, and
the gradient of the router's logits through g = softmax over the chosen experts. The departure is judged on
y and on the logits' gradient (what reaches the router's parameters): ``renormalise_dropped`` divides by
Σ_{S_t} g = 1, the same function of the logits, and is refused where the objective keeps the weights (PL290).
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil

STALE = Fraction(100)


def witness_call(experts: int, top_k: int, cf: Fraction) -> list | None:
    """[(chosen experts, probabilities over the E experts, padded?)] (check.encode_capacity's call form), or
    None where no capacity step drops (cf·k >= E)."""
    x = Fraction(cf) * top_k / experts
    if not (0 < x < 1 and 1 <= top_k <= experts):
        return None
    n = 1
    while ceil(x * n) >= n:
        n += 1
    chosen = tuple(range(top_k))
    out = []
    for j in range(n):
        raw = [2 * n - j, n + j] + [n] * (top_k - 2) if top_k >= 2 else [1]
        total = sum(raw)
        out.append((chosen, tuple(Fraction(raw[i], total) if i < top_k else Fraction(0) for i in range(experts)), False))
    return out


def expert_out(i: int, x: Fraction) -> Fraction:
    return (i + 2) * x


def combine(call: list, kept: frozenset, dropped_value: str, renormalise: str) -> list[tuple]:
    """Per token: (y_t, {dropped expert: ∂L/∂g_{t,i}}, {chosen expert: ∂L/∂l_{t,i}}), the last through the
    router's normalisation g = softmax of the chosen experts' logits l (∂g_i/∂l_j = g_i(δ_ij − g_j)), which is
    what reaches the router's parameters. ``dropped_value``: zero | stale | hidden; ``renormalise``: none |
    kept | chosen (over all k chosen, the dropped too)."""
    out = []
    for j, (chosen, probs, _) in enumerate(call):
        x = Fraction(j + 1)
        keep = [i for i in chosen if (j, i) in kept]
        den = {"none": Fraction(1), "kept": sum((probs[i] for i in keep), Fraction(0)),
               "chosen": sum((probs[i] for i in chosen), Fraction(0))}[renormalise] or Fraction(1)  # none kept: 1
        fill = {"zero": Fraction(0), "stale": STALE, "hidden": x}[dropped_value]
        mixed = sum((probs[i] * expert_out(i, x) for i in keep), Fraction(0))
        y = x + mixed / den + sum((probs[i] * fill for i in chosen if i not in keep), Fraction(0))
        dg = {}
        for m in chosen:
            in_den = renormalise == "chosen" or (renormalise == "kept" and m in keep)
            dg[m] = ((expert_out(m, x) / den) if m in keep else fill) - (mixed / den ** 2 if in_den else 0)
        spread = sum((probs[i] * dg[i] for i in chosen), Fraction(0))
        out.append((y, {m: dg[m] for m in chosen if m not in keep}, {m: probs[m] * (dg[m] - spread) for m in chosen}))
    return out


def differs(a: tuple, b: tuple) -> bool:
    """Two tokens' layers differ where their outputs or their router-logit gradients do."""
    return a[0] != b[0] or a[2] != b[2]


def path_modes(output_verb: str | None, weights_verb: str | None, objective_renormalises: bool) -> tuple[str, str]:
    """The path's (dropped_value, renormalise) from its statements (None: as derived)."""
    value = {"dropped_uninitialised": "stale", "dropped_weighted": "hidden"}.get(output_verb or "", "zero")
    weights = {"renormalise_kept": "kept", "renormalise_dropped": "chosen"}.get(
        weights_verb or "", "kept" if objective_renormalises else "none")
    return value, weights
