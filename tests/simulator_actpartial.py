"""A concrete simulator of operations on a partial activation, written from docs/semantics.md
("Operations on a partial activation") without the checker's code (it imports nothing from
``placement_logic.check`` or ``placement_logic.ir.actflow``).

Every device holds its samples X (whole: the region's input), its column block of the
column-parallel weight A and its row block of the row-parallel weight B (tests/simulator_act's
matrices), so its summand of the row-parallel output is X·A_r·B_r. The sum over the tensor group
runs as real collectives over the devices: first over the tensor axes the statement does not name
(the value is whole there when the operation runs), then the operation on every device, then the sum
over the named axes. The operations: ``bias_before_reduce`` adds a bias row (every entry 1) to every
row, ``residual_before_reduce`` adds X, ``nonlinear_before_reduce`` squares every entry (a
non-additive f). The single device applies the same operation once to X·A·B. A region's statements
of one verb act together over the union of their axes; a statement without a region acts in
attention and mlp; each verb is run on its own (the region is wrong where any of them is).

In backward (``activation_grads[R]: residual_before_reduce``) each device's summand of the input
gradient is G·B_r^T·A_r^T for the output gradient G (whole on every device, the matrix X stands for
it), the residual's gradient G is added on every device, then the sums as above; the single device
computes G·B^T·A^T + G.

``violations(plan, sizes)`` returns ``("act", region)`` for each region whose output differs on
some device, ``("grad", region)`` for its input gradient.
"""

from __future__ import annotations

from simulator_act import Mesh, _cols, _matrix, _mm, _t, collective

from placement_logic import ir

VERBS = ("bias_before_reduce", "residual_before_reduce", "nonlinear_before_reduce")
REGIONS = ("attention", "mlp")


def _op(verb: str, m: list, x: list) -> list:
    if verb == "bias_before_reduce":
        return [[v + 1 for v in row] for row in m]
    if verb == "residual_before_reduce":
        return [[v + w for v, w in zip(row, xr)] for row, xr in zip(m, x)]
    return [[v * v for v in row] for row in m]


def _stated(plan: ir.Plan, region: str, target: str = "activations") -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for o in plan.overrides:
        if o.target == target and o.verb in VERBS and o.group in (None, region):
            out[o.verb] = tuple(dict.fromkeys(out.get(o.verb, ()) + tuple(o.axes or ())))
    return out


def _one(mesh: Mesh, verb: str, axes: tuple[str, ...], back: bool = False) -> bool:
    """True where the output differs from the single device's on some device. ``back``: the input gradient,
    each device's summand G·B_r^T·A_r^T of the output gradient G (whole), the residual's gradient G added."""
    n = mesh.tp(mesh.devices[0])[1]
    hid, per = 2, 2
    A = _matrix(hid, per * n, 3)
    B = _matrix(per * n, hid, 4)
    xs, vals, want = {}, {}, {}
    for d in mesh.devices:
        r, _ = mesh.tp(d)
        X = _matrix(2, hid, 20 + mesh.sample(d))
        xs[mesh.key(d)] = X
        a_r, b_r = _cols(A, r * per, (r + 1) * per), B[r * per:(r + 1) * per]
        if back:
            vals[mesh.key(d)] = _mm(_mm(X, _t(b_r)), _t(a_r))
            want[mesh.key(d)] = _op(verb, _mm(_mm(X, _t(B)), _t(A)), X)
        else:
            vals[mesh.key(d)] = _mm(_mm(X, a_r), b_r)
            want[mesh.key(d)] = _op(verb, _mm(_mm(X, A), B), X)
    rest = tuple(a for a in mesh.tensor if a not in axes)
    vals = collective(mesh, "sum", rest, vals) if rest else vals  # whole over the axes not named
    vals = {k: _op(verb, v, xs[k]) for k, v in vals.items()}  # the operation on every device
    named = tuple(a for a in mesh.tensor if a in axes)
    vals = collective(mesh, "sum", named, vals) if named else vals
    return any(vals[k] != want[k] for k in vals)


def region_violations(plan: ir.Plan, sizes: dict[str, int], region: str) -> set:
    """Each stated operation run on its own (the region is wrong where any of them is)."""
    mesh = Mesh(plan, sizes)
    out = set()
    if any(_one(mesh, verb, axes) for verb, axes in _stated(plan, region).items()):
        out.add(("act", region))
    if any(_one(mesh, verb, axes, True) for verb, axes in _stated(plan, region, "activation_grads").items()):
        out.add(("grad", region))
    return out


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    return set().union(*(region_violations(plan, sizes, r) for r in REGIONS))
