"""Lift a trace into a ``.place`` spec: what the script really did, as a plan (no torch).

Input: a trace (``schema``). Output: a ``Lifted``: the spec text, every recorded call that
could not be lifted (rank, call order, the user's line, why), notes, and for each line of
the spec the script lines it was lifted from (so a finding of the checker points back at
the script).

Steps, on the last step of the trace that reached the optimizer:

1. Mesh axes: the DeviceMesh the script built (its dimension names and rank layout);
   without one, the process groups seen, factored into a 1-D or 2-D layout. Every
   collective's group must be the ranks that differ from the caller along a set of axes.
2. Roles: an axis along which the ranks' model inputs differ splits the batch (data);
   one along which the inputs agree and parameters are sharded splits the weights (tensor).
3. Strategies: a data axis with parameters sharded on it is ``zero3`` (all-gathered again
   in backward) or ``fsdp_shard_grad_op``, else ``ddp``; a tensor axis is ``megatron_sp``
   when forward reduce-scatters/all-gathers activations over it, else ``megatron_tp``.
4. Parameter groups: by layout (split over the tensor axis, or whole on it — partial when
   its gradient is reduced over it or differs between tensor ranks, else invariant) and by
   gradient program (the reductions and constant scales between its computation and the
   optimizer step). The largest split group is ``dense``; the others are declared.
5. Overrides where the program departs from the strategy's derivation: the reductions
   (``grads[G]: reduce over``), the divisor relative to the loss convention
   (``grads[G]: divide by``, as a product of axis sizes where the numbers allow), the loss
   (``per_device_mean`` from a mean cross-entropy, ``sum``), the token count's reduction,
   the clip-norm reduction.
"""

from __future__ import annotations

import itertools
import keyword
import re
from dataclasses import dataclass, field
from fractions import Fraction

REDUCTIONS = ("all_reduce", "reduce_scatter")
REDUCE_OPS = ("sum", "avg", "premul_sum")
NOT_LIFTED_KINDS = ("send", "recv", "recv_any_source", "all_to_all", "gather", "scatter", "reduce")
RESERVED_GROUPS = {"dense", "norms", "biases", "embedding", "head", "attention", "kv", "mlp", "experts",
                   "expert_biases", "router", "final_norm", "all"}


@dataclass(frozen=True)
class Unliftable:
    ranks: tuple[int, ...]
    seq: int
    what: str
    reason: str
    stack: tuple[dict, ...]
    calls: tuple[int, ...] = ()  # every call number (over the ranks) reported here

    @property
    def where(self) -> str:
        return f"{self.stack[0]['file']}:{self.stack[0]['line']}" if self.stack else "<no user frame>"

    def to_json(self) -> dict:
        return {"ranks": list(self.ranks), "call": self.seq, "calls": sorted(set(self.calls)) or [self.seq],
                "what": self.what, "reason": self.reason, "stack": list(self.stack)}


@dataclass
class Lifted:
    text: str
    plan: str
    unliftable: list[Unliftable] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    origins: dict[int, list[dict]] = field(default_factory=dict)  # spec line -> script frames
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> parameter names


class _Layout:
    """Axes (name, size) and each rank's coordinates."""

    def __init__(self, names: list[str], sizes: list[int], grid) -> None:
        self.names, self.sizes = names, sizes
        self.coords: dict[int, tuple[int, ...]] = {}
        for idx in itertools.product(*(range(s) for s in sizes)):
            cell = grid
            for i in idx:
                cell = cell[i]
            self.coords[int(cell)] = idx

    def axes_of(self, ranks, observer: int) -> tuple[str, ...] | None:
        want = set(ranks)
        if observer not in want:
            return None
        me = self.coords[observer]
        for k in range(len(self.names) + 1):
            for subset in itertools.combinations(range(len(self.names)), k):
                members = {r for r, c in self.coords.items()
                           if all(c[i] == me[i] for i in range(len(me)) if i not in subset)}
                if members == want:
                    return tuple(self.names[i] for i in subset)
        return None

    def neighbour(self, rank: int, axis: str) -> int | None:
        """A rank that differs from ``rank`` along ``axis`` only."""
        i = self.names.index(axis)
        me = self.coords[rank]
        for r, c in self.coords.items():
            if c[i] != me[i] and all(c[j] == me[j] for j in range(len(me)) if j != i):
                return r
        return None

    def size(self, axes) -> int:
        n = 1
        for a in axes:
            n *= self.sizes[self.names.index(a)]
        return n


def _ident(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W", "_", name) or "axis"
    if base[0].isdigit() or keyword.iskeyword(base):
        base = "a_" + base
    out, i = base, 2
    while out in taken:
        out, i = f"{base}{i}", i + 1
    taken.add(out)
    return out


def _layout(trace: dict) -> tuple[_Layout, bool]:
    world = trace["world"]
    meshes = [m for m in trace["ranks"][0]["meshes"] if m.get("shape")]
    if meshes:
        mesh = max(meshes, key=lambda m: len(m["shape"]))
        taken: set[str] = set()
        names = [_ident(n, taken) for n in mesh["dim_names"]]
        return _Layout(names, list(mesh["shape"]), mesh["ranks"]), True
    groups = {tuple(sorted(c["ranks"])) for r in trace["ranks"] for c in r["collectives"]
              if len(c["ranks"]) > 1 and c["kind"] not in ("send", "recv")}
    flat = list(range(world))
    candidates = [(world,)] + [(world // k, k) for k in range(2, world) if world % k == 0]
    for shape in sorted(candidates, key=len, reverse=True):
        grid = [flat[i * shape[-1]:(i + 1) * shape[-1]] for i in range(shape[0])] if len(shape) == 2 else flat
        lay = _Layout([f"d{i}" for i in range(len(shape))], list(shape), grid)
        if all(lay.axes_of(g, g[0]) is not None for g in groups):
            used = {a for g in groups for a in lay.axes_of(g, g[0])}
            if len(shape) == 1 or used == set(lay.names):
                return lay, False
    return _Layout(["d0"], [world], flat), False


def _placement_axes(p: dict, layout: _Layout) -> set[str]:
    """Axes over which parameter ``p`` is sharded (DTensor Shard placements)."""
    out = set()
    dims = p.get("mesh_dims") or []
    for dim, pl in zip(dims, p.get("placements") or []):
        if pl.startswith(("S(", "Shard", "_S", "_StridedShard")):
            name = re.sub(r"\W", "_", dim)
            if name in layout.names:
                out.add(name)
            elif len(layout.names) == 1:
                out.add(layout.names[0])
    return out


def _express(q: Fraction, layout: _Layout, prefer: list[tuple[str, ...]]) -> str | None:
    """``q`` as a product of axis sizes (or its inverse), the preferred axis sets first."""
    if q == 1:
        return "1"
    subsets = list(prefer) + [s for k in range(1, len(layout.names) + 3)
                              for s in itertools.combinations_with_replacement(layout.names, k)]
    for s in subsets:
        if s and Fraction(layout.size(s)) == q:
            return " * ".join(s)
    for s in subsets:
        if s and Fraction(1, layout.size(s)) == q:
            return "1 / " + (s[0] if len(s) == 1 else "(" + " * ".join(s) + ")")
    return None


def _frames(stacks, script: str = "") -> list[dict]:
    """One frame per call: the innermost in the traced script itself, else the innermost user frame."""
    out, seen = [], set()
    for st in stacks:
        st = [f for f in (st or []) if f.get("file")]
        if not st:
            continue
        frame = next((f for f in st if f["file"] == script), st[0])
        key = (frame["file"], frame["line"])
        if key not in seen:
            seen.add(key)
            out.append(frame)
    return out


def _group_name(members: list[str], taken: set[str]) -> str:
    leaves = [m.split(".") for m in members]
    for token, name in (("norm", "norm"), ("ln", "norm"), ("embed", "embed"), ("wte", "embed"), ("head", "lm_head"),
                        ("bias", "bias")):
        if all(any(token in part for part in parts) for parts in leaves):
            return _ident(name, taken)
    return _ident("params", taken)


def lift(trace: dict, plan_name: str = "traced", path: str = "<trace>") -> Lifted:
    """The spec of what the traced script ran; a trace whose records do not fit the schema is PL612."""
    try:
        return _lift(trace, plan_name)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as exc:
        from ..diagnostics import Diagnostic, DiagnosticError, Span

        raise DiagnosticError([Diagnostic("PL612", f"a record of the trace does not fit the schema "
                                          f"({type(exc).__name__}: {exc})", Span.point(path, 1, 1))]) from None


def _lift(trace: dict, plan_name: str) -> Lifted:
    script = str(trace.get("script", ""))
    items: list[Unliftable] = []
    notes: list[str] = []
    ranks = {r["rank"]: r for r in trace["ranks"]}
    layout, from_mesh = _layout(trace)
    by_seq = {r: {c["seq"]: c for c in ranks[r]["collectives"]} for r in ranks}

    # the step analysed: the last one that reached the optimizer on rank 0
    steps = [s for s in ranks[0]["steps"] if s.get("optimizer")]
    if not steps:
        items.append(Unliftable((0,), -1, "optimizer step", "no optimizer step was recorded: the script never called "
                                "step() on a torch.optim optimizer", ()))
        return Lifted(_empty_spec(trace, plan_name, layout), plan_name, items, notes)
    step_no = steps[-1]["step"]
    step = {r: next((s for s in ranks[r]["steps"] if s["step"] == step_no), {}) for r in ranks}
    observer = 0

    def coll(c_seq: int, r: int = observer) -> dict:
        return by_seq[r][c_seq]

    def axes(c: dict, r: int = observer) -> tuple[str, ...]:
        return layout.axes_of(c["ranks"], r) or ()

    # roles
    params = step[observer]["optimizer"]["params"]
    unnamed = [p for p in params if p["name"].startswith("<unnamed")]
    if unnamed:
        items.append(Unliftable((observer,), -1, f"{len(unnamed)} of {len(params)} optimizer parameters",
                                "not held by any module seen in forward (DistributedDataParallel over tensor-parallel "
                                "local shards re-registers them): their groups and gradient programs are not lifted "
                                "reliably", tuple(step[observer]["optimizer"].get("stack", []))))
    roles: dict[str, str] = {}
    for a in layout.names:
        other = layout.neighbour(observer, a)
        mine = [i["checksum"] for i in step[observer].get("inputs", [])]
        theirs = [i["checksum"] for i in step.get(other, {}).get("inputs", [])] if other is not None else mine
        sharded = any(a in _placement_axes(p, layout) for p in params)
        # activations exchanged over the axis in forward (no parameter carried): the weights are split
        exchanged = any(c["phase"] == "forward" and not c["carried"] and c["kind"] != "broadcast"
                        and a in (layout.axes_of(c["ranks"], observer) or ())
                        for c in ranks[observer]["collectives"] if c["step"] == steps[-1]["step"])
        if mine != theirs:
            roles[a] = "data"
        elif sharded or exchanged:
            roles[a] = "tensor"
        else:
            roles[a] = "data"
            notes.append(f"axis {a}: the ranks along it saw the same inputs and hold whole parameters; lifted as a "
                         "data axis")
    data_axes = [a for a in layout.names if roles[a] == "data"]
    tensor_axes = [a for a in layout.names if roles[a] == "tensor"]
    if len(tensor_axes) > 1:
        for a in tensor_axes[1:]:
            items.append(Unliftable((observer,), -1, f"axis {a}", "a second axis that splits the weights is not "
                                    "lifted (one tensor axis)", ()))
    tp = tensor_axes[0] if tensor_axes else None
    if not from_mesh:
        taken: set[str] = set()
        rename = {a: _ident("dp" if roles[a] == "data" else "tp", taken) for a in layout.names}
        layout.names = [rename[a] for a in layout.names]
        roles = {rename[a]: v for a, v in roles.items()}
        data_axes = [rename[a] for a in data_axes]
        tp = rename[tp] if tp else None

    # every collective must run over a set of mesh axes; pipelines and experts are not lifted
    bad: dict[tuple, Unliftable] = {}
    for r, part in sorted(ranks.items()):
        for c in part["collectives"]:
            if c["step"] < 0 and c["kind"] not in ("send", "recv", "recv_any_source", "all_to_all"):
                continue  # set-up before the first step (DDP's broadcast, distributing weights by scatter)
            reason = None
            if c["kind"] in NOT_LIFTED_KINDS:
                reason = f"{c['kind']} is not lifted (pipeline and expert schedules are not recognised)"
            elif layout.axes_of(c["ranks"], r) is None:
                reason = (f"its group {c['ranks']} is no set of mesh axes of the layout "
                          + ", ".join(f"{n}={s}" for n, s in zip(layout.names, layout.sizes)))
            if reason:
                # one report per call site and reason: the ranks and every call number it covers
                where = tuple((f["file"], f["line"]) for f in c["stack"][:1])
                key = (c["api"], where, reason)
                prev = bad.get(key)
                ranks_ = tuple(sorted(set((prev.ranks if prev else ()) + (r,))))
                calls = (prev.calls if prev else ()) + (c["seq"],)
                bad[key] = Unliftable(ranks_, min(calls), f"{c['kind']} ({c['api']})", reason, tuple(c["stack"]),
                                      calls)
        for u in part["unrecognised"]:
            where = tuple((f["file"], f["line"]) for f in u["stack"][:1])
            key = (u["op"], where, "unrecognised")
            prev = bad.get(key)
            ranks_ = tuple(sorted(set((prev.ranks if prev else ()) + (r,))))
            calls = (prev.calls if prev else ()) + (u["seq"],)
            bad[key] = Unliftable(ranks_, min(calls), u["op"],
                                  "an op of the c10d namespaces the recorder does not recognise", tuple(u["stack"]), calls)
    items.extend(bad.values())

    step_colls = [c for c in ranks[observer]["collectives"] if c["step"] == step_no]
    if len(step[observer].get("losses", [])) > 1:
        items.append(Unliftable((observer,), -1, "backward", f"{len(step[observer]['losses'])} backward passes in one "
                                "step (gradient accumulation) are not lifted: the spec takes one", tuple(
                                    step[observer]["losses"][0]["stack"])))

    # strategies
    bindings: dict[str, str] = {}
    no_regather: list[tuple[str, list[dict]]] = []
    binding_frames: dict[str, list[dict]] = {}
    for a in data_axes:
        sharded = any(a in _placement_axes(p, layout) for p in params)
        over = [c for c in step_colls if a in axes(c)]
        binding_frames[a] = _frames((c["stack"] for c in over), script)
        if sharded:
            regather = any(c["kind"] == "all_gather" and c["phase"] == "backward" and a in axes(c) for c in step_colls)
            bindings[a] = "zero3" if regather else "fsdp_shard_grad_op"
        elif _optimizer_sharded(step, layout, observer, a):
            bindings[a] = "zero1"
            # the updated shards must come back: broadcasts or all-gathers over the axis after the step
            synced = [c for c in step_colls if c["phase"] == "optimizer" and c["kind"] in ("broadcast", "all_gather")
                      and a in axes(c)]
            if not synced:
                no_regather.append((a, _frames([step[observer]["optimizer"].get("stack", [])], script)))
        else:
            bindings[a] = "ddp"
    sp = False
    if tp:
        sp = any(c["phase"] == "forward" and c["kind"] in ("reduce_scatter", "all_gather") and not c["carried"]
                 and axes(c) == (tp,) for c in step_colls)
        bindings[tp] = "megatron_sp" if sp else "megatron_tp"
        binding_frames[tp] = _frames((c["stack"] for c in step_colls if tp in axes(c) and c["phase"] == "forward"),
                                     script)

    # gradient programs
    def program(p: dict, r: int = observer):
        g = p.get("grad") or {}
        reds: list[str] = []
        frames = []
        const = Fraction(1)
        for s in g.get("collectives", []):
            c = coll(s, r)
            if c["kind"] in REDUCTIONS and c["op"] in REDUCE_OPS:
                ax = axes(c, r)
                reds.extend(ax)
                frames.append(c["stack"])
                if c["op"] == "avg":
                    const /= layout.size(ax)
        # a gradient still Partial at the step (DTensor): the optimizer's first use all-reduces it
        for dim, pl in zip(p.get("mesh_dims") or [], g.get("placements") or []):
            if pl.startswith(("P(", "Partial")):
                name = re.sub(r"\W", "_", dim)
                axis = name if name in layout.names else (layout.names[0] if len(layout.names) == 1 else None)
                if axis is not None:
                    reds.append(axis)
                    frames.append(step[r]["optimizer"].get("stack", []))
        reds = sorted(reds)
        for sc in g.get("scales", []):
            factor, at = (sc["factor"], sc.get("at")) if isinstance(sc, dict) else (sc, None)
            const *= Fraction(factor)
            if at:
                frames.append([at])
        return tuple(reds), const, frames

    grads_of = {r: {p["name"]: p for p in step[r].get("optimizer", {}).get("params", [])} for r in ranks}
    first_no = steps[0]["step"]
    initial = {r: {p["name"]: p for s in ranks[r]["steps"] if s["step"] == first_no
                   for p in s.get("optimizer", {}).get("params", [])} for r in ranks}
    info = []
    disagree: dict[tuple, list[str]] = {}
    for p in params:
        if p.get("grad") is None:
            notes.append(f"{p['name']}: no gradient at the optimizer step; counted in its layout's group")
        reds, const, frames = program(p)
        cls = "split"
        numel = 1
        for d in p["shape"]:
            numel *= d
        if tp:
            other = layout.neighbour(observer, tp)
            mine_plain = not p.get("placements")
            # the values before the first update: replicas start equal, local shards differ
            first_mine = initial.get(observer, {}).get(p["name"], {})
            first_theirs = initial.get(other, {}).get(p["name"], {})
            if mine_plain and first_theirs and first_theirs.get("checksum") != first_mine.get("checksum"):
                cls = "split"  # a plain local shard (DDP over tensor-parallel shards): different values per rank
                numel *= layout.size((tp,))
            elif tp in _placement_axes(p, layout):
                cls = "split"
            else:
                other = layout.neighbour(observer, tp)
                theirs = grads_of.get(other, {}).get(p["name"], {}).get("grad") or {}
                differs = (theirs.get("checksum") != (p.get("grad") or {}).get("checksum"))
                cls = "partial" if (tp in reds or differs) else "whole"
        info.append((p, cls, reds, const, frames, numel))
        # every rank must run the same program on this parameter's gradient
        for r in sorted(ranks):
            theirs = grads_of.get(r, {}).get(p["name"])
            if r == observer or theirs is None or theirs.get("grad") is None or p.get("grad") is None:
                continue
            r_reds, r_const, _ = program(theirs, r)
            if (r_reds, r_const) != (reds, const):
                disagree.setdefault((r_reds, r_const, r), []).append(p["name"])

    for (r_reds, r_const, r), names in sorted(disagree.items(), key=lambda kv: kv[0][2]):
        mine = next(e for e in info if e[0]["name"] == names[0])
        items.append(Unliftable((r,), -1, f"the gradient program of {names[0]}"
                                + (f" and {len(names) - 1} more" if len(names) > 1 else ""),
                                f"rank {r} reduces it over ({', '.join(r_reds)}) and scales it by {r_const}, rank "
                                f"{observer} over ({', '.join(mine[2])}) by {mine[3]}: ranks that disagree are not "
                                "one plan", tuple(step[r]["optimizer"].get("stack", []))))

    # loss convention
    loss_kind, w, loss_frames, tokens_axes, tokens_equal = _loss(step, layout, data_axes, observer, step_colls,
                                                                  tp, notes, script)
    data_size = layout.size(data_axes)
    default_div = Fraction(data_size) if loss_kind == "per_device_mean" else Fraction(1)

    # groups: by class, then by program
    groups: dict[tuple, list] = {}
    for entry in info:
        p, cls, reds, const, frames, numel = entry
        groups.setdefault((cls, reds, const), []).append(entry)
    split_keys = sorted((k for k in groups if k[0] == "split"), key=lambda k: -sum(e[5] for e in groups[k]))
    taken: set[str] = set(layout.names)
    named: list[tuple[str, tuple, list]] = []
    for k in sorted(groups, key=lambda k: (k != (split_keys[0] if split_keys else None), k[0], -len(groups[k]))):
        members = groups[k]
        if split_keys and k == split_keys[0]:
            named.append(("dense", k, members))
        else:
            named.append((_group_name([e[0]["name"] for e in members], taken), k, members))

    # the plan's lines, with the script lines behind them
    lines: list[tuple[str, list[dict]]] = []
    # replicate x shard over two data axes is HYBRID_SHARD: the library's two-axis strategy
    hybrid = None
    if len(data_axes) == 2 and [bindings[a] for a in data_axes] == ["ddp", "zero3"]:
        hybrid = tuple(data_axes)
    for a in layout.names:
        if hybrid and a == hybrid[0]:
            lines.append((f"  [{hybrid[0]}, {hybrid[1]}]: hybrid_shard",
                          _frames([[f] for x in hybrid for f in binding_frames.get(x, [])], script)))
        elif not (hybrid and a == hybrid[1]):
            lines.append((f"  {a}: {bindings[a]}", binding_frames.get(a, [])))
    if loss_kind == "per_device_mean":
        lines.append(("  override loss: per_device_mean", loss_frames))
    elif loss_kind == "sum":
        lines.append(("  override loss: sum", loss_frames))
    if tokens_equal and loss_kind != "sum":
        lines.append(("  override tokens: equal  # observed: every rank held the same number of tokens, no padding",
                      loss_frames))
    elif tokens_axes is not None and loss_kind != "sum" and sorted(tokens_axes[0]) != sorted(data_axes):
        lines.append((f"  override tokens: reduce over ({', '.join(tokens_axes[0])})", tokens_axes[1]))
    for _axis, frames in no_regather[:1]:
        lines.append(("  override params: no_regather  # the updated optimizer shards are never sent back", frames))
    for gname, (cls, reds, const), members in named:
        expected = sorted(data_axes + ([tp] if (tp and cls == "partial" and sp) else []))
        target = "grads" if len(named) == 1 else f"grads[{gname}]"
        frames = _frames((st for e in members for st in e[4]), script)
        opt_frames = _frames([step[observer]["optimizer"].get("stack", [])], script)
        if sorted(reds) != expected:
            lines.append((f"  override {target}: reduce over ({', '.join(reds)})", frames or opt_frames))
        q = (1 / const) / w
        if q != default_div:
            expr = _express(q, layout, [tuple(sorted(set(reds)))] + [tuple(data_axes)])
            if expr is None:
                expr = str(q)
                notes.append(f"grads[{gname}]: divided by {q}, which is no product of mesh sizes: lifted as a "
                             "constant, so the proof holds at these sizes only")
            lines.append((f"  override {target}: divide by {expr}", frames or opt_frames))
    clip = _clip(step_colls, params, layout, axes, info, tp, data_axes, script)
    if clip is not None:
        lines.append(clip)

    text, origins = _render(trace, plan_name, layout, roles, bindings, named, lines, loss_kind, step[observer], notes,
                            script)
    return Lifted(text, plan_name, items, notes, origins,
                  {g: [e[0]["name"] for e in members] for g, _, members in named})


def _optimizer_sharded(step, layout: _Layout, observer: int, axis: str) -> bool:
    """The optimizer (an inner one: ZeroRedundancyOptimizer's) updates disjoint parameters along ``axis``."""
    def held(r):
        inner = (step.get(r, {}).get("optimizer") or {}).get("inner")
        return None if not inner else {n for o in inner for n in o["params"]}

    mine = held(observer)
    other = layout.neighbour(observer, axis)
    theirs = held(other) if other is not None else None
    return mine is not None and theirs is not None and not (mine & theirs)


def _loss(step, layout: _Layout, data_axes, observer, step_colls, tp, notes, script=""):
    """(kind, loss multiplier w, frames, (token axes, frames) or None, tokens equal)."""
    mine = step[observer]
    nll = mine.get("nll", [])
    losses = mine.get("losses", [])
    if not nll or not losses:
        notes.append("no cross-entropy (nll_loss) was recorded: the loss normalisation is assumed to be the global "
                     "token mean, scaled by the data-parallel size as DDP expects")
        return "global_mean", Fraction(layout.size(data_axes)), [], None, False
    first = nll[0]
    frames = _frames([first["stack"]], script)
    value = Fraction(losses[0]["value"]).limit_denominator(1 << 24)
    nll_value = Fraction(first["value"]).limit_denominator(1 << 24)
    # the ranks holding distinct data: one per data coordinate (the observer's tensor coordinate)
    data_ranks = [r for r, c in layout.coords.items()
                  if tp is None or c[layout.names.index(tp)] == layout.coords[observer][layout.names.index(tp)]]
    counts = [sum(n["tokens"] for n in step[r].get("nll", [])) for r in data_ranks]
    positions = [sum(n["positions"] for n in step[r].get("nll", [])) for r in data_ranks]
    total = sum(counts)
    equal = len(set(counts)) == 1 and counts == positions
    tokens_axes = None
    for c in step_colls:
        if c["phase"] in ("before_forward", "forward") and c["kind"] == "all_reduce" and c["numel"] == 1 and \
                c.get("value_in") == float(first["tokens"]):
            tokens_axes = (layout.axes_of(c["ranks"], observer) or (), _frames([c["stack"]], script),
                           c.get("value_out"))
    if nll_value == 0:
        return "global_mean", Fraction(1), frames, tokens_axes, equal
    if first["reduction"] == "mean":
        c = _nice(value / nll_value)
        return "per_device_mean", c, frames, None, equal
    if first["reduction"] == "sum":
        if _nice(value / nll_value) == 1:
            return "sum", Fraction(1), frames, None, False
        if tokens_axes is not None and tokens_axes[0]:
            # normalised by the count summed over the token axes: the multiplier on top of it
            reduced = tokens_axes[2] if tokens_axes[2] is not None else sum(counts)
            return "global_mean", _nice(value * Fraction(reduced) / nll_value), frames, tokens_axes, False
        w = _nice(value * total / nll_value)
        return "global_mean", w, frames, tokens_axes, False
    notes.append(f"cross-entropy with reduction={first['reduction']} is not a recognised loss normalisation")
    return "global_mean", Fraction(1), frames, tokens_axes, False


def _nice(x: Fraction) -> Fraction:
    """A float ratio read back as the small rational it is (fp32 loss values)."""
    return x.limit_denominator(64)


def _clip(step_colls, params, layout, axes, info, tp, data_axes, script=""):
    dynamic = [e for e in info if (e[0].get("grad") or {}).get("dynamic_scales")]
    if not dynamic:
        return None
    # the norm's reductions: all-reduces after backward that carry no gradient
    in_programs = {s for e in info for s in ((e[0].get("grad") or {}).get("collectives") or [])}
    norm_colls = [c for c in step_colls if c["phase"] == "after_backward" and c["kind"] == "all_reduce"
                  and c["seq"] not in in_programs and c["dtype"].startswith(("float", "bfloat"))]
    observed = sorted({a for c in norm_colls for a in axes(c)})
    sharded = set()
    for p, *_ in info:
        sharded |= _placement_axes(p, layout)
    expected = sorted(sharded)
    at = [sc for e in dynamic for sc in (e[0]["grad"].get("dynamic_at") or [])]
    frames = _frames([c["stack"] for c in norm_colls], script) or _frames([[a] for a in at], script)
    if observed == expected:
        return None
    return (f"  override clip_norm: reduce over ({', '.join(observed)})", frames)


def _render(trace, plan_name, layout, roles, bindings, named, lines, loss_kind, step, notes, script=""):
    opt = step.get("optimizer", {})
    params = opt.get("params", [])
    total = sum(e[5] for _, _, members in named for e in members)
    pbytes = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}.get(params[0]["dtype"], 4) if params else 4
    elements = opt.get("param_elements") or 0
    obytes = Fraction(opt.get("state_bytes", 0), elements) if elements else Fraction(0)
    # the strategies the plan's binding lines name
    used = {m.group(1) for t, _ in lines for m in [re.match(r"\s+(?:\[[^\]]*\]|\w+): (\w+)$", t)] if m}
    imports = sorted(used & {"ddp", "zero1", "zero3", "fsdp_shard_grad_op", "hybrid_shard"})
    tensor = sorted(used & {"megatron_tp", "megatron_sp"})
    out: list[str] = []
    origins: dict[int, list[dict]] = {}
    out.append(f"# Lifted by `placement lift` from a trace of {trace.get('script', '?')} on {trace['world']} processes.")
    out.append("# The plan is what the script did; each override names where it departs from the library")
    out.append("# strategy it resembles, and the script line it was lifted from.")
    if imports:
        out.append(f"from std.data import {', '.join(imports)}")
    if tensor:
        out.append(f"from std.tensor import {', '.join(tensor)}")
    out.append("")
    out.append("model {")
    out.append(f"  params = {total}")
    out.append("  bytes {")
    out.append(f"    params = {pbytes}")
    out.append(f"    grads = {pbytes}")
    out.append(f"    optimizer = {obytes}  # {opt.get('class', '?')} state per parameter element, as observed")
    out.append("  }")
    for gname, (cls, _, _), members in named:
        if gname == "dense":
            continue
        count = sum(e[5] for e in members)
        like = "norms" if cls == "partial" else "dense"
        tensor_word = "whole" if cls in ("partial", "whole") else "split"
        names = ", ".join(e[0]["name"] for e in members[:4]) + (", ..." if len(members) > 4 else "")
        out.append(f"  group {gname} {{ count = {count}  like = {like}  tensor = {tensor_word} }}  # {names}")
    out.append("}")
    out.append("")
    out.append("mesh {")
    for a, s in zip(layout.names, layout.sizes):
        out.append(f"  {a} = {s}  # {roles[a]}")
    out.append("}")
    out.append("")
    dense = next((members for g, _, members in named if g == "dense"), [])
    if dense:
        out.append(f"# dense: {len(dense)} parameter tensors ("
                   + ", ".join(e[0]["name"] for e in dense[:3]) + (", ..." if len(dense) > 3 else "") + ")")
    for n in notes:
        out.append(f"# note: {n}")
    out.append(f"plan {plan_name} {{")
    origins[len(out)] = _frames([opt.get("stack", [])], script)  # what the plan as a whole ran into: the step
    for text, frames in lines:
        where = "; ".join(f"{f['file']}:{f['line']}" for f in frames[:3])
        out.append(text + (("  # " if "#" not in text else "; ") + where if where else ""))
        origins[len(out)] = frames
    out.append("}")
    return "\n".join(out) + "\n", origins


def _empty_spec(trace, plan_name, layout) -> str:
    return (f"# Lifted by `placement lift` from a trace of {trace.get('script', '?')}: no optimizer step was "
            "recorded, so there is no plan to lift.\n")
