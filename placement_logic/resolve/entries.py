"""Entries shared by strategy and plan bodies: placement entries, options, settings and
overrides -> modes per state per axis, placement options, settings and ``ir.Override``.

``placement_entry`` fills the ``modes`` and ``options`` tables of whatever is being built
(a strategy over its formal axes, a plan over the mesh axes); ``setting`` fills a settings
table (recompute, flash attention, sequence parallelism, a pipeline schedule).
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..diagnostics import Code, Span, did_you_mean
from ..frontend import surface
from ..frontend.canonical import expr as surface_text
from ..ir import actflow, unequal
from ..ir import losses as ir_losses
from ..ir.groups import BUILTIN as BUILTIN_GROUPS
from ..ir.overrides import HEAD_GROUPS, LAYOUT_ITEMS, TAKES_RANKS, TAKES_SETS, TAKES_SIZES, OverrideTarget, OverrideVerb
from . import ranksets as rank_sets
from .override_verbs import bad_verb
from .shapes import number
from .values import STATE_NAMES, Values

MODE_NAMES = ("R", "S", "S*", "M", "O")
UNITS_OF_RECONSTRUCTION = ("layer", "block", "chunk", "stage", "model")
SCHEDULES = {"gpipe": ir.ScheduleKind.GPIPE, "one_f_one_b": ir.ScheduleKind.ONE_F_ONE_B,
             "interleaved": ir.ScheduleKind.INTERLEAVED, "zeropp": ir.ScheduleKind.ZEROPP}
SCHEDULE_ARGS = {"gpipe": (), "one_f_one_b": (), "interleaved": ("v",), "zeropp": ("v", "U")}
OPTION_NAMES = ("unit", "prefetch", "reshard_after_forward", "residency")

Modes = dict[ir.State, dict[str, ir.Mode]]
Options = dict[ir.State, dict[str, object]]


# targets a user may reach for that the step semantics leaves out: a located PL129, never a no-op
NOT_MODELLED = {
    "process_group": "every reduction is over whole mesh axes or over groups over part of an axis: blocks of B "
                     "consecutive ranks, strided groups of stride S, the first K ranks only (override grads[g] / "
                     "clip_norm: reduce_blocks / reduce_strided / reduce_first over (AXES) by E), consecutive groups "
                     "of unequal sizes (reduce_groups over (AXIS) by (S1, S2, ...)), the groups of a list of rank sets "
                     "(reduce_sets over (AXIS) ranks ([R, ...], ...)), or of the flattened ranks of several axes "
                     "(reduce_sets over (A, B) ranks ([R, ...], ...)); any other group across two axes' ranks is out "
                     "of scope",
    "rank": "every device of an axis runs the same step; of the operations on some of its ranks only these are "
            "modelled: a group's part of the grad norm on rank 0 or on any set of ranks of one axis or of the group "
            "over several (override clip_norm[g]: rank0_only over (AXES), count_on_ranks over (AXES) ranks (R1, ...)), "
            "its clip coefficient or a divisor on rank 0 (override grads[g]: clip_rank0_only / divide_rank0_only over "
            "(AXES)), a divisor on the last rank or every rank but it (override grads[g]: divide_last_only / "
            "divide_except_last over (AXES) by X), and a clip or a divisor on any set of one axis's ranks (override "
            "grads[g]: clip_on_ranks / divide_on_ranks over (AXIS) ranks (R1, ...)); a loss term or the norm's epsilon "
            "on a set of ranks (override loss[T]: on_ranks / divide_on_ranks, clip_norm: eps_on_ranks ... ranks (...))",
    "one_rank": "every device of an axis runs the same step; of the operations on some of its ranks only these are "
                "modelled: a group's part of the grad norm on rank 0 or on any set of ranks of one axis or of the "
                "group over several (override clip_norm[g]: rank0_only over (AXES), count_on_ranks over (AXES) ranks "
                "(R1, ...)), its clip coefficient or a divisor on rank 0 (override grads[g]: clip_rank0_only / divide_rank0_only "
                "over (AXES)), a divisor on the last rank or every rank but it (override grads[g]: "
                "divide_last_only / divide_except_last over (AXES) by X), and a clip or a divisor on any set of one "
                "axis's ranks (override grads[g]: clip_on_ranks / divide_on_ranks over (AXIS) ranks (R1, ...)); a "
                "loss term or the norm's epsilon on a set of ranks (loss[T]: on_ranks / divide_on_ranks, clip_norm: "
                "eps_on_ranks)",
    "expert_tensor": "an expert tensor size of its own is the expert group's roles, not an override: "
                     "group experts { role = {AXIS: tensor} } (docs/costs.md, 'Parallel folding')",
    "expert_data": "an expert-data group of its own is the expert group's roles, not an override: "
                   "group experts { role = {AXIS: data} } (docs/costs.md, 'Parallel folding')",
}


def mode(ref: surface.ModeRef, vals: Values) -> ir.Mode | None:
    text = ref.text
    if text in MODE_NAMES:
        return ir.Mode(text)
    vals.cx.error(Code.UNKNOWN_MODE, f"unknown mode '{text}'", ref.span,
                  did_you_mean(text, MODE_NAMES) or ("modes are R, S, S*, M and O",))
    return None


def placement_entry(vals: Values, modes: Modes, options: Options, item: surface.Entry, axes,
                    env: dict[str, ir.Value], formal: bool) -> None:
    """Apply ``state: mode`` or ``state: {axis: mode, ...}`` with its options.

    ``formal``: the axes are a strategy's formal axes (each needs a mode), not mesh axes.
    """
    error = vals.cx.error
    state = ir.State(item.lhs[0])
    rhs = item.rhs
    if isinstance(rhs, surface.StrategyRef):
        if len(rhs.path) == 1 and not rhs.args:
            rhs = surface.ModeRef(rhs.path[0], False, rhs.span)
        else:
            error(Code.UNKNOWN_MODE, f"unknown mode '{rhs.dotted}'", rhs.span, ("modes are R, S, S*, M and O",))
            return
    if isinstance(rhs, surface.ModeRef):
        m = mode(rhs, vals)
        if m is None:
            return
        new = {a: m for a in axes}
    else:
        new = {}
        for entry in rhs.entries:
            if entry.key not in axes:
                what = "formal axes" if formal else "mesh axes"
                error(Code.UNDEFINED_AXIS, f"'{entry.key}' is not one of the {what} ({', '.join(axes)})",
                      entry.span, did_you_mean(entry.key, axes))
                continue
            if entry.key in new:
                error(Code.DUPLICATE_AXIS, f"axis '{entry.key}' appears twice in this placement", entry.span)
                continue
            m = mode(entry.value, vals)
            if m is not None:
                new[entry.key] = m
        if formal:
            missing = [a for a in axes if a not in new]
            if missing and not modes.get(state):
                error(Code.MISSING_STATE, f"the placement of {state.value} leaves {', '.join(missing)} without a mode",
                      rhs.span)
                return
    modes[state] = {**modes.get(state, {}), **new}
    opts = options.setdefault(state, {})
    if ir.Mode.O in new.values():
        opts.setdefault("residency", ir.Residency.HOST)
    _options(vals, opts, item.options, set(modes[state].values()), env)


def _options(vals: Values, opts: dict[str, object], kwargs, modes_used, env) -> None:
    error = vals.cx.error
    seen = set()
    for kw in kwargs:
        if kw.name not in OPTION_NAMES:
            error(Code.UNKNOWN_PROPERTY, f"a placement has no option '{kw.name}'", kw.span,
                  did_you_mean(kw.name, OPTION_NAMES))
            continue
        if kw.name in seen:
            error(Code.DUPLICATE_PROPERTY, f"option '{kw.name}' is given twice", kw.span)
            continue
        seen.add(kw.name)
        if kw.name in ("unit", "prefetch", "reshard_after_forward") and ir.Mode.S_STAR not in modes_used:
            error(Code.MODE_OPTION, f"'{kw.name}' applies to a sharded-with-gather (S*) state only", kw.span)
            continue
        if kw.name == "unit":
            w = vals.word(kw.value, UNITS_OF_RECONSTRUCTION, "the reconstruction unit")
            if w:
                opts["unit"] = w
        elif kw.name == "residency":
            w = vals.word(kw.value, tuple(r.value for r in ir.Residency), "residency")
            if w:
                opts["residency"] = ir.Residency(w)
        elif kw.name == "reshard_after_forward":
            if isinstance(kw.value, surface.Bool):
                opts["reshard_after_forward"] = kw.value.value
            else:
                error(Code.BAD_PROPERTY_VALUE, "'reshard_after_forward' is true or false", kw.value.span)
        else:
            v = vals.count(kw.value, env, "prefetch")
            if v is None:
                continue
            if not (isinstance(v, ir.Const) and v.value.denominator == 1 and v.value >= 1):
                error(Code.BAD_PROPERTY_VALUE, "prefetch depth must be a whole number of at least 1", kw.value.span)
                continue
            opts["prefetch"] = int(v.value)


def setting(vals: Values, settings: dict[str, object], prop: surface.Prop, env: dict[str, ir.Value],
            allowed: tuple[str, ...], where: str) -> None:
    """Record a flag, ``recompute`` or ``schedule`` setting that ``where`` (a strategy, a plan)
    accepts; a strategy's ``role`` is handled by the strategy itself."""
    key = prop.key
    if key not in allowed:
        vals.cx.error(Code.UNKNOWN_PROPERTY, f"{where} has no setting '{key}'", prop.span,
                      did_you_mean(key, allowed + STATE_NAMES))
        return
    value = prop.value
    if key in ("flash_attention", "sequence_parallel"):
        b = vals.flag_value(prop)
        if b is not None:
            settings[key] = b
    elif key == "recompute":
        w = vals.word(value, tuple(r.value for r in ir.Recompute), "'recompute'")
        if w:
            settings[key] = ir.Recompute(w)
    elif key == "schedule":
        sched = _schedule(vals, value, env, prop.span)
        if sched is not None:
            settings[key] = sched


def _schedule(vals: Values, value, env, span: Span) -> tuple | None:
    error = vals.cx.error
    if isinstance(value, surface.Name):
        name, kwargs = value.id, ()
    elif isinstance(value, surface.Call) and not value.args:
        name, kwargs = value.func, value.kwargs
    else:
        error(Code.BAD_PROPERTY_VALUE, "a schedule is gpipe, one_f_one_b, interleaved(v = ...) or zeropp(v = ..., U = ...)",
              getattr(value, "span", span))
        return None
    if name not in SCHEDULES:
        error(Code.BAD_PROPERTY_VALUE, f"unknown schedule '{name}'", getattr(value, "span", span),
              did_you_mean(name, SCHEDULES))
        return None
    args = {"v": ir.const(1), "U": ir.const(1)}
    for kw in kwargs:
        if kw.name not in SCHEDULE_ARGS[name]:
            error(Code.BAD_ARGUMENTS, f"schedule '{name}' takes no argument '{kw.name}'", kw.span)
            return None
        v = vals.count(kw.value, env, f"'{kw.name}'")
        if v is None:
            return None
        n = number(v, vals)
        if n is not None and (n.denominator != 1 or n < 1):
            shown = str(n.numerator) if n.denominator == 1 else f"{float(n):g}"
            what = "model chunks per pipeline rank" if kw.name == "v" else "the scheduling unit"
            written = getattr(v, "span", None)  # where the number was written (a strategy's argument)
            error(Code.BAD_PROPERTY_VALUE, f"schedule '{name}': {kw.name} ({what}) must be a positive integer, not {shown}",
                  written if written is not None and written.line else getattr(kw.value, "span", kw.span))
            return None
        args[kw.name] = v
    return (SCHEDULES[name], args["v"], args["U"])


def override(vals: Values, o: surface.OverrideStmt, env: dict[str, ir.Value],
             axes_allowed: set[str]) -> ir.Override | None:
    if _bad_target(vals, o):
        return None
    if o.target in (OverrideTarget.LOSS, OverrideTarget.TOKENS) and o.group is not None:
        return _term_override(vals, o, env, axes_allowed)
    verbs = ir.OVERRIDE_VERBS.get(o.target)
    if bad_verb(vals, o, verbs) or _bad_group(vals, o) or _bad_clauses(vals, o, verbs[o.verb]):
        return None
    out = _axes_and_divisor(vals, o, env, axes_allowed)
    if out is not None and o.sizes is not None:
        return _group_sizes(vals, o, out, env)
    if out is not None and o.sets is not None:
        return rank_sets.rank_sets(vals, o, out, env)
    if out is None or o.ranks is None:
        return out
    ranks = tuple(vals.count(r, env, "a rank") for r in o.ranks)
    if any(r is None for r in ranks) or not _ranks_in_range(vals, out, ranks):
        return None
    return replace(out, ranks=ranks)


def _bad_target(vals: Values, o: surface.OverrideStmt) -> bool:
    """An error where the target is one the step semantics leaves out, or a loss term written as a target of its own."""
    error = vals.cx.error
    if o.target in NOT_MODELLED:
        error(Code.NOT_MODELLED, f"'{o.target}' is not modelled by the checker: {NOT_MODELLED[o.target]}", o.span,
              ("docs/checker.md, 'Out of scope', lists what the step semantics leaves out",))
        return True
    if o.target in TERM_ALIASES:
        error(Code.UNDECLARED_LOSS_TERM, f"a loss term is not a target of its own: write override loss[{TERM_ALIASES[o.target]}]: ... "
              f"with '{TERM_ALIASES[o.target]}' in the model's losses section", o.span,
              (f"e.g. model {{ losses {{ {TERM_ALIASES[o.target]} = per_microbatch_mean }} }}",))
        return True
    return False


def _bad_group(vals: Values, o: surface.OverrideStmt) -> bool:
    """An error where the override names a group its target does not have: a parameter group, a layer region, a
    per-token tensor or a pair of Ulysses' all-to-alls."""
    known = ir.PARAM_GROUPS + tuple(sorted(vals.groups))
    if o.target == OverrideTarget.OPTIMIZER:  # an optimizer section names the model's parameter groups (ir.groups)
        known = known + tuple(g for g in BUILTIN_GROUPS if g not in known) + ("matrices",)
    elif o.target in actflow.TARGETS:  # a layer region, not a parameter group
        known = actflow.REGIONS
    elif o.target == OverrideTarget.LAYOUT:  # a per-token tensor of context parallelism (check.encode_cplayout)
        known = LAYOUT_ITEMS
    elif o.target == OverrideTarget.HEADS:  # a pair of Ulysses' all-to-alls, or the kv heads (check.encode_ulysses_heads)
        known = HEAD_GROUPS
    if o.group is None or o.group in known:
        return False
    kind = ("layer region" if o.target in actflow.TARGETS else
            "per-token tensor" if o.target == OverrideTarget.LAYOUT else
            "all-to-all pair" if o.target == OverrideTarget.HEADS else "parameter group")
    vals.cx.error(Code.BAD_OVERRIDE, f"unknown {kind} '{o.group}'", o.span,
                  did_you_mean(o.group, known) or (f"groups an override may name: {', '.join(known)}",))
    return True


def _bad_clauses(vals: Values, o: surface.OverrideStmt, takes: tuple[bool, bool]) -> bool:
    """An error where the verb's clauses are missing or not its own: over, rank sets, sizes, by, ranks."""
    error = vals.cx.error
    takes_over, takes_by = takes
    if takes_over != (o.axes is not None):
        error(Code.BAD_OVERRIDE, f"'{o.target}: {o.verb}' " + ("needs 'over (axes...)'" if takes_over
                                                              else "takes no 'over' clause"), o.span)
        return True
    if not rank_sets.check_clause(vals, o, (o.target, o.verb) in TAKES_SETS):
        return True
    takes_sizes = (o.target, o.verb) in TAKES_SIZES
    if o.sizes is not None and not takes_sizes:
        error(Code.GROUPS_AXIS, f"'{o.target}: {o.verb}' takes no list of sizes 'by (S1, S2, ...)' (the sizes of "
              "consecutive groups are reduce_groups's)", o.span)
        return True
    if takes_sizes and o.sizes is None:
        error(Code.BAD_OVERRIDE, f"'{o.target}: {o.verb}' needs 'by (S1, S2, ...)': the sizes of two or more consecutive groups "
              "of ranks the axis is cut into", o.span)
        return True
    if takes_by != (o.by is not None):
        need = f"needs 'by <{'epsilon' if o.verb in EPSILONS else 'divisor'}>'"
        error(Code.BAD_OVERRIDE, f"'{o.target}: {o.verb}' " + (need if takes_by else "takes no 'by' clause"), o.span)
        return True
    takes_ranks = (o.target, o.verb) in TAKES_RANKS
    if takes_ranks != (o.ranks is not None):
        error(Code.BAD_OVERRIDE, f"'{o.target}: {o.verb}' " + ("needs 'ranks (R1, R2, ...)': the ranks of the axis it is "
              "applied on" if takes_ranks else "takes no 'ranks' clause"), o.span)
        return True
    return False


def _group_sizes(vals: Values, o: surface.OverrideStmt, out: ir.Override, env: dict) -> ir.Override | None:
    """``reduce_groups ... by (S1, ...)``: one axis (PL251), each size a positive whole number and their sum the
    axis's size where the file gives it (PL250)."""
    head = f"override {o.target}{f'[{o.group}]' if o.group else ''}: {o.verb} over ({', '.join(o.axes or ())}) by (" \
        + ", ".join(map(surface_text, o.sizes)) + ")"
    if len(o.axes or ()) != 1:
        vals.cx.error(Code.GROUPS_AXIS, f"{head}: a list of group sizes cuts one axis; name one", o.span)
        return None
    sizes = tuple(vals.count(s, env, "a group's size") for s in o.sizes)
    if any(s is None for s in sizes):
        return None
    values = tuple(number(s, vals) for s in sizes)
    why = unequal.problem(head, sizes, values, o.axes[0], number(ir.Sym(o.axes[0]), vals))
    if why is not None:
        vals.cx.error(Code.GROUP_SIZES, why, o.span)
        return None
    return replace(out, sizes=tuple(ir.const(v) for v in values))  # each a whole number (``problem``)


def _ranks_in_range(vals: Values, o: ir.Override, ranks: tuple[ir.Value, ...]) -> bool:
    """PL191 where a rank of a one-axis rank set is a number (with the file's sizes and lets) that is not a
    whole number from 0 to the axis's size minus 1; a set over several axes is checked by check.rankset (the
    group's size the product of theirs)."""
    if len(o.axes or ()) != 1:
        return True
    axis = o.axes[0]
    n = number(ir.Sym(axis), vals)
    for r in ranks:
        v = number(r, vals)
        if v is not None and (v.denominator != 1 or v < 0 or (n is not None and v >= n)):
            text = ir.show(r)  # a folded expression with its value; a literal (``-1``) once
            shown = f"{text} = {v}" if text != str(v) else text
            size = f" of {n} ranks" if n is not None else ""
            vals.cx.error(Code.RANK_OUT_OF_RANGE, f"override {o.target}{f'[{o.group}]' if o.group else ''}: "
                          f"{o.verb} over ({axis}): rank {shown} is not a rank of {axis}{size} (its ranks are 0 .. "
                          f"{axis} - 1)", o.span)
            return False
    return True


def _axes_and_divisor(vals: Values, o: surface.OverrideStmt, env: dict[str, ir.Value],
                      axes_allowed: set[str]) -> ir.Override | None:
    """The override with its axes (each one of ``axes_allowed``) and its divisor (a count, not
    zero) checked; None after reporting an error."""
    error = vals.cx.error
    for a in o.axes or ():
        if a not in axes_allowed:
            error(Code.UNDEFINED_AXIS, f"'{a}' is not an axis here", o.span, did_you_mean(a, axes_allowed))
            return None
    by = None
    if o.by is not None:
        eps = o.verb in EPSILONS  # an epsilon, not a divisor: 0 changes nothing (check.partial, check.normeps, PL506)
        by = vals.count(o.by, env, "the epsilon" if eps else "the divisor")
        if by is None:
            return None
        if number(by, vals) == 0 and not eps:
            error(Code.DIVISION_BY_ZERO, f"the divisor {ir.show(by)} is zero", o.span)
            return None
    return ir.Override(o.target, o.group, o.verb, o.axes, by, o.span)


TERM_ALIASES = {"aux_loss": "aux", "mtp_loss": "mtp", "z_loss": "z"}
EPSILONS = (OverrideVerb.EPS_BEFORE_REDUCE, OverrideVerb.EPS_ON_RANKS)  # the verbs whose 'by' is an epsilon


def _term_override(vals: Values, o: surface.OverrideStmt, env: dict[str, ir.Value],
                   axes_allowed: set[str]) -> ir.Override | None:
    """``override loss[TERM]: VERB [by X]`` / ``override tokens[TERM]: reduce over (...)``: what a
    plan's path does with a loss term the model's ``losses`` section declares (``ir.losses``)."""
    error = vals.cx.error
    if o.group not in vals.loss_terms:
        declared = ", ".join(vals.loss_terms) or "none"
        error(Code.UNDECLARED_LOSS_TERM, f"'{o.target}[{o.group}]' names a loss term the model's losses section does not declare "
              f"(declared: {declared})", o.span,
              did_you_mean(o.group, tuple(vals.loss_terms)) or
              (f"terms: {', '.join(ir_losses.TERMS)} or a name of your own, declared as model {{ losses {{ TERM = "
               "NORMALISATION }} }}",))
        return None
    per_sequence = vals.loss_terms[o.group] in ir_losses.SEQUENCE_OBJECTIVES  # sequence counts (check.seqterms)
    verbs = ir_losses.PATH_VERBS + ir_losses.STATS_VERBS + ir_losses.RANK_VERBS if o.target == OverrideTarget.LOSS \
        else (OverrideVerb.REDUCE, OverrideVerb.EQUAL) + ir_losses.LENGTH_VERBS
    if o.verb in ir_losses.SEQUENCE_OBJECTIVES and not _sequences_countable(vals, o):
        return None
    if o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.EQUAL and not per_sequence:
        error(Code.SEQUENCE_COUNT_STATEMENT, f"'tokens[{o.group}]: equal' states equal sequence counts, but the {o.group} "
              f"term is normalised {vals.loss_terms[o.group]}, per token", o.span,
              ("equal token counts are override tokens: equal",))
        return None
    if o.verb not in verbs:
        error(Code.BAD_OVERRIDE, f"'{o.target}[{o.group}]' has no override '{o.verb}'", o.span,
              did_you_mean(o.verb, verbs) or (f"accepted: {', '.join(verbs)}",))
        return None
    stats = o.verb in ir_losses.STATS_VERBS  # the scope of the term's routing statistics (check.auxstats)
    if stats and o.group not in ir_losses.STATS_TERMS:
        error(Code.STATS_SCOPE_TERM, f"'{o.target}[{o.group}]: {o.verb}': the {o.group} term's value is a sum over "
              "tokens, with no statistics over a group of tokens to scope", o.span,
              (f"statistics scopes apply to: {', '.join(ir_losses.STATS_TERMS)}",))
        return None
    on_ranks = o.verb in ir_losses.RANK_VERBS  # the term's operation on some ranks (check.termranks)
    takes_over = o.verb in (OverrideVerb.REDUCE,) + ir_losses.LENGTH_VERBS or on_ranks or (
        stats and o.verb not in ir_losses.NO_AXES_VERBS)
    takes_by = o.verb in (OverrideVerb.DIVIDE, OverrideVerb.DIVIDE_ON_RANKS)
    if takes_over != (o.axes is not None) or takes_by != (o.by is not None) or on_ranks != (o.ranks is not None):
        need = "needs 'over (axes...)'" if takes_over and o.axes is None else "needs 'by <divisor>'" if takes_by \
            and o.by is None else "needs 'ranks (R1, R2, ...)'" if on_ranks else "takes no 'over', 'by' or 'ranks' clause"
        error(Code.BAD_OVERRIDE, f"'{o.target}[{o.group}]: {o.verb}' {need}", o.span)
        return None
    if o.verb in ir_losses.LENGTH_VERBS and not o.axes:  # no context axis whose ranks divide by a length
        return error(Code.OVERRIDE_NO_EFFECT, f"override tokens[{o.group}]: {o.verb} over () changes nothing", o.span)
    out = _axes_and_divisor(vals, o, env, axes_allowed)
    if out is None or not on_ranks:
        return out
    ranks = tuple(vals.count(r, env, "a rank") for r in o.ranks)
    if any(r is None for r in ranks) or not _ranks_in_range(vals, out, ranks):
        return None
    return replace(out, ranks=ranks)


def _sequences_countable(vals: Values, o: surface.OverrideStmt) -> bool:
    """A per-sequence path needs sequences to count: not the router's terms (PL289), not a term whose objective is one
    value per device and microbatch (PL299)."""
    if o.group in ir_losses.ROUTER_TERMS:
        vals.cx.error(Code.LOSS_TERM_NAME, f"'loss[{o.group}]: {o.verb}': the {o.group} term is computed from the router's "
                      "statistics, not as a value per sequence", o.span)
        return False
    if vals.loss_terms[o.group] == "per_microbatch_mean":
        vals.cx.error(Code.SEQUENCE_COUNT_STATEMENT, f"'loss[{o.group}]: {o.verb}': the {o.group} term's objective is one "
                      "value per device and microbatch, with no sequences to count", o.span)
        return False
    return True


def rename_override(o: ir.Override, rename: dict[str, tuple[str, ...]]) -> ir.Override:
    """The override with its axes renamed (formal axes -> the axes they are bound to: several
    for a product binding)."""
    if o.axes is None:
        return o
    return replace(o, axes=tuple(x for a in o.axes for x in rename.get(a, (a,))))
