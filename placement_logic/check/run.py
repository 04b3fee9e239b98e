"""The checker: plans in, a report of proved / refuted / unknown obligations out.

Input: an ``ir.Spec``, the plan names to check, pinned sizes and a time limit. Output: a
``CheckReport``. Per obligation: first the for-all query (every mesh size, token counts
over the reals, which over-approximates integer counts); unsat proves it for all mesh
sizes. Otherwise counterexamples are searched in small integer tiers; a witness is
shown only after ``replay`` re-runs it concretely. If no witness survives and the
bounded tier is unsat, the obligation is proved up to that bound; else it is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .. import ir
from ..diagnostics import NO_SPAN, Diagnostic, DiagnosticError, Span
from . import encode as en
from . import replay as rp
from . import replay_state as rs
from . import steps
from .plan import PlanChecker
from .report import CheckReport, Finding, ObligationResult, PlanReport, Verdict
from .rules import GRADIENT_INTEGRITY, RULES, STATE_CONSISTENCY
from ..solver.session import Session

DEFAULT_BOUND = 6
ALL_GROUPS = "*"  # an explanation of every group's whole-plan gradient integrity
MAX_REPLAY_DEVICES = 1 << 14


@dataclass
class Obligation:
    name: str
    condition: str
    span: Span
    checked: str
    encode: Callable[[en.Env], tuple[list, Callable]]
    replay: Callable[[dict], object]
    notes: tuple[str, ...] = ()
    whole: str | None = None  # the group whose whole-plan gradient integrity this is
    aspect_of: str | None = None  # the group whose whole-plan GI this per-aspect finding explains


@dataclass(frozen=True)
class Tier:
    label: str
    bound: int | None
    int_counts: bool
    equal_counts: bool
    counts_cap: int | None = None


FORALL = Tier("for all", None, False, False)
SEARCH = (Tier("sizes <= 2, equal counts", 2, True, True, 4), Tier("sizes <= 2", 2, True, False, 3),
          Tier("sizes <= 3", 3, True, False, 6))


def _span(span: Span, fallback: Span) -> Span:
    return fallback if span == NO_SPAN else span


def obligations(step: steps.StepModel, derived: steps.StepModel, ctx: rp.Context) -> list[Obligation]:
    obs: list[Obligation] = []
    P = step.plan_span
    for g in step.groups:
        obs.append(Obligation(
            f"GI grads[{g.group}]", GRADIENT_INTEGRITY, _span(g.span, P),
            f"the {g.group} gradient that enters every update equals the global-batch mean-loss gradient: the "
            "plan's reductions, accumulation, loss weights and divisor taken together",
            lambda env, g=g: en.gi_negation(env, g, f"gi_{g.group}"),
            lambda w, g=g: rp.replay_gi(ctx, w, g, None), whole=g.group))
        for aspect in steps.gi_aspects(g):
            h = steps.isolate(g, aspect)
            label, checked = _gi_text(g, aspect)
            obs.append(Obligation(
                f"GI grads[{g.group}] {label}", GRADIENT_INTEGRITY, _span(g.span_of(aspect), P), checked,
                lambda env, h=h, a=aspect: en.gi_negation(env, h, f"gi_{h.group}_{_slug(a)}"),
                lambda w, h=h, a=aspect: rp.replay_gi(ctx, w, h, a), aspect_of=g.group))
    for g in step.groups:
        obs.append(Obligation(
            f"SC grads[{g.group}]", STATE_CONSISTENCY, _span(g.span, P),
            f"replicas that update the same {g.group} elements receive identical reduced gradients",
            lambda env, g=g: en.gi_replica_negation(env, g, f"sc_{g.group}"),
            lambda w: rp.replay_replica(ctx, w)))
    obs.append(Obligation(
        "SC clip_norm", STATE_CONSISTENCY, _span(step.clip_span, P),
        "every device's grad norm (and so its clip coefficient) equals the global norm over all shards and "
        "stages, each parameter counted once",
        lambda env: en.norm_negation(env, "clip", False), lambda w: rs.replay_norm(ctx, w, False)))
    obs.append(Obligation(
        "SC overflow", STATE_CONSISTENCY, _span(step.overflow_span, P),
        "every device takes the same loss-scale overflow decision (skip or step), the global one",
        lambda env: en.norm_negation(env, "ovf", True), lambda w: rs.replay_norm(ctx, w, True)))
    obs.append(Obligation(
        "SC dropout_seed", STATE_CONSISTENCY, _span(step.seed_span, P),
        "dropout seeds are identical over axes where the region is replicated and distinct where it is split",
        lambda env: en.seed_negation(env), lambda w: rs.replay_seed(ctx, w),
        () if step.tensor_axes else ("vacuous: no tensor-parallel axis",)))
    for a in step.data_axes + step.context_axes:
        obs.append(Obligation(
            f"SC params usable over {a}", STATE_CONSISTENCY, _span(step.params_span, P),
            f"the forward on every {a} rank uses the whole parameters: params are replicated, gathered (S*) or "
            f"fetched over {a}, never left sharded (S)",
            lambda env, a=a: en.axes_negation(env, "usable", [(a, env.sess.true() if a in step.unusable_axes
                                                                 else env.sess.false())]),
            lambda w: rs.replay_usable(ctx, w)))
    for a, times in step.gather_counts:
        obs.append(Obligation(
            f"SC params gathered over {a}", STATE_CONSISTENCY, _span(step.params_span, P),
            f"params sharded-with-gather (S*) over {a} are all-gathered over {a} exactly once before each use",
            lambda env, a=a, times=times: en.axes_negation(
                env, "usable", [(a, env.sess.true() if times != 1 else env.sess.false())]),
            lambda w, times=times: rs.replay_usable(ctx, {**w, "times": times})))
    split_grads = [a for a in step.axes if a in step.grads_split_axes]
    for a in split_grads:
        obs.append(Obligation(
            f"SC optimizer step over {a}", STATE_CONSISTENCY, _span(step.optimizer_span, P),
            f"gradients are sharded over {a}, so the optimizer state is sharded over {a} too and every rank steps "
            "exactly the elements whose reduced gradient it holds",
            lambda env, a=a: en.axes_negation(env, "optimizer", [(a, env.sess.true() if a in step.optimizer_mismatch
                                                                     else env.sess.false())]),
            lambda w: rs.replay_optimizer(ctx, w)))
    missing = [a for a in step.regather_needed if a not in step.regather_axes]
    obs.append(Obligation(
        "SC params re-gather", STATE_CONSISTENCY, _span(step.regather_span, P),
        "after a sharded optimizer step, params replicated over an axis are all-gathered over it",
        lambda env: en.axes_negation(env, "regather", [(a, env.sess.true()) for a in missing]),
        lambda w: rs.replay_regather(ctx, w),
        () if step.regather_needed else ("vacuous: no axis with replicated params and a sharded optimizer",)))
    # ---------------------------------------------------------------- composition rules
    multi = [a for a, bound in step.axis_bindings if len(bound) > 1]
    obs.append(_rule("CR01", P, lambda env: en.axes_negation(env, "roles", [(a, env.sess.true()) for a in multi]),
                     lambda w: rs.replay_axis_roles(ctx, w)))
    group_spans = [g.span for g in step.groups if g.span != NO_SPAN]
    obs.append(_rule("CR02", group_spans[0] if group_spans else P, lambda env: en.typing_negation(env),
                     lambda w: rp.replay_structural(ctx, w["group"], w["sizes"], w["dim"])))
    obs[-1].aspect_of = ALL_GROUPS
    modes = dict(step.param_modes)
    bad_gather = [a for a in step.gather_axes if modes.get(a) not in ("S", "S*", "O")]
    obs.append(_rule("CR03", _span(step.gather_span, P),
                     lambda env: en.axes_negation(env, "gather", [(a, env.sess.true()) for a in bad_gather]),
                     lambda w: rs.replay_gather(ctx, w),
                     () if step.gather_axes else ("vacuous: params are gathered over no axis",)))
    obs.append(_rule("CR04", _span(step.fetch_span, P),
                     lambda env: en.flag_negation(env, "fetch", step.offloaded and not step.fetch),
                     lambda w: rs.replay_fetch(ctx, w),
                     () if step.offloaded else ("vacuous: params stay on device",)))
    sp_bad = []
    if step.sequence_parallel:
        for gname in ("norms", "biases"):
            if gname in [g.group for g in step.groups]:
                g = step.group(gname)
                sp_bad += [(gname, d.name) for d in g.dims if d.axis in step.tensor_axes and d.k != 1]
    obs.append(_rule("CR05", _span(step.sp_span, P),
                     lambda env: _sp_negation(env, step, sp_bad),
                     lambda w: (rp.replay_structural(ctx, w["group"], w["sizes"], w["dim"]) if w.get("dim") else
                                _sp_without_tp(ctx, w)),
                     () if step.sequence_parallel else ("vacuous: no sequence parallelism",)))
    acc_applies = bool(step.grads_sharded_data) and step.pipelined
    obs.append(_rule("CR06", _span(step.accumulation_span, P),
                     lambda env: en.flag_negation(env, "accumulation", not step.accumulation_buffer, needs_m=True),
                     lambda w: rp.replay_structural(ctx, "dense", w["sizes"], steps.MICROBATCHES),
                     _accumulation_notes(step, acc_applies)))
    has_experts = "experts" in [g.group for g in step.groups]
    obs.append(_rule("CR07", _span(step.group("experts").span, P) if has_experts else P, lambda env: _expert_negation(env, step),
                     lambda w: rp.replay_gi(ctx, w),
                     () if has_experts else ("vacuous: no expert parameters",)))
    tie_applies = step.tied and bool(step.pipeline_axes)
    tie_k = next((d.k for d in step.group("embedding").dims if d.tie), 1)
    obs.append(_rule("CR08", _span(step.group("embedding").span, P),
                     lambda env: en.axes_negation(env, "tie", [(a, env.sess.true() if tie_k != 1 else env.sess.false())
                                                               for a in step.pipeline_axes] if tie_applies else []),
                     lambda w: rs.replay_tie(ctx, w),
                     () if tie_applies else ("vacuous: no tied weights across pipeline stages",)))
    return obs


def _slug(aspect: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in aspect)


def _gi_text(g: steps.GroupModel, aspect: str) -> tuple[str, str]:
    """The obligation's name suffix and what it states."""
    if aspect == steps.NORMALISATION:
        return "normalisation", (
            f"with every reduction and the accumulation of the {g.group} gradient as derived, the loss weights, "
            "token count and divisor make it the global-batch mean-loss gradient (the mean over all tokens of the step)")
    if aspect == steps.MICROBATCHES:
        return "over microbatches", (
            f"the {g.group} gradient of every microbatch is accumulated exactly once "
            "(every reduction over mesh axes and the normalisation as derived)")
    d = g.dim(aspect)
    if d.tie:
        return f"over {d.axis}", (
            f"the tied {g.group} gradient halves on the first and last {d.axis} stage are summed exactly once "
            "(every other reduction and the normalisation as derived)")
    if d.implicit:
        what = f"summed by the all-to-all over {d.axis} and not reduced over it again"
    elif d.kind in (steps.TOKEN, steps.SPLIT):
        what = f"split over {d.axis}, so every partial contribution is all-reduced over {d.axis} exactly once"
    elif d.kind == steps.INVARIANT:
        what = f"identical on every {d.axis} rank, so it is not reduced over {d.axis}"
    else:
        what = f"sharded over {d.axis}, so different elements are never added over {d.axis}"
    return f"over {d.axis}", (f"the {g.group} gradient is {what} "
                              "(every other reduction and the normalisation as derived)")


def _rule(code: str, span: Span, encode, replay, notes: tuple[str, ...] = ()) -> Obligation:
    r = RULES[code]
    return Obligation(f"{code} {r.name}", code, span, r.description, encode, replay, notes)


def _sp_negation(env: en.Env, step: steps.StepModel, bad: list[tuple[str, str]]):
    import z3

    ctx = env.sess.ctx
    if step.sequence_parallel and not step.tensor_axes:
        return [z3.BoolVal(True, ctx)], lambda m: {"kind": "sp", "sizes": env.size_values(m), "dim": None}
    conds = [((gr, d), env.size(d) >= 2) for gr, d in bad]
    cons = [z3.Or([c for _, c in conds])] if conds else [z3.BoolVal(False, ctx)]

    def extract(model):
        from ..solver.session import value_of

        gr, d = next(key for key, c in conds if value_of(model, c))
        return {"kind": "sp", "sizes": env.size_values(model), "group": gr, "dim": d}

    return cons, extract


def _sp_without_tp(ctx: rp.Context, w: dict):
    from .report import Counterexample

    return Counterexample(ctx.sizes_tuple(w["sizes"]), (), (("tensor axes", "none"),),
                          "sequence parallel is enabled but no axis has the tensor role",
                          ("sequence parallelism splits the tensor-parallel region's sequence; without a tensor axis "
                           "it has no group to run on",), ctx.command(w["sizes"]))


def _expert_negation(env: en.Env, step: steps.StepModel):
    import z3

    if "experts" not in [g.group for g in step.groups]:
        return [z3.BoolVal(False, env.sess.ctx)], lambda m: {}
    eq = en.Env(env.sess, env.step, env.bindings, env.pinned, env.bound, True, True)
    eq.sizes, eq.side = env.sizes, env.side
    # the experts with their own divisor, and every other group over the expert axes
    # (reduced there once, as over the rest of the data group), each judged in isolation
    parts = [en.gi_negation(eq, step.group("experts"), "cr07")]
    for g in step.groups:
        if g.group == "experts":
            continue
        for d in g.dims:
            if d.axis in step.expert_axes and not d.tie:
                parts.append(en.gi_negation(eq, steps.isolate(g, d.name), f"cr07_{g.group}_{d.name}"))
    if len(parts) == 1:
        return parts[0]
    pick = [env.sess.bool(f"cr07_part_{i}") for i in range(len(parts))]
    cons = [z3.Or(*pick)] + [z3.Implies(b, z3.And(*c)) for b, (c, _) in zip(pick, parts)]

    def extract(model):
        from ..solver.session import value_of

        i = next(i for i, b in enumerate(pick) if value_of(model, b))
        return parts[i][1](model)

    return cons, extract


def _accumulation_notes(step: steps.StepModel, applies: bool) -> tuple[str, ...]:
    if not applies:
        return ("vacuous: no gradients sharded over a data axis under pipeline accumulation",)
    axes = ", ".join(step.grads_sharded_data)
    n = "·".join(step.grads_sharded_data)
    n = n if len(step.grads_sharded_data) == 1 else f"({n})"
    return (f"cost: gradients sharded over ({axes}) with pipeline accumulation take one reduce-scatter per "
            f"microbatch (microbatches × ({n}-1)/{n}·|G| sent per device per step) unless a full-size "
            "accumulation buffer is kept",)


# --------------------------------------------------------------------------- running


def _scope(pinned: dict[str, int], step: steps.StepModel) -> str:
    names = step.axes + (steps.MICROBATCHES,)
    if all(n in pinned for n in names):
        return "at " + ", ".join(f"{n}={pinned[n]}" for n in names)
    if pinned:
        return "all sizes with " + ", ".join(f"{n}={v}" for n, v in pinned.items() if n in names)
    return "all mesh sizes"


def _devices(w: dict) -> int:
    n = 1
    for v in w.get("sizes", {}).values():
        n *= max(1, v)
    return n


def discharge(sess: Session, ob: Obligation, step: steps.StepModel, bindings: dict, pinned: dict[str, int],
              bound: int) -> ObligationResult:
    seconds = 0.0
    reasons: list[str] = []

    def query(tier: Tier):
        nonlocal seconds
        env = en.Env(sess, step, bindings, pinned, tier.bound, tier.int_counts, tier.equal_counts or step.equal_tokens,
                     counts_cap=tier.counts_cap)
        cons, extract = ob.encode(env)
        out = sess.check(f"{step.plan}:{ob.name}:{tier.label}", env.side + cons)
        seconds += out.seconds
        return out, extract

    def result(verdict: Verdict, scope: str, **kw) -> ObligationResult:
        notes = kw.pop("notes", ()) + ob.notes
        return ObligationResult(ob.name, ob.condition, verdict, scope, ob.span, ob.checked,
                                notes=notes, seconds=seconds, **kw)

    first, extract = query(FORALL)
    if first.status == "unsat":
        return result(Verdict.PROVED, _scope(pinned, step))
    if first.status == "unknown":
        reasons.append(f"for-all query: {first.reason}")
    tiers = SEARCH + (Tier(f"sizes <= {bound}", bound, True, False),)
    bounded_unsat = False
    for tier in tiers:
        out, extract = query(tier)
        if out.status == "unknown":
            reasons.append(f"{tier.label}: {out.reason}")
            continue
        if out.status == "unsat":
            bounded_unsat = tier.bound == bound
            continue
        try:
            witness = extract(out.model)
        except ValueError as exc:  # an irrational model value cannot be replayed
            reasons.append(f"{tier.label}: {exc}")
            continue
        witness["sizes"] = {**witness.get("sizes", {}), **pinned}
        cex = ob.replay(witness)
        if cex is not None:
            return _refuted(ob, result, _scope(pinned, step), cex)
        reasons.append(f"{tier.label}: the solver's witness did not survive concrete replay")
    if first.status == "sat":
        try:
            witness = extract(first.model)
        except ValueError as exc:
            witness = None
            reasons.append(f"for-all witness: {exc}")
        if witness is not None and _devices(witness) <= MAX_REPLAY_DEVICES:
            witness["sizes"] = {**witness.get("sizes", {}), **pinned}
            cex = ob.replay(witness)
            if cex is not None:
                return _refuted(ob, result, _scope(pinned, step), cex)
    if bounded_unsat:
        return result(Verdict.PROVED, f"mesh sizes and microbatches <= {bound}",
                      notes=("the for-all query found only witnesses that need real-valued token counts or larger "
                             "meshes; proved up to the bound",))
    return result(Verdict.UNKNOWN, _scope(pinned, step), reason="; ".join(reasons) or "no verdict")


def _refuted(ob: Obligation, result, scope: str, cex) -> ObligationResult:
    why = fix = ""
    if ob.condition in RULES:
        why, fix = RULES[ob.condition].why, RULES[ob.condition].fix
    return result(Verdict.REFUTED, scope, counterexample=cex, why=why, fix=fix)


def check_plan(sess: Session, spec: ir.Spec, plan: ir.Plan, pinned: dict[str, int], bound: int = DEFAULT_BOUND) -> PlanReport:
    checker = PlanChecker(spec, plan, dict(pinned))
    step, bindings = checker.step, checker.bindings
    obs = checker.obligations()
    results = _explain(obs, [discharge(sess, ob, step, bindings, pinned, bound) for ob in obs])
    free = [n for n in step.axes + (steps.MICROBATCHES,) if n not in pinned]
    assumed = (
        "deterministic, synchronous execution",
        (f"{', '.join(free)}: any positive integer" if free else "every size pinned"),
        f"loss: {step.loss.replace('_', ' ')}",
        "every device and microbatch has >= 1 token; token counts otherwise arbitrary",
        "gradient contributions and squared norms arbitrary",
    )
    return PlanReport(plan.name, results, assumed, findings(results))


GRADIENT_RULES = ("CR02", "CR05", "CR07", "CR08")  # rules that restate gradient integrity per axis


def _rank(r: ObligationResult) -> int:
    """How directly an obligation names a defect: a per-aspect GI finding names the axis or the
    normalisation, a state-consistency one the value, a whole-plan GI one only the group."""
    if r.condition == GRADIENT_INTEGRITY:
        return 0 if "] " in r.name else 2
    if r.condition == STATE_CONSISTENCY:
        return 1
    return 3


def findings(results: tuple[ObligationResult, ...]) -> tuple[Finding, ...]:
    """Refuted obligations grouped into defects: the ones that come from one source location
    (an override line, a placement, a binding) are one defect; a gradient rule refuted beside a
    gradient-integrity refutation joins that defect. The root is the most direct obligation."""
    refuted = [r for r in results if r.verdict is Verdict.REFUTED]
    aspect_loc: dict[str, Span] = {}  # group -> location of its first refuted GI aspect
    for r in refuted:
        if r.condition == GRADIENT_INTEGRITY and "] " in r.name:
            aspect_loc.setdefault(r.name.split("] ", 1)[0] + "]", r.location)

    def key(r: ObligationResult) -> Span:
        # a group's whole-plan GI and replica consistency go with the aspect that explains them
        group = r.name.replace("SC grads[", "GI grads[", 1)
        return aspect_loc.get(group, r.location) if "] " not in r.name else r.location

    by_loc: dict[Span, list[ObligationResult]] = {}
    for r in refuted:
        by_loc.setdefault(key(r), []).append(r)
    gi_locs = [loc for loc, rs in by_loc.items() if any(r.condition == GRADIENT_INTEGRITY for r in rs)]
    if gi_locs:
        for loc in list(by_loc):
            if loc in gi_locs:
                continue
            rules = [r for r in by_loc[loc] if r.condition in GRADIENT_RULES]
            if rules and len(rules) == len(by_loc[loc]):
                by_loc[gi_locs[0]].extend(rules)
                del by_loc[loc]
    out = []
    for loc, rs in by_loc.items():
        root = min(rs, key=_rank)  # stable: the first of the most direct ones
        cause = root.counterexample.diagnosis[0] if root.counterexample and root.counterexample.diagnosis \
            else root.checked
        out.append(Finding(root.name, cause, loc, (root.name,) + tuple(r.name for r in rs if r is not root)))
    return tuple(out)


def _explain(obs: list[Obligation], results: list[ObligationResult]) -> tuple[ObligationResult, ...]:
    """Per-aspect GI findings explain their group's whole-plan obligation. Where the whole
    plan is proved but aspects depart from the derivation, the errors cancel: the aspects
    become notes of the proof instead of refutations of a correct plan."""
    whole = {ob.whole: r for ob, r in zip(obs, results) if ob.whole is not None}
    all_proved = bool(whole) and all(r.verdict is Verdict.PROVED for r in whole.values())
    cancelled: dict[str, list[str]] = {}
    out: list[ObligationResult] = []
    for ob, r in zip(obs, results):
        if ob.aspect_of == ALL_GROUPS:
            explained = all_proved
            owner = next(iter(whole), None)
        else:
            w = whole.get(ob.aspect_of) if ob.aspect_of is not None else None
            explained = w is not None and w.verdict is Verdict.PROVED
            owner = ob.aspect_of
        if explained and r.verdict is not Verdict.PROVED:
            cancelled.setdefault(owner, []).append(f"{r.name}: {r.verdict.name.lower()} in isolation")
            continue
        out.append(r)
    if cancelled:
        out = [replace(r, notes=r.notes + (
            "errors cancel: the plan departs from the derivation, but the departures compensate exactly ("
            + "; ".join(cancelled[g]) + ")",))
            if (g := next((ob.whole for ob, rr in zip(obs, results) if rr is r and ob.whole), None)) in cancelled
            else r for r in out]
    return tuple(out)


def check_spec(spec: ir.Spec, plans: list[str] | None = None, pinned: dict[str, int] | None = None,
               timeout: float = 10.0, bound: int = DEFAULT_BOUND, session: Session | None = None) -> CheckReport:
    """Check the named plans (all when None) of ``spec``; raises DiagnosticError on bad input."""
    pinned = dict(pinned or {})
    names = plans or [p.name for p in spec.plans]
    selected = []
    for name in names:
        try:
            selected.append(spec.plan(name))
        except KeyError:
            known = ", ".join(p.name for p in spec.plans) or "none"
            raise DiagnosticError([Diagnostic("PL302", f"no plan named '{name}' (plans: {known})")]) from None
    sizes: dict[str, int] = {}
    rebound: dict[str, ir.Value] = {}
    names = {a for p in selected for a in p.mesh.names} | {steps.MICROBATCHES}
    bindings = spec.binding_map
    for k, v in pinned.items():
        if v < 1:
            raise DiagnosticError([Diagnostic("PL301", f"--set {k}={v}: sizes must be positive integers")])
        if k in names:
            sizes[k] = v
        elif k in bindings:
            rebound[k] = ir.const(v)
        else:
            known = ", ".join(sorted(names | set(bindings)))
            raise DiagnosticError([Diagnostic("PL301", f"--set {k}: names no mesh axis, microbatches or let "
                                                       f"symbol (known: {known})")])
    for p in selected:
        m = p.model.microbatches
        if isinstance(m, ir.Sym) and m.name in rebound:
            sizes.setdefault(steps.MICROBATCHES, int(rebound[m.name].value))
    if rebound:
        spec = replace(spec, bindings=tuple((k, rebound.get(k, v)) for k, v in spec.bindings))
    pinned = sizes
    sess = session or Session(timeout=timeout)
    reports = tuple(check_plan(sess, spec, p, pinned, bound) for p in selected)
    return CheckReport(spec.file, reports, timeout, tuple(sorted(pinned.items())))
