"""The model's ``losses { ... }`` section (``ir.losses``): the built-in terms, terms of the user's own, the aux
term's statistics scope and the cross entropy's own extra terms."""

from __future__ import annotations

from ..diagnostics import Code
from ..frontend import surface
from ..ir import losses as ir_losses
from ..ir.groups import BUILTIN as BUILTIN_GROUPS
from .groups import props
from .values import Values

MAX_NAMED_TERMS = 64


def losses_section(vals: Values, block: surface.SubBlock, fields: dict) -> None:
    """``losses { aux = per_microbatch_mean  mtp = global_mean }``: the loss terms besides the
    main loss, each with the normalisation its objective states (``ir.losses``)."""
    terms = []
    ce = []
    keys = tuple(ir_losses.TERMS) + (ir_losses.STATS_KEY, ir_losses.PACKED_KEY) + tuple(ir_losses.CE_TERMS)
    named: dict[str, None] = {}  # terms of the user's own; a flag (true/false) under another name is a misspelt key
    for p in block.props:
        if p.key not in keys and not isinstance(p.value, surface.Bool) and p.key not in named:
            if len(named) == MAX_NAMED_TERMS:  # each term is an objective of its own, checked per parameter group
                vals.cx.error(Code.BAD_PROPERTY_VALUE, f"loss term '{p.key}' is one more than the {MAX_NAMED_TERMS} "
                              "terms of the user's own a losses section may declare", p.span)
                fields["loss_terms"], fields["ce_terms"] = (), ()
                return
            named[p.key] = None
    for p in props(vals, block.props, keys + tuple(named), "losses"):
        if p.key == ir_losses.PACKED_KEY:  # the rows pack documents of free lengths (check.auxpacked)
            if vals.flag_value(p):
                fields["aux_packed"] = p.span
            continue
        if p.key in ir_losses.CE_TERMS:  # the cross entropy's label smoothing or output z-loss (check.actflow_loss)
            if vals.flag_value(p):
                ce.append((p.key, p.span))
            continue
        if p.key == ir_losses.STATS_KEY:  # the aux term's statistics scope (check.auxstats)
            w = vals.word(p.value, ir_losses.STATS_OBJECTIVES, "the scope of the aux term's routing statistics")
            if w:
                fields["aux_stats"] = (w, p.span)
            continue
        w = vals.word(p.value, ir_losses.OBJECTIVES, f"the normalisation of loss term '{p.key}'")
        if w and not _term_name_ok(vals, p.key, w, p.span):
            continue
        if w:
            terms.append((p.key, w, p.span))
            vals.loss_terms[p.key] = w
    fields["loss_terms"] = tuple(terms)
    fields["ce_terms"] = tuple(ce)
    if "aux_stats" in fields and not any(t in ir_losses.STATS_TERMS for t, _, _ in terms):
        vals.cx.error(Code.STATS_SCOPE_TERM, f"'{ir_losses.STATS_KEY}' states the scope of the routing statistics of a "
                      "term the losses section does not declare", fields["aux_stats"][1],
                      ("declare the load-balancing term with it: losses { aux = global_mean  aux_stats = global_batch }",))


    if "aux_packed" in fields and "aux_stats" not in fields:
        vals.cx.error(Code.PACKED_WITHOUT_STATS, f"'{ir_losses.PACKED_KEY}' states that the rows pack documents for the aux "
                      "term's per-sequence statistics, but the losses section states no aux_stats", fields["aux_packed"],
                      ("state the statistics' scope: losses { aux = per_microbatch_mean  aux_stats = per_sequence  "
                       "aux_packed = true }",))


def _term_name_ok(vals: Values, name: str, objective: str, span) -> bool:
    """A term of the user's own needs a name that is not a reserved word or a parameter group's; the router's
    terms (computed from routing statistics) take no per-sequence normalisation (PL289)."""
    clash = name in ir_losses.RESERVED_WORDS or (name not in ir_losses.TERMS and name in BUILTIN_GROUPS)
    if clash:
        vals.cx.error(Code.LOSS_TERM_NAME, f"loss term '{name}' clashes with a reserved word or a parameter group's name",
                      span, (f"name the term otherwise, e.g. {name}_loss = {objective}",))
        return False
    if name in ir_losses.ROUTER_TERMS and objective in ir_losses.SEQUENCE_OBJECTIVES:
        vals.cx.error(Code.LOSS_TERM_NAME, f"loss term '{name}' cannot take {objective}: it is computed from the "
                      "router's statistics, not as a value per sequence", span,
                      ("the scope of its statistics is losses { aux_stats = per_sequence }",))
        return False
    return True
