"""A concrete simulator of a matrix-wise optimizer step (Muon) on every device of a small mesh.

Written from docs/semantics.md ("Optimizers that need whole matrices"), not from the checker:
one weight matrix of a parameter group, its rows cut by every data, context or expert axis over
which the group's optimizer state is flat-sharded (a ZeRO/FSDP shard of the row-major buffer),
its columns cut by every tensor axis that splits the group's weights (a tensor axis never cuts a
group it holds whole, whatever the optimizer mode there); an axis the plan gathers the matrix over
(``optimizer[G]: gather``) or hands it whole to an owner over (``round_robin``) cuts nothing.
Each device orthogonalises the piece it holds with Muon's quintic Newton–Schulz (exact
fractions) and keeps the elements it owns; the step is correct exactly when every device's
elements equal those of the whole matrix orthogonalised on one device.
"""

from __future__ import annotations

import random
from fractions import Fraction
from itertools import product

from placement_logic import ir
from placement_logic.ir import groups as pg

A, B, C = Fraction(34445, 10000), Fraction(-47750, 10000), Fraction(20315, 10000)


def matmul(x, y):
    return [[sum(x[i][k] * y[k][j] for k in range(len(y))) for j in range(len(y[0]))] for i in range(len(x))]


def transpose(x):
    return [[x[i][j] for i in range(len(x))] for j in range(len(x[0]))]


def orthogonalise(m, steps):
    """X0 = M / Σ|m_ij|; if taller than wide work on Mᵀ; X ← A·X + B·(XXᵀ)X + C·(XXᵀ)²X."""
    norm = sum(abs(v) for row in m for v in row)
    flip = len(m) > len(m[0])
    x = transpose(m) if flip else [row[:] for row in m]
    x = [[v / norm for v in row] for row in x]
    for _ in range(steps):
        gram = matmul(x, transpose(x))
        gx = matmul(gram, x)
        ggx = matmul(gram, gx)
        x = [[A * x[i][j] + B * gx[i][j] + C * ggx[i][j] for j in range(len(x[0]))] for i in range(len(x))]
    return transpose(x) if flip else x


def _modes(plan: ir.Plan, group: pg.ParamGroup, state: ir.State) -> dict[str, ir.Mode]:
    modes = dict(plan.placement(state).modes)
    modes.update(group.own_modes(state))
    return modes


# `optimizer[matrices]` names the weight matrices inside the layers (docs/language.md, "Optimizers")
MATRICES = ("attention", "kv", "mlp", "experts", "shared_experts", "router", "dense")


def _stated(plan: ir.Plan, group: str) -> set[str]:
    return {a for o in plan.overrides if o.target == "optimizer" and o.verb in ("gather", "round_robin")
            and (o.group in (None, "all", group) or (o.group == "matrices" and group in MATRICES))
            for a in (o.axes or ())}


def _data_mode(plan: ir.Plan) -> ir.Mode:
    """The optimizer mode of the plan's first data axis (R without one)."""
    for a in plan.mesh.names:
        if plan.role(a) is ir.Role.DATA:
            m = plan.placement(ir.State.OPTIMIZER).mode(a)
            return ir.Mode.R if m is ir.Mode.M else m
    return ir.Mode.R


def layout(plan: ir.Plan, group: str) -> tuple[list[str], list[str]]:
    """(axes cutting rows, axes cutting columns) of one of ``group``'s matrices at the update."""
    g = next(x for x in pg.param_groups(plan.model) if x.name == group)
    opt = _modes(plan, g, ir.State.OPTIMIZER)
    whole = _stated(plan, group)
    t = plan.model.transformer
    kv_one = t is not None and isinstance(t.kv_heads, ir.Const) and t.kv_heads.value == 1
    rows, cols = [], []
    for a in plan.mesh.names:
        role = dict(g.roles).get(a, plan.role(a))
        if a in whole or role is ir.Role.PIPELINE or (role is ir.Role.EXPERT and g.expert):
            continue
        mode = opt[a]
        params = _modes(plan, g, ir.State.PARAMS)[a]
        if role is ir.Role.EXPERT and a not in g.own_modes(ir.State.OPTIMIZER) and params in (ir.Mode.S, ir.Mode.O):
            mode = _data_mode(plan)  # a data-parallel replica over the expert axis
        splits_weights = g.tensor == pg.SPLIT or (g.tensor == pg.HEADS and not kv_one)
        if role in (ir.Role.TENSOR, ir.Role.SEQUENCE):  # the tensor rule: whole weights are not cut
            if splits_weights:
                cols.append(a)
        elif mode in (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O):
            rows.append(a)
    return rows, cols


def violated(plan: ir.Plan, group: str, steps: int, sizes: dict[str, int], rng: random.Random) -> bool:
    """Whether some device's update of its elements differs from the single-device update."""
    rows_axes, cols_axes = layout(plan, group)
    nr = 1
    for a in rows_axes:
        nr *= sizes[a]
    nc = 1
    for a in cols_axes:
        nc *= sizes[a]
    rows, cols = 2 * nr, 2 * nc
    m = [[Fraction(rng.choice([-3, -2, -1, 1, 2, 3, 4])) for _ in range(cols)] for _ in range(rows)]
    whole = orthogonalise(m, steps)
    names = plan.mesh.names
    for coord in product(*(range(sizes[a]) for a in names)):
        at = dict(zip(names, coord))
        r, c = 0, 0
        for a in rows_axes:
            r = r * sizes[a] + at[a]
        for a in cols_axes:
            c = c * sizes[a] + at[a]
        r0, c0 = r * rows // nr, c * cols // nc
        piece = [row[c0:c0 + cols // nc] for row in m[r0:r0 + rows // nr]]
        mine = orthogonalise(piece, steps)
        for i in range(len(piece)):
            for j in range(len(piece[0])):
                if mine[i][j] != whole[r0 + i][c0 + j]:
                    return True
    return False
