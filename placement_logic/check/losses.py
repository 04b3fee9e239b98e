"""Loss terms besides the main loss (``ir.losses``): an MoE auxiliary load-balancing loss, a
router z-loss, multi-token-prediction heads, terms of the user's own, each with its own normalisation.

Input: a plan whose model declares ``losses { TERM = OBJECTIVE }`` and its step models. Output:
per term, one gradient-integrity obligation per parameter group the term reaches (``GI loss[T]
grads[g]``) and one for the term as a whole (``GI loss[T]``). A term's gradient flows into the
group's buffer and through the group's reductions; its obligation takes those reductions as
derived (a reduction defect is the group's own finding) and checks the term's normalisation on
the plan's path (``override loss[T]: VERB``, ``loss[T]: divide by X``, ``tokens[T]: reduce over
(...)``) against the objective the model states once. Every plan of a spec is one path that
computes the objective (with and without a pipeline, with and without accumulation), so two
paths that weight the term differently cannot both be proved.

The normalisations, as weights on one contribution:

- ``global_mean`` (per token over the global batch): 1 / (tokens of the step), like the main loss;
- ``sum``: 1 per token;
- ``per_microbatch_mean``: the term is one value per device (of the data and expert axes) and
  microbatch, and the objective is their mean: 1 / (devices · microbatches); the context ranks of a
  sequence each compute a part of its value (a split dimension, summed once). The encoding and the
  replay call this objective ``unit_mean``;
- ``per_sequence_mean`` / ``per_sequence_sum``: a value per sequence, the objective their mean over
  the step's sequences: a global mean over sequence counts (``check.seqterms``).

A term of the user's own (any name the section does not reserve) reaches the dense layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir import groups as param_groups
from ..ir import losses as terms
from ..ir import views as plan_views
from ..ir.overrides import OverrideTarget, OverrideVerb
from . import encode as en
from . import gathered, seqterms, steps, termranks
from . import replay as rp
from .obligation import Obligation
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY

NATURAL_PATH = {"global_mean": "global_mean", "sum": "sum", "per_microbatch_mean": "per_microbatch_mean",
                "per_sequence_mean": "per_sequence_mean", "per_sequence_sum": "per_sequence_sum"}
# a per-sequence term: each sequence's value is one contribution and its objective a mean over sequence counts
ENCODED = {"global_mean": "mean", "sum": "sum", "per_microbatch_mean": "unit_mean", "per_sequence_mean": "mean",
           "per_sequence_sum": "mean"}
OBJECTIVE_TEXT = {
    "global_mean": "per token over the global batch (divided by the step's token count)",
    "sum": "summed over tokens (no normaliser)",
    "per_microbatch_mean": "one value per device and microbatch, averaged over every device and microbatch",
    "per_sequence_mean": "each sequence's token mean, averaged over the global batch's sequences",
    "per_sequence_sum": "each sequence's token sum, averaged over the global batch's sequences",
}


@dataclass(frozen=True)
class TermView:
    term: str
    objective: str  # as the model states it (ir.losses.OBJECTIVES)
    path: str  # what the plan's path does (ir.losses.PATH_VERBS, not divide)
    group: steps.GroupModel  # the group's derived reductions with the term's normalisation on the plan's path
    natural: steps.GroupModel  # the same with the objective's own path: what a correct system does
    span: Span
    equal_sequences: bool = False  # tokens[T]: equal: every device and microbatch holds as many sequences (seqterms)
    lengths: tuple[tuple[str, str], ...] = ()  # (context axis, tokens[T] length verb): what a rank divides its part by


def _err(code: str, msg: str, span: Span) -> DiagnosticError:
    return DiagnosticError([Diagnostic(code, msg, span)])


def _normalisation(path: str, token_axes: tuple[str, ...], tok_axes: tuple[str, ...] | None):
    """(token-count dims, divisor axes) of a path, as ``steps.derive`` gives them for the main loss."""
    if path in ("global_mean",) + terms.SEQUENCE_OBJECTIVES:
        return (tok_axes if tok_axes is not None else token_axes) + (steps.MICROBATCHES,), ()
    if path == "per_device_mean":
        return (steps.MICROBATCHES,), token_axes
    if path == "sum":
        return (), ()
    return (), token_axes + (steps.MICROBATCHES,)


def _path_count(path: str, objective: str) -> str:
    """Whether the path divides by a count (``stepmodel.GroupModel.path_count``): a sum takes none; a mean takes
    its count even where the objective is a sum; a per-microbatch value is taken as it is."""
    if path == "sum":
        return "none"
    return "" if objective == "per_microbatch_mean" else "count"


def views(plan: ir.Plan, derived: steps.StepModel) -> list[TermView]:
    """One view per (term the model declares, group it reaches that the plan has)."""
    context = plan_views.view(plan).axes_with_role(ir.Role.CONTEXT)
    token_axes = plan_views.view(plan).axes_with_role(ir.Role.DATA) + context + plan_views.view(plan).axes_with_role(ir.Role.EXPERT)
    present = [g.group for g in derived.groups]
    out = []
    declared = {name for name, _, _ in plan.model.loss_terms}
    for o in plan.overrides:
        if o.target in (OverrideTarget.LOSS, OverrideTarget.TOKENS) and o.group is not None and o.group not in declared:
            raise _err(Code.UNDECLARED_LOSS_TERM, f"'{o.target}[{o.group}]' names a loss term the model's losses section does not "
                       "declare", o.span)
    for name, objective, span in plan.model.loss_terms:
        mine = [o for o in plan.overrides if o.target in (OverrideTarget.LOSS, OverrideTarget.TOKENS) and o.group == name]
        path_o = next((o for o in reversed(mine) if o.target == OverrideTarget.LOSS and o.verb != OverrideVerb.DIVIDE
                       and o.verb not in terms.STATS_VERBS + terms.RANK_VERBS), None)  # check.auxstats, check.termranks
        div_o = next((o for o in reversed(mine) if o.target == OverrideTarget.LOSS and o.verb == OverrideVerb.DIVIDE), None)
        tok_o = next((o for o in reversed(mine) if o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.REDUCE), None)
        equal = any(o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.EQUAL for o in mine)
        path = path_o.verb if path_o else NATURAL_PATH[objective]
        reaches = terms.TERMS.get(name, terms.NAMED_REACH)  # a term of the user's own: the dense layers
        reach = [g for g in reaches if g in present] + [  # and a group of one's own like the router
            g.name for g in param_groups.param_groups(plan.model) if g.user and g.name in present
            and (g.checks_as == param_groups.GradClass.ROUTER and "router" in reaches
                 or g.checks_as == param_groups.GradClass.DENSE and name not in terms.TERMS)]  # a named term: dense-like
        if not reach:
            raise _err(Code.LOSS_TERM_REACHES_NOTHING, f"loss term '{name}' reaches {', '.join(reaches)}, which this plan's model "
                       f"does not have (its groups: {', '.join(present)}): there is no gradient to check", span)
        if tok_o is not None and path not in ("global_mean",) + terms.SEQUENCE_OBJECTIVES:
            raise _err(Code.OVERRIDE_NO_EFFECT, f"override tokens[{name}]: reduce changes nothing: the {name} term's path is {path}, "
                       "which divides by no global token or sequence count", tok_o.span)
        if equal and path not in ("per_device_mean", "per_microbatch_mean"):
            raise _err(Code.OVERRIDE_NO_EFFECT, f"override tokens[{name}]: equal changes nothing: the {name} term's path "
                       f"is {path}, which divides by no local sequence count", next(
                           o for o in mine if o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.EQUAL).span)
        lengths = _lengths(name, objective, path, mine, context)
        # a value per microbatch or per sequence: the context ranks' slices of a sequence are parts of one value
        unit = objective == "per_microbatch_mean" or objective in terms.SEQUENCE_OBJECTIVES
        axes = tuple(a for a in token_axes if not (unit and a in context))
        norm, div_axes = _normalisation(path, axes, tuple(tok_o.axes or ()) if tok_o else None)
        nat_norm, nat_div = _normalisation(NATURAL_PATH[objective], axes, None)
        local_o = next((o for o in reversed(mine) if o.target == OverrideTarget.TOKENS
                        and o.verb == OverrideVerb.PER_SEQUENCE_LOCAL), None)  # the slice-mean path (seqterms)
        where = (local_o or div_o or tok_o or path_o)
        where_span = where.span if where is not None else span
        for gname in reach:
            dg = derived.group(gname)
            dims = tuple(replace(d, kind=steps.SPLIT, why=f"the context ranks' parts of one {name} value per "
                                 + ("sequence" if objective in terms.SEQUENCE_OBJECTIVES else "microbatch")) if unit and d.kind == steps.TOKEN and d.axis in context else d
                         for d in dg.dims)
            base = replace(dg, dims=dims, objective=ENCODED[objective], double_count=False, span=where_span,
                           spans=((steps.NORMALISATION, where_span),))
            view = replace(base, norm_dims=norm, divisor_axes=div_axes, path_count=_path_count(path, objective),
                           divisor_value=div_o.by if div_o is not None else None)
            natural = replace(base, norm_dims=nat_norm, divisor_axes=nat_div, divisor_value=None,
                              path_count=_path_count(NATURAL_PATH[objective], objective))
            out.append(TermView(name, objective, path, view, natural, where_span, equal, lengths))
    return out


def _lengths(name: str, objective: str, path: str, mine: list, context: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``tokens[T]: per_sequence_local | per_sequence_gathered over (AXES)``: per context axis, the last statement
    naming it (check.seqterms); an axis that is not a context axis, or a path that divides no sequence by its
    length, is an error."""
    out: dict[str, str] = {}
    for o in mine:
        if o.target != OverrideTarget.TOKENS or o.verb not in terms.LENGTH_VERBS:
            continue
        bad = [a for a in o.axes if a not in context]
        if bad:
            raise _err(Code.BAD_OVERRIDE, f"'tokens[{name}]: {o.verb} over ({', '.join(o.axes)})': {', '.join(bad)} "
                       f"is not a context axis of this plan (its context axes: {', '.join(context) or 'none'}): no rank "
                       "holds a part of a sequence there", o.span)
        if not seqterms.inner_mean(objective, path):
            raise _err(Code.OVERRIDE_NO_EFFECT, f"override tokens[{name}]: {o.verb} changes nothing: the {name} term's "
                       f"path is {path}, which divides no sequence by its length", o.span)
        out.update({a: o.verb for a in o.axes})
    return tuple(sorted(out.items()))


def obligations(plan: ir.Plan, derived: steps.StepModel, ctx: rp.Context):
    """The term obligations of ``plan`` (``obligations.Obligation`` records)."""

    out = []
    by_term: dict[str, list[TermView]] = {}
    termranks.check(plan)  # the term's operations on sets of ranks (check.termranks)
    all_views = views(plan, derived)
    for v in all_views:
        by_term.setdefault(v.term, []).append(v)
    context = plan_views.view(plan).axes_with_role(ir.Role.CONTEXT)
    for term, vs in by_term.items():
        if seqterms.is_sequence(vs[0].objective) or vs[0].path in seqterms.SEQUENCE:  # check.seqterms
            out += _sequence_obligations(ctx, vs, term, context)
            continue
        out.append(Obligation(
            f"GI loss[{term}]", GRADIENT_INTEGRITY, vs[0].span,
            f"the {term} loss term's gradient contributions to {', '.join(v.group.group for v in vs)} are weighted as "
            f"its objective states: {OBJECTIVE_TEXT[vs[0].objective]}",
            lambda env, vs=vs, term=term: _any(env, vs, term),
            lambda w, vs=vs: replay_term(ctx, w, next(v for v in vs if v.group.group == w["group"])),
            whole=f"loss[{term}]", unknown=gathered.term_fact(plan, term)))
        for v in vs:
            out.append(Obligation(
                f"GI loss[{term}] grads[{v.group.group}]", GRADIENT_INTEGRITY, v.span,
                f"with the {v.group.group} gradient's reductions as derived, the {term} term's contributions to it are "
                f"weighted {OBJECTIVE_TEXT[v.objective]}",
                lambda env, v=v: en.gi_negation(env, v.group, f"term_{v.term}_{v.group.group}"),
                lambda w, v=v: replay_term(ctx, w, v), aspect_of=f"loss[{term}]", unknown=gathered.term_fact(plan, term)))
    from . import encode_termranks  # the rank arm where the term is computed or divided on some ranks only

    return encode_termranks.extend(out, plan, all_views, ctx, replay_term)


def _sequence_obligations(ctx: rp.Context, vs: list[TermView], term: str, context: tuple[str, ...]) -> list[Obligation]:
    """A per-sequence term, or a per-sequence path: the family test without the solver, unknown under context
    parallelism, else the objective held as a mean over sequence counts (``check.seqterms``)."""
    v0 = vs[0]
    family = seqterms.mismatch(v0.objective, v0.path)
    stated = dict(v0.lengths)  # a token mean per sequence: the length each context rank divides its part by
    unstated = [a for a in context if a not in stated] if seqterms.inner_mean(v0.objective, v0.path) else []
    local = [a for a in context if stated.get(a) == OverrideVerb.PER_SEQUENCE_LOCAL]
    unknown = seqterms.CONTEXT_FACT.format(axes=", ".join(unstated), term=term) if unstated else ""
    what = f"the {term} loss term's gradient contributions are weighted as its objective states: {OBJECTIVE_TEXT[v0.objective]}"
    if family:
        def encode(env, v=v0):
            return [], lambda m: {"sizes": env.size_values(m), "group": v.group.group}

        def replay(w, term=term, v=v0):
            return seqterms.replay_family(ctx, w, term, v.objective, v.path)
    else:
        def encode(env, vs=vs, term=term):
            return _with_sequence_counts(env, vs[0], lambda: _any(env, vs, term))

        def replay(w, vs=vs):
            return replay_term(ctx, w, next(v for v in vs if v.group.group == w["group"]))
    if local and not family:
        encode, replay = _sliced(ctx, vs, term, local[0], lambda env: _any(env, vs, term))
    out = [Obligation(f"GI loss[{term}]", GRADIENT_INTEGRITY, v0.span, what, encode, replay, whole=f"loss[{term}]",
                      unknown=unknown)]
    for v in vs:
        if not family:
            def encode(env, v=v):
                return _with_sequence_counts(env, v, lambda: en.gi_negation(env, v.group, f"term_{v.term}_{v.group.group}"))

            def replay(w, v=v):
                return replay_term(ctx, w, v)
            if local:
                encode, replay = _sliced(ctx, [v], term, local[0],
                                         lambda env, v=v: en.gi_negation(env, v.group, f"term_{v.term}_{v.group.group}"))
        out.append(Obligation(f"GI loss[{term}] grads[{v.group.group}]", GRADIENT_INTEGRITY, v.span,
                              f"with the {v.group.group} gradient's reductions as derived, the {term} term's contributions "
                              f"to it are weighted {OBJECTIVE_TEXT[v.objective]}", encode, replay,
                              aspect_of=f"loss[{term}]", unknown=unknown))
    return out


def _sliced(ctx: rp.Context, vs: list[TermView], term: str, axis: str, build):
    """``tokens[T]: per_sequence_local over (AXIS)``: the slice-mean path departs wherever the axis has two ranks or
    more (``seqterms.replay_local``), else where the path's counts do."""
    def encode(env):
        local = ([env.size(axis) >= 2], lambda m: {"sizes": env.size_values(m), "group": vs[0].group.group, "local": axis})
        return en.any_negation(env, [local, _with_sequence_counts(env, vs[0], lambda: build(env))], f"term_{term}_local")

    def replay(w):
        if "local" in w:
            return seqterms.replay_local(ctx, w, term, vs[0].path, w["local"])
        return replay_term(ctx, w, next(v for v in vs if v.group.group == w["group"]))
    return encode, replay


def _with_sequence_counts(env: en.Env, v: TermView, build):
    """The negation over sequence counts: equal only where ``tokens[T]: equal`` says so (equal token counts say
    nothing about sequences)."""
    saved = env.equal_counts
    env.equal_counts = v.equal_sequences or (saved and not env.step.equal_tokens)
    try:
        return build()
    finally:
        env.equal_counts = saved


def _any(env: en.Env, vs: list[TermView], term: str):
    """Some group the term reaches is weighted wrongly."""
    return en.any_negation(env, [en.gi_negation(env, v.group, f"term_{term}_all_{v.group.group}") for v in vs],
                           f"term_{term}")


def replay_term(ctx: rp.Context, w: dict, v: TermView) -> Counterexample | None:
    """Run the witness's step concretely (``replay.simulate_gi``) for the term's contributions."""
    g = v.group
    sizes = w["sizes"]
    ref = rp._reference(g, sizes)
    sdims = [d for d in g.dims if d.kind in (steps.TOKEN, steps.SPLIT)]
    star = {d.name: (ref[d.name] if w["agree"].get(d.name, True) else rp._other(ref[d.name])) for d in sdims}
    counts = rp._concrete_counts(g, sizes, {d.name: star[d.name] for d in sdims if d.kind == steps.TOKEN},
                                 w["counts"])
    if counts is None:
        return None
    edims = [d for d in g.dims if d.name != steps.MICROBATCHES and (d.kind == steps.SHARDED or d.implicit)]
    sigma = tuple(star[d.name] for d in sdims)
    if not all(0 <= c < rp.dim_size(d, sizes) for d, c in zip(sdims, sigma)):
        return None
    run = rp.simulate_gi(ctx, g, sizes, counts, {((0,) * len(edims), sigma): Fraction(1)})
    bad = [dev for dev in sorted(run.values) if run.values[dev] != run.expected[dev]]
    if not bad:
        return None
    dev = bad[0]
    names = [d.name for d in run.grid]
    tnames = [d.name for d in g.dims if d.kind == steps.TOKEN]
    shown = sorted(counts.items())[:12]
    count_text = "; ".join(f"{rp.coords_text(tnames, t)}: {n}" for t, n in shown)
    seq = seqterms.is_sequence(v.objective)  # the counts are sequence counts, a contribution one sequence's value
    unit = "value" if v.objective == "per_microbatch_mean" else "sequence value" if seq else "per-token gradient"
    counted = "sequence" if seq else "token"
    values = (
        ("objective", f"{v.term} = {v.objective}: {OBJECTIVE_TEXT[v.objective]}"),
        ("path", f"loss[{v.term}]: {v.path}, divided by {rp.divisor_text(g)}"
                 + (f", {counted} count over ({', '.join(g.norm_dims)})" if g.norm_dims else "")),
        (f"{counted} counts", count_text),
        (f"{v.term} contributions", f"{unit} 1 from shard {rp.coords_text([d.name for d in sdims], sigma)} for "
                                    f"element {g.group}[0], 0 elsewhere"),
        (f"total {counted}s", str(run.total_tokens)),
    )
    eq = (f"the {v.term} part of grad[{g.group}] on device {rp.coords_text(names, dev)} = "
          f"{rp._frac(run.values[dev])}, but its objective gives {rp._frac(run.expected[dev])}")
    return Counterexample(ctx.sizes_tuple(sizes), (("observer", rp.coords_text(names, dev)),), values, eq,
                          tuple(diagnose(v)), ctx.command(sizes))


def diagnose(v: TermView) -> list[str]:
    """What the plan's path does differently from the objective's, one cause per line."""
    g, n = v.group, v.natural
    out = []
    natural_path = NATURAL_PATH[v.objective]
    if v.path != natural_path:
        means = v.path in ("per_device_mean", "per_microbatch_mean") and v.objective in ("global_mean",) + seqterms.SEQUENCE
        counted = "sequence" if seqterms.is_sequence(v.objective) else "token"
        out.append(f"the {v.term} loss term is normalised as {v.path} on this path; its objective is "
                   f"{v.objective}: {OBJECTIVE_TEXT[v.objective]}"
                   + (f" (a mean of local means equals it only when {counted} counts are equal)" if means else ""))
    elif sorted(g.norm_dims) != sorted(n.norm_dims):
        token = {d.name for d in g.token_dims}
        replicated = sorted({a for a in g.norm_dims if a not in token})
        twice = sorted({a for a in g.norm_dims if a in token and g.norm_dims.count(a) > 1})
        missing = sorted(set(n.norm_dims) - set(g.norm_dims))
        if replicated or twice:
            over = ", ".join(replicated + twice)
            out.append(f"the {v.term} term's token count is summed over ({over}), where every rank holds the same "
                       f"tokens' count already: it is multiplied by {'·'.join(replicated + twice)}")
        if missing:
            out.append(f"the {v.term} term's token count misses ({', '.join(missing)}): it is a partial count there")
    if (g.divisor_value, g.divisor_axes) != (n.divisor_value, n.divisor_axes) and (
            g.divisor_value is not None or v.path == natural_path):  # else the path's own divisor: said above
        out.append(f"the {v.term} term's contributions are divided by {rp.divisor_text(g)}; its objective needs "
                   f"{rp.divisor_text(n)}")
    return out or [f"the {v.term} term's weights differ from its objective's"]

