"""Design-space search: which parallel configuration fits a device, and which is fastest.

Input: a model (a spec's model block or a Hugging Face ``config.json``), a catalogue device,
a device count, a global batch (sequences) and a sequence length, and the space a user
allows (``Space``). Output: every candidate evaluated (``Result``), the fitting ones ranked by
step time, the Pareto frontier of memory against time, and the winners re-derived exactly
and checked.

How: candidates share a few *structures* (data strategy × recompute × schedule × which axes
have more than one device). Each structure is written as a spec with its sizes as symbols,
derived once (exact closed forms: peak memory per device, step time, MFU), compiled with
``sympy.lambdify`` and evaluated over every size assignment at once (numpy when installed,
else value by value). Every size assignment honours divisibility: heads and kv heads over
tp, layers over pp × chunks, experts over ep, the sequence over cp, the global batch over
dp × ep × microbatch. Winners are then written as specs with literal sizes, derived again in
exact arithmetic (bytes to the byte, seconds as rationals) and checked with ``check``.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import sympy

from .. import hardware as hw
from .. import ir
from ..costs import derive, steptime, with_sizes
from ..costs.symbolic import symbol
from ..diagnostics import Diagnostic, DiagnosticError, Span, did_you_mean
from ..frontend import surface
from ..frontend.loader import load_string
from ..frontend.parser import parse

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "offload")
DEFAULT_STRATEGIES = STRATEGIES[:-1]  # offload (ZeRO-Offload) only when asked for
_LIBRARY = {"fsdp": "fsdp_full_shard", "hsdp": "hybrid_shard", "offload": "zero_offload"}  # search name -> library
RECOMPUTE = ("none", "selective", "full")
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
    mfu: Fraction | None = None  # None: the catalogue default (1/2)


@dataclass(frozen=True)
class Structure:
    strategy: str
    recompute: str
    schedule: str | None  # None without a pipeline
    axes: tuple[str, ...]  # the axes with more than one device


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

    def label(self) -> str:
        s, z = self.structure, self.sizes
        parts = [f"dp{z['dp'] * z['ds']}"]
        for a in ("tp", "pp", "cp", "ep"):
            if z[a] > 1:
                parts.append(f"{a}{z[a]}" + (f"v{z['nv']}" if a == "pp" and s.schedule == "interleaved" else ""))
        strat = f"hsdp({z['dp']}x{z['ds']})" if s.strategy == "hsdp" else s.strategy
        return " ".join(parts) + f" {strat} {s.recompute} mb{z['mb']}"


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


# --------------------------------------------------------------------------- the model


def model_text(path: str, seq: int) -> tuple[str, ir.TransformerShape, str]:
    """The model block of a spec or a config.json, with the batch written as symbols
    (``seq = S  microbatch = mb  microbatches = nmb``), the lets it may need, and its shape."""
    p = Path(path)
    if p.suffix == ".json":
        block = f'model from "{p.resolve()}" {{\n  seq = {seq}\n  microbatch = mb\n  microbatches = nmb\n}}\n'
        shown = f'model from "{path}" {{\n  seq = {seq}\n  microbatch = mb\n  microbatches = nmb\n}}\n'
        spec = load_string(_lets(1, 1) + block, "<search>", p.resolve().parent)
        return block, spec.model.transformer, shown
    from ..frontend.files import read_source

    text = read_source(str(p))
    module = parse(text, str(p))
    lines = text.splitlines(keepends=True)
    blocks = [i for i in module.items if isinstance(i, surface.ModelBlock)]
    if not blocks:
        raise DiagnosticError([Diagnostic("PL151", f"{path} has no model block to search for",
                                          Span.point(str(p), 1, 1))])
    mb = blocks[0]
    lets = "".join(_slice(lines, i.span) + "\n" for i in module.items if isinstance(i, surface.LetStmt)
                   and i.name not in SIZE_SYMBOLS)
    kept = []
    for item in mb.items:
        if isinstance(item, surface.Prop) and item.key in ("seq", "microbatch", "microbatches"):
            continue
        kept.append("  " + _slice(lines, item.span))
    head = "model" + (f' from "{(p.parent / mb.source).resolve()}"' if mb.source else "")
    body = "\n".join(kept + [f"  seq = {seq}", "  microbatch = mb", "  microbatches = nmb"])
    block = f"{lets}{head} {{\n{body}\n}}\n"
    spec = load_string(_lets(1, 1) + block, str(p), p.resolve().parent)
    if spec.model is None or spec.model.transformer is None:
        raise DiagnosticError([Diagnostic("PL151", "the search needs a transformer shape (FLOPs and divisibility "
                                          "come from it)", mb.span)])
    return block, spec.model.transformer, block


def _slice(lines: list[str], s: Span) -> str:
    if s.line == s.end_line:
        return lines[s.line - 1][s.column - 1:s.end_column - 1]
    out = [lines[s.line - 1][s.column - 1:]] + lines[s.line:s.end_line - 1] + [lines[s.end_line - 1][:s.end_column - 1]]
    return "".join(out).rstrip()


def _lets(mb: int, nmb: int) -> str:
    return f"let mb = {mb}\nlet nmb = {nmb}\n"


# --------------------------------------------------------------------------- specs


def spec_text(block: str, structure: Structure, sizes: dict, device: str, mfu: Fraction | None,
              literal: bool = False) -> str:
    """A spec for one structure: sizes as symbols (``literal``: as numbers)."""
    s = structure
    per_node = hw.device(device).per_node
    imports = [("from std.offload import " if s.strategy == "offload" else "from std.data import ")
               + _LIBRARY.get(s.strategy, s.strategy)]
    if "tp" in s.axes:
        imports.append("from std.tensor import megatron_sp")
    if "pp" in s.axes:
        imports.append("from std.pipeline import " + ("interleaved_1f1b" if s.schedule == "interleaved"
                                                         else "one_f_one_b"))
    if "cp" in s.axes:
        imports.append("from std.context import context_parallel")
    if "ep" in s.axes:
        imports.append("from std.expert import expert_parallel")
    if s.recompute != "none":
        imports.append("from std.recompute import " + ("selective_recompute" if s.recompute == "selective"
                                                       else "full_recompute"))
    mesh = [f"  device = {device}"]
    if mfu is not None:
        mesh.append(f"  mfu = {mfu.numerator}/{mfu.denominator}" if mfu.denominator != 1 else f"  mfu = {mfu}")
    inner = sizes.get("tp", 1)
    for a in ("dp", "tp", "pp", "cp", "ep"):
        if a != "dp" and a not in s.axes:
            continue
        if a == "tp":
            link = "intra_node" if sizes.get("tp", 2) <= per_node else "inter_node"
        elif a == "cp":
            link = "intra_node" if inner * sizes.get("cp", 2) <= per_node else "inter_node"
        else:
            link = "inter_node"
        mesh.append(f"  {a} = {sizes[a] if literal else 2} @ {link}")
        if a == "dp" and s.strategy == "hsdp":  # the shard group inside a node when it fits there
            ds = sizes.get("ds", 2)
            link = "intra_node" if ds * inner * sizes.get("cp", 1) <= per_node else "inter_node"
            mesh.append(f"  ds = {ds if literal else 2} @ {link}")
    plan = ["  [dp, ds]: hybrid_shard" if s.strategy == "hsdp" else f"  dp: {_LIBRARY.get(s.strategy, s.strategy)}"]
    if "tp" in s.axes:
        plan.append("  tp: megatron_sp")
    if "pp" in s.axes:
        plan.append("  pp: " + (f"interleaved_1f1b(v = {sizes['nv'] if literal else 'nv'})"
                                 if s.schedule == "interleaved" else "one_f_one_b"))
    if "cp" in s.axes:
        plan.append("  cp: context_parallel")
    if "ep" in s.axes:
        plan.append("  ep: expert_parallel")
    lets = f"let mb = {sizes['mb'] if literal else 1}\nlet nmb = {sizes['nmb'] if literal else 1}\n"
    if not literal and s.schedule == "interleaved":
        lets += "let nv = 2\n"
    return ("\n".join(imports) + "\n\n" + lets + "\n" + block + "\nmesh {\n" + "\n".join(mesh) + "\n}\n\n"
            + "plan searched {\n" + "\n".join(plan) + "\n" + _RECOMPUTE_USE[s.recompute] + "  flash_attention\n}\n")


# --------------------------------------------------------------------------- enumeration


def _int(v) -> int | None:
    return int(v.value) if isinstance(v, ir.Const) and v.value.denominator == 1 else None


def enumerate_space(space: Space, t: ir.TransformerShape):
    """Structure -> (sizes, valid): every grid point of the structure's space as an integer
    array (one row each, columns ``SIZE_SYMBOLS``) and a mask of those that honour
    divisibility (heads, kv heads and the MLP width over tp, layers over pp × chunks,
    experts over ep, the sequence over cp × tp, devices and the global batch over the
    sizes; microbatches a multiple of pp for the interleaved schedule). Built with numpy,
    without a Python loop over candidates."""
    import numpy as np

    heads, kv, ffn, layers, experts = (_int(x) for x in (t.heads, t.kv_heads, t.ffn, t.layers, t.experts))
    moe = bool(experts and experts > 1)
    per_node = hw.device(space.device).per_node
    allowed = {"tp": space.tp, "pp": space.pp, "cp": space.cp, "ep": space.ep if moe else (1,)}
    out: dict[Structure, tuple] = {}
    for pattern in itertools.product((False, True), repeat=4):
        present = tuple(a for a, on in zip(("tp", "pp", "cp", "ep"), pattern) if on)
        # tensor and expert axes keep their closed forms at size one (ring factors (n - 1)/n
        # vanish, divisions by one), so one structure holds every size of them; a pipeline or
        # context axis of one device sends nothing point to point, so it is a structure apart
        if any(a in COLLAPSED and on != any(v > 1 for v in allowed[a])
               for a, on in zip(("tp", "pp", "cp", "ep"), pattern)):
            continue
        values = {a: (list(allowed[a]) if a in COLLAPSED else [v for v in allowed[a] if v > 1]) if a in present
                  else ([1] if 1 in allowed[a] else []) for a in allowed}
        if any(not v for v in values.values()):
            continue
        for sched in (space.schedules if "pp" in present else (None,)):
            chunks = space.chunks if sched == "interleaved" else (1,)
            grid = np.meshgrid(*(np.array(values[a], dtype=np.int64) for a in ("tp", "pp", "cp", "ep")),
                               np.array(space.microbatch, dtype=np.int64), np.array(chunks, dtype=np.int64),
                               indexing="ij")
            tp, pp, cp, ep, mb, nv = (g.ravel() for g in grid)
            rest = tp * pp * cp * ep
            ok = space.devices % rest == 0
            dp = np.where(ok, space.devices // rest, 1)  # the data-parallel size
            replicas = dp * ep * mb
            ok &= space.global_batch % replicas == 0
            nmb = np.where(ok, space.global_batch // replicas, 1)
            if heads:
                ok &= heads % tp == 0
            if kv:
                ok &= (kv % tp == 0) | (tp % kv == 0)
            if ffn:
                ok &= ffn % tp == 0
            if moe:
                ok &= experts % ep == 0
            ok &= space.seq % (cp * tp) == 0
            if layers:
                ok &= layers % (pp * nv) == 0
            if sched == "interleaved":
                ok &= nmb % pp == 0
            one = np.ones_like(dp)
            sizes = np.stack([dp, tp, pp, cp, ep, one, mb, nmb, nv], axis=1)
            # hsdp: shard over the largest power of two of the data size that fits a node beside
            # tp x cp, replicate over the rest (both more than one device)
            ds = one.copy()
            k = 2
            while k <= per_node:
                ds = np.where((dp % k == 0) & (k * tp * cp <= per_node), k, ds)
                k *= 2
            hsizes = np.stack([dp // ds, tp, pp, cp, ep, ds, mb, nmb, nv], axis=1)
            # one data replica: every data strategy is plain replication (a size-1 axis gathers
            # and reduces nothing, which ddp's closed forms give at size 1; ZeRO's do not), so
            # it is evaluated once, as ddp
            strategies = space.strategies + (() if "ddp" in space.strategies else ("ddp",))
            for strat, rec in itertools.product(strategies, space.recompute):
                if strat == "hsdp":
                    out[Structure(strat, rec, sched, present)] = (hsizes, ok & (ds > 1) & (dp // ds > 1))
                    continue
                if strat != "ddp":
                    valid = ok & (dp > 1)
                else:
                    valid = ok if "ddp" in space.strategies else ok & (dp == 1)
                out[Structure(strat, rec, sched, present)] = (sizes, valid)
    return out


# --------------------------------------------------------------------------- evaluation


def _forms(block: str, s: Structure, space: Space):
    text = spec_text(block, s, {}, space.device, space.mfu)
    spec = load_string(text, "<search>", None)
    plan = spec.plans[0]
    pc = derive(plan)
    st = steptime.step_time(pc, plan.mesh.hardware)
    return pc.memory.device_total, st.step, st.mfu, pc.communication.total_bytes


EVAL_BLOCK = 8192  # rows evaluated at once


def _np_max(*xs):
    import numpy as np

    out = xs[0]
    for x in xs[1:]:
        out = np.maximum(out, x)
    return out


def _np_min(*xs):
    import numpy as np

    out = xs[0]
    for x in xs[1:]:
        out = np.minimum(out, x)
    return out


def _compile(exprs):
    args = [symbol(n) for n in SIZE_SYMBOLS]
    return sympy.lambdify(args, exprs, modules=[{"Max": _np_max, "Min": _np_min}, "numpy"], cse=True)


def needs_numpy() -> None:
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise DiagnosticError([Diagnostic(
            "PL151", "placement search evaluates its candidates with numpy, which is not installed",
            Span("<command line>", 1, 1, 1, 2),
            notes=("install it with: pip install 'placement-logic[search]'",))]) from None


def run(model: str, space: Space, top: int = 10, check: bool = True) -> Result:
    needs_numpy()
    import numpy as np

    if hw.device(space.device) is None:
        raise DiagnosticError([Diagnostic("PL150", f"--device {space.device}: not a device of the catalogue",
                                          Span("<command line>", 1, 1, 1, 2),
                                          notes=did_you_mean(space.device, tuple(hw.DEVICES)))])
    t0 = time.perf_counter()
    block, shape, shown = model_text(model, space.seq)
    groups = enumerate_space(space, shape)
    groups = {k: v for k, v in groups.items() if v[1].any()}
    result = Result(space, shown, sum(len(v[0]) for v in groups.values()), structures=len(groups))
    result.block = block
    t1 = time.perf_counter()
    capacity = hw.device(space.device).memory
    parts = []
    derive_s = 0.0
    evaluate_s = 0.0
    for s, (sizes, valid) in groups.items():
        d0 = time.perf_counter()
        fn = _compile(list(_forms(block, s, space)))
        d1 = time.perf_counter()
        derive_s += d1 - d0
        cols = [sizes[:, i].astype(np.float64) for i in range(len(SIZE_SYMBOLS))]
        vals = np.empty((len(sizes), 4))
        # in blocks that stay in the cache (temporaries above ~128 KiB are fresh pages every time)
        with np.errstate(all="ignore"):  # rows that break divisibility are evaluated too, then dropped
            for a in range(0, len(sizes), EVAL_BLOCK):
                for k, x in enumerate(fn(*(c[a:a + EVAL_BLOCK] for c in cols))):
                    vals[a:a + EVAL_BLOCK, k] = x
        evaluate_s += time.perf_counter() - d1
        parts.append((s, sizes[valid], vals[valid]))
    t2 = time.perf_counter()
    result.valid = sum(len(p[1]) for p in parts)
    result.parts = parts
    # rank the fitting rows of every structure by step time, then memory
    if parts:
        allv = np.concatenate([v for _, _, v in parts])
        where = np.concatenate([np.stack([np.full(len(v), i), np.arange(len(v))], axis=1) for i, (_, _, v) in
                                enumerate(parts)])
        fit = np.nonzero(allv[:, 0] <= capacity)[0]
        order = fit[np.lexsort((allv[fit, 0], allv[fit, 1]))]
        ranked = [tuple(where[o]) for o in order]
    else:
        ranked = []
    result.fitting = len(ranked)

    def candidate(i, j) -> Candidate:
        s, sizes, v = parts[i]
        z = {n: int(sizes[j, c]) for c, n in enumerate(SIZE_SYMBOLS)}
        return Candidate(s, z, float(v[j, 0]), float(v[j, 1]), float(v[j, 2]), float(v[j, 3]), True)

    best = math.inf
    for i, j in ranked:  # fastest first: on the frontier when it needs less memory than every faster one
        m = parts[i][2][j, 0]
        if m < best:
            c = candidate(i, j)
            c.frontier = True
            result.frontier.append(c)
            best = m
    result.ranked = [candidate(i, j) for i, j in ranked[:max(top, 0)]]
    for c in result.ranked:
        c.frontier = any(f.sizes == c.sizes and f.structure == c.structure for f in result.frontier)
    t3 = time.perf_counter()
    for c in result.ranked:
        exact(c, block, space, check)
    result.timings = {"setup": t1 - t0, "derive_and_compile": derive_s, "evaluate": evaluate_s,
                      "filter": t2 - t1 - derive_s - evaluate_s,
                      "rank": t3 - t2, "exact_and_check": time.perf_counter() - t3}
    return result


def concrete_spec(c: Candidate, block: str, space: Space) -> str:
    text = spec_text(block, c.structure, c.sizes, space.device, space.mfu, literal=True)
    return text


def exact(c: Candidate, block: str, space: Space, check: bool = True) -> None:
    """Re-derive a candidate in exact arithmetic (and check it): the figures the report prints."""
    text = concrete_spec(c, block, space)
    spec = load_string(text, "<search>", None)
    plan = spec.plans[0]
    subs = {symbol(n): sympy.Integer(v) for n, v in c.sizes.items()}
    pc = derive(with_sizes(plan, subs), sized=True)
    st = steptime.step_time(pc, plan.mesh.hardware)
    mem = pc.memory.device_total.xreplace(subs)
    stp = st.step.xreplace(subs)
    if not (mem.is_Rational and stp.is_Rational):  # every size is bound: a number, or a bug
        raise AssertionError(f"{c.label()}: the exact figures are not numbers: {mem}, {stp}")
    c.exact_memory = Fraction(int(mem.p), int(mem.q))
    c.exact_step = Fraction(int(stp.p), int(stp.q))
    c.agrees = abs(float(c.exact_memory) - c.memory) < 0.5 and \
        abs(float(c.exact_step) - c.step) <= 1e-9 * max(1.0, float(c.exact_step))
    if check:
        from ..check.run import check_plan
        from ..solver.session import Session

        pinned = {a: c.sizes[a] for a in plan.mesh.names}
        report = check_plan(Session(timeout=20), spec, plan, pinned)
        c.verdict = report.verdict.word


def emitted_spec(c: Candidate, result: Result) -> str:
    """The spec of a ranked configuration, to save and run ``cost`` and ``check`` on: its sizes
    literal, the model as the user named it."""
    sp = result.space
    head = (f"# {c.label()} on {sp.devices} x {sp.device}: global batch {sp.global_batch} x {sp.seq} tokens\n"
            "# written by placement search\n")
    return head + spec_text(result.model_text, c.structure, c.sizes, sp.device, sp.mfu, literal=True)
