"""The checker: plans in, a report of proved / refuted / unknown obligations out.

Input: an ``ir.Spec``, the plan names to check, pinned sizes and a time limit. Output: a
``CheckReport``. Per obligation: first the for-all query (every mesh size, token counts
over the reals, which over-approximates integer counts); unsat proves it for all mesh
sizes. Otherwise its witness is tried first (``witness.shrink``): replayed concretely as
found or cut to small sizes, then minimised axis by axis with the replay as the judge; a
witness is shown only after ``replay`` re-runs it concretely. Only when no variant of it
fails (or the for-all query gave none) are counterexamples searched in small integer
tiers. If no witness survives and the bounded tier is unsat, the obligation is unknown
with that bound stated (a bounded search is not a proof); else it is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Callable

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir.losses import SEQUENCE_OBJECTIVES
from ..ir.overrides import OverrideTarget, OverrideVerb
from ..resolve.validate import check_rebinding
from ..solver.session import Session, SolverStatus
from . import encode as en
from . import encode_shapefacts as shapefacts
from . import (
    kvproduct,
    render,  # noqa: F401 - gives CheckReport its Markdown view in a notebook
    steps,
)
from . import witness as wt
from .obligations import ALL_GROUPS, Obligation, obligations  # noqa: F401 - obligations re-exported
from .plan import PlanChecker
from .report import CheckReport, Finding, ObligationResult, PlanReport, Verdict
from .rules import GRADIENT_INTEGRITY, RULES, STATE_CONSISTENCY

DEFAULT_BOUND = 6
MAX_REPLAY_DEVICES = 1 << 14
QUICK_SECONDS = 1.0  # the first try of the for-all query (see ``discharge``)


@dataclass(frozen=True)
class Tier:
    label: str
    bound: int | None
    int_counts: bool
    equal_counts: bool
    counts_cap: int | None = None
    fixed_size: int | None = None  # every size not pinned fixed at this value
    counts_pattern: tuple[int, int] | None = None  # every token count fixed (encode.Env.counts_pattern)


FORALL = Tier("for all", None, False, False)
# when the for-all query gives no witness that survives: every size 2 and every token count fixed, so
# only the choice of shard and element is left to the solver (its witness is then minimised by replay)
GUESSES = (Tier("sizes = 2, one token per shard", 2, True, True, fixed_size=2, counts_pattern=(1, 1)),
           Tier("sizes = 2, 1 token on the observer's shard, 2 on the others", 2, True, False, fixed_size=2,
                counts_pattern=(1, 2)))
SEARCH = (Tier("sizes <= 2, equal counts", 2, True, True, 4), Tier("sizes <= 2", 2, True, False, 3),
          Tier("sizes <= 3", 3, True, False, 6))


def _scope(pinned: dict[str, int], step: steps.StepModel, fixed: dict[str, int] | None = None) -> str:
    """The sizes a verdict covers: the ``--set`` pins and the sizes the obligation's encoding holds
    axes at itself (``fixed``, ``encode.Env.fix``: a K/V copy layout's declared sizes, the ranks a
    list of groups or rank sets holds), in one wording."""
    names = step.axes + (steps.MICROBATCHES,)
    held = {**pinned, **{n: v for n, v in (fixed or {}).items() if n not in pinned}}
    if all(n in held for n in names):
        return "at " + ", ".join(f"{n}={held[n]}" for n in names)
    if held:
        return "all sizes with " + ", ".join(f"{n}={v}" for n, v in held.items() if n in names)
    return "all mesh sizes"


@dataclass
class _Discharge:
    """One obligation's queries in the order ``discharge`` asks them: the time they took and why
    those that decided nothing did not."""

    sess: Session
    ob: Obligation
    step: steps.StepModel
    bindings: dict
    pinned: dict[str, int]
    shape: tuple
    seconds: float = 0.0
    reasons: list[str] = field(default_factory=list)
    fixed: dict[str, int] = field(default_factory=dict)  # sizes the encoding holds axes at (encode.Env.fix)

    def query(self, tier: Tier, timeout: float | None = None):
        step, pinned = self.step, self.pinned
        fixed = {n: tier.fixed_size for n in step.axes + (steps.MICROBATCHES,)} if tier.fixed_size else {}
        env = en.Env(self.sess, step, self.bindings, {**fixed, **pinned}, tier.bound, tier.int_counts,
                     tier.equal_counts or step.equal_tokens, counts_cap=tier.counts_cap,
                     counts_pattern=None if step.equal_tokens and tier.counts_pattern else tier.counts_pattern)
        cons, extract = self.ob.encode(env)
        self.fixed.update({a: n for a, n in env.fixed.items() if a not in self.fixed})
        out = self.sess.check(f"{step.plan}:{self.ob.name}:{tier.label}",
                              env.side + shapefacts.side(env.sizes, self.shape) + cons, timeout)
        self.seconds += out.seconds
        return out, extract

    def result(self, verdict: Verdict, scope: str, **kw) -> ObligationResult:
        ob = self.ob
        notes = kw.pop("notes", ()) + ob.notes
        fixed = tuple((a, n) for a, n in self.fixed.items() if a not in self.pinned)
        return ObligationResult(ob.name, ob.condition, verdict, scope, ob.span, ob.checked,
                                notes=notes, seconds=self.seconds, groups=ob.groups, fixed_sizes=fixed, **kw)

    @property
    def scope(self) -> str:
        return _scope(self.pinned, self.step, self.fixed)

    def ok(self, sizes: dict[str, int]) -> bool:  # sizes the model takes, at which its layouts hold
        return kvproduct.layout_ok(self.step.groups, sizes) and shapefacts.holds(self.shape, sizes)

    def refuted(self, out, extract, label: str) -> ObligationResult | None:
        """Refuted by the smallest variant of a sat query's witness that fails on replay, if one does."""
        cex = _shrunk(self.ob, out, extract, self.pinned, label, self.reasons, self.ok)
        return None if cex is None else _refuted(self.ob, self.result, self.scope, cex)

    def forall(self, timeout: float | None = None):
        """The for-all query: proved when unsat, refuted by its witness when one fails on replay."""
        first, extract = self.query(FORALL, timeout)
        if first.status == SolverStatus.UNSAT:
            return first, self.result(Verdict.PROVED, self.scope)
        if first.status == SolverStatus.SAT:  # the witness already found goes first: one replay per candidate
            return first, self.refuted(first, extract, "for-all witness")
        return first, None

    def too_large(self, first, devices: int) -> ObligationResult:
        # every witness keeps the pinned sizes, so none can be replayed: no search can end otherwise
        found = "found a counterexample" if first.status == SolverStatus.SAT else f"gave no answer ({first.reason})"
        return self.result(Verdict.UNKNOWN, self.scope,
                           reason=f"at the pinned sizes the solver {found}, but a mesh of {devices:,} devices is too "
                                  f"large to replay concretely (at most {MAX_REPLAY_DEVICES:,}), and a counterexample "
                                  "is shown only once replayed: pin smaller sizes, or none, to see it")

    def guesses(self) -> ObligationResult | None:
        """Every size 2 and every token count fixed: refuted where a guess's witness fails on replay."""
        for tier in GUESSES:
            out, extract = self.query(tier)
            if out.status == SolverStatus.SAT:
                found = self.refuted(out, extract, tier.label)
                if found is not None:
                    return found
            elif out.status == SolverStatus.UNKNOWN:
                self.reasons.append(f"{tier.label}: {out.reason}")
        return None

    def search(self, bound: int, first) -> ObligationResult:
        """Counterexamples in small integer tiers, then up to ``bound``; unknown where none survives replay."""
        reasons = self.reasons
        bounded_unsat = False
        for tier in SEARCH + (Tier(f"sizes <= {bound}", bound, True, False),):
            out, extract = self.query(tier)
            if out.status == SolverStatus.UNKNOWN:
                reasons.append(f"{tier.label}: {out.reason}")
                continue
            if out.status == SolverStatus.UNSAT:
                bounded_unsat = tier.bound == bound
                continue
            try:
                witness = extract(out.model)
            except ValueError as exc:
                reasons.append(f"{tier.label}: {exc}")
                continue
            witness["sizes"] = {**witness.get("sizes", {}), **self.pinned}
            cex = self.ob.replay(witness)
            if cex is not None:
                return _refuted(self.ob, self.result, self.scope, cex)
            reasons.append(f"{tier.label}: the solver's witness did not survive concrete replay")
        if bounded_unsat:  # a bounded search is not a proof: unknown, saying how far it looked
            reasons.append(f"no counterexample with mesh sizes and microbatches <= {bound}, but the for-all query "
                           + ("timed out" if first.status == SolverStatus.UNKNOWN else "found only witnesses that need "
                              "real-valued token counts or larger meshes") + ": a bounded search, not a proof")
        return self.result(Verdict.UNKNOWN, self.scope, reason="; ".join(reasons) or "no verdict")


def discharge(sess: Session, ob: Obligation, step: steps.StepModel, bindings: dict, pinned: dict[str, int],
              bound: int, shape: tuple = ()) -> ObligationResult:
    """The obligation's verdict: proved, refuted with a replayed counterexample, or unknown. Every
    query's sizes meet the model's shape facts (``shape``, check.encode_shapefacts), and so does every
    witness variant the replay is shown."""
    d = _Discharge(sess, ob, step, bindings, pinned, shape)
    if ob.unknown:
        return d.result(Verdict.UNKNOWN, d.scope, reason=ob.unknown)
    # the for-all query, first with a short limit: a query that z3 does not decide at once is
    # left while the cheap guesses run, and asked again with the full limit only if they fail
    first, found = d.forall(QUICK_SECONDS)
    quick = first.status == SolverStatus.UNKNOWN and sess.timeout > QUICK_SECONDS
    if found is not None:
        return found
    devices = _pinned_devices(step, pinned)
    if devices > MAX_REPLAY_DEVICES:
        return d.too_large(first, devices)
    found = d.guesses()
    if found is None and quick:
        first, found = d.forall()
    if found is not None:
        return found
    if first.status == SolverStatus.UNKNOWN:
        d.reasons.insert(0, f"for-all query: {first.reason}")
    return d.search(bound, first)


def _pinned_devices(step: steps.StepModel, pinned: dict[str, int]) -> int:
    """The fewest devices any witness at the pinned sizes has (the pinned mesh axes' product)."""
    n = 1
    for a in step.axes:
        n *= max(1, int(pinned.get(a, 1)))
    return n


def _shrunk(ob: Obligation, out, extract, pinned: dict[str, int], label: str, reasons: list[str], ok=None):
    """The counterexample of the smallest variant of a sat query's witness that fails on replay (a
    variant at sizes ``ok`` refuses, a configuration the model does not take, is none)."""

    def replay(w: dict):
        return ob.replay(w) if ok is None or ok(w.get("sizes", {})) else None

    try:
        found = wt.shrink(extract(out.model), replay, pinned, MAX_REPLAY_DEVICES)
    except ValueError as exc:  # an irrational model value cannot be replayed
        reasons.append(f"{label}: {exc}")
        return None
    if found is None:
        reasons.append(f"{label}: no variant of the solver's witness failed on concrete replay")
        return None
    return found[1]


def _refuted(ob: Obligation, result, scope: str, cex) -> ObligationResult:
    why = fix = ""
    if ob.condition in RULES:
        why, fix = RULES[ob.condition].why, RULES[ob.condition].fix
    return result(Verdict.REFUTED, scope, counterexample=cex, why=why, fix=fix)


def check_plan(sess: Session, spec: ir.Spec, plan: ir.Plan, pinned: dict[str, int], bound: int = DEFAULT_BOUND) -> PlanReport:
    checker = PlanChecker(spec, plan, dict(pinned))
    step, bindings = checker.step, checker.bindings
    obs = checker.obligations()
    shape = tuple(f for f in shapefacts.facts(plan, bindings) if any(a not in pinned for a in f.axes))
    results = _explain(obs, [discharge(sess, ob, step, bindings, pinned, bound, shape) for ob in obs])
    free = [n for n in step.axes + (steps.MICROBATCHES,) if n not in pinned]
    assumed = (
        "deterministic, synchronous execution",
        (f"{', '.join(free)}: any positive integer" if free else "every size pinned")
        + (f", as the model's shapes take them ({'; '.join(f.text() for f in shape)})" if shape else ""),
        f"loss: {step.loss.replace('_', ' ')}",
        ("a device's microbatch may hold 0 tokens (its count is clamped before the reduction)"
         if any(o.target == OverrideTarget.TOKENS and o.verb == OverrideVerb.CLAMP_BEFORE_REDUCE for o in plan.overrides)
         else "every device and microbatch has >= 1 token") + "; token counts otherwise arbitrary",
        "gradient contributions and squared norms arbitrary",
    ) + tuple(f"loss term {t}: >= 1 sequence per device and microbatch, sequence counts otherwise arbitrary"
              + (" (equal, tokens[" + t + "]: equal)" if any(o.target == OverrideTarget.TOKENS and o.group == t and
                                                          o.verb == OverrideVerb.EQUAL for o in plan.overrides) else "")
              for t, o, _ in plan.model.loss_terms if o in SEQUENCE_OBJECTIVES)  # check.seqterms
    held = PlanReport(plan.name, results).fixed_sizes
    if held:  # the free sizes above, but for the obligations whose encodings hold some axes at fixed sizes
        assumed += (f"some obligations decided only at {', '.join(f'{a}={n}' for a, n in held.items())} (each "
                    "obligation's scope names the sizes it covers)",)
    if plan.unobserved:
        results = _unobserved(results, plan.unobserved)
        assumed += ("not stated by the plan: " + "; ".join(t for t, _ in plan.unobserved),)
    return PlanReport(plan.name, results, assumed, findings(results))


def _unobserved(results, facts) -> tuple[ObligationResult, ...]:
    """A plan that names facts of the step it does not state (``unobserved "..."``): what would be
    proved about the plan as written is unknown about the step, naming the facts; refutations stay
    (they hold of the part the plan states)."""
    named = "; ".join(f"{t} (line {span.line})" for t, span in facts)
    return tuple(replace(r, verdict=Verdict.UNKNOWN, location=facts[0][1],
                         reason=f"proved of the plan as written, but the step depends on facts it does not state: "
                                f"{named}") if r.verdict is Verdict.PROVED else r for r in results)


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
        if root.groups:  # a placement that some groups take: name them
            cause = f"{'group' if len(root.groups) == 1 else 'groups'} {', '.join(root.groups)}: {cause}"
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
               timeout: float = 10.0, bound: int = DEFAULT_BOUND, session: Session | None = None,
               progress: Callable[[int, int, str], None] | None = None) -> CheckReport:
    """Check the named plans (all when None) of ``spec``; raises DiagnosticError on bad input.
    ``progress(done, total, plan)`` is called before each plan is checked."""
    pinned = dict(pinned or {})
    names = plans or [p.name for p in spec.plans]
    selected = []
    for name in names:
        try:
            selected.append(spec.plan(name))
        except KeyError:
            known = ", ".join(p.name for p in spec.plans) or "none"
            raise DiagnosticError([Diagnostic(Code.UNKNOWN_PLAN, f"no plan named '{name}' (plans: {known})")]) from None
    sizes: dict[str, int] = {}
    rebound: dict[str, ir.Value] = {}
    names = {a for p in selected for a in p.mesh.names} | {steps.MICROBATCHES}
    bindings = spec.binding_map
    for k, v in pinned.items():
        if v < 1:
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set {k}={v}: sizes must be positive integers")])
        if k in names:
            sizes[k] = v
        elif k in bindings:
            rebound[k] = ir.const(v)
        else:
            known = ", ".join(sorted(names | set(bindings)))
            raise DiagnosticError([Diagnostic(Code.BAD_SET, f"--set {k}: names no mesh axis, microbatches or let "
                                                       f"symbol (known: {known})")])
    for p in selected:
        m = p.model.microbatches
        if isinstance(m, ir.Sym) and m.name in rebound:
            sizes.setdefault(steps.MICROBATCHES, int(rebound[m.name].value))
    # a pinned size or re-bound let is held to what the same value written in the file is
    check_rebinding(spec, {k: Fraction(v) for k, v in pinned.items() if k in bindings})
    if rebound:
        spec = replace(spec, bindings=tuple((k, rebound.get(k, v)) for k, v in spec.bindings))
    pinned = sizes
    sess = session or Session(timeout=timeout)
    reports = []
    for i, p in enumerate(selected):
        if progress is not None:
            progress(i, len(selected), p.name)
        reports.append(check_plan(sess, spec, p, pinned, bound))
    reports = tuple(reports)
    return CheckReport(spec.file, reports, timeout, tuple(sorted(pinned.items())))
