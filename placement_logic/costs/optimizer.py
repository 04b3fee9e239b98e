"""The cost of each parameter group's optimizer algorithm (ir.optimizers): state, traffic, compute.

Input: a plan with an ``optimizer`` section, its ``Shape`` and ``Layout``. Output, as exact
sympy closed forms (docs/costs.md, "Optimizers"):

- ``state_bytes(plan, sh, group, held)``: the group's optimizer state on a device holding
  ``held`` of its parameters: the algorithm's bytes per parameter (``ir.optimizers``; the
  model's ``bytes.optimizer`` for AdamW) × held, plus, for Adafactor and Dion, the per-matrix
  terms (4·(m + n) bytes of factored second moment; 4·r·n bytes of Dion's n×r right factor, for
  an m×n (out × in) weight) in the share held.
- ``collectives(plan, sh)``: the collectives a whole-matrix update adds, one device, one step:
  ``gather over (A)``: an all-gather over A of the group's gradient matrices (the model's
  gradient element), of the buffer the device needs whole over A (the group's parameters on the
  device divided over every other axis that cuts them, the pipeline and the expert axes);
  ``round_robin over (A)``, the group's matrices spread evenly over the owners: over the tensor
  axes T of A that split the matrices, an all-to-all of the pieces to their owners and one of
  the updated pieces back (each of buffer m/|T|, m the device's matrices whole over T); over the
  axes of A where the optimizer state is sharded, the shards are whole matrices (the derived
  reduce-scatter and parameter re-gather move the same bytes: nothing added); over the axes of
  A where it is replicated, one all-gather of the owners' updated matrices (buffer m).
- ``update_flops(plan, sh)``: the FLOPs per device of the matrix-wise updates: Newton–Schulz,
  per m×n matrix with p = min(m, n), q = max(m, n), ns_steps × (4·p²·q + 2·p³) (each quintic step
  forms A = XXᵀ (2p²q), A² (2p³) and (bA + cA²)X (2p²q); Jordan et al. 2024,
  ``zeropower_via_newtonschulz5``); every device orthogonalises the matrices it updates (all of
  its stage's under ``gather``, 1/n of them under ``round_robin``), each on the piece it holds
  where a cut is left in place. Shampoo/SOAP: 4·B FLOPs per parameter (L⁻¹ᐟ⁴·G·R⁻¹ᐟ⁴ per B×B
  block; the amortised root inverses are not counted); Dion: 4·r FLOPs per parameter (its two
  rank-r products; the r×r orthonormalisation is not counted).
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from .. import ir
from ..ir import optimizers as opt
from ..ir import views
from ..ir.buffers import Collective, Kind, Payload, Phase, group_grads, link_of
from ..ir.nodes import Role
from ..ir.overrides import OverrideVerb
from .sizes import Shape, per_group
from .symbolic import symbol, to_sympy

ZERO = sympy.Integer(0)
_TENSOR = (Role.TENSOR, Role.SEQUENCE)


def matrices(plan: ir.Plan, sh: Shape, group: str) -> list[tuple[sympy.Expr, sympy.Expr, sympy.Expr]] | None:
    """(how many, rows, cols) of the group's weight matrices in the whole model (out × in), or
    None where the shape does not give them (no transformer shape, latent attention, user groups)."""
    t = plan.model.transformer
    g = next((x for x in sh.groups if x.name == group), None)
    if t is None or g is None or t.mla:
        return None
    h, a, kv, f, V, E = sh.h, sh.a, sh.kv, sh.f, sh.V, sh.experts
    dh = to_sympy(t.head_dim) if t.head_dim is not None else h / a
    layers = g.count / g.per_layer if g.per_layer is not None else None  # the layers holding it
    mats = 3 if sh.gated else 2

    def mlp(width):
        up = [(sympy.Integer(mats - 1), width, h)]
        return up + [(sympy.Integer(1), h, width)]
    per_layer = {
        "attention": [(sympy.Integer(1), a * dh, h), (sympy.Integer(1), h, a * dh)],
        "kv": [(sympy.Integer(2), kv * dh, h)],
        "mlp": mlp(f),
        "experts": [(E * n, r, c) for n, r, c in mlp(sh.fe if sh.fe is not None else f)],
        "router": [(sympy.Integer(1), E, h)],
    }.get(group)
    if group in ("embedding", "head"):
        return [(sympy.Integer(1), V, h)]
    if per_layer is None or layers is None or g.group.user or (t.bias and group in ("mlp", "experts")):
        return None  # shared experts (several widths), column biases inside the group: not modelled
    return [(n * layers, r, c) for n, r, c in per_layer]


def _matrix_total(plan: ir.Plan, sh: Shape, group: str, c: opt.Choice) -> sympy.Expr | None:
    """The algorithm's per-matrix state bytes over the whole model (0 where it keeps none)."""
    alg = opt.ALGORITHMS[c.algorithm]
    if not alg.per_dim:
        return ZERO
    mats = matrices(plan, sh, group)
    if mats is None:
        return None
    if alg.per_dim == "rows+cols":
        return sum((4 * n * (r + k) for n, r, k in mats), ZERO)
    return sum((4 * n * c.arg("rank") * k for n, r, k in mats), ZERO)


def state_bytes(plan: ir.Plan, sh: Shape, group: str, held: sympy.Expr, notes: list | None = None) -> sympy.Expr:
    """Optimizer-state bytes of ``group`` on a device holding ``held`` of its parameters."""
    c = opt.choice(plan, group)
    alg = opt.ALGORITHMS[c.algorithm]
    per = sh.bytes[ir.State.OPTIMIZER] if alg.state is None else sympy.Integer(alg.state)
    out = per * held
    total = _matrix_total(plan, sh, group, c)
    g = next((x for x in sh.groups if x.name == group), None)
    if total is None:
        if notes is not None:
            notes.append(f"optimizer[{group}]: {c.algorithm}'s per-matrix state needs the matrix shapes, which the "
                         "model does not give: only its per-parameter state is counted")
    elif total != 0 and g is not None and g.count != 0:
        out = out + total * held / g.count
    return out


def _divided_over(plan: ir.Plan, group: str, whole: tuple[str, ...]) -> tuple[str, ...]:
    cut = opt.cuts(plan, group)
    return tuple(a for a in plan.mesh.names if a not in whole and (
        a in cut or views.view(plan).role(a) in (Role.PIPELINE, Role.EXPERT)))


def collectives(plan: ir.Plan, notes: list | None = None) -> list[Collective]:
    """The collectives the stated gathers and owners of whole-matrix updates add (one step)."""
    out: list[Collective] = []
    for group, c in opt.whole_needed(plan):
        cut = opt.cuts(plan, group)
        gather, _ = opt.stated(plan, OverrideVerb.GATHER, group)
        owner = opt.owners(plan, group)
        n = opt.updates_per_step(plan, group)
        each = " (after every micro-step: optimizer step_every_microbatch)" if opt.stepped_every_microbatch(plan, group) else ""
        if gather:
            out.append(Collective(
                Kind.ALL_GATHER, ir.State.GRADS, _in_mesh(plan, gather), link_of(plan, gather), Phase.OPTIMIZER,
                n, Payload(group_grads(group), _divided_over(plan, group, gather), f"{group} gradient matrices"),
                f"{c.text()} on {group}: every rank gathers each whole gradient matrix over ({', '.join(gather)})" + each))
        if owner:
            start = len(out)
            _owners(plan, group, c, _in_mesh(plan, tuple(a for a in owner if a not in gather)), cut, gather, out)
            out[start:] = [replace(x, count=n, rule=x.rule + each) for x in out[start:]]
    return out


def _owners(plan: ir.Plan, group: str, c: opt.Choice, axes: tuple[str, ...], cut: tuple[str, ...],
            gather: tuple[str, ...], out: list) -> None:
    """round_robin over ``axes``: each matrix owned by one rank of them. A tensor axis that splits
    the matrix sends the pieces to their owner and back (two all-to-alls); an axis over which the
    optimizer state is sharded partitions it by whole matrices instead of flat pieces (its derived
    reduce-scatter and re-gather move the same bytes: nothing is added); an axis over which the
    state is replicated all-gathers the owners' updated matrices."""
    tensor = tuple(a for a in axes if a in cut and views.view(plan).role(a) in _TENSOR)
    replicated = tuple(a for a in axes if a not in cut)
    rule = f"{c.text()} on {group}, round_robin over ({', '.join(axes)})"
    if tensor:
        whole = gather + tensor
        share = Payload(group_grads(group), _divided_over(plan, group, whole) + tensor, f"{group} matrix pieces")
        for what in ("the pieces of each matrix to its owner", "the updated pieces back from the owners"):
            out.append(Collective(Kind.ALL_TO_ALL, ir.State.GRADS, tensor, link_of(plan, tensor), Phase.OPTIMIZER,
                                  ir.const(1), share, f"{rule}: {what} over ({', '.join(tensor)})"))
    if replicated:
        pay = Payload(group_grads(group), _divided_over(plan, group, gather + tensor), f"{group} updated matrices")
        out.append(Collective(Kind.ALL_GATHER, ir.State.GRADS, replicated, link_of(plan, replicated), Phase.OPTIMIZER,
                              ir.const(1), pay, f"{rule}: the owners' updated matrices to every rank of "
                              f"({', '.join(replicated)})"))


def _in_mesh(plan: ir.Plan, axes: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for a in plan.mesh.names if a in axes)


def _ns(steps: int, r: sympy.Expr, k: sympy.Expr) -> sympy.Expr:
    p, q = sympy.Min(r, k), sympy.Max(r, k)
    return steps * (4 * p ** 2 * q + 2 * p ** 3)


def update_flops(plan: ir.Plan, sh: Shape, split, notes: list | None = None) -> sympy.Expr:
    """FLOPs per device per step of the matrix-wise and block-wise updates (the busiest stage's
    share of the layers; element-wise updates are counted by the memory-bound optimizer step)."""
    total = ZERO
    for group, c in ((g, opt.choice(plan, g.name)) for g in sh.groups):
        name = group.name
        if c.locality == opt.ELEMENT or name in opt.VECTOR_GROUPS:
            continue
        whole = opt.uncut(plan, name)
        owners = opt.owners(plan, name)
        # the device's share of the group's matrices: its stage's layers, its experts, its owned 1/n
        spread = tuple(a for a in plan.mesh.names if views.view(plan).role(a) in (Role.PIPELINE, Role.EXPERT))
        held = per_group(sh, spread, split).get(name, ZERO)
        frac = held / group.count if group.count != 0 else ZERO
        for a in owners:
            frac = frac / symbol(a)
        if c.locality != opt.MATRIX:
            per = 4 * c.arg("block") if c.locality == opt.BLOCK else 4 * c.arg("rank")
            total += per * group.count * frac
            continue
        mats = matrices(plan, sh, name)
        if mats is None:
            if notes is not None:
                notes.append(f"optimizer[{name}]: the Newton–Schulz FLOPs need the matrix shapes, which the model "
                             "does not give: not counted")
            continue
        # a cut left in place: a flat shard cuts the rows (out) of the row-major buffer, a tensor split
        # the dimension that is not the hidden size (heads, MLP width, vocabulary)
        left = [a for a in opt.cuts(plan, name) if a not in whole]
        flat = sympy.Mul(*(symbol(a) for a in left if views.view(plan).role(a) not in _TENSOR))
        tp = sympy.Mul(*(symbol(a) for a in left if views.view(plan).role(a) in _TENSOR))
        times = to_sympy(opt.updates_per_step(plan, name))  # Newton–Schulz once per update
        for n, r, k in mats:
            r, k = (r / tp, k) if r != sh.h else (r, k / tp)
            total += times * n * frac * _ns(c.arg("ns_steps"), r / flat, k)
    return total


def transient(plan: ir.Plan, sh: Shape) -> dict[str, sympy.Expr]:
    """Newton–Schulz's working copy of the largest matrix a device orthogonalises (one at a time):
    the model's gradient element times the matrix's size, divided by the cuts left in place (a
    gathered matrix, or an owned one, is whole)."""
    sizes = []
    for group, c in opt.whole_needed(plan):
        mats = matrices(plan, sh, group) if c.locality == opt.MATRIX else None
        if not mats:
            continue
        left = [a for a in opt.cuts(plan, group) if a not in opt.uncut(plan, group)]
        flat = sympy.Mul(*(symbol(a) for a in left if views.view(plan).role(a) not in _TENSOR))
        tp = sympy.Mul(*(symbol(a) for a in left if views.view(plan).role(a) in _TENSOR))
        sizes += [(r / tp if r != sh.h else r) * (k if r != sh.h else k / tp) / flat for _, r, k in mats]
    if not sizes:
        return {}
    return {"Newton–Schulz working copy (the largest matrix, one at a time)": sh.bytes[ir.State.GRADS] * sympy.Max(*sizes)}


def notes(plan: ir.Plan, sh: Shape, split) -> tuple[str, ...]:
    """What the optimizer costs leave out for this plan (per-matrix terms without shapes, mixed owners)."""
    out: list[str] = []
    for g in sh.groups:
        state_bytes(plan, sh, g.name, g.count, out)
        if opt.choice(plan, g.name).locality == opt.SHARDED:
            out.append(f"optimizer[{g.name}]: Dion's own collectives (the reductions of its rank-r factors over the "
                       "shards) are not counted")
    collectives(plan, out)
    update_flops(plan, sh, split, out)
    return tuple(dict.fromkeys(out))
