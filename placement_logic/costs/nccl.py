"""The time of a collective as NCCL runs it: its choice of algorithm and protocol, exact.

NCCL times every (algorithm, protocol) pair of a collective with a latency–bandwidth model
and runs the fastest (``ncclTopoTuneModel`` in src/graph/tuning.cc, ``getAlgoInfo`` in
src/enqueue.cc of github.com/NVIDIA/nccl, v2.9.9-1, the series of the published runs of
docs/validation_time.md). Per call, with n ranks on ``nodes`` nodes (ppn = n/nodes a node),
m the buffer (the whole gathered or reduced buffer) and B the link's sustained bus bandwidth:

  ring       steps 2(n − 1) for an all-reduce (2(nodes − 1) of them across nodes), n − 1 for
             reduce-scatter and all-gather (nodes − 1): latency baseLat + intra steps × the node
             link's hwLat + inter steps × the network's (LL's node hwLat × 1.8 across nodes), an
             all-reduce across nodes with Simple × 1.9 from m ≥ n/16 × 64 KiB (NCCL's "plateau
             effect of ring"); time latency + (steps/n)·m / bus bandwidth
  tree       all-reduce only: latency baseLat + 2((ppn − 1)·node hwLat + ⌊log₂ nodes⌋·network
             hwLat); time latency + m / (bus bandwidth / 2 × NCCL's tree correction at m)
  bus bw     ring Simple B; ring LL B/4 (B/3 for reduce-scatter and all-gather on one
             node), ring LL128 0.92·B (0.7·B with
             one rank a node); tree 0.92·B, its LL 1/3.8 and its LL128 7/9 (one node) or 0.915
             of that. LL128 runs only where the node link is NVLink (NCCL enables it there).
  curve      NCCL's model is a floor: where the link has a published curve of the bus
             bandwidth nccl-tests reaches by message size (``hardware.Link.bus_curve``, B × the
             fraction at m), a call takes no less than (steps/n)·m over it.

Left out: NCCL's caps per channel (they depend on the channel count its topology search
finds), CollNet and NVLink SHARP, and point-to-point, all-to-all and broadcast (timed by the
ring latency of the caller, ``steptime``). Every figure is exact: the choice is a ``Min`` over
the candidates, the size classes ``Piecewise`` constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import sympy

from ..ir.collectives import Kind
from .symbolic import at_least

SOURCE = ("NCCL's tuning model, src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime) and src/enqueue.cc "
          "(getAlgoInfo) of github.com/NVIDIA/nccl, v2.9.9-1 (commit 3fec2fa5, 2021)")
PROTOCOLS = ("LL", "LL128", "Simple")
US = Fraction(1, 10**6)


def _us(*xs: str) -> tuple[Fraction, ...]:
    return tuple(Fraction(x) * US for x in xs)


# baseLat and hwLat of tuning.cc, microseconds, (LL, LL128, Simple)
BASE_LATENCY = {"tree": _us("4.4", "4.4", "0"), "ring": _us("3.6", "10.0", "8.4")}
HW_LATENCY = {"nvlink": {"tree": _us(".52", "1.25", "28"), "ring": _us(".47", "1.9", "3.4")},
              "pci": {"tree": _us("1.0", "1.9", "28"), "ring": _us("1.0", "2.5", "5.7")},
              "net": {"tree": _us("5.0", "8.5", "28"), "ring": _us("2.7", "4.0", "9.6")}}
# treeCorrectionFactor: the tree's bandwidth at 64 B × 2^i up to the next power of two (i = 0..22); 1 from 512 MiB
TREE_CORRECTION = {
    "LL": (1, 1, 1, 1, ".9", ".8", ".7", ".7", ".7", ".7", ".6", ".5", ".4", ".4", ".5", ".6", ".7", ".8", ".9",
           1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, ".9", ".8", ".8", ".8", ".7", ".6", ".6", ".6", ".5", ".6", ".6", ".7", ".7", ".8",
              ".9", ".9", ".92", ".92"),
    "Simple": (".9", ".9", ".9", ".9", ".9", ".9", ".9", ".8", ".7", ".6", ".6", ".5", ".5", ".5", ".5", ".6", ".7",
               ".8", ".7", ".7", ".8", ".9", ".9"),
}
RING_PLATEAU = Fraction(19, 10)
MAX_DEPTH = 20  # ⌊log₂ nodes⌋ tabulated up to 2^20 nodes


@dataclass(frozen=True)
class Group:
    """A collective's group as NCCL sees it."""

    n: sympy.Expr  # ranks
    nodes: sympy.Expr  # nodes they span (1 without a network axis)
    intra: str  # NCCL's hardware class of the node link: "nvlink" or "pci"
    multi_node: bool  # the group has a network axis (decided by its axes, not its sizes)
    one_per_node: bool  # no axis of the group stays inside a node
    bus: sympy.Expr  # the sustained bus bandwidth of the slowest link, bytes per second
    curve: tuple = ()  # that link's bus bandwidth curve by message size (hardware.Link.bus_curve)


@lru_cache(maxsize=4096)
def tabulated(x: sympy.Expr, table: tuple) -> sympy.Expr:
    """The value of the first (bound, value) row whose bound ``x`` reaches (the last row's bound is 0).
    Kept per (size, table) in the process, as ``kernels._tabulated`` is: each condition's
    canonical form costs sympy assumption queries, and the same sizes come back."""
    if not table:
        return sympy.Integer(1)
    if x.is_number:
        return sympy.Rational(next(f for b, f in table if x >= sympy.Rational(b)))
    rows = [(sympy.Rational(f), at_least(x, sympy.Rational(b))) for b, f in table[:-1]]
    return sympy.Piecewise(*rows, (sympy.Rational(table[-1][1]), True))


def tree_correction(protocol: str, m: sympy.Expr) -> sympy.Expr:
    """NCCL's tree bandwidth correction at ``m`` bytes: index ⌊log₂(m/64)⌋, 1 from 2^23 × 64 B."""
    values = [Fraction(v) for v in TREE_CORRECTION[protocol]]
    rows = [(Fraction(64 * 2**23), Fraction(1))]
    for i in range(len(values) - 1, 0, -1):
        if values[i] == rows[-1][1]:
            rows[-1] = (Fraction(64 * 2**i), values[i])
        else:
            rows.append((Fraction(64 * 2**i), values[i]))
    if values[0] == rows[-1][1]:
        rows[-1] = (Fraction(0), values[0])
    else:
        rows.append((Fraction(0), values[0]))
    return tabulated(m, tuple(rows))


def depth(nodes: sympy.Expr) -> sympy.Expr:
    """⌊log₂ nodes⌋ (NCCL's log2i), exact."""
    if nodes.is_number:
        return sympy.Integer(max(int(nodes), 1).bit_length() - 1)
    return tabulated(nodes, (*((Fraction(2**k), Fraction(k)) for k in range(MAX_DEPTH, 0, -1)), (Fraction(0), 0)))


@lru_cache(maxsize=4096)
def _candidates(kind: Kind, g: Group, m: sympy.Expr) -> tuple[tuple[str, str, sympy.Expr], ...]:
    """(algorithm, protocol, seconds of one call) of every pair NCCL would weigh; kept per
    (kind, group, size) in the process (every configuration of a structure asks again)."""
    allreduce = kind is Kind.ALL_REDUCE
    n, nodes = g.n, g.nodes
    steps = _steps(kind, n)
    inter = (2 * (nodes - 1) if allreduce else nodes - 1) if g.multi_node else sympy.Integer(0)
    active = sympy.Min(1, steps)  # a group of one device runs no collective
    out = []
    for i, p in enumerate(PROTOCOLS):
        if p == "LL128" and g.intra != "nvlink":
            continue
        intra_lat = HW_LATENCY[g.intra]["ring"][i] * (Fraction(18, 10) if p == "LL" and g.multi_node else 1)
        lat = BASE_LATENCY["ring"][i] + (steps - inter) * intra_lat + inter * HW_LATENCY["net"]["ring"][i]
        if p == "Simple":
            bus = g.bus
            if allreduce and g.multi_node:
                lat = lat * sympy.Piecewise((RING_PLATEAU, m >= n * 4096), (1, True))
        elif p == "LL":
            bus = g.bus * (Fraction(1, 4) if g.multi_node or allreduce else Fraction(1, 3))
        else:
            bus = g.bus * (Fraction(7, 10) if g.one_per_node else Fraction(92, 100))
        out.append(("ring", p, active * lat + steps / n * m / bus))
    if not allreduce:
        return tuple(out)
    ppn = n / nodes
    for i, p in enumerate(PROTOCOLS):
        if p == "LL128" and g.intra != "nvlink":
            continue
        intra_lat = HW_LATENCY[g.intra]["tree"][i] * (Fraction(18, 10) if p == "LL" and g.multi_node else 1)
        lat = BASE_LATENCY["tree"][i] + 2 * ((ppn - 1) * intra_lat + depth(nodes) * HW_LATENCY["net"]["tree"][i])
        bus = g.bus * Fraction(92, 100)
        if p == "LL":
            bus = bus / Fraction(38, 10)
        elif p == "LL128":
            bus = bus * (Fraction(915, 1000) if g.multi_node else Fraction(7, 9))
        out.append(("tree", p, active * lat + m / (bus / 2 * tree_correction(p, m))))
    return tuple(out)


def _steps(kind: Kind, n: sympy.Expr) -> sympy.Expr:
    return 2 * (n - 1) if kind is Kind.ALL_REDUCE else n - 1


@lru_cache(maxsize=4096)
def call_seconds(kind: Kind, g: Group, m: sympy.Expr) -> sympy.Expr:
    """Seconds of one call: the fastest of NCCL's candidates, as NCCL picks it, and no less than
    the link's published curve allows (ring bytes / (bus bandwidth × its fraction at m)). Kept
    per (kind, group, size) in the process, as ``_candidates`` is: the same collectives come back
    in every structure a search derives, and building the maximum orders its arguments."""
    times = [t for _, _, t in _candidates(kind, g, m)]
    if all(t.is_number for t in times):
        best = min(times)
    else:
        best = sympy.Min(*times, evaluate=False)
    if not g.curve:
        return best
    measured = _steps(kind, g.n) / g.n * m / (g.bus * tabulated(m, g.curve))
    if best.is_number and measured.is_number:
        return max(best, measured)
    return sympy.Max(best, measured, evaluate=False)


def choice(kind: Kind, g: Group, m: sympy.Expr) -> tuple[str, str]:
    """(algorithm, protocol) NCCL picks for a call of ``m`` bytes (every size bound to a number)."""
    best = min(_candidates(kind, g, m), key=lambda c: c[2])
    return best[0], best[1]


def seconds(kind: Kind, g: Group, m: sympy.Expr, count: sympy.Expr) -> sympy.Expr:
    """Seconds of ``count`` calls of an all-reduce, reduce-scatter or all-gather of ``m`` bytes."""
    return count * call_seconds(kind, g, m)
