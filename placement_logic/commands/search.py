"""``placement search``: a model, a device and a batch in; the configurations that fit,
ranked by step time, with the Pareto frontier of memory against time, the winners
re-derived exactly and checked.

Input: MODEL (a spec with a model block, or a Hugging Face config.json), --device,
--devices, --global-batch, --seq, and the allowed space (--tp, --pp, --cp, --ep,
--microbatch, --chunks as lists ``1,2,4`` or ranges ``1..8``; --strategies, --recompute,
--schedules as names). Output: a table (text, markdown, csv or json); ``--emit N`` prints the
spec of row N instead; ``--plot FILE`` draws the frontier. Exit 0 when some configuration
fits, 1 when none does, 2 on bad input.
"""

from __future__ import annotations

import csv
import io
import json
from fractions import Fraction
from typing import TextIO

from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..outcome import Exit
from .options import add_width, command_line_span, output_width

FORMATS = ("text", "markdown", "csv", "json")
MAX_VALUES = 64
# the search's vocabulary (placement_logic.search, which imports sympy: not loaded to build --help)
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp", "offload")
DEFAULT_STRATEGIES = STRATEGIES[:-1]
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved")
OPTIMIZERS = ("adamw", "muon")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "search", help="the parallel configurations that fit a device, fastest first",
        description="Enumerate mesh factorisations x data strategy x recompute x microbatch x schedule for a "
        "model on a number of catalogue devices; keep those that fit; rank them by the step-time model; "
        "re-derive the winners exactly and check them. Lists: 1,2,4 or 1..8.")
    p.add_argument("model", metavar="MODEL", help="a .place spec with a model block, or a Hugging Face config.json")
    p.add_argument("--device", required=True, metavar="NAME", help="a catalogue device (docs/hardware.md)")
    p.add_argument("--devices", required=True, type=str, metavar="N", help="how many devices")
    p.add_argument("--global-batch", required=True, type=str, metavar="B", help="sequences per step")
    p.add_argument("--seq", required=True, type=str, metavar="S", help="tokens per sequence")
    p.add_argument("--tp", default="1,2,4,8", metavar="LIST", help="tensor-parallel sizes (default 1,2,4,8)")
    p.add_argument("--pp", default="1,2,4,8,16", metavar="LIST", help="pipeline sizes (default 1,2,4,8,16)")
    p.add_argument("--cp", default="1", metavar="LIST", help="context-parallel sizes (default 1)")
    p.add_argument("--ep", default="1,2,4,8", metavar="LIST", help="expert-parallel sizes, MoE only (default 1,2,4,8)")
    p.add_argument("--no-folding", action="store_true", help="MoE: plain expert parallelism only, without the "
                   "folded layouts (experts on ep × tp × cp, expert tensor size 1)")
    p.add_argument("--microbatch", default="1,2,4,8", metavar="LIST", help="microbatch sizes (default 1,2,4,8)")
    p.add_argument("--chunks", default="2,4", metavar="LIST", help="virtual chunks per stage, interleaved (default 2,4)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES), metavar="NAMES",
                   help=f"data strategies among {','.join(STRATEGIES)} (default {','.join(DEFAULT_STRATEGIES)}; "
                   "offload is ZeRO-Offload, the optimizer state and step on the host)")
    p.add_argument("--recompute", default=",".join(RECOMPUTE), metavar="NAMES",
                   help=f"recompute modes (default {','.join(RECOMPUTE)})")
    p.add_argument("--schedules", default=",".join(SCHEDULES), metavar="NAMES",
                   help=f"pipeline schedules (default {','.join(SCHEDULES)})")
    p.add_argument("--optimizer", default="adamw", metavar="NAMES",
                   help="algorithms on the weight matrices (adamw, muon; default adamw): muon with whole-matrix owners "
                   "over the data axes and the tensor pieces gathered")
    p.add_argument("--mfu", default=None, metavar="X",
                   help="time compute by this one assumed MFU (default: each kernel timed, docs/time.md)")
    p.add_argument("--top", default="10", metavar="K", help="rows to show, re-derive and check (default 10)")
    p.add_argument("--no-check", action="store_true", help="do not run the checker on the winners")
    p.add_argument("--emit", default=None, metavar="N", help="print the spec of row N (1-based) instead")
    p.add_argument("--plot", default=None, metavar="FILE", help="draw memory against step time (png, svg, pdf)")
    p.add_argument("--reserve", default=None, metavar="BYTES|FRACTION",
                   help="memory per device kept free: bytes (4GiB, 2.5GB, 1000000) or a fraction of the device's "
                   "memory (0.05); a configuration fits in what is left (default 0)")
    p.add_argument("--jobs", default=None, metavar="N",
                   help="processes deriving the structures not met before (default: one per core; 1: this process "
                   "alone); the figures are the same whatever N")
    p.add_argument("--format", choices=FORMATS, default="text", help="output format (default: text)")
    add_width(p)
    p.set_defaults(run=run)


def _bad(option: str, value: str, message: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.BAD_SET, f"{option} {value}: {message}", command_line_span(f"{option} {value}"))])


def positive(option: str, text: str, cap: int = 10**7) -> int:
    t = text.strip().replace("_", "")
    if not t.isdigit() or int(t) < 1:
        raise _bad(option, text, "a positive integer")
    if int(t) > cap:
        raise _bad(option, text, f"at most {cap:,}")
    return int(t)


def int_list(option: str, text: str) -> tuple[int, ...]:
    """``1,2,4`` or ``1..8`` (inclusive) or both mixed: ``1..4,8``."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if ".." in part:
            lo, _, hi = part.partition("..")
            a, b = positive(option, lo or "?"), positive(option, hi or "?")
            if b < a:
                raise _bad(option, text, f"the range {part} runs backwards")
            if b - a + 1 > MAX_VALUES:
                raise _bad(option, text, f"at most {MAX_VALUES} values")
            out += list(range(a, b + 1))
        else:
            out.append(positive(option, part or "?"))
    if len(set(out)) > MAX_VALUES:
        raise _bad(option, text, f"at most {MAX_VALUES} values")
    return tuple(sorted(set(out)))


def name_list(option: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    from ..diagnostics import did_you_mean

    out = []
    for part in (x.strip() for x in text.split(",")):
        if part not in allowed:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"{option} {text}: '{part}' is not one of "
                                              f"{', '.join(allowed)}", command_line_span(f"{option} {text}"),
                                              notes=did_you_mean(part, allowed))])
        if part not in out:
            out.append(part)
    return tuple(out)


def _fraction(option: str, text: str) -> Fraction:
    try:
        f = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise _bad(option, text, "a number such as 0.45 or 9/20") from None
    if not 0 < f <= 1:
        raise _bad(option, text, "must lie in (0, 1]")
    return f


def reserve_bytes(text: str, memory: int) -> Fraction:
    """``--reserve``: a byte count with an optional unit (``4GiB``, ``2.5 GB``, ``1000000``), or a
    fraction of the device's ``memory`` below 1 (``0.05``)."""
    import re

    from ..resolve.values import BYTE_UNITS

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGT]i?B|B)?\s*", text)
    if m is None or (m.group(2) is not None and m.group(2) not in BYTE_UNITS):
        raise _bad("--reserve", text, "bytes such as 4GiB or 2.5GB, or a fraction of the device's memory such as 0.05")
    number = Fraction(m.group(1))
    if m.group(2) is None and number < 1:
        return number * memory
    out = number * BYTE_UNITS[m.group(2) or "B"]
    if out.denominator != 1:
        raise _bad("--reserve", text, "a whole number of bytes")
    if out >= memory:
        raise _bad("--reserve", text, f"leaves nothing of the device's {memory:,} bytes")
    return out


def space_of(args):
    from .. import hardware
    from ..search import Space
    from .options import device_option

    args.device = args.device.lower() if hardware.device(args.device) else args.device
    device_option(args)
    return Space(
        devices=positive("--devices", args.devices, 10**6), global_batch=positive("--global-batch", args.global_batch),
        seq=positive("--seq", args.seq, 10**8), device=args.device,
        tp=int_list("--tp", args.tp), pp=int_list("--pp", args.pp), cp=int_list("--cp", args.cp),
        ep=int_list("--ep", args.ep), microbatch=int_list("--microbatch", args.microbatch),
        chunks=int_list("--chunks", args.chunks),
        strategies=name_list("--strategies", args.strategies, STRATEGIES),
        recompute=name_list("--recompute", args.recompute, RECOMPUTE),
        schedules=name_list("--schedules", args.schedules, SCHEDULES),
        optimizers=name_list("--optimizer", args.optimizer, OPTIMIZERS),
        mfu=_fraction("--mfu", args.mfu) if args.mfu is not None else None,
        folding=(False,) if args.no_folding else (False, True),
        reserve=reserve_bytes(args.reserve, hardware.device(args.device).memory)
        if args.reserve is not None and hardware.device(args.device) is not None else Fraction(0))


def run(args, out: TextIO, err: TextIO) -> int:
    from .. import search

    space = space_of(args)
    top = positive("--top", args.top, 1000)
    emit = positive("--emit", args.emit, 1000) if args.emit is not None else None
    jobs = positive("--jobs", args.jobs, 1024) if args.jobs is not None else None
    if emit is not None and emit > top:
        top = emit
    search.needs_numpy()
    if args.plot:
        from ..costreport import plot

        plot.require_matplotlib()  # a missing matplotlib is reported before any work

    from .progress import Progress

    with Progress(err, "search", quiet=getattr(args, "quiet", False)) as bar:
        result = search.run(args.model, space, top=top, check=not args.no_check and emit is None, progress=bar.tick,
                            jobs=jobs)
    if emit is not None:
        if emit > len(result.ranked):
            raise _bad("--emit", str(emit), f"only {len(result.ranked)} configurations fit")
        c = result.ranked[emit - 1]
        out.write(search.emitted_spec(c, result))
        return int(Exit.OK)
    if args.plot:
        from ..costreport.plot import frontier_plot
        from ..search.plotting import plot_inputs

        points, candidates, budget = plot_inputs(result)
        frontier_plot(points, args.plot, candidates, budget)
    status = int(Exit.OK if result.ranked else Exit.FAILED)
    if args.format == "json":
        out.write(render_json(result, status, str(args.model)))
    else:
        render = {"text": lambda r: render_text(r, output_width(args, out)), "markdown": render_markdown,
                  "csv": render_csv}[args.format]
        out.write(render(result))
    return status


# --------------------------------------------------------------------------- renderers

COLUMNS = ("rank", "dp", "tp", "pp", "v", "cp", "ep", "strategy", "recompute", "microbatch", "microbatches",
           "memory_bytes", "headroom_bytes", "step_s", "tokens_per_s", "mfu", "frontier", "check", "folded",
           "stage_memory_bytes", "link_bytes", "tie")


def error_band(result) -> Fraction:
    """The model's error band: a search with --mfu times compute by the MFU convention."""
    from ..search import error_band as band

    return band(result.space)


def rows(result) -> list[dict]:
    from .. import hardware

    cap = hardware.device(result.space.device).memory - result.space.reserve
    out = []
    band = error_band(result)
    # the fastest row: the ties (within the band of it) come first, ordered by robustness (search.by_robustness)
    best = min((c.exact_step if c.exact_step is not None else Fraction(c.step) for c in result.ranked), default=None)
    for i, c in enumerate(result.ranked, 1):
        z, s = c.sizes, c.structure
        mem = c.exact_memory if c.exact_memory is not None else Fraction(c.memory)
        step = c.exact_step if c.exact_step is not None else Fraction(c.step)
        tokens = result.space.global_batch * result.space.seq
        out.append({"rank": i, "dp": z["dp"] * z["ds"], "shard": z["ds"], "tp": z["tp"], "pp": z["pp"],
                    "v": z["nv"] if s.schedule == "interleaved" else 1, "cp": z["cp"], "ep": z["ep"],
                    "strategy": s.strategy, "optimizer": s.optimizer, "recompute": s.recompute, "schedule": s.schedule,
                    "microbatch": z["mb"], "microbatches": z["nmb"], "memory": mem, "headroom": cap - mem,
                    "step": step, "tokens_per_s": tokens / step, "mfu": c.mfu, "frontier": c.frontier,
                    "check": c.verdict, "agrees": c.agrees, "folded": s.folded, "same_as": list(c.same),
                    "stage_memory": dict(c.stage_memory), "link_bytes": dict(c.link_bytes),
                    "exposed": c.exposed if c.exposed is not None else Fraction(0),
                    "tie": i > 1 and step <= best * (1 + band)})
    return out


def _ties_line(result, rs) -> str:
    ties = [r["rank"] for r in rs if r["tie"]]
    band = f"{100 * float(error_band(result)):g}%"
    if not ties:
        return f"no row within {band} of the fastest (the model's error on published runs, docs/validation_time.md)"
    return (f"ties (~): rows {', '.join(map(str, ties))} within {band} of the fastest, the model's error on "
            "published runs (docs/validation_time.md): the model cannot tell which is faster, so the tied rows "
            "are ranked by robustness: less communication on the critical path, then more memory headroom")


def _header(result) -> str:
    from .. import hardware

    sp = result.space
    d = hardware.device(sp.device)
    from ..costreport import units

    kept = f", {units.both(sp.reserve)} per device kept free (--reserve)" if sp.reserve else ""
    return (f"search: {sp.devices} x {d.title}, global batch {sp.global_batch} x {sp.seq} tokens{kept}\n"
            f"{result.candidates:,} candidates, {result.valid:,} valid, {result.fitting:,} fit "
            f"({result.structures} structures derived)\n")


def _strategy(r: dict) -> str:
    """The row's strategy, the strategies with the same figures beside it (``zero3/fsdp``)."""
    name = f"hsdp ({r['dp'] // r['shard']}x{r['shard']})" if r["strategy"] == "hsdp" else r["strategy"]
    return ("/".join([name] + r["same_as"]) + ("" if r.get("optimizer", "adamw") == "adamw" else f" +{r['optimizer']}")
            + (" folded" if r["folded"] else ""))


def _layout(r: dict) -> str:
    """The mesh sizes of more than one device: ``dp16 tp2 pp4v2`` (dp always)."""
    parts = [f"dp{r['dp']}"] + [f"{a}{r[a]}" + (f"v{r['v']}" if a == "pp" and r["v"] > 1 else "")
                                for a in ("tp", "pp", "cp", "ep") if r[a] > 1]
    return " ".join(parts)


def render_text(result, width: int = 120) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from ..costreport import units

    buf = io.StringIO()
    con = Console(file=buf, width=width, no_color=True, highlight=False)
    con.print(_header(result).rstrip())
    if not result.ranked:
        con.print("no configuration fits: allow more devices, recompute, sharding or a smaller microbatch")
        return buf.getvalue()
    # wide: layout, strategy and recompute in columns of their own and tokens/s (global batch × seq
    # / step); narrow (80 columns): the three in one column that wraps, the figures whole
    wide = width >= 110
    t = Table(title="fastest configurations that fit (exact figures; * on the memory-time frontier, ~ a tie within "
              "the model's error; GB = 10⁹ bytes, as cost prints)", title_justify="left", box=box.SIMPLE_HEAD,
              padding=(0, 1), pad_edge=False)
    words = ("layout", "strategy", "recompute") if wide else ("plan",)
    for col in ("#",) + words + ("mb x m", "memory", "headroom", "step") + (("tokens/s",) if wide else ()) \
            + ("MFU", "check"):
        t.add_column(col, no_wrap=col not in words, overflow="fold")
    for r in rows(result):
        plan = [_layout(r), _strategy(r), r["recompute"]]
        cells = [f"{r['rank']}{'*' if r['frontier'] else ''}{'~' if r['tie'] else ''}"] + (
            plan if wide else [" ".join(plan)]) + [
            f"{r['microbatch']} x {r['microbatches']}", units.gb(r["memory"]), units.gb(r["headroom"]),
            units.seconds(r["step"])] + ([units.scaled(r["tokens_per_s"])] if wide else []) + [
            units.percent(Fraction(r["mfu"]).limit_denominator(10**6)), r["check"] or "-"]
        t.add_row(*cells)
    con.print(t)
    con.print(_ties_line(result, rows(result)))
    per = Table(title="per pipeline stage (memory per device) and per link class (bytes per device per step), exact",
                title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    for col in ("#", "memory per stage", "bytes per link"):
        per.add_column(col, overflow="fold")
    for r in rows(result):
        per.add_row(str(r["rank"]), _stages_text(r["stage_memory"], units.both) or "one stage",
                    _stages_text(r["link_bytes"], units.both) or "none")
    con.print(per)
    con.print("frontier (memory against step time): " + "; ".join(
        f"{units.gb(Fraction(c.memory))} {units.seconds(Fraction(c.step))}" for c in result.frontier[:12]))
    bad = [r["rank"] for r in rows(result) if r["agrees"] is False]
    con.print("exact re-derivation: " + ("every row agrees with the vectorised figures" if not bad
                                         else f"rows {bad} DISAGREE with the vectorised figures"))
    con.print(f"searched in {sum(result.timings.values()):.2f} s")
    return buf.getvalue()


def _stages_text(d: dict, show) -> str:
    return ", ".join(f"{k} {show(v)}" for k, v in d.items())


def _pairs(d: dict) -> str:
    return ";".join(f"{k}={_int_or(v)}" for k, v in d.items())


def render_markdown(result) -> str:
    from ..costreport import units

    lines = [f"# Search: {result.space.devices} x {result.space.device}", "", _header(result).replace("\n", "  \n"),
             "| # | dp | tp | pp | v | cp | ep | strategy | recompute | mb × m | memory/device | step | MFU | check "
             "| memory per stage | bytes per link |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|---:|---|---|---|"]
    for r in rows(result):
        lines.append(f"| {r['rank']}{'*' if r['frontier'] else ''}{'~' if r['tie'] else ''} | {r['dp']} | {r['tp']} | "
                     f"{r['pp']} | {r['v']} | {r['cp']} | {r['ep']} | {_strategy(r)} | {r['recompute']} | "
                     f"{r['microbatch']} × "
                     f"{r['microbatches']} | {units.both(r['memory'])} | {units.seconds(r['step'])} | "
                     f"{units.percent(Fraction(r['mfu']).limit_denominator(10**6))} | {r['check'] or '-'} | "
                     f"{_stages_text(r['stage_memory'], units.both) or 'one stage'} | "
                     f"{_stages_text(r['link_bytes'], units.both) or 'none'} |")
    if result.ranked:
        lines += ["", _ties_line(result, rows(result))]
    return "\n".join(lines) + "\n"


def render_csv(result) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows(result):
        w.writerow([r["rank"], r["dp"], r["tp"], r["pp"], r["v"], r["cp"], r["ep"], "/".join([r["strategy"]] + r["same_as"])
                    + ("" if r["optimizer"] == "adamw" else f" +{r['optimizer']}"),
                    r["recompute"],
                    r["microbatch"], r["microbatches"], _int_or(r["memory"]), _int_or(r["headroom"]),
                    f"{float(r['step']):.6f}", f"{float(r['tokens_per_s']):.1f}", f"{r['mfu']:.6f}",
                    int(r["frontier"]), r["check"] or "", int(r["folded"]), _pairs(r["stage_memory"]),
                    _pairs(r["link_bytes"]), int(r["tie"])])
    return buf.getvalue()


def _int_or(x: Fraction):
    return x.numerator if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def render_json(result, exit_status: int, file: str) -> str:
    """The search in the envelope every command prints (docs/schema/search.schema.json)."""
    from ..outcome import envelope

    sp = result.space
    doc = {
        **envelope("search", exit_status), "file": file,
        "space": {"devices": sp.devices, "device": sp.device, "global_batch": sp.global_batch, "seq": sp.seq,
                  "tp": list(sp.tp), "pp": list(sp.pp), "cp": list(sp.cp), "ep": list(sp.ep),
                  "microbatch": list(sp.microbatch), "chunks": list(sp.chunks), "strategies": list(sp.strategies),
                  "recompute": list(sp.recompute), "schedules": list(sp.schedules), "folding": list(sp.folding),
                  "optimizers": list(sp.optimizers),
                  "mfu": str(sp.mfu) if sp.mfu is not None else None, "reserve_bytes": _int_or(sp.reserve)},
        "candidates": result.candidates, "valid": result.valid, "fitting": result.fitting,
        "structures": result.structures, "error_band": str(error_band(result)),
        "timings_s": {k: round(v, 4) for k, v in result.timings.items()},
        "ranked": [{**{k: v for k, v in r.items() if k not in ("memory", "headroom", "step", "tokens_per_s",
                                                                 "stage_memory", "link_bytes", "exposed")},
                    "exposed_comm_s": float(r["exposed"]),
                    "stage_memory_bytes": {k: _int_or(v) for k, v in r["stage_memory"].items()},
                    "link_bytes": {k: _int_or(v) for k, v in r["link_bytes"].items()},
                    "memory_bytes": _int_or(r["memory"]), "headroom_bytes": _int_or(r["headroom"]),
                    "step_s": float(r["step"]), "step_exact": str(r["step"]),
                    "tokens_per_s": float(r["tokens_per_s"])} for r in rows(result)],
        "frontier": [{"label": c.label(), "memory_bytes": c.memory, "step_s": c.step} for c in result.frontier],
    }
    return json.dumps(doc, indent=2) + "\n"
