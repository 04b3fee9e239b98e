"""The clip coefficient's value on the ranks that hold replicas of a gradient (no torch).

``clip_values``: per step and parameter, the values of the data-dependent scales (the recorder's
``dynamic_values``: a clip coefficient, ``p.grad.mul_(coef)``, ``clip_grad_norm_``) that the ranks along a
non-pipeline axis apply to its gradient after backward, where every one of them holds the gradient all-reduced over
that axis (a replica: DDP's reduction, a hand-written all-reduce), applies as many data-dependent scales and the
same constant ones (a clip or a divisor on some ranks only is ``lift_perrank``'s). Compared along every such axis,
whatever the step's norm all-reduces sum over. Equal values: nothing. Different values where the replicas' norm
all-reduces give different sums (each sum recomputed from the inputs every rank of its group recorded: groups that
miss a shard or count one twice, ``clip_norm: reduce_sets`` / ``reduce_blocks``): the norm's statements hold
those (an epsilon on some ranks' pieces before the sum, ``eps_on_ranks``, is inside the sum and changes no
coefficient between the ranks of one group). Different values from equal sums (or where no norm all-reduce runs):
the coefficient departs after the sum (``dist.all_reduce(sq); if rank == 0: sq += eps``, or an epsilon added to
rank 0's own squared norm where the gradients are replicated already and no norm all-reduce follows), the ranks
scale equal gradients by different coefficients and the replicas drift apart. No plan statement holds a
coefficient that differs between replicas in its value alone (``clip_norm: eps_on_ranks`` states an epsilon on
some ranks' pieces before the sum, ``grads: clip_on_ranks`` a clip some ranks skip): named (PL614) at the line
that scales the gradient, never proved. A sum that cannot be recomputed (a rank's record missing, a vector or a
reduction other than a sum or a maximum) is named too.
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames
from .lift_perrank import _key

WHAT = "the clip coefficient of gradients replicated over an axis"


def _replicated(st, r: int, grad: dict, a: str) -> bool:
    """Whether rank ``r``'s gradient went through an all-reduce over ``a`` (equal on the ranks of ``a`` after it)."""
    mine = st.by_seq.get(r) or {}
    return any((c := mine.get(s)) is not None and c["kind"] == "all_reduce"
               and a in (st.layout.axes_of(c["ranks"], r) or ()) for s in grad.get("collectives") or [])


def _lines(st, pp: str | None) -> list[tuple[str, list[int]]]:
    """Every line of ranks along each non-pipeline axis (the ranks that differ along it alone), lowest rank first."""
    out = []
    for i, a in enumerate(st.layout.names):
        if a == pp or st.layout.sizes[i] < 2:
            continue
        rows: dict[tuple, list[int]] = {}
        for r, c in sorted(st.layout.coords.items()):
            if r in st.ranks:
                rows.setdefault(c[:i] + c[i + 1:], []).append(r)
        out.extend((a, row) for row in rows.values() if len(row) > 1)
    return out


def _grads(st, r: int) -> dict[int, dict[str, dict]]:
    """step -> parameter name -> rank ``r``'s gradient record at its optimizer step."""
    return {s.get("step", -1): {p["name"]: p["grad"] for p in (s.get("optimizer") or {}).get("params", [])
                                if p.get("grad") is not None}
            for s in st.ranks[r].get("steps") or [] if s.get("optimizer")}


def _norm_calls(st, grads: dict) -> set[int]:
    """The call numbers of the norm all-reduces (after backward, a float carrying no gradient) on any rank."""
    carried = {s for per in grads.values() for step in per.values() for g in step.values()
               for s in g.get("collectives") or []}
    return {c["seq"] for r in st.ranks for c in st.ranks[r]["collectives"]
            if c["phase"] == "after_backward" and c["kind"] == "all_reduce" and c["seq"] not in carried
            and str(c.get("dtype", "float")).startswith(("float", "bfloat"))}


def _sums(st, r: int, k: int, calls: set[int]) -> tuple | None:
    """The results of rank ``r``'s norm all-reduces on step ``k``, each recomputed from the inputs every rank of
    its group recorded (a sum or a maximum of one value each); None where one cannot be recomputed."""
    out = []
    for c in st.ranks[r]["collectives"]:
        if c["seq"] not in calls or c["step"] != k:
            continue
        ins = [((st.by_seq.get(q) or {}).get(c["seq"]) or {}).get("value_in") for q in c["ranks"]]
        if c.get("op", "sum") not in ("sum", "max") or c.get("numel", 1) != 1 or None in ins:
            return None
        out.append(sum(ins) if c.get("op", "sum") == "sum" else max(ins))
    return tuple(out)


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-6 * max(abs(x), abs(y)) for x, y in zip(a, b))


def clip_values(st, pp: str | None) -> None:
    """The replicas whose clip coefficients differ in value after equal norm sums, named in ``st.items`` (one item
    per axis)."""
    grads = {r: _grads(st, r) for r in st.ranks}
    calls = _norm_calls(st, grads)
    named: set[str] = set()
    for a, row in _lines(st, pp):
        if a in named:
            continue
        for k in sorted(grads[row[0]]):
            found = _departure(st, a, row, k, grads)
            if found is None:
                continue
            name, ranks, frame = found
            sums = [_sums(st, r, k, calls) for r, _ in ranks]
            if None not in sums and not all(_same(sums[0], x) for x in sums[1:]):
                continue  # the norm all-reduces give the replicas different sums: the norm's statements
            values = ", ".join(f"rank {r}: {v:.9g}" for r, v in ranks)
            after = "from norm sums it cannot recompute" if None in sums else \
                "from equal norm sums (the difference arises after the norm's all-reduce, or no norm all-reduce runs)"
            st.items.append(Unliftable(
                tuple(r for r, _ in ranks), -1, WHAT,
                f"the ranks of {a} hold {name}'s gradient all-reduced over {a} (replicas) and scale it by "
                f"different clip coefficients on step {k} ({values}) {after}: the replicas drift apart, and no "
                "statement holds a coefficient that differs between replicas in its value alone",
                tuple(_frames([[frame]], st.script))))
            named.add(a)
            break


def _departure(st, a: str, row: list[int], k: int, grads: dict) -> tuple | None:
    """(parameter, (rank, its first differing value) per rank, the scaling frame) of the first parameter whose
    replicas along ``a`` on step ``k`` apply clip coefficients of different values; None where all agree."""
    for name, g0 in (grads[row[0]].get(k) or {}).items():
        held = [(r, (grads[r].get(k) or {}).get(name)) for r in row]
        if any(g is None or not g.get("dynamic_values") for _, g in held):
            continue
        if len({_key(g) for _, g in held}) > 1 or any(len(g["dynamic_values"]) != len(g["dynamic_scales"] or [])
                                                      for _, g in held):
            continue  # a clip or a divisor on some ranks only (lift_perrank), or a record that does not pair up
        if not all(_replicated(st, r, g, a) for r, g in held):
            continue
        for j in range(len(g0["dynamic_values"])):
            vals = [(r, g["dynamic_values"][j]) for r, g in held]
            if len({repr(float(v)) for _, v in vals}) > 1:  # a NaN on every rank is equal
                at = g0.get("dynamic_at") or []
                return name, vals, at[j] if j < len(at) else {}
    return None
