"""costs/nccl.py: the time of an all-reduce, reduce-scatter or all-gather as NCCL runs it.

Three oracles, none read back from the code: NCCL 2.9.9's own tuning model transcribed here in
floating point from src/graph/tuning.cc and src/enqueue.cc (its loops, refinements and unit
conventions as written there: µs, GB/s, bytes / (1000 × bw)); the choice of ring or tree that
NCCL documents (trees for their logarithmic latency at scale, rings on one node); and the bus
bandwidth a published nccl-tests run measured on 8 A100s, message size by message size.
"""

from __future__ import annotations

from fractions import Fraction
from math import floor, log2

import pytest
import sympy

from placement_logic import hardware as hw
from placement_logic.costs import derive, nccl
from placement_logic.costs.steptime import step_time
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_string
from placement_logic.ir.collectives import Kind

# ---------------------------------------------------------------- NCCL 2.9.9, transcribed

BASE = {"tree": [4.4, 4.4, 0], "ring": [3.6, 10.0, 8.4]}
HWLAT = {"nvlink": {"tree": [.52, 1.25, 28], "ring": [.47, 1.9, 3.4]},
         "pci": {"tree": [1.0, 1.9, 28], "ring": [1.0, 2.5, 5.7]},
         "net": {"tree": [5.0, 8.5, 28], "ring": [2.7, 4.0, 9.6]}}
CORRECTION = [[1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0],
              [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .5, .6, .6, .7, .7, .8, .9, .9, .92, .92],
              [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9]]
LL, LL128, SIMPLE = 0, 1, 2


def log2i(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else 0


def nccl_times(coll: str, n_ranks: int, n_nodes: int, n_bytes: int, bw: float, intra: str = "nvlink") -> dict:
    """{(algorithm, protocol): µs} as ncclTopoTuneModel and ncclTopoGetAlgoTime compute them (caps
    per channel left out: one channel of ``bw`` GB/s)."""
    ppn = n_ranks / n_nodes
    nsteps = 2 * (n_ranks - 1) if coll == "allreduce" else n_ranks - 1
    ninter = 2 * (n_nodes - 1) if coll == "allreduce" else n_nodes - 1
    out = {}
    for a in ("tree", "ring"):
        if coll != "allreduce" and a != "ring":
            continue
        for p in (LL, LL128, SIMPLE):
            if p == LL128 and intra != "nvlink":
                continue
            bus = bw
            if a == "ring" and p == LL:
                bus = bus * (1 / 4 if (n_nodes > 1 or coll == "allreduce") else 1 / 3)
            if a == "ring" and p == LL128:
                bus = bus * (0.7 if ppn < 2 else 0.92)
            if a == "tree":
                bus = bus * .92
            if a == "tree" and p == LL:
                bus = bus / 3.8
            if a == "tree" and p == LL128:
                bus = bus * (7 / 9 if n_nodes == 1 else 0.915)
            ratio = .5 if a != "ring" else n_ranks / nsteps
            algbw = bus * ratio
            lat = BASE[a][p]
            intra_lat = HWLAT[intra][a][p] * (1.8 if n_nodes > 1 and p == LL else 1)
            inter_lat = HWLAT["net"][a][p]
            if a == "ring":
                lat += (nsteps - ninter) * intra_lat + ninter * inter_lat
            else:
                lat += 2 * ((n_ranks // n_nodes - 1) * intra_lat + log2i(n_nodes) * inter_lat)
            # ncclTopoGetAlgoTime
            log_size = log2i(n_bytes >> 6)
            if a == "tree" and log_size < 23:
                algbw *= CORRECTION[p][log_size]
            if a == "ring" and p == SIMPLE and n_nodes > 1 and coll == "allreduce" and \
                    n_bytes >= n_ranks / 16.0 * 65536:
                lat *= 1.9
            out[(a, ("LL", "LL128", "Simple")[p])] = lat + n_bytes / (1000 * algbw)
    return out


def group(n: int, nodes: int, bw_gbps: float, intra: str = "nvlink", curve=()) -> nccl.Group:
    return nccl.Group(sympy.Integer(n), sympy.Integer(nodes), intra, nodes > 1, n == nodes,
                      sympy.Rational(Fraction(bw_gbps).limit_denominator(10**6) * 10**9), curve)


CASES = [("allreduce", 8, 1, "nvlink"), ("allreduce", 4, 1, "nvlink"), ("allreduce", 16, 2, "nvlink"),
         ("allreduce", 512, 64, "nvlink"), ("allreduce", 15, 15, "nvlink"), ("allreduce", 32, 4, "pci"),
         ("reducescatter", 8, 1, "nvlink"), ("allgather", 64, 8, "nvlink"), ("allgather", 8, 1, "pci")]
KINDS = {"allreduce": Kind.ALL_REDUCE, "reducescatter": Kind.REDUCE_SCATTER, "allgather": Kind.ALL_GATHER}


@pytest.mark.parametrize("coll, n, nodes, intra", CASES)
def test_time_and_choice_are_nccls_own(coll, n, nodes, intra):
    """Without a curve the model is NCCL's tuning model: the same fastest (algorithm, protocol)
    and its time, at every power-of-two size from 64 B to 8 GiB."""
    bw = 22.5 if nodes > 1 else 200.0
    g = group(n, nodes, bw, intra)
    for e in range(6, 34):
        size = 2**e
        times = nccl_times(coll, n, nodes, size, bw, intra)
        best = min(times, key=times.get)
        secs = nccl.call_seconds(KINDS[coll], g, sympy.Integer(size))
        assert abs(float(secs) * 1e6 - times[best]) <= 1e-9 * times[best], (size, best)
        if sorted(times.values())[1] - times[best] > 1e-9 * times[best]:  # no near-tie
            assert nccl.choice(KINDS[coll], g, sympy.Integer(size)) == best, size


def test_tree_for_large_allreduces_across_many_nodes_ring_on_one_node():
    """NCCL's documented rule (Jeaugey, "Massively Scale Your Deep Learning Training with NCCL
    2.4", NVIDIA blog 2019; NCCL_ALGO in NCCL's environment-variable docs): trees for their
    logarithmic latency at scale, rings for bandwidth on few ranks. A 256 MiB all-reduce over
    InfiniBand HDR with 8 GPUs a node runs a ring on 2 and on 8 nodes and a tree on 256; a 64 MiB
    one a tree from 64 nodes; one node's all-reduce of a large gradient bucket runs a ring."""
    m = sympy.Integer(256 * 2**20)
    assert nccl.choice(Kind.ALL_REDUCE, group(16, 2, 22.5), m)[0] == "ring"
    assert nccl.choice(Kind.ALL_REDUCE, group(64, 8, 22.5), m)[0] == "ring"
    assert nccl.choice(Kind.ALL_REDUCE, group(2048, 256, 22.5), m)[0] == "tree"
    assert nccl.choice(Kind.ALL_REDUCE, group(64, 8, 22.5), m / 4)[0] == "ring"
    assert nccl.choice(Kind.ALL_REDUCE, group(512, 64, 22.5), m / 4)[0] == "tree"
    assert nccl.choice(Kind.ALL_REDUCE, group(8, 1, 200.0), m) == ("ring", "Simple")
    # the tree's latency grows with log2 of the nodes, the ring's with the ranks
    small = sympy.Integer(64)
    t64, t128 = (float(nccl.call_seconds(Kind.ALL_REDUCE, group(8 * k, k, 22.5), small)) for k in (64, 128))
    assert nccl.choice(Kind.ALL_REDUCE, group(8 * 128, 128, 22.5), small)[0] == "tree"
    assert t128 - t64 < 20e-6  # one more tree level: 2 × 5 µs (LL) × 1, not 2 × 64 ring steps
    # reduce-scatter and all-gather have rings only
    assert nccl.choice(Kind.ALL_GATHER, group(512, 64, 22.5), m)[0] == "ring"


def test_symbolic_sizes_give_the_same_time_once_bound():
    """The choice stays an exact closed form (a Min over the candidates, piecewise constants) in
    the group's and the message's symbols; binding them gives the numeric answer."""
    t, d, m = sympy.symbols("t d m", positive=True)
    g = nccl.Group(t * d, d, "nvlink", True, False, sympy.Integer(25 * 10**9) * Fraction(9, 10))
    form = nccl.call_seconds(Kind.ALL_REDUCE, g, m)
    assert form.has(sympy.Min) and form.has(sympy.Piecewise)
    for tv, dv, mv in ((8, 4, 2**20), (8, 64, 2**28), (2, 2, 2**12)):
        bound = form.xreplace({t: tv, d: dv, m: mv})
        direct = nccl.call_seconds(Kind.ALL_REDUCE, group(tv * dv, dv, 22.5), sympy.Integer(mv))
        assert bound == direct
    assert sympy.latex(form)


# ------------------------------------------------- the published curve (8 x A100, NVLink 3)

# nccl-tests all_reduce_perf -b 64 -e 10G -f 2 -g 8 on one OCI BM.GPU4.8 (8 x A100-SXM4-40GB),
# github.com/oracle-japan/ocitutorials tutorials/_hpc/spinup-gpu-cluster.md (2022 revision,
# section 4-2): out-of-place busbw in GB/s by message size
PUBLISHED = {64 * 2**10: 3.24, 128 * 2**10: 5.96, 256 * 2**10: 10.15, 512 * 2**10: 15.56, 2**20: 23.92,
             2 * 2**20: 32.66, 4 * 2**20: 54.57, 8 * 2**20: 79.02, 16 * 2**20: 119.81, 32 * 2**20: 147.46,
             64 * 2**20: 199.23, 128 * 2**20: 197.17, 256 * 2**20: 221.38, 512 * 2**20: 223.26,
             2**30: 230.08, 2 * 2**30: 231.52, 4 * 2**30: 234.17, 8 * 2**30: 235.14}


def _a100_bus(size: int) -> float:
    """The bus bandwidth the model gives an all-reduce of ``size`` bytes on 8 A100s over NVLink 3,
    through a spec (the tensor-parallel all-reduce of a one-layer model whose activation is that size)."""
    k = hw.link("nvlink3")
    g = group(8, 1, float(k.bandwidth * k.efficiency) / 1e9, "nvlink", k.bus_curve)
    secs = nccl.call_seconds(Kind.ALL_REDUCE, g, sympy.Integer(size))
    return 2 * 7 / 8 * size / float(secs) / 1e9


def test_the_a100_bus_bandwidth_follows_the_published_curve():
    """Within 10 % of the published busbw at every size from 64 KiB to 8 GiB, never above it by more
    than 1 % (the classes take the fraction their smallest size reaches), and within 7 % from 1 MiB."""
    for size, bus in PUBLISHED.items():
        ours = _a100_bus(size)
        assert -0.10 <= (ours - bus) / bus <= 0.01, (size, ours, bus)
        if size >= 2**20:
            assert abs(ours - bus) / bus <= 0.07, (size, ours, bus)
    # not the link's peak: 300 GB/s per direction
    assert _a100_bus(8 * 2**30) < 0.8 * 300


def test_a_spec_times_its_tensor_parallel_all_reduce_as_nccl_would():
    """The step-time model uses it: a one-layer Megatron model's forward all-reduces of one s·b·h fp16
    activation (16 MiB) on 8 A100s of a node take two calls at the published curve's 16 MiB figure."""
    t = "hidden = 4096 layers = 1 heads = 32 ffn = 16384 vocab = 32000"
    src = ("from std.tensor import megatron_tp\nmodel {\n  transformer { " + t + " }\n  seq = 2048\n"
           "  microbatch = 1\n  microbatches = 1\n}\nmesh {\n  device = a100_80gb\n  precision = fp16\n"
           "  tp = 8 @ intra_node\n}\nplan p {\n  tp: megatron_tp\n}\n")
    plan = load_string(src).plans[0]
    st = step_time(derive(plan), plan.mesh.hardware)
    c = next(x for x in st.collectives if x.sized.collective.rule.startswith("Megatron TP: 2 all-reduces per layer "
                                                                               "per microbatch in forward"))
    secs = c.seconds.xreplace({symbol("tp"): 8})
    m = 2048 * 4096 * 2
    # 16 MiB: the class from 16 MiB, half the sustained 235 GB/s (47/60 of 300); NCCL's own LL128 time is less
    assert secs == 2 * Fraction(14, 8) * m / (Fraction(300 * 10**9) * Fraction(47, 60) / 2)
    assert abs(1.75 * m / (float(secs) / 2) / 1e9 - PUBLISHED[m]) / PUBLISHED[m] < 0.03


def test_a_link_of_ones_own_latency_is_not_nccls():
    """``intra_node = nvlink3(latency = 2e-6)``: α–β with the given per-step latency, no NCCL model, no curve."""
    t = "hidden = 4096 layers = 1 heads = 32 ffn = 16384 vocab = 32000"
    src = ("from std.tensor import megatron_tp\nmodel {\n  transformer { " + t + " }\n  seq = 2048\n"
           "  microbatch = 1\n  microbatches = 1\n}\nmesh {\n  device = a100_80gb\n  precision = fp16\n"
           "  intra_node = nvlink3(latency = 2e-6)\n  tp = 8 @ intra_node\n}\nplan p {\n  tp: megatron_tp\n}\n")
    plan = load_string(src).plans[0]
    assert plan.mesh.hardware.link("intra_node").nccl is None
    st = step_time(derive(plan), plan.mesh.hardware)
    c = next(x for x in st.collectives if x.sized.collective.rule.startswith("Megatron TP: 2 all-reduces per layer "
                                                                               "per microbatch in forward"))
    m = 2048 * 4096 * 2
    bus = Fraction(300 * 10**9) * Fraction(47, 60)
    assert c.seconds.xreplace({symbol("tp"): 8}) == 2 * (2 * 7 * Fraction(2, 10**6) + Fraction(14, 8) * m / bus)


def test_tree_correction_and_depth_are_ncclss_tables():
    for e in range(6, 34):
        size = 2**e + 3  # inside the class, not on its bound
        idx = log2i(size >> 6)
        want = [1.0] * 3 if idx >= 23 else [CORRECTION[p][idx] for p in range(3)]
        got = [float(nccl.tree_correction(p, sympy.Integer(size))) for p in ("LL", "LL128", "Simple")]
        assert got == pytest.approx(want), size
    d = sympy.Symbol("d", positive=True)
    form = nccl.depth(d)
    for k in (1, 2, 3, 15, 64, 1000, 2**20):
        assert form.xreplace({d: k}) == floor(log2(k)) == nccl.depth(sympy.Integer(k))
