"""Calibration: measure a device's matrix products, memory bandwidth and collectives with torch,
and write them as mesh lines a spec can use (``placement calibrate``, docs/hardware.md).

Input: the backend (``cpu``: fp32 products, gloo collectives between processes of this machine;
``cuda``: bf16 products, NCCL collectives between the GPUs of this node), the sweep sizes, and
the catalogue device the measurement refines (or none: a device of one's own). Output:
``Calibration``, every sweep as (size, achieved rate) rows, and ``mesh_lines``: the
``device = ...`` line (a catalogue device with its measured best-shape ``matmul`` fraction and
``hbm``; or ``NAME(memory, flops, hbm, matmul = 1)`` with the measured best as its peak) and an
``intra_node = link(bandwidth, latency)`` line (the bus bandwidth of the largest all-reduce, the
latency per ring step of the smallest), with the sweeps as comments.

How: each product n × n × n is timed over ``repeats`` runs after a warm-up (CUDA events on a
GPU, ``time.perf_counter`` on the CPU), FLOP/s = 2n³ / seconds; each copy of ``b`` bytes
moves 2b (read and write); each all-reduce of ``b`` bytes over ``r`` ranks has a bus bandwidth
of 2(r − 1)/r · b / seconds (nccl-tests' convention, the figure a link's bandwidth is
compared with), the slowest rank's time. torch is imported only here, when a calibration runs.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction

from . import hardware as hw

QUICK = {"gemm": (64, 128, 256), "memory": (1 << 20, 1 << 22), "collective": (1 << 10, 1 << 16, 1 << 20)}
FULL = {"cpu": {"gemm": (128, 256, 512, 1024), "memory": (1 << 20, 1 << 24, 1 << 27),
                "collective": (1 << 10, 1 << 16, 1 << 20, 1 << 24)},
        "cuda": {"gemm": (512, 1024, 2048, 4096, 8192, 16384), "memory": (1 << 20, 1 << 24, 1 << 28, 1 << 30),
                 "collective": (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 28)}}


@dataclass
class Calibration:
    backend: str
    card: str  # the device's own name (torch.cuda.get_device_name, or the CPU)
    dtype: str
    torch_version: str
    gemm: list = field(default_factory=list)  # (n, FLOP/s) of n × n × n products
    memory: list = field(default_factory=list)  # (bytes, bytes/s moved)
    collective: list = field(default_factory=list)  # (bytes, seconds, bus bandwidth in bytes/s)
    ranks: int = 1
    total_memory: int = 0  # bytes of the device (or of the machine, on the CPU)

    @property
    def best_flops(self) -> float:
        return max(r for _, r in self.gemm)

    @property
    def best_bandwidth(self) -> float:
        return max(r for _, r in self.memory)


def _timer(torch, cuda: bool):
    def timed(fn, repeats: int) -> float:
        fn()  # warm-up
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1000 / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats
    return timed


def _compute_sweeps(torch, cal: Calibration, sizes: dict, repeats: int) -> None:
    cuda = cal.backend == "cuda"
    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    timed = _timer(torch, cuda)
    for n in sizes["gemm"]:
        a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
        cal.gemm.append((n, 2 * n**3 / timed(lambda a=a, b=b: torch.mm(a, b), repeats)))
    for nbytes in sizes["memory"]:
        src = torch.empty(nbytes // 4, device=dev, dtype=torch.float32).fill_(1.0)
        dst = torch.empty_like(src)
        cal.memory.append((nbytes, 2 * nbytes / timed(lambda d=dst, s=src: d.copy_(s), repeats)))


def _collective_worker(rank: int, ranks: int, init: str, backend: str, sizes, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init, rank=rank, world_size=ranks)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    out = []
    for nbytes in sizes:
        x = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=dev)
        dist.all_reduce(x)  # warm-up
        dist.barrier()
        if backend == "nccl":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(x)
        if backend == "nccl":
            torch.cuda.synchronize()
        secs = torch.tensor([(time.perf_counter() - t0) / repeats], dtype=torch.float64, device=dev)
        dist.all_reduce(secs, op=dist.ReduceOp.MAX)  # the slowest rank's time
        out.append((nbytes, float(secs.cpu())))
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def _collective_sweep(cal: Calibration, sizes, repeats: int, ranks: int) -> None:
    import torch.multiprocessing as mp

    backend = "nccl" if cal.backend == "cuda" else "gloo"
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.start_processes(_collective_worker, args=(ranks, init, backend, tuple(sizes), repeats, queue),
                           nprocs=ranks, join=True, start_method="spawn")
    for nbytes, secs in queue.get():
        cal.collective.append((nbytes, secs, 2 * (ranks - 1) / ranks * nbytes / secs))
    cal.ranks = ranks


def measure(backend: str = "cpu", quick: bool = False, repeats: int = 5, ranks: int = 2) -> Calibration:
    """Run the sweeps on this machine."""
    import torch

    sizes = QUICK if quick else FULL[backend]
    if backend == "cuda":
        props = torch.cuda.get_device_properties(0)
        card, total = torch.cuda.get_device_name(0), int(props.total_memory)
    else:
        card = f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cal = Calibration(backend, card, "bf16" if backend == "cuda" else "fp32", torch.__version__,
                      total_memory=total)
    _compute_sweeps(torch, cal, sizes, repeats)
    if ranks > 1:
        _collective_sweep(cal, sizes["collective"], repeats, ranks)
    return cal


def _num(x: float) -> str:
    """A measured figure as the spec writes it: four significant digits."""
    return f"{x:.4g}"


def mesh_lines(cal: Calibration, device: str | None, name: str = "calibrated") -> str:
    """The mesh lines of a calibration, with its sweeps as comments."""
    lines = [f"# placement calibrate: {cal.card}, {cal.backend} ({cal.dtype} products), torch {cal.torch_version}",
             "# matrix products n x n x n: n, achieved FLOP/s"]
    lines += [f"#   {n}, {_num(r)}" for n, r in cal.gemm]
    lines += ["# memory copies: bytes, bytes/s moved (read + write)"]
    lines += [f"#   {b}, {_num(r)}" for b, r in cal.memory]
    d = hw.device(device) if device else None
    if d is not None:
        peak = d.peak(cal.dtype) or d.peak("bf16")
        frac = min(Fraction(_num(cal.best_flops)) / peak, Fraction(1))
        lines.append(f"device = {d.name}(matmul = {float(frac):.4g}, hbm = {_num(cal.best_bandwidth)} B)")
    else:
        lines.append(f"device = {name}(memory = {cal.total_memory} B, flops = {_num(cal.best_flops)}, "
                     f"hbm = {_num(cal.best_bandwidth)} B, matmul = 1)")
    if cal.collective:
        lines.append(f"# all_reduce over {cal.ranks} ranks: bytes, seconds, bus bandwidth bytes/s")
        lines += [f"#   {b}, {_num(s)}, {_num(bw)}" for b, s, bw in cal.collective]
        small_b, small_s, _ = cal.collective[0]
        latency = small_s / (2 * (cal.ranks - 1))  # the smallest message: its time is the ring's steps
        lines.append(f"intra_node = link(bandwidth = {_num(cal.collective[-1][2])} B, latency = {_num(latency)})")
    return "\n".join(lines) + "\n"
