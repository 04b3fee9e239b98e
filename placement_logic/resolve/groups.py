"""``group NAME { ... }`` in the model block: a parameter group of one's own or a built-in
one restated (its tensor rule, stage, modes and, for an expert group, the roles the mesh
axes play for it: parallel folding), and the property reader the model block shares."""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from .. import ir
from ..diagnostics import Code, did_you_mean
from ..frontend import surface
from ..ir import groups as pg
from .entries import mode
from .values import Values


def props(vals: Values, props, allowed, where) -> Iterator[surface.Prop]:
    seen = set()
    for p in props:
        if p.key not in allowed:
            vals.cx.error(Code.UNKNOWN_PROPERTY, f"'{where}' has no property '{p.key}'", p.span, did_you_mean(p.key, allowed))
            continue
        if p.key in seen:
            vals.cx.error(Code.DUPLICATE_PROPERTY, f"'{p.key}' is given twice in '{where}'", p.span)
            continue
        seen.add(p.key)
        yield p



GROUP_PROPS = ("count", "fraction", "tensor", "sees", "stage", "experts", "like", "placement", "params", "optimizer",
               "grads", "role")
RESTATABLE = ("tensor", "sees", "stage", "placement", "params", "optimizer", "grads", "role")
FOLD_ROLES = ("data", "tensor", "expert")  # what an axis may be for an expert group of its own (folding)
MODE_KEYS = {"params": (ir.State.PARAMS,), "optimizer": (ir.State.OPTIMIZER,), "grads": (ir.State.GRADS,),
             "placement": (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS)}


def group_decl(vals: Values, block: surface.SubBlock) -> ir.GroupDecl | None:
    """``group NAME { ... }``: a parameter group of the user's own, or a built-in one restated."""
    error = vals.cx.error
    name = block.name
    if name == "all":
        error(Code.UNKNOWN_PROPERTY, "'all' names every parameter group; give the group another name", block.span)
        return None
    found: dict[str, object] = {}
    modes: dict[ir.State, dict[str, ir.Mode]] = {}
    roles: dict[str, ir.Role] = {}
    for p in props(vals, block.props, GROUP_PROPS, f"group {name}"):
        if p.key == "role":
            _roles(vals, p, roles)
        elif p.key in MODE_KEYS:
            if not isinstance(p.value, surface.ModeMap):
                error(Code.BAD_PROPERTY_VALUE, f"'{p.key}' takes a mode per axis, e.g. {{dp: R}}", p.span)
                continue
            for e in p.value.entries:
                if e.key not in vals.axes:
                    error(Code.UNDEFINED_AXIS, f"'{e.key}' is not an axis of the mesh", e.span,
                          did_you_mean(e.key, tuple(vals.axes)))
                    continue
                m = mode(e.value, vals)
                if m is None:
                    continue
                if m is ir.Mode.M and p.key != "grads":
                    error(Code.TRANSIENT_PERSISTENT_STATE, f"a group's params and optimizer state persist from one step to the next; "
                          f"M applies to gradients only (group {name}, axis {e.key})", e.span)
                    continue
                for st in MODE_KEYS[p.key]:
                    modes.setdefault(st, {})[e.key] = m
        elif p.key == "tensor":
            found["tensor"] = _member(pg.Holding, vals.word(p.value, (pg.SPLIT, pg.WHOLE), "'tensor'"))
        elif p.key == "sees":
            found["sees"] = _member(pg.Holding, vals.word(p.value, (pg.WHOLE, pg.HEADS), "'sees'"))
        elif p.key == "stage":
            found["stage"] = _member(pg.Stage, vals.word(p.value, (pg.LAYERS, pg.FIRST, pg.LAST), "'stage'"))
        elif p.key == "like":
            found["like"] = _member(pg.GradClass, vals.word(p.value, pg.LIKE, "'like'"))
        elif p.key == "experts":
            found["experts"] = vals.flag_value(p)
        elif p.value is None or isinstance(p.value, (surface.ModeMap, surface.Bool)):
            error(Code.BAD_PROPERTY_VALUE, f"'{p.key}' needs a number", p.span)
        else:
            v = vals.count(p.value, {}, f"'{p.key}'")
            if v is not None:
                found[p.key] = (v, p.span)
    if "count" in found and "fraction" in found:
        error(Code.DUPLICATE_PROPERTY, f"group {name} gives both 'count' and 'fraction'; give one", block.span)
        return None
    count = found.get("count")
    fraction = found.get("fraction")
    if fraction is not None and isinstance(fraction[0], ir.Const) and not 0 < fraction[0].value < 1:
        error(Code.BAD_AXIS_SIZE, f"the fraction of group {name} must lie between 0 and 1", fraction[1])
        return None
    return ir.GroupDecl(
        name, count=count[0] if count else None, fraction=fraction[0] if fraction else None,
        tensor=found.get("tensor"), stage=found.get("stage"), experts=found.get("experts"), like=found.get("like"),
        sees=found.get("sees"), modes=tuple((st, tuple(m.items())) for st, m in modes.items()), roles=tuple(roles.items()),
        span=block.span)


def _member(vocabulary, word: str | None):
    """The member of a vocabulary (a StrEnum) a checked word names, or None."""
    return None if word is None else vocabulary(word)


def _roles(vals: Values, p: surface.Prop, roles: dict[str, ir.Role]) -> None:
    """``role = {axis: data | tensor | expert, ...}``: the role each axis plays for this group."""
    if not isinstance(p.value, surface.ModeMap):
        vals.cx.error(Code.BAD_PROPERTY_VALUE, "'role' takes a role per axis, e.g. {tp: expert}", p.span)
        return
    for e in p.value.entries:
        if e.key not in vals.axes:
            vals.cx.error(Code.UNDEFINED_AXIS, f"'{e.key}' is not an axis of the mesh", e.span, did_you_mean(e.key, tuple(vals.axes)))
        elif e.value.text not in FOLD_ROLES:
            vals.cx.error(Code.UNKNOWN_ROLE, f"'{e.value.text}' is not a role an axis may play for a parameter group",
                          e.value.span, did_you_mean(e.value.text, FOLD_ROLES) or (f"roles: {', '.join(FOLD_ROLES)}",))
        else:
            roles[e.key] = ir.Role(e.value.text)


def check_groups(vals: Values, model: ir.Model) -> None:
    """A declaration naming one of the model's own groups restates it (tensor rule, stage,
    modes); any other needs a size; the built-in names a model lacks are reserved."""
    builtin = pg.param_groups(replace(model, groups=()))
    present = [g.name for g in builtin]
    for d in model.groups:
        tensor = d.tensor or next((g.tensor for g in builtin if g.name == d.name), pg.SPLIT)
        if d.sees == pg.HEADS and tensor != pg.WHOLE:
            vals.cx.error(Code.SEES_HEADS_SPLIT, f"group {d.name} sees head-split activations (sees = heads) but is split over the "
                          f"tensor axes (tensor = {tensor}): only a weight kept whole on every tensor rank has a partial "
                          "gradient there; say tensor = whole", d.span)
        expert = d.experts or any(g.name == d.name and g.expert for g in builtin)
        if d.roles and not expert and (d.name in present or d.name not in pg.BUILTIN):
            vals.cx.error(Code.IMPOSSIBLE_FOLD, f"group {d.name} is not divided over expert axes: only an expert group may "
                          "take roles of its own (parallel folding)", d.span,
                          ("the dense parameters follow the plan's roles",))
        if d.name in present:
            extra = [k for k, v in (("count", d.count), ("fraction", d.fraction), ("experts", d.experts),
                                    ("like", d.like)) if v is not None]
            if extra:
                vals.cx.error(Code.UNKNOWN_PROPERTY, f"'{d.name}' is a built-in parameter group of this model: its "
                              f"{', '.join(extra)} come from the model; a restatement may give "
                              f"{', '.join(RESTATABLE)}", d.span)
        elif d.name in pg.BUILTIN or d.name in pg.CLASSES:
            vals.cx.error(Code.UNKNOWN_PROPERTY, f"this model has no '{d.name}' parameter group to restate, and the name is "
                          "reserved", d.span, (f"its groups: {', '.join(present)}",))
        elif d.count is None and d.fraction is None:
            vals.cx.error(Code.MISSING_SECTION, f"group {d.name} needs 'count' (parameters) or 'fraction' (of Ψ)", d.span)
