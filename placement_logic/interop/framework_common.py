"""What the framework configurations share: diagnostics, the spec text they produce (mesh,
plan and imports), precision and the placement options a framework sets
(``interop.frameworks``, ``interop.torchtitan``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir import views
from ..ir.walker import fold


def _err(file: str, message: str, notes: tuple[str, ...] = ()) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.BAD_FRAMEWORK_CONFIG, message, Span.point(file, 1, 1), notes=notes)])


def _mesh_and_plan(axes: list[tuple[str, int, str]], plan: str, extra: list[str],
                   products: tuple[tuple[str, ...], ...] = (), links: dict[str, str] | None = None) -> str:
    """The mesh (each axis with its link class in ``links``) and the plan binding each axis;
    the axes of each of ``products`` (those of them in the mesh) bound together as one group,
    ``[a, b]: strategy``."""
    links = links or {}
    used = [(n, s, b) for n, s, b in axes if s > 1] or [axes[0]]
    mesh = "mesh {\n" + "".join(_axis_line(n, s, links) for n, s, _ in used) + "}\n"
    names = [n for n, _, _ in used]
    lines = []
    for n, _, b in used:
        group = next(([a for a in names if a in g] for g in products if n in g), [n])
        if n == group[0]:
            lines.append(f"  {group[0] if len(group) == 1 else '[' + ', '.join(group) + ']'}: {b}\n")
    body = "".join(lines) + "".join(f"  {line}\n" for line in extra)
    return mesh + f"\nplan {plan} {{\n{body}}}\n"


def _axis_line(name: str, size: int, links: dict[str, str]) -> str:
    return f"  {name} = {size}" + (f" @ {links[name]}" if name in links else "") + "\n"


# --------------------------------------------------------------------------- what an import assumed

DEFAULT_PER_NODE = 8  # devices per node when nothing says: an 8-GPU node (DGX/HGX H100, A100)


@dataclass
class ImportReport:
    """What an import assumed (printed always) and the keys it read and dropped (``--verbose``;
    the dropped ones each with why)."""

    assumed: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)

    def comments(self) -> str:
        return "".join(f"# assumed: {a}\n" for a in self.assumed)


def node_links(inner_first: list[tuple[str, int]], per_node: int) -> dict[str, str]:
    """The link class of each axis (of more than one device) from the framework's rank order,
    ``inner_first`` (consecutive ranks on the first axis): an axis whose groups lie inside one
    node (the product of its size and the sizes of the axes inside it divides the devices per
    node) is ``intra_node``, every other ``inter_node``."""
    links, n = {}, 1
    for name, size in inner_first:
        if size <= 1:
            continue
        n *= size
        links[name] = "intra_node" if per_node % n == 0 else "inter_node"
    return links


def links_assumption(links: dict[str, str], per_node: int, source: str, order: str) -> list[str]:
    """The assumption lines of ``node_links``: devices per node (and where the figure came
    from), then which axes are inside a node and which across."""
    inside = [a for a, k in links.items() if k == "intra_node"]
    across = [a for a, k in links.items() if k == "inter_node"]
    parts = ([f"{', '.join(inside)} inside a node (intra_node)"] if inside else []) + \
        ([f"{', '.join(across)} across nodes (inter_node)"] if across else [])
    return [f"{per_node} devices per node ({source})",
            "links: " + ("; ".join(parts) or "no axis of more than one device") + f" (ranks {order})"]


def per_node_source(option: int | None, stated: int | None, what: str) -> tuple[int, str]:
    """Devices per node and where the figure came from: ``--gpus-per-node``, else the
    configuration's own statement (``what``), else the default of 8."""
    if option is not None:
        extra = f", over {what} {stated}" if stated is not None and stated != option else ""
        return option, f"--gpus-per-node{extra}"
    if stated is not None:
        return stated, what
    return DEFAULT_PER_NODE, f"the default: neither --gpus-per-node nor {what} says"


def leaf_keys(doc: Any, prefix: tuple[str, ...] = ()) -> list[str]:
    """The dotted keys of a JSON/TOML document's values (a table's keys recursively; a list or
    an empty table is one value)."""
    if isinstance(doc, dict) and doc:
        return [k for key, v in doc.items() for k in leaf_keys(v, prefix + (str(key),))]
    return [".".join(prefix)] if prefix else []


def dropped_keys(doc: Any, used: list[str], reasons: dict[str, str], default: str) -> list[tuple[str, str]]:
    """Every key of ``doc`` the reader did not read (nor a table above it), with why: the
    reason of its longest dotted prefix in ``reasons``, else ``default``."""
    read = set(used)
    out = []
    for key in leaf_keys(doc):
        parts = key.split(".")
        if any(".".join(parts[:i]) in read for i in range(1, len(parts) + 1)):
            continue
        why = next((reasons[".".join(parts[:i])] for i in range(len(parts), 0, -1)
                    if ".".join(parts[:i]) in reasons), default)
        out.append((key, why))
    return out


def near_misses(doc: Any, used: list[str], reasons: dict[str, str], text: str, file: str,
                asked: set[str] = frozenset()) -> None:
    """A key of ``doc`` the reader does not know that is a letter or two from one it does (a key it
    reads, or one whose dropping it explains): a PL141 at the key with the suggestion, where a
    typo would otherwise be dropped in silence (``zero_optimisation``, ``stgae``)."""
    import difflib

    from ..diagnostics import DiagnosticError
    from ..frontend.configs import Table

    known = {k.split(".")[-1] for k in list(used) + list(reasons)} | set(asked)
    for key in leaf_keys(doc):
        parts = key.split(".")
        for i, part in enumerate(parts):
            if part in known:
                continue
            close = difflib.get_close_matches(part, sorted(known), n=1, cutoff=0.85) or [
                k for k in sorted(known) if len(k) > 3 and sorted(k) == sorted(part)][:1]  # letters swapped
            if close:
                table = Table({}, text, file, Code.BAD_FRAMEWORK_CONFIG, tuple(parts[:i]))
                raise DiagnosticError(table.error(part, f"unknown key {'.'.join(parts[:i + 1])}",
                                                  (f"did you mean {close[0]}?",)).diagnostics, {file: text})
            break


def _imports(text: str) -> str:
    names = {"ddp": "data", "zero1": "data", "zero2": "data", "zero3": "data", "zero_offload": "offload",
             "zero_infinity": "offload", "megatron_tp": "tensor", "megatron_sp": "tensor",
             "one_f_one_b": "pipeline", "interleaved_1f1b": "pipeline", "context_parallel": "context",
             "expert_parallel": "expert", "selective_recompute": "recompute", "full_recompute": "recompute"}
    mods: dict[str, list[str]] = {}
    for name, mod in names.items():
        if f": {name}" in text or f"use {name}" in text:
            mods.setdefault(mod, []).append(name)
    return "".join(f"from std.{m} import {', '.join(sorted(ns))}\n" for m, ns in sorted(mods.items()))


# --------------------------------------------------------------------------- DeepSpeed


def _widths(half: bool, grads: int = 2) -> str:
    """The model's byte widths: 16-bit weights (gradients of ``grads`` bytes, a 12-byte Adam
    state with its fp32 master copy), or fp32 throughout."""
    if half:
        return f"params = 2\n    grads = {grads}\n    optimizer = 12\n    activations = 2"
    return "params = 4\n    grads = 4\n    optimizer = 8\n    activations = 4"


def _precision(spec: ir.Spec, model: ir.Model, half_grads: int, what: str, problems: list[str]) -> bool | None:
    """True for the 16-bit widths ``_widths(True, half_grads)``, False for fp32; otherwise a problem."""
    got = tuple(_number(v, spec) for v in (model.bytes_params, model.bytes_grads, model.bytes_optimizer,
                                           model.bytes_activations))
    if got == (2, half_grads, 12, 2):
        return True
    if got == (4, 4, 8, 4):
        return False
    shown = ", ".join("?" if v is None else str(v) for v in got)
    problems.append(f"bytes (params, grads, optimizer, activations) = ({shown}): {what} has 16-bit weights with "
                    f"{half_grads}-byte gradients and a 12-byte Adam state (2, {half_grads}, 12, 2), or fp32 "
                    "(4, 4, 8, 4)")
    return None


def _placement_options(plan: ir.Plan, state: ir.State, unit: str, reshard: bool | None, framework: str,
                       problems: list[str]) -> None:
    """An S* state's reconstruction unit, prefetch depth and resharding, as ``framework`` gathers."""
    pl = plan.placement(state)
    if not any(m is ir.Mode.S_STAR for _, m in pl.modes):
        return
    got = [f"unit = {pl.unit}" if pl.unit not in ("layer", "block") else "", f"prefetch = {pl.prefetch}" if pl.prefetch != 1 else "",
           f"reshard_after_forward = {str(pl.reshard_after_forward).lower()}"
           if reshard is not None and pl.reshard_after_forward is not reshard else ""]
    got = [g for g in got if g]
    if got:
        problems.append(f"{state.value} S* ({', '.join(got)}): {framework} gathers one layer at a time"
                        + (" and frees it after forward" if reshard else ""))


def _number(v: ir.Value | None, spec: ir.Spec) -> Fraction | None:
    return fold(v, dict(spec.bindings))


# the placements (params, optimizer, grads, activations) Megatron-LM gives each role; data: DDP or the
# distributed optimizer
_R, _S = ir.Mode.R, ir.Mode.S
_MEGATRON_MODES = {ir.Role.TENSOR: ((_S, _S, _S, _S),), ir.Role.SEQUENCE: ((_S, _S, _S, _S),),
                   ir.Role.PIPELINE: ((_S, _S, _S, _S),), ir.Role.CONTEXT: ((_R, _R, _R, _S),),
                   ir.Role.EXPERT: ((_S, _S, _S, _R),), ir.Role.DATA: ((_R, _R, _R, _R), (_R, _S, _R, _R))}


def _modes(plan: ir.Plan, a: str) -> tuple[ir.Mode, ...]:
    return tuple(plan.placement(s).mode(a) for s in ir.STATES)


def _role_problems(plan: ir.Plan, axes: list[str], allowed: dict, framework: str, problems: list[str]) -> None:
    for a in axes:
        got = _modes(plan, a)
        role = views.view(plan).role(a)
        if role not in allowed:
            why = {ir.Role.EXPERT: f"{framework} borrows its expert devices from the data-shard and context devices "
                                   "(parallel folding); an expert axis of its own has no degree there"}
            problems.append(f"{a} ({role.value}): " + why.get(role, f"{framework} has no {role.value} parallelism"))
        elif got not in allowed[role]:
            want = " or ".join("(" + ", ".join(m.value for m in w) + ")" for w in allowed[role])
            problems.append(f"params, optimizer, grads, activations ({', '.join(m.value for m in got)}) over {a}: "
                            f"{framework}'s {role.value} parallelism places them {want}")
        for s in ir.STATES:
            if plan.placement(s).mode(a) is not ir.Mode.S_STAR and plan.placement(s).offloaded:
                problems.append(f"{s.value} offloaded to {plan.placement(s).residency.value}: not exported ("
                                f"{framework}'s configuration has no offload of this kind that the plan models)")
                break


# --------------------------------------------------------------------------- MoE parallel folding


def fold_axes(dense: list[tuple[str, int]], expert: list[tuple[str, int]]) -> list[tuple[str, int, str, str]] | None:
    """Mesh axes for two groupings of the same devices (MoE parallel folding).

    ``dense`` and ``expert`` list (name, size) factors from the innermost (consecutive ranks)
    outwards, each multiplying to the same count. The rank boundaries of both (the running
    products) cut the devices into whole mesh axes when they nest (each divides the next);
    each axis lies in one dense and one expert factor. Returns (axis, size, dense factor,
    expert factor) from the innermost axis outwards, or None when the boundaries do not nest
    (an expert group that cuts across a dense factor without containing it)."""

    def cuts(factors: list[tuple[str, int]]) -> list[int]:
        out, n = [], 1
        for _, s in factors:
            n *= s
            out.append(n)
        return out

    bounds = sorted(set(cuts(dense)) | set(cuts(expert)) | {1})
    if any(b % a for a, b in zip(bounds, bounds[1:])):
        return None

    def owner(factors: list[tuple[str, int]], b: int) -> str:
        return next(name for (name, _), c in zip(factors, cuts(factors)) if b <= c)

    pieces = [(b // a, owner(dense, b), owner(expert, b)) for a, b in zip(bounds, bounds[1:])]
    split = {d for _, d, _ in pieces if sum(1 for _, d2, _ in pieces if d2 == d) > 1}
    return [(f"{d}_{e}" if d in split else d, s, d, e) for s, d, e in pieces]
