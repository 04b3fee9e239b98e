"""Compositions of library strategies, generated from the shipped library and checked.

Input: the strategy library (``loader.library_index``). Output: ``Composition`` records:
one plan per single strategy, per pair and per triple of single-axis strategies with
distinct roles bound to disjoint mesh axes, and per multi-axis strategy; each with the
checker's verdicts (``check.run.check_plan``) on every safety condition and composition
rule. Compositions the resolver rejects (e.g. two schedules) are kept with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from .. import ir
from ..check import run as check_run
from ..check.report import PlanReport, Verdict
from ..check.rules import RULES
from ..diagnostics import DiagnosticError
from ..frontend.loader import library_index, load_string
from ..ir import views
from ..solver.session import Session

AXES = ("x", "y", "z")
MODEL = """\
model {
  transformer {
    hidden = 1024
    layers = 8
    heads = 8
    ffn = 4096
    vocab = 32000
    experts = 4
    top_k = 2
    tied_embeddings = true
  }
  seq = 1024
  microbatch = 1
  microbatches = 4
}
"""


@dataclass(frozen=True)
class Strategy:
    module: str
    name: str
    arity: int
    roles: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return f"std.{self.module}.{self.name}"


@dataclass(frozen=True)
class Composition:
    family: str  # e.g. "data × tensor"
    strategies: tuple[str, ...]
    text: str  # the spec text
    plan: ir.Plan | None
    spec: ir.Spec | None
    report: PlanReport | None
    rejected: str = ""  # resolver diagnostic when the composition is not a valid plan

    @property
    def label(self) -> str:
        return " + ".join(self.strategies)

    def verdicts(self, rules: bool) -> dict[str, Verdict]:
        if self.report is None:
            return {}
        return {o.name: o.verdict for o in self.report.obligations if (o.condition in RULES) == rules}

    @property
    def rules_hold(self) -> bool:
        return self.report is not None and all(v is Verdict.PROVED for v in self.verdicts(True).values())

    @property
    def safe(self) -> bool:
        return self.report is not None and all(v is Verdict.PROVED for v in self.verdicts(False).values())


def _spec_text(bindings: list[tuple[Strategy, tuple[str, ...]]], axes: tuple[str, ...]) -> str:
    imports = sorted({(s.module, s.name) for s, _ in bindings})
    lines = [f"from std.{m} import {n}" for m, n in imports]
    lines.append(MODEL)
    lines.append("mesh {\n" + "\n".join(f"  {a} = 2" for a in axes) + "\n}")
    body = []
    for s, ax in bindings:
        target = ax[0] if len(ax) == 1 else "[" + ", ".join(ax) + "]"
        body.append(f"  {target}: {s.name}")
    lines.append("plan p {\n" + "\n".join(body) + "\n}")
    return "\n".join(lines) + "\n"


def library_strategies() -> tuple[Strategy, ...]:
    """Every library strategy that places states on axes, with its arity and roles."""
    out = []
    for module, names in library_index().items():
        for name in names:
            for arity in (1, 2, 3):
                s = Strategy(module, name, arity, ())
                text = _spec_text([(s, AXES[:arity])], AXES[:arity])
                try:
                    spec = load_string(text, f"<library: {name}>")
                except DiagnosticError:
                    continue
                plan = spec.plan("p")
                out.append(Strategy(module, name, arity, tuple(views.view(plan).role(a).value for a in AXES[:arity])))
                break
    return tuple(out)


def _compose(family: str, parts: list[Strategy], sess: Session) -> Composition:
    bindings, used = [], 0
    for s in parts:
        bindings.append((s, AXES[used:used + s.arity]))
        used += s.arity
    text = _spec_text(bindings, AXES[:used])
    names = tuple(s.name for s in parts)
    try:
        spec = load_string(text, "<composition: " + " + ".join(names) + ">")
    except DiagnosticError as exc:
        return Composition(family, names, text, None, None, None, rejected=exc.diagnostics[0].message)
    plan = spec.plan("p")
    report = check_run.check_plan(sess, spec, plan, {})
    return Composition(family, names, text, plan, spec, report)


def compositions(sess: Session) -> list[Composition]:
    """Singles, then pairs and triples of single-axis strategies with distinct roles."""
    lib = library_strategies()
    single_axis = [s for s in lib if s.arity == 1]
    out = [_compose("single", [s], sess) for s in lib]
    for k, fam in ((2, "pairs"), (3, "triples")):
        for combo in combinations(single_axis, k):
            roles = [s.roles[0] for s in combo]
            if len(set(roles)) == k:
                out.append(_compose(fam, list(combo), sess))
    return out
