"""Where a row-parallel layer adds its bias (or a residual) relative to its all-reduce over the tensor axis, as the
plan's ``activations[R]: bias_before_reduce | residual_before_reduce`` overrides (no torch).

For a layer whose own forward all-reduced a sum over exactly the tensor axis, the recorder keeps linear
fingerprints (``recorder_partial``): ``f(P_r)`` of its bias-free local product ``x_r W_r^T`` on every rank,
``f(out)`` of its output, ``f(b)`` of its bias and ``f(h)`` of each tensor argument shaped like its output (a
residual passed in). With ``t`` ranks in the reduction, the output is ``sum_r P_r`` plus the bias once when it is
added after the reduction and ``t`` times before it (each rank's summand carrying it), and the same for a
residual (or not at all: an argument that is no residual). The lift solves
``f(out) - sum_r f(P_r) = a * rows * f(b) + sum_i c_i f(h_i)`` over ``a`` in {after, before} and ``c_i`` in
{none, after, before}, within the fingerprints' rounding:

- one order matches (every matching choice agrees on what is added before): the bias (a residual) before the
  reduction is ``override activations[R]: bias_before_reduce (residual_before_reduce) over (TP)`` at the layer's
  ``def forward`` (R its region, ``lift_activations.region_of``); the order Megatron-LM uses lifts to nothing;
- a layer it cannot recompute (no 2-D ``weight`` fitting its input and output: experts' einsums, a module holding
  several weights) whose all-reduce summed, on every rank of the reduction, a value a product wrote (``mm``,
  ``bmm``, ``matmul``; through copies, the collective's ``origin``): nothing was added before the reduction, as
  Megatron-LM's order;
- no choice matches (something else added or applied, a norm or an activation on each summand, a residual not
  passed in), the choices disagree (a zero bias in the step read), a layer it cannot recompute whose summand an op
  other than a product wrote, or a rank of the reduction has no fingerprint: reported (PL614) naming the layer, so
  its region's activation obligations are unknown, never proved.

A layer with a bias and no all-reduce of its own whose output a forward all-reduce over the tensor axis sums (the
same linear checksums, ``sums``), its input differing between the tensor ranks, is reduced by its caller:
``sum_r (f(out_r) - f(P_r))`` is its bias counted 0, 1 or ``t`` times; ``t`` times is ``bias_before_reduce`` as
above, 0 or 1 nothing, neither or more than one reported (PL614). The script's own all-reduce over the tensor axis
in forward, in no layer's forward and matched to no layer's output, whose input an addition (or any op other than
a product or a reduction to a statistic) wrote, is reported (PL614): a term added to each rank's partial sum is not
told from one added to a value already whole.

A layer whose own forward reduce-scatters the sum over exactly the tensor axis instead (sequence parallelism by
hand, each rank keeping a slice of the rows) is read the same way: each rank's summand is its whole input, the
slices' fingerprints add up to the sum's, the bias after is counted on each slice's rows and before on each
summand's; a residual argument shaped like the product can only be in the summands, one shaped like the slice only
after. The script's own sum all-reduce or reduce-scatter over the tensor axis whose input neither a product alone
nor a reduction to a statistic wrote (an addition, a scale, any other op or none seen), or a statistic of an
addition's result (``reduce((fc2(h) + b).sum(-1))``: the statistic's input, ``statistic_of``), is reported the same
way; a caller's reduce-scatter of a layer's output is matched by the same checksums as its all-reduce.

Every sum collective over the tensor axis in a layer's forward is read: the fingerprints decide the output where at
most one of them sums a value other than a product alone or a statistic of one; more, or a buffer summed again
after its in-place all-reduce (its ``origin`` the all-reduce), is reported; a layer not recomputed is trusted only
where every one of its reductions summed a product alone.

A layer whose weight is a DTensor (torch's parallel styles) is DTensor's to order: not read here.
"""

from __future__ import annotations

from itertools import product

from ..ir.overrides import OverrideVerb
from .lift_activations import _where, region_of
from .lift_layout import Unliftable, _frames, _Layout

RTOL = 1e-4  # the fingerprints' rounding, relative to their magnitudes (float32 layers summed in float64)
PRODUCTS = ("mm", "bmm", "matmul", "mv", "dot")  # a summand written by a product alone: nothing added to it
SUMS = ("all_reduce", "reduce_scatter")  # the collectives that sum the partial outputs (the output a slice)
ADDITIONS = ("add", "add_", "addmm", "addmm_", "baddbmm", "addcmul", "sub", "sub_")
# a statistic reduced from each rank's slice (a softmax's normaliser, a mean's numerator): the loss lifts read it
REDUCTIONS = ("sum", "mean", "amax", "amin", "max", "min", "logsumexp", "norm", "linalg_vector_norm")


def _reductions(m: dict, by_seq: dict, layout: _Layout, tp: str, r: int) -> list[dict]:
    """Every all-reduce or reduce-scatter (a sum) over exactly ``tp`` that the layer's own forward issued."""
    found = []
    for s in m.get("collectives", []):
        c = by_seq.get(s)
        if (c is not None and c.get("module") == m.get("name") and c["kind"] in SUMS
                and c.get("op", "sum") == "sum" and layout.axes_of(c["ranks"], r) == (tp,)):
            found.append(c)
    return found


def _reduction(m: dict, by_seq: dict, layout: _Layout, tp: str, r: int) -> dict | None:
    """The first of them, if any."""
    found = _reductions(m, by_seq, layout, tp, r)
    return found[0] if found else None


def _trusted(c: dict) -> bool:
    """A summand a product alone wrote, or a statistic of a value no addition wrote: nothing added to it."""
    return c.get("origin") in PRODUCTS or (c.get("origin") in REDUCTIONS and c.get("statistic_of") not in ADDITIONS)


def _products_alone(name: str, c: dict, mods: dict, by_seq: dict, layout: _Layout, tp: str) -> bool:
    """Whether on every rank of the reduction every sum the layer's forward reduced over ``tp`` is a value a product
    wrote (through copies; a second reduction of the same buffer is the first's): nothing was added to or applied
    on the partial sums before them."""
    counts = set()
    for g in c["ranks"]:
        m = mods.get(g, {}).get(name)
        mine = _reductions(m, by_seq.get(g, {}), layout, tp, g) if m is not None else []
        if not mine or any(x.get("origin") not in PRODUCTS for x in mine):
            return False
        counts.add(len(mine))
    return len(counts) == 1


def _unexplained(name: str, c: dict, mods: dict, by_seq: dict, layout: _Layout, tp: str) -> str:
    """Why the fingerprints of a layer that reduces over ``tp`` more than once do not decide it ("" where they do):
    they read its output as the sum of its products plus the terms added, so at most one of its reductions may sum
    a value other than a product alone or a statistic of one (that one is the output's); a buffer reduced twice is
    not that."""
    for g in c["ranks"]:
        m = mods.get(g, {}).get(name)
        mine = _reductions(m, by_seq.get(g, {}), layout, tp, g) if m is not None else []
        if any(x.get("origin") == "all_reduce" for x in mine):
            return f"its forward sums over {tp} a buffer it already summed (each summand counted again on every rank)"
        if sum(not _trusted(x) for x in mine) > 1:
            return (f"its forward sums over {tp} {len(mine)} values, more than one of them neither a product alone "
                    "nor a statistic of one: what each rank added to those summands is not observed")
    return ""


def _orders(mine: dict, group: list[dict]) -> tuple[set[tuple[str, ...]], float]:
    """The sets of terms added before the reduction that fit the fingerprints, and the residual's gap. Under a
    reduce-scatter (``scattered``) each rank's output is its slice of the sum: the slices' fingerprints add up to
    the whole output's, the bias added after is counted on each slice's rows, a residual shaped like the product
    can only be in each rank's summand (before) and one shaped like the slice only after."""
    scattered = mine.get("scattered", False)
    outs = group if scattered else [mine]
    if scattered and not all(p.get("scattered") for p in group):
        return set(), 0.0
    gap = sum(p["output"] for p in outs) - sum(p["product"] for p in group)
    tol = RTOL * (sum(p["product_abs"] for p in group) + sum(p["output_abs"] for p in outs)) + 1e-9
    terms = []  # (name, the values it may add, the index of the value added before the reduction: -1 none)
    if "bias" in mine:
        after = sum(p.get("out_rows", p["rows"]) * p.get("bias", 0.0) for p in outs)
        terms.append(("bias", [after, sum(p["rows"] * p.get("bias", 0.0) for p in group)], 1))
    for key, before in (("residuals", True), ("slice_residuals", False)):
        for i, h in enumerate(mine.get(key, [])):
            theirs = [p.get(key, []) for p in group]
            if not all(len(x) > i for x in theirs):
                continue
            total = sum(x[i] for x in theirs)
            if scattered:
                terms.append(("residual", [0.0, total], 1 if before else -1))
            else:
                terms.append(("residual", [0.0, h, total], 2))
    fits: set[tuple[str, ...]] = set()
    for pick in product(*(range(len(v)) for _, v, _ in terms)):
        total = sum(v[k] for (_, v, _), k in zip(terms, pick))
        if abs(gap - total) <= tol:
            fits.add(tuple(sorted({name for (name, _, b), k in zip(terms, pick) if k == b})))
    return fits, gap


def _summands(step: dict, ranks: dict, layout: _Layout, tp: str, mods: dict) -> list[tuple[int, dict, dict]]:
    """(rank, layer, all-reduce) for each forward sum all-reduce over exactly ``tp`` whose input is the output of a
    layer with a bias (the same linear checksums) that did not issue it, the layer's input differing between the
    tensor ranks (row-parallel): the caller reduces the layer's output."""
    found = []
    for r in sorted(mods):
        no = step.get(r, {}).get("step")
        outs = {tuple(m["partial"]["sums"]): m for m in mods[r].values() if (m.get("partial") or {}).get("sums")}
        other = layout.neighbour(r, tp)
        for c in ranks[r]["collectives"]:
            m = outs.get(tuple(c.get("sums") or ()))
            if (m is None or c["step"] != no or c["phase"] != "forward" or c["kind"] not in SUMS
                    or c.get("op", "sum") != "sum" or layout.axes_of(c["ranks"], r) != (tp,)
                    or c["seq"] in m.get("collectives", [])):
                continue
            theirs = mods.get(other, {}).get(m.get("name")) or {}
            if m.get("input") is not None and theirs.get("input") not in (None, m["input"]):
                found.append((r, m, c))
    return found


def _why(c: dict, tp: str) -> str:
    origin, kind = c.get("origin") or "", c["kind"].replace("_", "-")
    if origin in REDUCTIONS:
        return (f"its input, on each rank, is a statistic ({origin}) of the result of an addition "
                f"({c.get('statistic_of')}): whether a bias or a residual is added to each rank's partial sum before "
                f"the statistic and the {kind} over {tp} (counted on every rank) is not observed")
    if origin in ADDITIONS:
        return (f"its input, on each rank, is the result of an addition ({origin}) that no layer's output accounts "
                f"for: whether a bias or a residual is added to each rank's partial sum before the {kind} over {tp} "
                "(counted on every rank) or to a value already whole is not observed")
    wrote = f"the result of {origin}" if origin else "written by no operation observed in forward"
    return (f"its input, on each rank, is {wrote}, neither a product alone nor a layer's output whose bias was "
            f"read: whether what was added to or applied on each rank's partial sum before the {kind} over {tp} "
            "commutes with the sum is not observed")


def _added_summands(step: dict, ranks: dict, layout: _Layout, tp: str, mods: dict, matched: set,
                    script: str) -> list[Unliftable]:
    """A forward sum all-reduce or reduce-scatter over exactly ``tp`` from the script (``dist.all_reduce``,
    ``dist.reduce_scatter_tensor``) outside any layer's own forward and matched to no layer's output, whose input
    neither a product alone nor a reduction to a statistic wrote (an addition, a scale, any other op, or none
    seen): a term added to the partial sums before the reduction, or after it to a value already whole; which is
    not observed."""
    items: list[Unliftable] = []
    seen: set[tuple] = set()
    for r in sorted(mods):
        no = step.get(r, {}).get("step")
        for c in ranks[r]["collectives"]:
            own = (mods[r].get(c.get("module")) or {}).get("partial")
            if (c["step"] != no or c["phase"] != "forward" or c["kind"] not in SUMS or own is not None
                    or c.get("op", "sum") != "sum" or _trusted(c)
                    or (r, c["seq"]) in matched or not str(c.get("api", "")).startswith("c10d.")
                    or layout.axes_of(c["ranks"], r) != (tp,)):
                continue
            where = tuple(_frames([c.get("stack")], script))
            key = tuple((f.get("file"), f.get("line")) for f in where[:1])
            if key in seen:
                continue
            seen.add(key)
            at = f" at {where[0]['file']}:{where[0]['line']}" if where else ""
            what = "all-reduce" if c["kind"] == "all_reduce" else "reduce-scatter"
            items.append(Unliftable((r,), c["seq"], f"the summand of the {what} over {tp}{at}", _why(c, tp), where))
    return items


def _caller_reduced(found, mods: dict, tp: str, script: str, done: set[str]):
    """The bias of a layer whose output its caller all-reduces: in every summand (each rank's output carries it),
    in one, or in none."""
    items: list[Unliftable] = []
    lines: list[tuple[str, list]] = []
    for r, m, c in found:
        name = m.get("name")
        if name in done:
            continue
        done.add(name)
        group = [(mods.get(g, {}).get(name) or {}).get("partial") or {} for g in c["ranks"]]
        label, where = f"{name} ({m.get('class')})", _where(m, script)
        what = f"the operations on the partial output of {label} over {tp}"
        if not all(p.get("recomputed") and "bias" in p for p in group):
            items.append(Unliftable((r,), c["seq"], what, f"its output is all-reduced over {tp} by its caller, but "
                                    "its bias and bias-free product were not recorded on every rank of the reduction: "
                                    "whether each rank's summand carries the bias is not observed", tuple(where)))
            continue
        mine = m["partial"]
        gap = sum(p["output"] - p["product"] for p in group)
        tol = RTOL * sum(p["product_abs"] + p["output_abs"] for p in group) + 1e-9
        once, every = mine["rows"] * mine["bias"], sum(p["rows"] * p["bias"] for p in group)
        fits = {k for k, v in (("none", 0.0), ("once", once), ("every", every)) if abs(gap - v) <= tol}
        if fits == {"every"}:
            region = region_of(name or "", m.get("class", ""))
            if region in ("attention", "mlp"):
                lines.append((f"  override activations[{region}]: {OverrideVerb.BIAS_BEFORE_REDUCE} over ({tp})  # "
                              f"observed: the bias of {label} in each rank's partial sum, all-reduced over {tp} by "
                              f"its caller (counted {len(group)} times)", where))
                continue
        elif fits and "every" not in fits:
            continue
        why = ("its name places it in no layer region (attention, mlp) whose activation override would state it"
               if fits == {"every"} else "the bias is too small in the step read to tell how many summands carry it"
               if fits else "the summands are not its bias-free product plus its bias: something else is applied")
        items.append(Unliftable((r,), c["seq"], what, f"its output, on each rank a partial sum, is all-reduced over "
                                f"{tp} by its caller; {why}", tuple(where)))
    return items, lines


def partial_ops(step: dict, ranks: dict, layout: _Layout, tp: str,
                script: str) -> tuple[list[Unliftable], list[tuple[str, list]]]:
    """(what is reported, the override lines) for the bias or a residual added before a row-parallel all-reduce."""
    by_seq = {r: {c["seq"]: c for c in ranks[r]["collectives"]} for r in ranks}
    mods = {r: {m.get("name"): m for m in step.get(r, {}).get("modules", [])} for r in step}
    done: set[str] = set()
    found = _summands(step, ranks, layout, tp, mods)
    items, lines = _caller_reduced(found, mods, tp, script, done)
    items += _added_summands(step, ranks, layout, tp, mods, {(r, c["seq"]) for r, _, c in found}, script)
    for r in sorted(mods):
        for name, m in mods[r].items():
            c = _reduction(m, by_seq.get(r, {}), layout, tp, r)
            mine = m.get("partial")
            if c is None or name in done or mine is None or mine.get("dtensor"):
                continue
            done.add(name)
            where = _where(m, script)
            label = f"{name} ({m.get('class')})"
            group = [mods.get(g, {}).get(name, {}).get("partial") or {} for g in c["ranks"]]
            if not all(p.get("recomputed") for p in group) and _products_alone(name, c, mods, by_seq, layout, tp):
                continue
            twice = _unexplained(name, c, mods, by_seq, layout, tp) if all(p.get("recomputed") for p in group) else ""
            if twice:
                items.append(Unliftable((r,), c["seq"], f"the operations on the partial output of {label} over {tp}",
                                        f"{twice}; its activation obligations are not decided", tuple(where)))
                continue
            if not all(p.get("recomputed") for p in group):
                items.append(Unliftable(
                    (r,), c["seq"], f"the operations on the partial output of {label} over {tp}",
                    f"its forward all-reduces a sum over {tp}, but its bias-free product cannot be recomputed from "
                    "its input and a 2-D weight on every rank of the reduction: whether a bias, a residual or a norm "
                    "is applied to each rank's summand before the all-reduce is not observed", tuple(where)))
                continue
            fits, gap = _orders(mine, group)
            if len(fits) != 1:
                why = ("the output is not the all-reduced product of its weight slices plus its bias or a residual "
                       f"argument (a difference of {gap:.6g} in its fingerprint): something else (a norm, an "
                       "activation, a residual not passed in) is applied to the partial sums or the result"
                       if not fits else "its bias and residual arguments are too small in the step read to tell "
                       "whether they are added before or after the reduction")
                items.append(Unliftable((r,), c["seq"], f"the operations on the partial output of {label} over {tp}",
                                        f"its forward all-reduces a sum over {tp}; {why}", tuple(where)))
                continue
            before = next(iter(fits))
            if not before:
                continue
            region = region_of(name or "", m.get("class", ""))
            if region not in ("attention", "mlp"):
                items.append(Unliftable(
                    (r,), c["seq"], f"the operations on the partial output of {label} over {tp}",
                    f"its {' and '.join(before)} added to each rank's partial sum before the all-reduce over {tp} "
                    f"(counted {len(group)} times); its name places it in no layer region (attention, mlp) whose "
                    "activation override would state it", tuple(where)))
                continue
            for term in before:
                verb = OverrideVerb.BIAS_BEFORE_REDUCE if term == "bias" else OverrideVerb.RESIDUAL_BEFORE_REDUCE
                lines.append((f"  override activations[{region}]: {verb} over ({tp})  # observed: the {term} of "
                              f"{label} added to each rank's partial sum before its all-reduce over {tp} "
                              f"(counted {len(group)} times)", where))
    return items, lines
