"""Pieces of a lifted spec shared by its steps: the mesh layout, unliftable records, names, frames."""

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
    # lifted facts this makes unreliable, left out of the plan ("reductions", "divisor"): what the gradient
    # programs or the loss multiplier read would otherwise become an override with a cause it does not have
    hides: tuple[str, ...] = ()

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
        # groups cutting an axis into blocks of B consecutive ranks (``lift_blocks``): read as over the axis
        self.blocks: dict[frozenset, tuple] = {}  # group -> (axis index, size (sizes for "groups"), kind)
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
        if frozenset(want) in self.blocks:  # one axis, or several (rank sets over their flattened ranks)
            at = self.blocks[frozenset(want)][0]
            return tuple(self.names[i] for i in at) if isinstance(at, tuple) else (self.names[at],)
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

    def along(self, a: int, b: int) -> str | None:
        """The axis along which ranks ``a`` and ``b`` are neighbours (one coordinate step apart), else None."""
        if a not in self.coords or b not in self.coords:
            return None
        ca, cb = self.coords[a], self.coords[b]
        diff = [i for i in range(len(ca)) if ca[i] != cb[i]]
        if len(diff) != 1 or abs(ca[diff[0]] - cb[diff[0]]) != 1:
            return None
        return self.names[diff[0]]

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
    # point-to-point pairs (pipeline stages): neighbours along one axis
    pairs = {tuple(c["ranks"]) for r in trace["ranks"] for c in r["collectives"]
             if c["kind"] in ("send", "recv") and len(c["ranks"]) == 2}
    flat = list(range(world))
    candidates = [(world,)] + [(world // k, k) for k in range(2, world) if world % k == 0]
    # a layout along which every pair lies first; then one along which some do (the others are reported)
    for every_pair in (True, False):
        for shape in sorted(candidates, key=len, reverse=True):
            grid = [flat[i * shape[-1]:(i + 1) * shape[-1]] for i in range(shape[0])] if len(shape) == 2 else flat
            lay = _Layout([f"d{i}" for i in range(len(shape))], list(shape), grid)
            along = [lay.along(*p) for p in pairs]
            if all(lay.axes_of(g, g[0]) is not None for g in groups) and (None not in along or not every_pair):
                # every axis must be needed by a group short of the whole world (the world group fits every
                # layout) or a pair: else the groups are one axis's, or blocks of one axis (``lift_blocks``)
                used = {a for g in groups if len(g) < world for a in lay.axes_of(g, g[0])} | (set(along) - {None})
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


def _stepped_differently(step, layout: _Layout, observer: int, axis: str) -> bool:
    """The neighbour along ``axis`` steps other parameters than the observer with an optimizer of
    its own (no inner optimizer): optimizer sharding written by hand."""
    def held(r):
        opt = step.get(r, {}).get("optimizer") or {}
        return None if opt.get("inner") else {p.get("name") for p in opt.get("params") or []}

    other = layout.neighbour(observer, axis)
    mine, theirs = held(observer), (held(other) if other is not None else None)
    return mine is not None and theirs is not None and mine != theirs


def _optimizer_sharded(step, layout: _Layout, observer: int, axis: str) -> bool:
    """The optimizer (an inner one: ZeroRedundancyOptimizer's) updates disjoint parameters along ``axis``."""
    def held(r):
        inner = (step.get(r, {}).get("optimizer") or {}).get("inner")
        return None if not inner else {n for o in inner for n in o["params"]}

    mine = held(observer)
    other = layout.neighbour(observer, axis)
    theirs = held(other) if other is not None else None
    return mine is not None and theirs is not None and not (mine & theirs)
