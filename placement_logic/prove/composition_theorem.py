"""The composition theorem: safe library strategies on disjoint axes compose safely.

Input: the generated compositions of ``library_compositions`` (each already run through the
checker). Output: per family of compositions (e.g. pairs of a data and a tensor
strategy) two obligations re-decided as one query each — the composition rules CR01–CR08
hold for every member, and every member satisfies gradient integrity and state
consistency — built from the checker's own z3 encodings (``check.run.obligations``,
for-all tier). And per rule, a composition that breaks it: an expected refutation whose
witness is replayed concretely by the checker's ``replay``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable

import z3

from .. import ir
from ..check.plan import PlanChecker
from ..check.report import Verdict
from ..check.rules import RULES
from ..check.run import FORALL, SEARCH, check_plan
from ..frontend.loader import load_string
from ..solver.query import Obligation, Query
from ..solver.session import Session
from .library_compositions import MODEL, Composition

THEOREM = "Composition"


def _negations(spec: ir.Spec, plan: ir.Plan, rules: bool, ctx: z3.Context, tier=FORALL):
    """The checker's obligations of ``plan`` (rules or safety conditions) in context ``ctx``."""
    return PlanChecker(spec, plan).negations(Session(ctx=ctx), tier, rules)


def _family_query(members: list[Composition], rules: bool) -> Callable[[z3.Context], Query]:
    def build(ctx: z3.Context) -> Query:
        disjuncts, index = [], []
        for c in members:
            env, negs = _negations(c.spec, c.plan, rules, ctx)
            inner = [z3.And(*cons) for _, cons, _ in negs]
            if inner:
                disjuncts.append(z3.And(*env.side, z3.Or(*inner)))
                index.append((c, env, negs))

        def explain(model: Any) -> tuple[tuple[str, str], ...]:
            for c, env, negs in index:
                for ob, cons, _ in negs:
                    if all(z3.is_true(model.evaluate(x, model_completion=True)) for x in env.side + cons):
                        return (("composition", c.label), ("obligation", ob.name))
            return (("model", "no member composition matched"),)

        return Query([z3.Or(*disjuncts)] if disjuncts else [z3.BoolVal(False, ctx)], explain)

    return build


def family_obligations(comps: list[Composition]) -> list[Obligation]:
    fams: dict[tuple[str, tuple[str, ...]], list[Composition]] = defaultdict(list)
    for c in comps:
        if c.report is None:
            continue
        roles = tuple(sorted({r.value for _, r in (b for bd in c.plan.bindings for b in bd.roles)}))
        fams[(c.family, roles)].append(c)
    obs = []
    for (family, roles), members in sorted(fams.items()):
        fam = f"{family}: {' × '.join(roles)}"
        slug = f"composition/{family}-{'-'.join(roles)}"
        included = [c for c in members if c.rules_hold]
        excluded = [c for c in members if not c.rules_hold]
        listing = (("compositions", "; ".join(c.label for c in members)),)
        if excluded:
            listing += (("excluded (a rule is refuted)", "; ".join(c.label for c in excluded)),)
        checker = sum(1 for c in included if c.safe)
        obs.append(Obligation(
            f"{slug}-rules", THEOREM, f"{fam}: composition rules CR01–CR08 hold ({len(included)} plans)",
            f"for each of the {len(included)} compositions P in the family: CR01(P) ∧ … ∧ CR08(P), for all mesh sizes",
            Verdict.PROVED, _family_query(included, True), "checker: check.run.obligations, rules, for-all tier",
            listing))
        obs.append(Obligation(
            f"{slug}-safe", THEOREM, f"{fam}: rules hold ⇒ GI ∧ SC ({len(included)} plans)",
            f"for each composition P in the family with CR01–CR08 proved: GI(P) ∧ SC(P), for all mesh sizes "
            f"(the checker proved {checker}/{len(included)} plan by plan)",
            Verdict.PROVED, _family_query(included, False), "checker: check.run.obligations, GI and SC, for-all tier",
            listing))
    return obs


# --------------------------------------------------------------------------- broken rules


@dataclass(frozen=True)
class Breaker:
    code: str
    imports: str
    bindings: str
    overrides: str = ""
    how: str = ""
    tweak: Callable[[ir.Plan], ir.Plan] | None = None


def _extra_binding(plan: ir.Plan) -> ir.Plan:
    extra = ir.Binding("std.tensor.megatron_tp", ("x",), (("x", ir.Role.TENSOR),))
    return replace(plan, bindings=plan.bindings + (extra,))


BREAKERS = (
    Breaker("CR01", "from std.data import ddp\nfrom std.tensor import megatron_tp", "x: ddp\n  y: megatron_tp",
            how="megatron_tp also bound to x, which ddp already uses", tweak=_extra_binding),
    Breaker("CR02", "from std.data import ddp\nfrom std.tensor import megatron_tp", "x: ddp\n  y: megatron_tp",
            "override grads[dense]: reduce over (x, y)", "dense gradients also all-reduced over the tensor axis y"),
    Breaker("CR03", "from std.data import zero3\nfrom std.context import context_parallel", "x: zero3\n  y: context_parallel",
            "override params: gather over (x, y)", "params gathered over y, where they are replicated"),
    Breaker("CR04", "from std.offload import zero_infinity", "x: zero_infinity",
            "override params: no_fetch", "offloaded params never fetched to the device"),
    Breaker("CR05", "from std.data import ddp", "x: ddp",
            how="sequence parallel switched on with no tensor-parallel axis",
            tweak=lambda p: replace(p, sequence_parallel=True)),
    Breaker("CR06", "from std.data import zero2\nfrom std.pipeline import one_f_one_b", "x: zero2\n  y: one_f_one_b",
            "override grads: no_accumulation_buffer", "sharded gradients, pipeline accumulation, no accumulation buffer"),
    Breaker("CR07", "from std.data import ddp\nfrom std.expert import expert_parallel", "x: ddp\n  y: expert_parallel",
            "override grads[experts]: divide by x", "expert gradients divided by the data axis only"),
    Breaker("CR08", "from std.data import ddp\nfrom std.pipeline import one_f_one_b", "x: ddp\n  y: one_f_one_b",
            "override embedding: tie_reduce over (y, y)", "tied embedding gradient summed twice across the stages"),
)


def breaker_plan(b: Breaker) -> tuple[ir.Spec, ir.Plan]:
    axes = sorted({ln.split(":")[0].strip() for ln in b.bindings.splitlines()})
    text = (f"{b.imports}\n{MODEL}mesh {{\n" + "\n".join(f"  {a} = 2" for a in axes) + "\n}\n"
            f"plan p {{\n  {b.bindings}\n" + (f"  {b.overrides}\n" if b.overrides else "") + "}\n")
    spec = load_string(text, f"<breaks {b.code}>")
    plan = spec.plan("p")
    if b.tweak is not None:
        plan = b.tweak(plan)
        spec = replace(spec, plans=(plan,))
    return spec, plan


def breaker_obligations(sess: Session) -> list[Obligation]:
    obs = []
    for b in BREAKERS:
        spec, plan = breaker_plan(b)
        report = check_plan(sess, spec, plan, {})
        refuted = tuple(o.name.split()[0] for o in report.obligations
                        if o.condition in RULES and o.verdict is Verdict.REFUTED)
        rule = RULES[b.code]
        obs.append(Obligation(
            f"composition/breaks-{b.code}", THEOREM, f"breaking {b.code} {rule.name} is refuted",
            f"statement refuted: {rule.description}  [plan: {b.how}]",
            Verdict.REFUTED, _breaker_query(spec, plan, b.code), "checker: rule encoding, bounded tier, concrete replay",
            (("plan", b.how), ("rules the checker refutes", ", ".join(refuted) or "none"))))
    return obs


def _breaker_query(spec: ir.Spec, plan: ir.Plan, code: str) -> Callable[[z3.Context], Query]:
    tier = SEARCH[0]  # the checker's first search tier: sizes <= 2, equal token counts

    def build(ctx: z3.Context) -> Query:
        env, negs = _negations(spec, plan, True, ctx, tier)
        ob, cons, extract = next(n for n in negs if n[0].condition == code)

        def counterexample(model: Any):
            w = extract(model)
            w["sizes"] = {**w.get("sizes", {})}
            return ob.replay(w)

        def explain(model: Any) -> tuple[tuple[str, str], ...]:
            cex = counterexample(model)
            if cex is None:
                return ()
            rows = [("sizes", ", ".join(f"{k}={v}" for k, v in cex.sizes))]
            rows += list(cex.devices) + list(cex.values) + [("fails", cex.equation)]
            rows += [("diagnosis", d) for d in cex.diagnosis]
            return tuple(rows)

        def replay(model: Any) -> str | None:
            return None if counterexample(model) is not None else "the checker's concrete replay rejected the witness"

        return Query(env.side + cons, explain, replay)

    return build
