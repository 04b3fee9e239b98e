"""An independent simulator of Ulysses' all-to-alls under a head split (the oracle of
tests/test_ulysses_heads.py; it shares no code with placement_logic).

One sample of g positions, position p on rank p of the Ulysses group, every one of h query heads
and k kv heads (query head j reads kv head j // (h // k)). The split rule gives each destination
rank its number of heads (``sizes``), and an all-to-all is run as ``all_to_all_single`` with those
input split sizes: rank p cuts its list of heads into consecutive pieces of those sizes and sends
piece r to rank r. Each rank then runs a linear attention per received query head over the whole
sequence, pairing its i-th query head with the kv head of its own list that a GQA kernel pairs it
with (i * n_kv // n_q); the inverse all-to-all sends each output back by the same sizes. In backward
the output gradients go through the backward rule's all-to-all, and rank r pairs its i-th received
gradient head with the i-th head it saved in forward. The verdict: every output and value gradient
equals the single device's.
"""

from __future__ import annotations

from fractions import Fraction


def sizes(rule: str, h: int, g: int) -> list[int]:
    if rule == "uneven":  # DeepSpeed's get_shard_size_list: the remainder spread over the first ranks
        base, rest = [h // g] * g, h - (h // g) * g
        for r in range(rest):
            base[r] += 1
        return base
    if rule == "chunk":  # torch.chunk: pieces of ceil(h/g), as many as there are
        c = -(-h // g)
        pieces = [list(range(h))[i:i + c] for i in range(0, h, c)]
        return [len(x) for x in pieces] + [0] * (g - len(pieces))
    if rule == "floor":
        return [h // g] * g
    raise ValueError(rule)


def _a2a(lists: list[list], split: list[int]) -> list[list]:
    """all_to_all_single: rank p's list cut into consecutive pieces of ``split``; piece r to rank r, each rank
    concatenating what it receives in the order of the senders."""
    g = len(lists)
    pieces = []
    for p in range(g):
        cut, at = [], 0
        for n in split:
            cut.append(lists[p][at:at + n])
            at += n
        pieces.append(cut)
    return [[x for p in range(g) for x in pieces[p][r]] for r in range(g)]


def _inverse(lists: list[list], split: list[int], g: int) -> list[list]:
    """The all-to-all back: rank r's list holds, sender by sender, the split[r] heads of each position; the
    position p's pieces are returned to rank p in rank order."""
    out: list[list] = [[] for _ in range(g)]
    for r in range(g):
        n = split[r]
        for p in range(g):
            out[p].extend(lists[r][p * n:(p + 1) * n])
    return out


def q(p, j):
    return Fraction(p + 2 + 10 * j)


def k_(p, j):
    return Fraction(2 * p + 1 + 10 * j)


def v(p, j):
    return Fraction(3 * p + 2 + 10 * j)


def dy(p, j):
    return Fraction(p + 1, 2) + 10 * j


def run(h: int, kv: int, g: int, fwd: str, bwd: str, kv_rule: str) -> bool:
    """Whether every attention output and value gradient of the step equals the single device's."""
    ratio = h // kv
    # forward: the query heads and, as the kv rule says, the kv heads
    held = _a2a([[(p, j) for j in range(h)] for p in range(g)], sizes(fwd, h, g))
    heads_of = [sorted({j for _, j in x}) for x in held]
    if kv_rule == "repeat":
        kv_of = [sorted({j // ratio for j in hs}) for hs in heads_of]
    else:
        got = _a2a([[(p, j) for j in range(kv)] for p in range(g)], sizes(fwd, kv, g))
        kv_of = [sorted({j for _, j in x}) for x in got]
    out: list[list] = []
    for r in range(g):
        res = []
        for i, j in enumerate(heads_of[r]):
            if not kv_of[r]:
                y = None
            else:
                m = kv_of[r][i * len(kv_of[r]) // len(heads_of[r])] if kv_rule == "split" else j // ratio
                y = sum((k_(s, m) * v(s, m) for s in range(g)), Fraction(0))
            res.append([(p, j, None if y is None else q(p, j) * y) for p in range(g)])
        out.append([x for p in range(g) for x in [res[i][p] for i in range(len(res))]])
    back = _inverse(out, sizes(fwd, h, g), g)
    for p in range(g):
        got = {j: y for _, j, y in back[p]}
        for j in range(h):
            want = q(p, j) * sum((k_(s, j // ratio) * v(s, j // ratio) for s in range(g)), Fraction(0))
            if got.get(j) != want:
                return False
    # backward: the output gradients by the backward rule, paired with the heads saved in forward
    grads = _a2a([[(p, j) for j in range(h)] for p in range(g)], sizes(bwd, h, g))
    for r in range(g):
        received = sorted({j for _, j in grads[r]})
        for i, j in enumerate(received):
            saved = heads_of[r][i] if i < len(heads_of[r]) else None
            got = None if saved is None else k_(0, saved) * sum((dy(s, j) * q(s, saved) for s in range(g)), Fraction(0))
            if got != k_(0, j) * sum((dy(s, j) * q(s, j) for s in range(g)), Fraction(0)):
                return False
        if len(received) < len(heads_of[r]):
            return False  # a head attended in forward whose gradient never arrives
    seen = sorted(j for r in range(g) for j in {j for _, j in grads[r]})
    return seen == list(range(h))


def traffic(h: int, kv: int, g: int, rule: str, kv_rule: str) -> list[int]:
    """Head-slots through each rank in one pair of all-to-alls, one position per rank: the q, k, v heads it
    receives from the other ranks before the attention and the output heads it sends them after it. The kv
    heads: ``repeat``, each sender sends a rank the kv heads its received query heads read, each once;
    ``split``, an all_to_all_single of the kv heads by the rule's sizes."""
    ratio = h // kv
    qs = _a2a([[(p, j) for j in range(h)] for p in range(g)], sizes(rule, h, g))
    if kv_rule == "repeat":
        kvs = [[(p, m) for p in range(g) for m in sorted({j // ratio for _, j in qs[r]})] for r in range(g)]
    else:
        kvs = _a2a([[(p, m) for m in range(kv)] for p in range(g)], sizes(rule, kv, g))
    outs = [[(r, p, j) for p, j in qs[r]] for r in range(g)]  # rank r's output of head j at position p
    back = _inverse(outs, sizes(rule, h, g), g)
    sent = [sum(1 for p in range(g) for r_, _, _ in back[p] if r_ == r and p != r) for r in range(g)]
    return [sum(1 for p, _ in qs[r] if p != r) + 2 * sum(1 for p, _ in kvs[r] if p != r) + sent[r] for r in range(g)]
