"""Concrete replay: run one step of a plan on an explicit small mesh, in exact Fractions.

Input: a ``StepModel`` (what the system does), the derived one (what is correct) and a
solver witness (plain numbers). Output: a ``Counterexample`` when the concrete run
really breaks the condition, else None. No solver is used here: every device holds its
own buffer and every collective is applied element by element, so a witness survives
only if plain arithmetic agrees with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from itertools import product
from math import lcm
from typing import Iterable

from .. import ir
from . import aspects, kvjoint, kvproduct, steps
from .report import Counterexample, coords_text
from .values import fold, resolver, show

Coord = tuple[int, ...]


def _frac(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


@dataclass(frozen=True)
class Context:
    """What every replay needs besides the witness."""

    step: steps.StepModel
    derived: steps.StepModel  # the correct derivation
    loss_derived: steps.StepModel  # the correct derivation for the plan's own loss normalisation
    bindings: dict[str, ir.Value]
    file: str
    pinned: dict[str, int]

    def command(self, sizes: dict[str, int]) -> str:
        sets = " ".join(f"--set {k}={v}" for k, v in sizes.items())
        return f"placement check {self.file} --plan {self.step.plan} {sets}".rstrip()

    def sizes_tuple(self, sizes: dict[str, int]) -> tuple[tuple[str, int], ...]:
        return tuple((k, sizes[k]) for k in self.step.axes + (steps.MICROBATCHES,))


def dim_size(d: steps.GradDim, sizes: dict[str, int]) -> int:
    if d.joint:  # copy groups crossing the axes (kvjoint): K heads, n/K copies, a folded axis
        return d.heads if d.part == steps.HEAD_PART else kvjoint.copies(d) if d.part else 1
    if d.part:  # K kv heads, or the axis/K copies of each
        return d.heads if d.part == steps.HEAD_PART else sizes[d.axis] // d.heads
    if d.tie:
        return 2 if sizes[d.axis] >= 2 else 1
    return sizes[d.axis if d.axis else steps.MICROBATCHES]


def divisor_value(ctx: Context, g: steps.GroupModel, sizes: dict[str, int]) -> Fraction:
    if g.divisor_value is not None:
        known = {k: Fraction(v) for k, v in sizes.items()}
        for alias, name in ctx.step.size_aliases().items():
            known.setdefault(alias, known[name])
        leaf = resolver(ctx.bindings, known)
        return Fraction(fold(g.divisor_value, leaf))
    out = Fraction(1)
    for a in g.divisor_axes:
        out *= sizes[a]
    return out


def divisor_text(g: steps.GroupModel) -> str:
    if g.divisor_value is not None:
        return show(g.divisor_value)
    return "·".join(g.divisor_axes) or "1"


# --------------------------------------------------------------------------- gradient simulation


@dataclass
class GradRun:
    grid: list[steps.GradDim]  # device dimensions
    values: dict[Coord, Fraction]  # final gradient buffer per device
    expected: dict[Coord, Fraction]  # global-batch gradient of the element each device holds
    total_tokens: int


def simulate_gi(ctx: Context, g: steps.GroupModel, sizes: dict[str, int], counts: dict[Coord, int],
                contrib: dict[tuple[Coord, Coord], Fraction]) -> GradRun:
    """One step of group ``g``: local grads, the plan's reductions, accumulation, divisor.

    counts: token shard (coords over g's token dims) -> tokens. contrib: (element,
    data shard over g's split dims) -> summed per-token gradient of that shard.
    """
    tdims = [d for d in g.dims if d.kind == steps.TOKEN]
    sdims = [d for d in g.dims if d.kind in (steps.TOKEN, steps.SPLIT)]
    grid = [d for d in g.dims if d.name != steps.MICROBATCHES]
    edims = [d for d in grid if d.kind == steps.SHARDED or d.implicit]
    mdim = g.dim(steps.MICROBATCHES)
    m = sizes[steps.MICROBATCHES]
    norm = set(g.norm_dims)

    # a second reduction of the token count over an axis sums a value already replicated there
    repeat = 1
    token_names = {d.name for d in tdims}
    for name in norm:
        times = g.norm_dims.count(name)
        extra = times - 1 if name in token_names else times  # a count replicated there is multiplied
        if extra > 0:
            repeat *= sizes[name] ** extra

    fixed = [i for i, d in enumerate(tdims) if d.name not in norm]
    slabs: dict[Coord, int] = {}  # the token count summed over the normalised dims, per fixed coordinates
    for t, n in counts.items():
        key = tuple(t[i] for i in fixed)
        slabs[key] = slabs.get(key, 0) + n

    def slab(tau: Coord) -> int:
        if g.path_count == "none" or (g.path_count != "count" and (
                g.objective == "sum" or (g.objective == "unit_mean" and not norm))):  # no token count (check.losses)
            return 1
        return repeat * slabs.get(tuple(tau[i] for i in fixed), 0)

    total = sum(counts.values())
    ranges = [range(dim_size(d, sizes)) for d in grid]
    devices = list(product(*ranges))
    gpos = {d.name: i for i, d in enumerate(grid)}
    implicit = [d for d in grid if d.implicit]

    def local(dev: Coord, t: int) -> Fraction:
        elem = tuple(dev[gpos[d.name]] for d in edims)
        total_v = Fraction(0)
        for extra in product(*[range(dim_size(d, sizes)) for d in implicit]):
            over = {d.name: c for d, c in zip(implicit, extra)}
            sigma = tuple(
                t if d.name == steps.MICROBATCHES else over.get(d.name, dev[gpos[d.name]] if d.name in gpos else 0)
                for d in sdims
            )
            s = contrib.get((elem, sigma))
            if s:
                tau = tuple(sigma[i] for i, d in enumerate(sdims) if d.kind == steps.TOKEN)
                total_v += s / slab(tau)
        return total_v

    per_t = [{dev: local(dev, t) for dev in devices} for t in range(m)]
    for d in grid:
        for _ in range(d.k):
            i = gpos[d.name]
            for buf in per_t:
                sums: dict[Coord, Fraction] = {}
                for dev, v in buf.items():
                    key = dev[:i] + dev[i + 1:]
                    sums[key] = sums.get(key, Fraction(0)) + v
                for dev in buf:
                    buf[dev] = sums[dev[:i] + dev[i + 1:]]
    if mdim.k >= 1:
        acc = {dev: sum((buf[dev] for buf in per_t), Fraction(0)) for dev in devices}
    else:
        acc = dict(per_t[-1])
    div = divisor_value(ctx, g, sizes)
    values = {dev: (v / div if div != 0 else Fraction(0)) for dev, v in acc.items()}
    expected = {}
    for dev in devices:
        elem = tuple(dev[gpos[d.name]] for d in edims)
        units = 1  # a loss term averaged over every device and microbatch (check.losses): their number
        for d in tdims:
            units *= dim_size(d, sizes)
        expected[dev] = sum((s for (e, _), s in contrib.items() if e == elem), Fraction(0)) / (
            1 if g.objective == "sum" else units if g.objective == "unit_mean" else total)
    return GradRun(grid, values, expected, total)


def _concrete_counts(g: steps.GroupModel, sizes: dict[str, int], ref: dict[str, int],
                     blocks: dict[frozenset[str], Fraction | int]) -> dict[Coord, int] | None:
    """Token counts per shard realising the witness's block sums (None if impossible)."""
    tdims = [d for d in g.dims if d.kind == steps.TOKEN]
    scale = lcm(*[Fraction(v).denominator for v in blocks.values()]) if blocks else 1
    members: dict[frozenset[str], list[Coord]] = {}
    for tau in product(*[range(dim_size(d, sizes)) for d in tdims]):
        b = frozenset(d.name for d, c in zip(tdims, tau) if c != ref[d.name])
        members.setdefault(b, []).append(tau)
    counts: dict[Coord, int] = {}
    for b, taus in members.items():
        n = Fraction(blocks.get(b, 0)) * scale
        if n.denominator != 1 or n < len(taus):
            return None
        counts[taus[0]] = int(n) - (len(taus) - 1)
        for tau in taus[1:]:
            counts[tau] = 1
    return counts


def _reference(g: steps.GroupModel, sizes: dict[str, int]) -> dict[str, int]:
    """The observer's coordinate on each split dimension (the kept microbatch is the last)."""
    return {d.name: (sizes[steps.MICROBATCHES] - 1 if d.name == steps.MICROBATCHES else 0)
            for d in g.dims if d.kind in (steps.TOKEN, steps.SPLIT)}


def _other(ref: int) -> int:
    return 1 if ref == 0 else 0


def diagnose_group(ctx: Context, g: steps.GroupModel, equal_counts: bool = False, aspect: str | None = None,
                   notes: list[str] | None = None) -> list[str]:
    """What differs between the plan's handling of a group and the correct derivation
    (only the dimension or the normalisation named by ``aspect``, when given).

    With ``equal_counts`` (the run has the same token count everywhere) a normalisation
    that is exact for equal counts is not blamed: that is said in ``notes`` (a side remark,
    not a cause)."""
    ref = ctx.derived.group(g.group)
    out = []
    for d in g.dims:
        if aspect is not None and d.name != aspect:
            continue
        if d.k == aspects.correct_k(d):
            continue
        where = f"the tied pair of {d.axis} stages" if d.tie else kvjoint.where(d) if d.joint else \
            f"each copy group of {d.axis} ({kvproduct.share(d)} ranks)" if d.part == steps.COPY_PART else d.axis
        if d.name == steps.MICROBATCHES:
            out.append("only the last microbatch's gradient survives: it is not accumulated "
                       "(no accumulation buffer, no per-microbatch reduce-scatter)")
        elif d.kind == steps.SHARDED or d.implicit:
            out.append(f"all-reduce over {where} adds up different parameters ({d.why})")
        elif d.kind == steps.INVARIANT:
            out.append(f"all-reduce over {where}, where the gradient is already identical ({d.why}): "
                       f"it is multiplied by {where}" + (f"^{d.k}" if d.k > 1 else ""))
        elif d.k == 0:
            out.append(f"missing all-reduce over {where}: the gradient there is a partial sum ({d.why})")
        else:
            out.append(f"reduced {d.k} times over {where} instead of once: the gradient is multiplied by {where}"
                       + (f"^{d.k - 1}" if d.k > 2 else ""))
    if aspect is not None and aspect != steps.NORMALISATION:
        return out
    if g.objective == "sum":
        pass  # a sum loss has no token count: only the divisor can be wrong
    elif set(g.norm_dims) == set(ref.norm_dims) and sorted(g.norm_dims) != sorted(ref.norm_dims):
        twice = sorted({n for n in g.norm_dims if g.norm_dims.count(n) > ref.norm_dims.count(n)})
        gathered = [a for a in twice if a in ctx.step.gathered_axes]
        if gathered:
            out.append(f"the loss is computed on the sequence gathered over ({', '.join(gathered)}): each rank's "
                       "token count is already the whole sequence's, the same on every rank there; reducing it over "
                       f"({', '.join(gathered)}) again counts every token {' x '.join(gathered)} times, the loss and "
                       "the gradient that many times too small")
        else:
            out.append(f"token count reduced more than once over ({', '.join(twice)}): a count already summed there "
                       "is summed again, multiplying it by the axis size")
    elif set(g.norm_dims) != set(ref.norm_dims):
        if ctx.step.loss != "global_mean" and equal_counts:
            if notes is not None:
                notes.append("every shard has the same token count in this run, so the mean of means is exact here")
        elif ctx.step.loss != "global_mean":
            kind = "device" if ctx.step.loss == "per_device_mean" else "microbatch"
            out.append(f"loss is a mean of per-{kind} token means, normalised over ({', '.join(g.norm_dims) or 'nothing'}) "
                       f"instead of the global token count over ({', '.join(ref.norm_dims)}): "
                       "equal to the global mean only when token counts are equal")
        else:
            out.append(f"token count summed over ({', '.join(g.norm_dims)}) instead of ({', '.join(ref.norm_dims)})")
    lref = ctx.loss_derived.group(g.group)
    if (g.divisor_value, g.divisor_axes) != (lref.divisor_value, lref.divisor_axes):
        out.append(f"divided by {divisor_text(g)}; this loss normalisation needs {divisor_text(lref)}")
    return out


def isolation_text(g: steps.GroupModel, aspect: str) -> str:
    """Which part of the run is the plan's and which is the correct derivation."""
    if aspect == steps.NORMALISATION:
        return "the plan's loss normalisation and divisor; every reduction and the accumulation as derived (correct)"
    if aspect == steps.MICROBATCHES:
        return "the plan's accumulation over microbatches; every reduction and the normalisation as derived (correct)"
    d = g.dim(aspect)
    where = f"the tied pair of {d.axis} stages" if d.tie else d.axis
    return f"the plan's reductions over {where}; every other reduction and the normalisation as derived (correct)"


def _gi_counterexample(ctx: Context, g: steps.GroupModel, sizes: dict[str, int], run: GradRun,
                       counts: dict[Coord, int], contrib_text: str, extra: list[str],
                       aspect: str | None = None) -> Counterexample | None:
    bad = [dev for dev in sorted(run.values) if run.values[dev] != run.expected[dev]]
    if not bad:
        return None
    dev = bad[0]
    names = [d.axis if d.tie else kvjoint.shown_name(d) if d.joint else d.name for d in run.grid]
    dev_shown = tuple((sizes[d.axis] - 1 if (d.tie and c == 1) else c) for d, c in zip(run.grid, dev))
    names, dev_shown = [n for n in names if n], tuple(c for n, c in zip(names, dev_shown) if n)  # kvjoint: folded
    tdims = [d.name for d in g.dims if d.kind == steps.TOKEN]
    shown = sorted(counts.items())[:12]
    count_text = "; ".join(f"{coords_text(tdims, t)}: {n}" for t, n in shown)
    if len(counts) > 12:
        count_text += f"; ... ({len(counts)} shards)"
    values = (() if aspect is None else (("isolated", isolation_text(g, aspect)),)) + (
        ("typing", typing_text(g)),
        ("token counts", count_text),
        ("gradient contributions", contrib_text),
        ("total tokens", str(run.total_tokens)),
    ) + tuple((f"{g.group} copy groups", kvjoint.groups_text(d)) for d in g.dims if d.joint and d.part == steps.HEAD_PART)
    eq = (f"grad[{g.group}] on device {coords_text(names, dev_shown)} = {_frac(run.values[dev])}, "
          f"but the global-batch gradient is {_frac(run.expected[dev])}")
    notes: list[str] = []
    diag = tuple(extra + diagnose_group(ctx, g, len(set(counts.values())) <= 1, aspect, notes))
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", coords_text(names, dev_shown)),), values, eq,
                          diag, ctx.command(sizes), tuple(notes))


_TYPE = {steps.TOKEN: "partial", steps.SPLIT: "partial", steps.INVARIANT: "invariant", steps.SHARDED: "sharded"}


def typing_text(g: steps.GroupModel) -> str:
    """Per dimension: the value's type, the reductions applied, and the resulting type."""
    def times(k: int) -> str:
        return "once" if k == 1 else f"{k}x"

    parts = []
    for d in g.dims:
        name = f"{d.axis} (tied pair)" if d.tie else (kvjoint.shown_name(d) if d.joint else d.name)
        if not name:  # an axis folded into a joint layout's parts (kvjoint)
            continue
        kind = _TYPE[d.kind]
        if d.name == steps.MICROBATCHES:
            parts.append(f"{name}: {'accumulated' if d.k else 'only the last kept'}")
        elif d.implicit:
            tail = f", then all-reduced {times(d.k)}: different experts added" if d.k else ""
            parts.append(f"{name}: partial, summed by the all-to-all -> invariant{tail}")
        elif d.k == 0:
            parts.append(f"{name}: partial, not reduced -> still partial" if kind == "partial" else f"{name}: {kind}")
        elif kind == "partial":
            scale = "" if d.k == 1 else f", multiplied by {name}" + (f"^{d.k - 1}" if d.k > 2 else "")
            parts.append(f"{name}: partial, all-reduced {times(d.k)} -> invariant{scale}")
        elif kind == "invariant":
            parts.append(f"{name}: invariant, all-reduced {times(d.k)} -> multiplied by {name}"
                         + (f"^{d.k}" if d.k > 1 else ""))
        else:
            parts.append(f"{name}: sharded, all-reduced {times(d.k)} -> different elements added")
    return "; ".join(parts)


def _in_range(dims: list[steps.GradDim], coords: Iterable[int], sizes: dict[str, int]) -> bool:
    return all(0 <= c < dim_size(d, sizes) for d, c in zip(dims, coords))


def replay_gi(ctx: Context, w: dict, g: steps.GroupModel | None = None, aspect: str | None = None) -> Counterexample | None:
    """Replay a GI witness on group ``g`` (default: the plan's group ``w["group"]``; a
    GI aspect's obligation passes its isolated group, see ``aspects.isolate``)."""
    g = g if g is not None else ctx.step.group(w["group"])
    sizes = w["sizes"]
    ref = _reference(g, sizes)
    sdims = [d for d in g.dims if d.kind in (steps.TOKEN, steps.SPLIT)]
    edims = [d for d in g.dims if d.name != steps.MICROBATCHES and (d.kind == steps.SHARDED or d.implicit)]
    leak = w.get("leak")
    star = {d.name: (ref[d.name] if (leak or w["agree"].get(d.name, True)) else _other(ref[d.name])) for d in sdims}
    counts = _concrete_counts(g, sizes, {d.name: star[d.name] for d in sdims if d.kind == steps.TOKEN}, w["counts"])
    if counts is None:
        return None
    elem = tuple((1 if leak == d.name else 0) for d in edims)
    sigma = tuple(star[d.name] for d in sdims)
    if not (_in_range(sdims, sigma, sizes) and _in_range(edims, elem, sizes)):
        return None  # a witness that names a shard or element the mesh does not have is no run
    run = simulate_gi(ctx, g, sizes, counts, {(elem, sigma): Fraction(1)})
    who = "another parameter element" if leak else f"element {g.group}[0]"
    text = f"1 from data shard {coords_text([d.name for d in sdims], sigma)} for {who}, 0 elsewhere"
    return _gi_counterexample(ctx, g, sizes, run, counts, text, [], aspect)


def replay_structural(ctx: Context, group: str, sizes: dict[str, int], dim: str | None) -> Counterexample | None:
    """GI replay with one token per shard and one contribution at coordinate 1 of ``dim``."""
    g = ctx.step.group(group)
    ref = _reference(g, sizes)
    sdims = [d for d in g.dims if d.kind in (steps.TOKEN, steps.SPLIT)]
    tdims = [d for d in sdims if d.kind == steps.TOKEN]
    edims = [d for d in g.dims if d.name != steps.MICROBATCHES and (d.kind == steps.SHARDED or d.implicit)]
    star = {d.name: ref[d.name] for d in sdims}
    elem = [0] * len(edims)
    if dim is not None:
        if dim in star:
            if not any(d.name == dim and (d.implicit) for d in edims):
                star[dim] = _other(ref[dim])
        for i, d in enumerate(edims):
            if d.name == dim:
                elem[i] = 1
    counts = {tau: 1 for tau in product(*[range(dim_size(d, sizes)) for d in tdims])}
    sigma = tuple(star[d.name] for d in sdims)
    if not (_in_range(sdims, sigma, sizes) and _in_range(edims, elem, sizes)):
        return None  # the dimension has one shard at these sizes: there is no other one to contribute
    run = simulate_gi(ctx, g, sizes, counts, {(tuple(elem), sigma): Fraction(1)})
    text = f"1 from data shard {coords_text([d.name for d in sdims], sigma)}, 0 elsewhere (one token per shard)"
    return _gi_counterexample(ctx, g, sizes, run, counts, text, [])


def replay_replica(ctx: Context, w: dict) -> Counterexample | None:
    g = ctx.step.group(w["group"])
    sizes, axis = w["sizes"], w["axis"]
    ref = _reference(g, sizes)
    sdims = [d for d in g.dims if d.kind in (steps.TOKEN, steps.SPLIT)]
    tdims = [d for d in sdims if d.kind == steps.TOKEN]
    counts = {tau: 1 for tau in product(*[range(dim_size(d, sizes)) for d in tdims])}
    sigma = tuple(ref[d.name] for d in sdims)
    run = simulate_gi(ctx, g, sizes, counts, {((0,) * sum(1 for d in run_grid(g) if d.kind == steps.SHARDED or d.implicit), sigma): Fraction(1)})
    names = [d.name for d in run.grid]
    i = names.index(axis)
    for dev in sorted(run.values):
        if dev[i] != 0:
            continue
        other = dev[:i] + (1,) + dev[i + 1:]
        if other in run.values and run.values[dev] != run.values[other]:
            eq = (f"grad[{g.group}] on {coords_text(names, dev)} = {_frac(run.values[dev])} but on its replica "
                  f"{coords_text(names, other)} = {_frac(run.values[other])}: the replicated update diverges")
            return Counterexample(
                ctx.sizes_tuple(sizes),
                (("replica A", coords_text(names, dev)), ("replica B", coords_text(names, other))),
                (("gradient contributions", f"1 from data shard {coords_text([d.name for d in sdims], sigma)}, 0 elsewhere"),
                 ("token counts", "1 per shard")),
                eq, tuple(diagnose_group(ctx, g)), ctx.command(sizes))
    return None


def run_grid(g: steps.GroupModel) -> list[steps.GradDim]:
    return [d for d in g.dims if d.name != steps.MICROBATCHES]
