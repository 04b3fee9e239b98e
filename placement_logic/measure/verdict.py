"""What a measured run is compared with besides the engine: the spec's bindings at the run's sizes and the
checker's verdict there (``measure.session`` and ``measure.optimizer_muon`` read both)."""

from __future__ import annotations

from .. import ir
from ..outcome import Verdict
from .report import CheckerView, CounterexampleView


def run_bindings(spec: ir.Spec, sizes: dict[str, int]) -> dict[str, ir.Value]:
    b = spec.binding_map
    b.update({a: ir.const(n) for a, n in sizes.items()})
    return b


def checker_view(spec: ir.Spec, plan: str, sizes: dict[str, int]) -> CheckerView:
    """The checker's verdict at the run's sizes, or ``available=False`` without the checker."""
    try:
        from ..check.run import check_spec
    except ImportError:
        return CheckerView(False)
    report = check_spec(spec, [plan], pinned=dict(sizes))
    pr = report.plans[0]
    summary, full = [], []
    for o in pr.obligations:
        if o.verdict is Verdict.REFUTED:
            line = f"{o.name}: refuted"
            cex = o.counterexample
            if cex is not None:
                line += f" — {cex.equation}"
                summary.extend([line] + [f"  {d}" for d in cex.diagnosis])
                full.append(CounterexampleView(o.name, tuple(cex.sizes), tuple(cex.devices) + tuple(cex.values),
                                               cex.equation, tuple(cex.diagnosis), cex.command,
                                               tuple(cex.notes)))
                continue
            summary.append(line)
    return CheckerView(True, pr.verdict.word, tuple(summary), tuple(full))
