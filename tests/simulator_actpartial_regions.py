"""A concrete simulator of operations on the embedding's and the experts' partial activations, written
from docs/semantics.md ("Operations on a partial activation") without the checker's code (it imports
nothing from ``placement_logic.check`` or ``placement_logic.ir.actflow``).

The group a value is partial over: for the embedding the tensor axes (each rank of the group holds a
slice of the vocabulary: rank r of n holds words 2r and 2r + 1 of a table of 2n rows); for the
experts, in a model with more than one expert, the axes the model's ``group experts { role = ... }``
names tensor (parallel folding), else the tensor axes (each expert's fc2 split over them as the
dense layers' are). Every device holds its samples' token ids (sample s, position i: word
(3i + s + 1) mod 2n) or its input X (simulator_act's matrices), and computes its summand: the
embedding's masked lookup (the token's row where the word is in its slice, zeros elsewhere), the
expert's X·A_r·B_r. The sum runs as real collectives: first over the group's axes the statement does
not name, then the operation on every device, then the sum over the named axes. The operations:
``positional_before_reduce`` adds the positions' embedding rows, ``nonlinear_before_reduce`` maps
every entry v to v² + 1 (the embedding of a model whose ``norm`` is layernorm: f(0) ≠ 0, as a
LayerNorm's shift) or v² (the experts); the embedding of a model with ``norm = rmsnorm`` divides each
row x by Σ x_j² + 1 (an RMSNorm with ε = 1 and no square root, kept exact: nonlinear, zero at zero),
``scale_before_reduce`` multiplies by 3, ``bias_before_reduce`` adds 1, ``residual_before_reduce``
adds X, ``shared_before_reduce`` adds the shared expert's output (a whole matrix). The single device
applies the operation once to the whole value. A statement without a region acts in the embedding
for positional embeddings, in the experts for the shared expert, in neither otherwise.

``violations(plan, sizes)`` returns ``("act", region)`` for each region whose output differs on a device.
"""

from __future__ import annotations

from fractions import Fraction

from simulator_act import Mesh, _cols, _matrix, _mm, collective

from placement_logic import ir

REGION_VERBS = {"embedding": ("positional_before_reduce", "nonlinear_before_reduce", "scale_before_reduce"),
                "experts": ("bias_before_reduce", "residual_before_reduce", "shared_before_reduce",
                            "nonlinear_before_reduce", "scale_before_reduce")}
ONLY = {"positional_before_reduce": "embedding", "shared_before_reduce": "experts"}
HID = 2


def _op(region: str, verb: str, m: list, x: list, pos: list, shared: list, norm: str = "layernorm") -> list:
    if verb == "scale_before_reduce":
        return [[3 * v for v in row] for row in m]
    if verb == "nonlinear_before_reduce" and region == "embedding" and norm == "rmsnorm":
        return [[Fraction(v) / (sum(w * w for w in row) + 1) for v in row] for row in m]
    if verb == "nonlinear_before_reduce":
        return [[v * v + (1 if region == "embedding" else 0) for v in row] for row in m]
    add = {"positional_before_reduce": pos, "residual_before_reduce": x, "shared_before_reduce": shared}.get(verb)
    if add is None:  # the bias: 1 in every entry
        add = [[1] * len(row) for row in m]
    return [[v + w for v, w in zip(row, ar)] for row, ar in zip(m, add)]


def group_axes(plan: ir.Plan, region: str, mesh: Mesh) -> tuple[str, ...]:
    if region == "embedding":
        return tuple(mesh.tensor)
    t = plan.model.transformer
    if t is None or (isinstance(t.experts, ir.Const) and t.experts.value <= 1):
        return ()
    roles = next((dict(g.roles) for g in plan.model.groups if g.name == "experts" and g.roles), None)
    if roles is not None:
        return tuple(a for a in plan.mesh.names if roles.get(a) is ir.Role.TENSOR)
    return tuple(mesh.tensor)


def _stated(plan: ir.Plan, region: str) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for o in plan.overrides:
        if o.target != "activations" or o.verb not in REGION_VERBS[region]:
            continue
        if o.group == region or (o.group is None and ONLY.get(o.verb) == region):
            out[o.verb] = tuple(dict.fromkeys(out.get(o.verb, ()) + tuple(o.axes or ())))
    return out


def _one(plan: ir.Plan, mesh: Mesh, region: str, verb: str, named: tuple[str, ...]) -> bool:
    grp = group_axes(plan, region, mesh)
    norm = plan.model.transformer.norm if plan.model.transformer is not None else "layernorm"
    n = 1
    for a in grp:
        n *= mesh.sizes[a]
    table, A, B = _matrix(2 * n, HID, 5), _matrix(HID, 2 * n, 3), _matrix(2 * n, HID, 4)
    pos, shared = _matrix(2, HID, 7), _matrix(2, HID, 9)
    xs, vals, want = {}, {}, {}
    for d in mesh.devices:
        r = 0
        for a in grp:
            r = r * mesh.sizes[a] + d[a]
        s = sum(d[a] * 7 ** i for i, a in enumerate(mesh.names) if a not in grp)  # the device's samples
        X = _matrix(2, HID, 20 + s)
        if region == "embedding":
            words = [(3 * i + s + 1) % (2 * n) for i in range(2)]
            whole = [list(table[w]) for w in words]
            mine = [list(table[w]) if 2 * r <= w < 2 * r + 2 else [0] * HID for w in words]
        else:
            whole = _mm(_mm(X, A), B)
            mine = _mm(_mm(X, _cols(A, 2 * r, 2 * r + 2)), B[2 * r:2 * r + 2])
        k = mesh.key(d)
        xs[k], vals[k] = X, mine
        want[k] = _op(region, verb, whole, X, pos, shared, norm)
    rest = tuple(a for a in grp if a not in named)
    vals = collective(mesh, "sum", rest, vals) if rest else vals
    vals = {k: _op(region, verb, v, xs[k], pos, shared, norm) for k, v in vals.items()}
    here = tuple(a for a in grp if a in named)
    vals = collective(mesh, "sum", here, vals) if here else vals
    return any(vals[k] != want[k] for k in vals)


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    mesh = Mesh(plan, sizes)
    out = set()
    for region in REGION_VERBS:
        if any(_one(plan, mesh, region, verb, axes) for verb, axes in _stated(plan, region).items()):
            out.add(("act", region))
    return out
