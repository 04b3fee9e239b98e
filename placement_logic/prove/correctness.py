"""The correctness theorem: GI ∧ SC ⇒ equivalence with single-device training, and
neither condition can be dropped.

Input: the checker's step model (``check.steps``) and its verdicts (``check.run``).
Output: obligations —

* sufficiency: in the step semantics of one parameter element (a deterministic update
  rule U and clip-coefficient rule C left uninterpreted; a device either runs the update
  on its own inputs or receives the owner's result through the re-gather, else keeps a
  stale copy), the conditions the checker calls GI and SC imply that every device ends
  the step with the single-device value. Proved for every U and C;
* necessity of GI: a plan whose SC obligations the checker proves but whose GI it
  refutes (DDP with a per-device-mean loss), with data found by the solver on which one
  SGD step differs from single-device training (``stepsem``);
* necessity of SC: a plan whose GI the checker proves but whose SC it refutes (ZeRO-1
  without the parameter re-gather), likewise.

Witnesses are replayed in exact Fractions by the same ``stepsem`` code.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import z3

from ..check import run as check_run
from ..check import steps
from ..check.plan import PlanChecker
from ..check.report import Verdict
from ..check.rules import GRADIENT_INTEGRITY, STATE_CONSISTENCY
from ..check.values import fold, resolver
from ..frontend.loader import load_string
from ..solver.query import Obligation, Query
from ..solver.session import Session
from . import stepsem
from .symbolic_ob import model_value

THEOREM = "Correctness"

SUFFICIENCY_STATEMENT = """\
∀ U, C (deterministic update and clip rules), ∀ θ, θ_d, θ_o, g*, ĝ_d, ĝ_o, ν*, ν_d, ν_o, f*, f_d, f_o, own_d, rg_d:
  GI:  (own_d ⇒ ĝ_d = g*) ∧ ĝ_o = g*
  SC:  θ_d = θ ∧ θ_o = θ ∧ (own_d ⇒ ν_d = ν* ∧ f_d = f*) ∧ ν_o = ν* ∧ f_o = f* ∧ (own_d ∨ rg_d)
  ⇒ θ'_d = θ'*,  where step(θ, g, ν, f) = if f then θ else U(θ, g, C(ν)),
  θ'* = step(θ, g*, ν*, f*),  θ'_d = if own_d then step(θ_d, ĝ_d, ν_d, f_d) else if rg_d then step(θ_o, ĝ_o, ν_o, f_o) else θ_d"""


def sufficiency() -> Obligation:
    def build(ctx: z3.Context) -> Query:
        R, B = z3.RealSort(ctx), z3.BoolSort(ctx)
        U = z3.Function("U", R, R, R, R)
        C = z3.Function("C", R, R)
        r = {n: z3.Real(n, ctx) for n in ("theta", "theta_d", "theta_o", "g_star", "g_d", "g_o",
                                           "nu_star", "nu_d", "nu_o")}
        b = {n: z3.Bool(n, ctx) for n in ("f_star", "f_d", "f_o", "own_d", "rg_d")}

        def step(theta, g, nu, f):
            return z3.If(f, theta, U(theta, g, C(nu)))

        ref = step(r["theta"], r["g_star"], r["nu_star"], b["f_star"])
        mine = z3.If(b["own_d"], step(r["theta_d"], r["g_d"], r["nu_d"], b["f_d"]),
                     z3.If(b["rg_d"], step(r["theta_o"], r["g_o"], r["nu_o"], b["f_o"]), r["theta_d"]))
        gi = z3.And(z3.Implies(b["own_d"], r["g_d"] == r["g_star"]), r["g_o"] == r["g_star"])
        sc = z3.And(r["theta_d"] == r["theta"], r["theta_o"] == r["theta"],
                    z3.Implies(b["own_d"], z3.And(r["nu_d"] == r["nu_star"], b["f_d"] == b["f_star"])),
                    r["nu_o"] == r["nu_star"], b["f_o"] == b["f_star"], z3.Or(b["own_d"], b["rg_d"]))
        _ = B
        return Query([gi, sc, mine != ref])

    return Obligation("correctness/sufficiency", THEOREM, "GI ∧ SC ⇒ equivalence (every update rule U)",
                      SUFFICIENCY_STATEMENT, Verdict.PROVED, build,
                      "step semantics of one element; GI and SC as the checker's obligations state them")


# --------------------------------------------------------------------------- necessity


@dataclass(frozen=True)
class Witness:
    key: str
    drop: str  # the condition shown necessary
    keep: str  # the condition the plan satisfies
    text: str
    how: str
    counts: int | None = None  # token count per device, or None: chosen by the solver (1..4)


_MODEL = "model {\n  params = 1000\n  microbatches = 2\n}\nmesh {\n  dp = 2\n}\n"
WITNESSES = (
    Witness("correctness/gi-necessary", GRADIENT_INTEGRITY, STATE_CONSISTENCY,
            "from std.data import ddp\n" + _MODEL + "plan p {\n  dp: ddp\n  override loss: per_device_mean\n}\n",
            "DDP whose loss is each device's own token mean (a mean of means)"),
    Witness("correctness/sc-necessary", STATE_CONSISTENCY, GRADIENT_INTEGRITY,
            "from std.data import zero1\n" + _MODEL + "plan p {\n  dp: zero1\n  override params: no_regather\n}\n",
            "ZeRO-1 that never all-gathers the updated parameters after the sharded optimizer step", counts=1),
)
SIZES = {"dp": 2, steps.MICROBATCHES: 2}


def _frac_value(spec, sizes):
    leaf = resolver(spec.binding_map, {k: Fraction(v) for k, v in sizes.items()})
    return lambda v: fold(v, leaf)


def necessity(sess: Session) -> list[Obligation]:
    obs = []
    for w in WITNESSES:
        spec = load_string(w.text, f"<{w.key}>")
        plan = spec.plan("p")
        report = check_run.check_plan(sess, spec, plan, {})
        by_cond: dict[str, list[str]] = {}
        for o in report.obligations:
            if o.condition in (GRADIENT_INTEGRITY, STATE_CONSISTENCY):
                by_cond.setdefault(o.condition, []).append(f"{o.name}: {o.verdict.word}")
        keep_ok = all(o.verdict is Verdict.PROVED for o in report.obligations if o.condition == w.keep)
        drop_refuted = any(o.verdict is Verdict.REFUTED for o in report.obligations if o.condition == w.drop)
        short = {GRADIENT_INTEGRITY: "GI", STATE_CONSISTENCY: "SC"}
        detail = (
            ("plan", w.how),
            (f"checker, {short[w.keep]}", "all proved" if keep_ok else "; ".join(by_cond.get(w.keep, []))),
            (f"checker, {short[w.drop]}", "refuted" if drop_refuted else "not refuted"),
        )
        step = PlanChecker(spec, plan).step
        obs.append(Obligation(
            w.key, THEOREM, f"{short[w.drop]} is necessary: {short[w.keep]} alone does not give equivalence",
            f"statement refuted: the plan ({w.how}), which satisfies {short[w.keep]}, is equivalent to "
            f"single-device training under one SGD step θ' = θ − ĝ, at sizes dp = 2, microbatches = 2",
            Verdict.REFUTED, _witness_query(spec, step, w.counts), "checker step model (check.steps) + stepsem", detail))
    return obs


def _witness_query(spec, step: steps.StepModel, fixed: int | None, at: dict[str, int] | None = None):
    """The query of a witness: data on which one SGD step of ``step``'s dense group differs from
    single-device training, at the sizes ``at`` (``SIZES`` unless given)."""
    g = step.group("dense")
    sizes = dict(SIZES if at is None else at)

    def run(counts, contrib, theta, zero, value):
        dims, cells = stepsem.grid(g, sizes)
        div = stepsem.divisor_of(g, sizes, value)
        mine = stepsem.device_gradient(g, sizes, counts, contrib, div, zero)
        ref = stepsem.global_gradient(cells, counts, contrib, zero)
        stale = stepsem.stale_axes(step, sizes)
        owner_after = theta - mine
        replica_after = theta if stale else owner_after  # a non-owner replica along a stale axis
        return mine, ref, owner_after, replica_after, theta - ref, stale

    def build(ctx: z3.Context) -> Query:
        dims, cells = stepsem.grid(g, sizes)
        counts = {c: z3.Int("N_" + "_".join(map(str, c)), ctx) for c in cells}
        contrib = {c: z3.Real("X_" + "_".join(map(str, c)), ctx) for c in cells}
        theta = z3.Real("theta", ctx)
        zero = z3.RealVal(0, ctx)
        rcounts = {c: z3.ToReal(v) for c, v in counts.items()}
        leaf = resolver(spec.binding_map, {k: z3.RealVal(v, ctx) for k, v in sizes.items()})
        mine, ref, owner_after, replica_after, ref_after, _ = run(
            rcounts, contrib, theta, zero, lambda v: fold(v, leaf, const=lambda q: z3.RealVal(str(q), ctx)))
        cons = [v >= 1 for v in counts.values()] + [v <= 4 for v in counts.values()]
        if fixed is not None:
            cons += [v == fixed for v in counts.values()]
        cons.append(z3.Or(owner_after != ref_after, replica_after != ref_after))

        def values(model):
            n = {c: model_value(model, v) for c, v in counts.items()}
            x = {c: model_value(model, v) for c, v in contrib.items()}
            return n, x, model_value(model, theta)

        def replay_numbers(model):
            n, x, th = values(model)
            fv = _frac_value(spec, sizes)
            return run(n, x, th, Fraction(0), fv)

        def explain(model: Any) -> tuple[tuple[str, str], ...]:
            n, x, th = values(model)
            mine_v, ref_v, own_v, rep_v, ref_after_v, stale = replay_numbers(model)
            names = [d.name for d in dims]
            cell = lambda c: "(" + ", ".join(f"{a}={i}" for a, i in zip(names, c)) + ")"
            rows = [("sizes", ", ".join(f"{k}={v}" for k, v in sizes.items()))]
            rows.append(("token counts", "; ".join(f"{cell(c)}: {n[c]}" for c in cells)))
            rows.append(("gradient sums", "; ".join(f"{cell(c)}: {_t(x[c])}" for c in cells)))
            rows.append(("θ before", _t(th)))
            rows.append(("gradient used", f"{_t(mine_v)} (single device: {_t(ref_v)})"))
            rows.append(("θ after, single device", _t(ref_after_v)))
            rows.append(("θ after, updating device", _t(own_v)))
            if stale:
                rows.append((f"θ after, replica across {', '.join(stale)}", f"{_t(rep_v)} (never re-gathered)"))
            return tuple(rows)

        def replay(model: Any) -> str | None:
            _, _, own_v, rep_v, ref_after_v, _ = replay_numbers(model)
            if own_v == ref_after_v and rep_v == ref_after_v:
                return "in exact arithmetic every device ends with the single-device value"
            return None

        return Query(cons, explain, replay)

    return build


def _t(x) -> str:
    if isinstance(x, Fraction):
        return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
    return str(x)
