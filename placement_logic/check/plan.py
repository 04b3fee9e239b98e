"""The public per-plan checker object: one plan in, its step model, obligations and their
negations out. ``check.run`` discharges the obligations for ``placement check``;
``prove`` builds its composition theorems from the same object, so neither rebuilds the
other's setup.

``PlanChecker(spec, plan)`` holds:

- ``step``: the plan's step model (``steps.derive``: what the plan does, from its
  placements and overrides); ``derived``: the correct derivation (no overrides);
  ``loss_derived``: the correct derivation keeping the plan's loss normalisation;
- ``replay``: the concrete-replay context counterexamples are re-run in;
- ``obligations()``: the obligations with their encoders and replays;
- ``negations(sess, tier, rules=None)``: each obligation's negation as z3 constraints in a
  session, with the size terms and side constraints of the tier.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .. import ir
from . import encode as en
from . import replay as rp
from . import steps
from .obligations import Obligation, obligations
from .rules import RULES

QueryTier = Any  # run.Tier: (label, bound, int_counts, equal_counts, counts_cap)


@dataclass
class PlanChecker:
    spec: ir.Spec
    plan: ir.Plan
    pinned: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.step = steps.derive(self.plan)
        self.derived = steps.derive(self.plan, overrides=False)
        self.loss_derived = steps.derive(self.plan, overrides=False, keep=("loss",))
        self.bindings = self.spec.binding_map
        self.replay = rp.Context(self.step, self.derived, self.loss_derived, self.bindings, self.spec.file,
                                 self.pinned)

    def obligations(self) -> list[Obligation]:
        return obligations(self.step, self.derived, self.replay, self.plan)

    def env(self, sess, tier: QueryTier) -> en.Env:
        """Size terms and side constraints of one query tier in ``sess``."""
        return en.Env(sess, self.step, self.bindings, self.pinned, tier.bound, tier.int_counts,
                      tier.equal_counts or self.step.equal_tokens, counts_cap=tier.counts_cap)

    def negations(self, sess, tier: QueryTier, rules: bool | None = None
                  ) -> tuple[en.Env, list[tuple[Any, list, Callable[[Any], dict]]]]:
        """(env, [(obligation, negation constraints, witness extractor)]) for the obligations
        that are composition rules (``rules=True``), safety conditions (``False``) or all."""
        env = self.env(sess, tier)
        out = []
        for ob in self.obligations():
            if rules is not None and (ob.condition in RULES) != rules:
                continue
            cons, extract = ob.encode(env)
            out.append((ob, cons, extract))
        return env, out
