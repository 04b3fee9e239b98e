"""The search space and its records: what a user allows (``Space``), a structure shared by
many candidates, a candidate and the search's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "offload")
DEFAULT_STRATEGIES = STRATEGIES[:-1]  # offload (ZeRO-Offload) only when asked for
_LIBRARY = {"fsdp": "fsdp_full_shard", "hsdp": "hybrid_shard", "offload": "zero_offload"}  # search name -> library
RECOMPUTE = ("none", "selective", "full")
OPTIMIZERS = ("adamw", "muon")  # muon: on the matrices, with whole-matrix owners over the data axes
SCHEDULES = ("1f1b", "interleaved")
AXES = ("dp", "tp", "pp", "cp", "ep")
COLLAPSED = ("tp", "ep")  # axes whose size-one case shares the structure of larger sizes
SIZE_SYMBOLS = AXES + ("ds", "mb", "nmb", "nv")  # ds: the shard size of hsdp (dp its replicas), else 1
_RECOMPUTE_USE = {"none": "", "selective": "  use selective_recompute\n", "full": "  use full_recompute\n"}


@dataclass(frozen=True)
class Space:
    """What a user allows; every tuple lists the allowed values."""

    devices: int
    global_batch: int  # sequences per step
    seq: int
    device: str
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8, 16)
    cp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    recompute: tuple[str, ...] = RECOMPUTE
    microbatch: tuple[int, ...] = (1, 2, 4, 8)
    schedules: tuple[str, ...] = SCHEDULES
    chunks: tuple[int, ...] = (2, 4)  # virtual chunks per stage of the interleaved schedule
    mfu: Fraction | None = None  # None: the kernel model; a figure: the MFU convention with it
    folding: tuple[bool, ...] = (False, True)  # MoE: plain expert parallelism, and parallel folding
    reserve: Fraction = Fraction(0)  # bytes per device kept free: a configuration fits in memory − reserve
    optimizers: tuple[str, ...] = ("adamw",)  # OPTIMIZERS: the algorithm on the weight matrices


@dataclass(frozen=True)
class Structure:
    strategy: str
    recompute: str
    schedule: str | None  # None without a pipeline
    axes: tuple[str, ...]  # the axes with more than one device
    # MoE parallel folding: ep (more than one device) is a data axis of the dense layers, the experts
    # on ep × tp × cp (expert tensor size 1, whatever the dense tensor size)
    folded: bool = False
    optimizer: str = "adamw"  # "muon": Muon on the matrices (ir.optimizers), AdamW on the rest
    # what a derivation decides from the sizes' values rather than their symbols (``FACTS``): the same
    # for every row of the structure, so its closed forms are those of each row's own spec
    facts: tuple[str, ...] = ()


# The facts a derivation branches on by value, each written into the structure's spec: the
# interleaved schedule with one chunk per stage (``interleaved_1f1b(v = 1)``); an axis whose group
# spans nodes (``@ inter_node``: tp, then cp beside tp, then hsdp's shard group beside both); K/V
# heads copied over the tensor ranks (more ranks than kv heads: a gradient sum over each copy group),
# written with the tensor size, which the spec then declares.
ONE_CHUNK = "v=1"
INTER_NODE = {"tp": "tp inter_node", "cp": "cp inter_node", "ds": "ds inter_node"}
KV_COPIES = "kv copied at tp="


def inter_node(per_node: int, tp, cp, ds) -> dict:
    """Which of tp, cp and ds span more than one node (tp innermost, cp beside it, hsdp's shard
    group beside both); elementwise over numpy arrays as over numbers."""
    return {"tp": tp > per_node, "cp": tp * cp > per_node, "ds": ds * tp * cp > per_node}


def kv_copied(kv: int | None, mla: bool, tp):
    """Whether the tensor ranks outnumber the model's K >= 2 kv heads, each copied on tp/K of them
    (``ir.heads.kv_copies``); elementwise over numpy arrays as over numbers."""
    if kv is None or kv < 2 or mla:
        return tp < 0  # never
    return (tp > kv) & (tp % kv == 0)


def row_facts(structure: Structure, sizes: dict, per_node: int, kv: int | None, mla: bool) -> set[str] | None:
    """The facts one row's sizes decide (those ``enumeration`` splits a structure's rows by), or
    ``None`` when the sizes do not have the structure's shape (an axis of more than one device
    that the structure lacks, or a pipeline or context axis of one device that it has)."""
    s, z = structure, sizes
    present = s.axes + (("ds",) if s.strategy == "hsdp" else ())
    for a in ("tp", "pp", "cp", "ep", "ds"):
        if (a not in present and z[a] != 1) or (a in present and a not in COLLAPSED and z[a] <= 1):
            return None
    out = {ONE_CHUNK} if s.schedule == "interleaved" and z["nv"] == 1 else set()
    crossing = inter_node(per_node, z["tp"], z["cp"], z["ds"])
    out |= {INTER_NODE[a] for a in ("tp", "cp", "ds") if a in present and crossing[a]}
    if "tp" in present and kv_copied(kv, mla, z["tp"]):
        out.add(f"{KV_COPIES}{z['tp']}")
    return out


@dataclass
class Candidate:
    structure: Structure
    sizes: dict  # symbol -> int (dp, tp, pp, cp, ep, mb, nmb, nv)
    memory: float = 0.0
    step: float = 0.0
    mfu: float = 0.0
    comm: float = 0.0
    fits: bool = False
    frontier: bool = False
    exact_memory: Fraction | None = None
    exact_step: Fraction | None = None
    verdict: str | None = None
    agrees: bool | None = None  # the vectorised figures equal the exact ones (bytes to the byte)
    stage_memory: dict = field(default_factory=dict)  # pipeline stage -> exact peak bytes per device (re-derived)
    link_bytes: dict = field(default_factory=dict)  # link class -> exact bytes per device per step (re-derived)
    same: list = field(default_factory=list)  # other strategies whose row is this one, figure for figure (exact)
    exposed: Fraction | None = None  # seconds of communication on the critical path, exact (step − compute − optimizer)

    def label(self) -> str:
        s, z = self.structure, self.sizes
        parts = [f"dp{z['dp'] * z['ds']}"]
        for a in ("tp", "pp", "cp", "ep"):
            if z[a] > 1:
                parts.append(f"{a}{z[a]}" + (f"v{z['nv']}" if a == "pp" and s.schedule == "interleaved" else ""))
        strat = f"hsdp({z['dp']}x{z['ds']})" if s.strategy == "hsdp" else s.strategy
        fold = f" experts on ep{z['ep'] * z['tp'] * z['cp']}" if s.folded else ""
        strat += "" if s.optimizer == "adamw" else f"+{s.optimizer}"
        return " ".join(parts) + f" {strat}{fold} {s.recompute} mb{z['mb']}"


@dataclass
class Result:
    space: Space
    model_text: str
    candidates: int  # size assignments evaluated
    ranked: list = field(default_factory=list)  # the fastest fitting ones (top k), fastest first
    frontier: list = field(default_factory=list)  # memory vs time, among the fitting
    structures: int = 0
    timings: dict = field(default_factory=dict)  # phase -> seconds
    valid: int = 0  # size assignments that honour divisibility (evaluated)
    fitting: int = 0  # of those, the ones that fit the device
    parts: list = field(default_factory=list)  # (structure, sizes array, values array) per structure
    block: str = ""  # the model block the specs are written with
