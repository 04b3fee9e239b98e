"""Ulysses' head split: the heads, query and kv, that each rank of a Ulysses group receives.

A stated split (``override heads[forward|backward]: uneven | chunk | floor``, check.encode_ulysses_heads)
gives rank r of the g ranks a contiguous run of the h query heads of a tensor rank (``split``). The kv
heads (k of them, query head j reading kv head j / (h/k)) follow by ``heads[kv]``: ``repeat``, each rank
receives the kv heads its query heads read, each once; ``split``, the k kv heads cut over the g ranks by
the same rule as if they were query heads.

The costs (docs/costs.md) price each all-to-all of the pair at its largest rank: per position it moves
the rank's query heads twice (q in, the output out; in backward the output gradient in, dq out) and its
kv heads twice (k, v; dk, dv), so the rank's share is ``share`` = max over r of n_q(r) + n_kv(r) heads
from (or to) each of the g − 1 others. A Ulysses all-to-all's payload tensor under a stated split is
``payload(rule, kv_rule)``.
"""

from __future__ import annotations

PAYLOAD = "ulysses:"  # the payload tensor of a pair under a stated split: "ulysses:<rule>:<kv rule>"


def split(rule: str, h: int, g: int) -> list[tuple[int, int]]:
    """(first head, head count) of each of the g ranks under ``rule``: ``uneven`` (floor(h/g) each, one more on the
    first h mod g ranks), ``chunk`` (ceil(h/g) each until the heads run out), ``floor`` (floor(h/g) each)."""
    out, start = [], 0
    for r in range(g):
        if rule == "uneven":
            n = h // g + (1 if r < h % g else 0)
        elif rule == "chunk":
            n = max(0, min(-(-h // g), h - start))
        else:
            n = h // g
        out.append((start, n))
        start += n
    return out


def local(heads: int, kv: int, t: int) -> tuple[int, int]:
    """The query heads and kv heads of one tensor rank of t (fewer kv heads than ranks: one, copied)."""
    return heads // t, (kv // t if kv % t == 0 else 1)


def kv_counts(rule: str, kv_rule: str, h: int, k: int, g: int) -> list[int]:
    """The kv heads each rank receives: ``repeat``, the distinct kv heads its query heads read; ``split``, the rule's
    run over the k kv heads."""
    if kv_rule == "split":
        return [n for _, n in split(rule, k, g)]
    ratio = h // k
    return [len({j // ratio for j in range(s, s + n)}) for s, n in split(rule, h, g)]


def share(rule: str, kv_rule: str, h: int, k: int, g: int) -> int:
    """The largest rank's heads per position and peer: max over r of its query heads plus its kv heads."""
    return max(n + m for (_, n), m in zip(split(rule, h, g), kv_counts(rule, kv_rule, h, k, g)))


def payload(rule: str, kv_rule: str) -> str:
    return f"{PAYLOAD}{rule}:{kv_rule}"


def rules_of(tensor: str) -> tuple[str, str] | None:
    """(rule, kv rule) of a payload tensor made by ``payload``; None for any other."""
    if not str(tensor).startswith(PAYLOAD):
        return None
    rule, kv_rule = str(tensor)[len(PAYLOAD):].split(":")
    return rule, kv_rule


MAX_SPLIT_HEADS = 1024  # the most heads a stated head split is judged and priced for (check.encode_ulysses_heads)


def too_many_heads(plan) -> list:
    """A head split of a model of more than MAX_SPLIT_HEADS heads: its exact price is a case per Ulysses size up to
    the heads (costs.ulysses_share: O(heads²)), refused rather than left to run. Only a literal head count is
    refused here; one a ``let`` or an expression gives is left unknown by the checker (check.encode_ulysses_heads)."""
    from ..diagnostics import Code
    from .overrides import OverrideTarget

    tf = plan.model.transformer
    value = getattr(getattr(tf, "heads", None), "value", None) if tf is not None else None
    if value is None or value <= MAX_SPLIT_HEADS:
        return []
    return [(Code.BAD_PROPERTY_VALUE, f"override heads{f'[{o.group}]' if o.group else ''}: {o.verb}: a head split "
             f"is judged and priced for at most {MAX_SPLIT_HEADS} heads, and the model states {value} (its exact "
             "price has a case per Ulysses size up to the heads)", o.span, ())
            for o in plan.overrides if o.target == OverrideTarget.HEADS]
