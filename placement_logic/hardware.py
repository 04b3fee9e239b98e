"""The hardware catalogue: devices (memory, peak dense FLOP/s per precision, HBM bandwidth)
and link classes (bandwidth per direction per device, latency per step), with the source of
every figure.

Pure data, exact: every figure is a ``Fraction`` (bytes, FLOP/s, bytes/s, seconds). Memory
capacities are binary: the vendors' "80 GB" of HBM3 is 80 GiB = 85,899,345,920 bytes (the
DRAM dies are binary); what a runtime reports as total is a little less (nvidia-smi says
81,559 MiB on an H100 SXM), which ``conventions { reserve = ... }`` accounts for. Peak
FLOP/s are the dense figures (the datasheets' "with sparsity" figures halved). Link
bandwidths are per direction per device (NVLink 4's "900 GB/s" is 450 GB/s each way);
latencies are assumptions of the order NCCL's own tuning model uses, documented as such
(docs/hardware.md), and meant to be replaced by measured figures where a user has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

GiB = 2**30
GB = 10**9
T = 10**12  # tera
P = 10**15  # peta

PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")


def _f(x: str | int) -> Fraction:
    return Fraction(x)


@dataclass(frozen=True)
class Link:
    """An interconnect: bandwidth and latency per device, NCCL's efficiency and latency model, sources."""

    name: str
    title: str
    bandwidth: Fraction  # bytes per second, per direction, per device
    latency: Fraction  # seconds per step of a ring (α)
    sources: tuple[str, ...] = ()
    efficiency: Fraction = Fraction(1)  # the fraction of the bandwidth NCCL's bus bandwidth reaches
    # NCCL's own latency model (kernel model only): seconds per collective call, and per ring step
    # in place of ``latency`` (None: ``latency``)
    call_latency: Fraction = Fraction(0)
    step_latency: Fraction | None = None
    # NCCL's hardware class of the link in its tuning model ("nvlink", "pci", "net"; None: not an
    # NCCL link), which picks the algorithm and protocol of each collective (costs/nccl.py)
    nccl: str | None = None
    # the fraction of the sustained bus bandwidth published nccl-tests runs reach by message size (the
    # bus bandwidth at most; NCCL's latency model is the floor): (lower bound in bytes, fraction) rows,
    # bounds decreasing, the last 0 (empty: no curve at hand, NCCL's latency-bandwidth model alone)
    bus_curve: tuple[tuple[Fraction, Fraction], ...] = ()


@dataclass(frozen=True)
class Efficiency:
    """What fraction of its roofline a kernel reaches, by size class (docs/time.md, the kernel
    model). Each table lists (lower bound, fraction) pairs, the bounds decreasing, the last 0:
    a kernel takes the fraction of the first bound its size reaches.

    ``gemm``: a matrix product by its FLOPs (the batch of a batched product together), of
    min(peak, HBM bandwidth × arithmetic intensity). ``memory``: an elementwise or reduction
    kernel by the bytes it moves, of the HBM bandwidth. ``flash``: a fused attention kernel
    (FlashAttention), of the peak, forward and backward together."""

    gemm: tuple[tuple[Fraction, Fraction], ...]
    memory: tuple[tuple[Fraction, Fraction], ...]
    flash: Fraction
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class Device:
    """An accelerator: memory, peak FLOP/s per precision, HBM bandwidth, links and kernel efficiencies."""

    name: str
    title: str
    memory: int  # bytes
    memory_label: str  # the vendor's figure, as printed
    flops: dict = field(default_factory=dict)  # precision -> dense peak FLOP/s
    hbm_bandwidth: Fraction = Fraction(0)  # bytes per second
    intra_link: str = "pcie5"  # between the devices of a node
    inter_link: str = "ib_ndr"  # between nodes (one NIC per device)
    per_node: int = 8
    sources: tuple[str, ...] = ()
    efficiency: Efficiency | None = None  # the calibrated kernel efficiencies (16-bit precisions)

    def peak(self, precision: str) -> Fraction | None:
        return self.flops.get(precision)


_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOPS BF16/FP16 dense, 156 TF32, "
         "19.5 FP32; 1,555 GB/s (40GB) and 2,039 GB/s (80GB SXM); NVLink 3 600 GB/s")
_H100 = ("NVIDIA H100 Tensor Core GPU datasheet (2023): SXM 1,979 TFLOPS BF16 and 3,958 FP8 with sparsity "
         "(989.4 and 1,978.9 dense, NVIDIA H100 whitepaper), 3.35 TB/s; PCIe 1,513 BF16 and 3,026 FP8 with "
         "sparsity, 2 TB/s; NVLink 4 900 GB/s")
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (2024): 141 GB HBM3e, 4.8 TB/s; Hopper compute as the H100 SXM"
_B200 = ("NVIDIA HGX B200 / DGX B200 datasheets (2024): 180 GB HBM3e and 8 TB/s per GPU; FP8 9 PFLOPS, "
         "BF16 4.5 PFLOPS, TF32 2.2 PFLOPS with sparsity (dense: half); NVLink 5 1.8 TB/s")
_MI300X = ("AMD Instinct MI300X data sheet (2023): 192 GB HBM3, 5.3 TB/s; 1,307.4 TFLOPS BF16/FP16 and "
           "2,614.9 FP8 dense, 653.7 TF32, 163.4 FP32; Infinity Fabric 7 links, 896 GB/s aggregate")
_L40S = ("NVIDIA L40S datasheet (2023): 48 GB GDDR6 with ECC, 864 GB/s; 362.05 TFLOPS BF16/FP16 and "
         "733 FP8 dense (733 and 1,466 with sparsity), 183 TF32, 91.6 FP32; PCIe Gen4 x16")

_CALCULON = ("Calculon (Isaev et al., SC'23), systems/a100_80g.json of github.com/calculon-ai/calculon: "
             "matrix efficiency 0.95 from 128 GFLOP, 0.9 from 16, 0.6 from 1, 0.1 below; memory efficiency 0.9 "
             "from 100 MB, 0.75 from 10, 0.6 from 1, 0.3 below (the size classes and their shape)")
_MAMF = ("Bekman, Machine Learning Engineering, 'Maximum Achievable Matmul FLOPS comparison table' "
         "(github.com/stas00/ml-engineering, compute/accelerator/README.md), bf16 matmul, best shape: "
         "A100 SXM 271.2 of 312 TFLOPS, H100 SXM 794.5 of 989 (H200 the same), B200 SXM 1745.0 of 2250, "
         "MI300X 668.4 of 1300")
_NVMM = ("NVIDIA, Matrix Multiplication Background User's Guide (DU-09799-001, 2023): GEMM throughput grows "
         "with size until the math-limited regime; small GEMMs are memory- or wave-quantisation-limited")
_FIT = ("fitted on docs/validation_time.md (Korthikanti et al. 2022, A100): transformer-shaped products reach "
        "7/8 of the best-shape figure (refitted with the communication model of Megatron-LM's sequence-parallel "
        "re-gather, pipeline scatter/gather and asynchronous tensor-parallel backward: the value that leaves those "
        "rows unbiased); the memory-bound "
        "kernels 7/10 of Calculon's fractions (the traffic the kernel count leaves out: casts, bias gradients, "
        "gradient accumulation)")
_FA2_A100 = ("Dao, FlashAttention-2 (2023): 50-73 % of the A100's 312 TFLOPS forward, lower backward; "
             "taken as 3/5 forward and backward together")
_FA_H100 = ("Dao, FlashAttention-2 (2023) about 35 % and Shah et al., FlashAttention-3 (2024) up to 75 % "
            "of the H100's 989 TFLOPS (fp16); taken as 1/2")
_ASSUMED = "no published matmul sweep at hand for this device: the H100's fractions assumed; measure and override"

GIGA = 10**9
MB = 10**6
SHAPE_FACTOR = Fraction(7, 8)  # transformer-shaped products against the best shape (fitted, _FIT)
MEMORY_FACTOR = Fraction(7, 10)  # the memory-bound kernels against Calculon's fractions (fitted, _FIT)


def _table(*pairs) -> tuple[tuple[Fraction, Fraction], ...]:
    return tuple((Fraction(b), Fraction(f)) for b, f in pairs)


def gemm_table(ceiling: Fraction) -> tuple[tuple[Fraction, Fraction], ...]:
    """A device's matrix-product fractions: its best-shape fraction (MAMF / peak) × 7/8 from
    128 GFLOP, × 9/10 of that from 16 GFLOP, × 3/5 of that from 1 GFLOP, 1/10 below (Calculon's
    classes and steps)."""
    top = ceiling * SHAPE_FACTOR
    return _table((128 * GIGA, top), (16 * GIGA, top * Fraction(9, 10)), (GIGA, top * Fraction(27, 50)),
                  (0, Fraction(1, 10)))


MEMORY_TABLE = _table((100 * MB, Fraction(9, 10) * MEMORY_FACTOR), (10 * MB, Fraction(3, 4) * MEMORY_FACTOR),
                      (MB, Fraction(3, 5) * MEMORY_FACTOR), (0, Fraction(3, 10) * MEMORY_FACTOR))
MAMF = {"a100": Fraction("271.2") / 312, "h100": Fraction("794.5") / 989, "b200": Fraction(1745, 2250),
        "mi300x": Fraction("668.4") / 1300}
_EFF_A100 = Efficiency(gemm_table(MAMF["a100"]), MEMORY_TABLE, Fraction(3, 5), (_MAMF, _CALCULON, _NVMM, _FIT, _FA2_A100))
_EFF_H100 = Efficiency(gemm_table(MAMF["h100"]), MEMORY_TABLE, Fraction(1, 2), (_MAMF, _CALCULON, _NVMM, _FIT, _FA_H100))
_EFF_B200 = Efficiency(gemm_table(MAMF["b200"]), MEMORY_TABLE, Fraction(1, 2), (_MAMF, _CALCULON, _FIT, _FA_H100))
_EFF_MI300X = Efficiency(gemm_table(MAMF["mi300x"]), MEMORY_TABLE, Fraction(1, 2), (_MAMF, _CALCULON, _FIT))
_EFF_OTHER = Efficiency(gemm_table(MAMF["h100"]), MEMORY_TABLE, Fraction(1, 2), (_ASSUMED, _CALCULON, _FIT))
GENERIC_EFFICIENCY = _EFF_OTHER  # a device of one's own given with its HBM bandwidth

DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("a100_40gb", "NVIDIA A100 SXM4 40GB", 40 * GiB, "40 GB HBM2",
           {"fp32": _f("19.5e12"), "tf32": _f(156 * T), "bf16": _f(312 * T), "fp16": _f(312 * T)},
           _f(1555 * GB), "nvlink3", "ib_hdr", 8, (_A100,), _EFF_A100),
    Device("a100_80gb", "NVIDIA A100 SXM4 80GB", 80 * GiB, "80 GB HBM2e",
           {"fp32": _f("19.5e12"), "tf32": _f(156 * T), "bf16": _f(312 * T), "fp16": _f(312 * T)},
           _f(2039 * GB), "nvlink3", "ib_hdr", 8, (_A100,), _EFF_A100),
    Device("h100_sxm", "NVIDIA H100 SXM5 80GB", 80 * GiB, "80 GB HBM3",
           {"fp32": _f("66.9e12"), "tf32": _f("494.7e12"), "bf16": _f("989.4e12"), "fp16": _f("989.4e12"),
            "fp8": _f("1978.9e12")},
           _f("3.35e12"), "nvlink4", "ib_ndr", 8, (_H100,), _EFF_H100),
    Device("h100_pcie", "NVIDIA H100 PCIe 80GB", 80 * GiB, "80 GB HBM2e",
           {"fp32": _f("51.2e12"), "tf32": _f("378e12"), "bf16": _f("756.5e12"), "fp16": _f("756.5e12"),
            "fp8": _f("1513e12")},
           _f(2 * T), "pcie5", "ib_ndr", 8, (_H100,), _EFF_H100),
    Device("h200", "NVIDIA H200 SXM 141GB", 141 * GiB, "141 GB HBM3e",
           {"fp32": _f("66.9e12"), "tf32": _f("494.7e12"), "bf16": _f("989.4e12"), "fp16": _f("989.4e12"),
            "fp8": _f("1978.9e12")},
           _f("4.8e12"), "nvlink4", "ib_ndr", 8, (_H200, _H100), _EFF_H100),
    Device("b200", "NVIDIA B200 (HGX B200) 180GB", 180 * GiB, "180 GB HBM3e",
           {"tf32": _f("1.1e15"), "bf16": _f("2.25e15"), "fp16": _f("2.25e15"), "fp8": _f("4.5e15")},
           _f(8 * T), "nvlink5", "ib_ndr", 8, (_B200,), _EFF_B200),
    Device("mi300x", "AMD Instinct MI300X 192GB", 192 * GiB, "192 GB HBM3",
           {"fp32": _f("163.4e12"), "tf32": _f("653.7e12"), "bf16": _f("1307.4e12"), "fp16": _f("1307.4e12"),
            "fp8": _f("2614.9e12")},
           _f("5.3e12"), "infinity_fabric", "roce_400", 8, (_MI300X,), _EFF_MI300X),
    Device("l40s", "NVIDIA L40S 48GB", 48 * GiB, "48 GB GDDR6",
           {"fp32": _f("91.6e12"), "tf32": _f("183e12"), "bf16": _f("362.05e12"), "fp16": _f("362.05e12"),
            "fp8": _f("733e12")},
           _f(864 * GB), "pcie4", "roce_200", 8, (_L40S,), _EFF_OTHER),
)}

_NV3_BUS = ("NCCL tests on other 8 x A100-SXM4-80GB systems over NVLink 3: all_reduce busbw about 200 GB/s "
            "(github.com/NVIDIA/nccl-tests issue 149) and 208 GB/s (issue 178): lower plateaus than _NV3_CURVE's")
_HDR_BUS = ("NCCL tests across 3 nodes of 8 x A100 with 4 HDR NICs each: all_reduce busbw 84.8 GB/s on average "
            "and 96 at best of 100 (github.com/NVIDIA/nccl-tests issue 119): 9/10")
_BUS_ASSUMED = "bus bandwidth efficiency: no NCCL-tests figure at hand for this link; 1 (the line rate) assumed"
_NCCL_LAT = ("NCCL's tuning model, src/graph/tuning.cc of github.com/NVIDIA/nccl (v2.9.9-1, commit 3fec2fa5, "
             "2021): ring, Simple protocol, baseLat 8.4 us per call, hwLat per ring step 3.4 us "
             "on NVLink, 5.7 on PCI, 9.6 across the network; the other algorithms and protocols: NCCL_TUNING "
             "(kernel model)")
_NV3_CURVE = ("nccl-tests all_reduce_perf -g 8 on one OCI BM.GPU4.8 (8 x A100-SXM4-40GB, NVLink 3 and NVSwitch), "
              "github.com/oracle-japan/ocitutorials, tutorials/_hpc/spinup-gpu-cluster.md (its 2022 revision, "
              "section 4-2): busbw 23.92 GB/s at 1 MiB, 54.57 at 4, 119.81 at 16, 199.23 at 64, 221.38 at 256 MiB, "
              "230.08 at 1 GiB, 235.14 at 8 GiB; the sustained figure 47/60 of 300 (235 GB/s: that run's plateau, "
              "and the 235 GB/s NCCL's own tuning model caps an A100 at); the curve: each size class at the fraction "
              "of the plateau its smallest size reaches, rounded down")
_NO_CURVE = ("bus bandwidth by message size: no published nccl-tests curve with a stated setup at hand for this "
             "link; the sustained figure at every size, NCCL's latency paid apart")
_NV4_BUS = ("NCCL's maintainer on 8 x H100 (github.com/NVIDIA/nccl-tests issue 212): 'NCCL can get an effective "
            "NVLink bandwidth of 370GB/s' of the 450 line rate, the ring busbw: 37/45")
_ALPHA = ("latency: an assumption of the order of NCCL's tuning model (per-step hardware latency "
          "about 1 µs on NVLink, 2 µs on PCIe, 5 µs across the network); measure and override")

MiB = 2**20
KiB = 2**10
# the fraction of the sustained bus bandwidth an 8-GPU all-reduce reaches by message size (_NV3_CURVE)
NV3_CURVE = tuple((Fraction(b), Fraction(f)) for b, f in (
    (4096 * MiB, 1), (1024 * MiB, "39/40"), (256 * MiB, "47/50"), (64 * MiB, "5/6"), (32 * MiB, "5/8"),
    (16 * MiB, "1/2"), (8 * MiB, "1/3"), (4 * MiB, "23/100"), (2 * MiB, "13/100"), (MiB, "1/10"),
    (512 * KiB, "1/16"), (256 * KiB, "1/25"), (128 * KiB, "1/40"), (0, "1/80")))

# (call, per-step) latency of NCCL's ring with the Simple protocol (_NCCL_LAT), seconds
_NV = (Fraction(84, 10**7), Fraction(34, 10**7))
_PCI = (Fraction(84, 10**7), Fraction(57, 10**7))
_NET = (Fraction(84, 10**7), Fraction(96, 10**7))

LINKS: dict[str, Link] = {k.name: k for k in (
    Link("nvlink3", "NVLink 3 (A100): 12 links, 600 GB/s bidirectional", _f(300 * GB), _f("1e-6"),
         (_A100, _ALPHA, _NV3_CURVE, _NV3_BUS, _NCCL_LAT), Fraction(47, 60), *_NV, "nvlink", NV3_CURVE),
    Link("nvlink4", "NVLink 4 (H100, H200): 18 links, 900 GB/s bidirectional", _f(450 * GB), _f("1e-6"),
         (_H100, _ALPHA, _NV4_BUS, _NCCL_LAT, _NO_CURVE), Fraction(37, 45), *_NV, "nvlink"),
    Link("nvlink5", "NVLink 5 (B200): 18 links, 1.8 TB/s bidirectional", _f(900 * GB), _f("1e-6"),
         (_B200, _ALPHA, _NCCL_LAT, _NO_CURVE), Fraction(1), *_NV, "nvlink"),
    Link("pcie4", "PCIe Gen4 x16: 64 GB/s bidirectional", _f(32 * GB), _f("2e-6"),
         ("PCI-SIG PCIe 4.0 x16, 16 GT/s per lane (nominal 32 GB/s per direction)", _ALPHA, _NCCL_LAT, _NO_CURVE),
         Fraction(1), *_PCI, "pci"),
    Link("pcie5", "PCIe Gen5 x16: 128 GB/s bidirectional", _f(64 * GB), _f("2e-6"),
         ("PCI-SIG PCIe 5.0 x16, 32 GT/s per lane (nominal 64 GB/s per direction)", _ALPHA, _NCCL_LAT, _NO_CURVE),
         Fraction(1), *_PCI, "pci"),
    Link("infinity_fabric", "AMD Infinity Fabric (MI300X): 7 links, 896 GB/s aggregate bidirectional",
         _f(448 * GB), _f("1e-6"), (_MI300X, _ALPHA)),
    Link("ib_hdr", "InfiniBand HDR, 200 Gb/s per device", _f(25 * GB), _f("5e-6"),
         ("NVIDIA ConnectX-6 / Quantum HDR: 200 Gb/s per port", _ALPHA, _HDR_BUS, _NCCL_LAT, _NO_CURVE),
         Fraction(9, 10), *_NET, "net"),
    Link("ib_ndr", "InfiniBand NDR, 400 Gb/s per device", _f(50 * GB), _f("5e-6"),
         ("NVIDIA ConnectX-7 / Quantum-2 NDR: 400 Gb/s per port", _ALPHA, _NCCL_LAT, _NO_CURVE), Fraction(1), *_NET, "net"),
    Link("ib_xdr", "InfiniBand XDR, 800 Gb/s per device", _f(100 * GB), _f("5e-6"),
         ("NVIDIA ConnectX-8 / Quantum-X800 XDR: 800 Gb/s per port", _ALPHA, _NCCL_LAT, _NO_CURVE), Fraction(1), *_NET, "net"),
    Link("roce_200", "RoCE, 200 Gb/s Ethernet per device", _f(25 * GB), _f("5e-6"),
         ("IEEE 802.3 200GbE line rate", _ALPHA, _NCCL_LAT, _NO_CURVE), Fraction(1), *_NET, "net"),
    Link("roce_400", "RoCE, 400 Gb/s Ethernet per device", _f(50 * GB), _f("5e-6"),
         ("IEEE 802.3 400GbE line rate", _ALPHA, _NCCL_LAT, _NO_CURVE), Fraction(1), *_NET, "net"),
)}

# The link classes an axis may name without defining them: a device's own node links.
NODE_LINKS = ("intra_node", "inter_node")


def device(name: str) -> Device | None:
    return DEVICES.get(name.lower())


def link(name: str) -> Link | None:
    return LINKS.get(name.lower())
