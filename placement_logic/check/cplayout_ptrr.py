"""The layout PyTorch's processing-time round-robin load balancer computes from the mask (``ptrr``).

PyTorch's ``_PTRRLoadBalancer`` (flex attention; torchtitan's ``--parallelism.context_parallel_load_balancer
ptrr``, its varlen variant reading the same work from ``cu_seqlens``) does not fix the order of the sequence in
advance: it reads every query block's *processing time* from the block mask (the number of key blocks its row
lets in), sorts the blocks by it, longest first (ties in sequence order), and deals them to the c ranks in
rows of c, left to right on even rows and right to left on odd rows (a snake round robin); each rank's blocks
are then taken in sequence order, and rank r holds group r (``torch.chunk`` of the rearranged sequence).

Here every position of a pack (check.encode_cplayout_packs) is one block, and the mask is the pack's own:
a query attends to the real keys of its document at or before it, so a real token at offset i of its document
takes i + 1 and a padding position of document d every one of d's 2c·a_d real tokens. The permutation thus
depends on the documents' lengths and padding, not on c and r alone.

``position(pack, c, r, j)``: the position rank r of c holds in slot j. For concrete c and r the schedule
itself (``schedule``); for z3 terms only on a pack of one unpadded document of 2c·u positions, where the
times p + 1 are distinct and the snake gives a closed form linear in c and r: slot j is row k = 2u − 1 − j,
position 2cu − 1 − kc − r on an even row and 2cu − c − kc + r on an odd one (u = 1: rank r holds r and
2c − 1 − r, the zigzag). ``closed(pack)`` says whether a pack has it. The independent oracle is PyTorch's own
``ptrr_scheduling`` on a mask written out position by position (tests/test_check_cplayout_ptrr.py).
"""

from __future__ import annotations

from functools import lru_cache

Pack = tuple[tuple[int, int], ...]  # per document: (padded units u, real units a)


def times(pack: Pack, c: int) -> list[int]:
    """Every position's processing time: the keys its row of the pack's mask lets in."""
    out: list[int] = []
    for u, a in pack:
        real = 2 * c * a
        out += [i + 1 if i < real else real for i in range(2 * c * u)]
    return out


@lru_cache(maxsize=512)
def schedule(pack: Pack, c: int) -> tuple[tuple[int, ...], ...]:
    """Rank r's positions in order, for every r < c: the snake round robin of the positions sorted by time,
    longest first, ties in sequence order."""
    return deal(tuple(times(pack, c)), c)


def deal(t: tuple[int, ...], c: int) -> tuple[tuple[int, ...], ...]:
    """The snake round robin of positions with processing times ``t`` (any mask's row counts) over c ranks."""
    order = sorted(range(len(t)), key=lambda p: -t[p])  # sorted() is stable: ties keep sequence order
    groups: list[list[int]] = [[] for _ in range(c)]
    for i, p in enumerate(order):
        row, col = divmod(i, c)
        groups[col if row % 2 == 0 else c - 1 - col].append(p)
    return tuple(tuple(sorted(g)) for g in groups)


def closed(pack: Pack) -> bool:
    """Whether the pack has the closed form: one document without padding."""
    return len(pack) == 1 and pack[0][0] == pack[0][1]


def position(pack: Pack, c, r, j: int):
    """The position rank r of c holds in slot j under the balancer (0 ≤ j < 2·Σu)."""
    if isinstance(c, int) and isinstance(r, int):
        return schedule(pack, c)[r][j]
    if not closed(pack):
        raise ValueError("the balancer's order of a pack of several or padded documents needs a concrete group size")
    u = pack[0][0]
    k = 2 * u - 1 - j
    return 2 * c * u - 1 - k * c - r if k % 2 == 0 else 2 * c * u - c - k * c + r
