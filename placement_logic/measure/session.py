"""Measure plans end to end: spec in, ``MeasureReport``s out.

Input: an ``ir.Spec``, plan names, a device count and a step count. Output: one
``MeasureReport`` per plan. Steps: choose the mesh sizes (``mesh_sizes``), decide the
realisation (``realise``), scale the model down (``shape``), ask the cost engine
(``predict``), run every realisable plan in one launch of ranks (``runner``), compare
(``compare``) and, when the checker is installed, attach its verdict for the same sizes.
Torch is imported only by the launched ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..outcome import Verdict
from .compare import SETUP, compare, peak_note
from .job import Job
from .predict import Prediction, UnboundPrediction, predict
from .realise import Realisation, Unrealised, realise, widths_of
from .report import DTYPE_NAMES, GRAD_TOLERANCES, TOLERANCES, MeasureReport, Outcome, RowStatus
from .runner import LaunchError, launch
from .shape import ShapeError, TinyShape, scale_down
from .verdict import checker_view, run_bindings
from .widths import DTYPES

DEFAULT_STEPS = 3


def require_torch() -> None:
    """PL601 unless torch can be imported by the ranks (checked without importing it)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise DiagnosticError([Diagnostic(
            Code.TORCH_MISSING, "placement measure needs PyTorch to run a plan: pip install '.[torch]' in a clone of placement-logic")])


def mesh_sizes(plan: ir.Plan, devices: int | None, pinned: Mapping[str, int] | None = None) -> dict[str, int]:
    """Axis sizes of the run: one axis takes all devices; k axes take 2 each (2^k devices).
    ``pinned`` (``--set AXIS=N``) gives an axis of the plan its size instead; every axis runs
    with at least 2 devices, and ``--devices``, when given too, must be the product."""
    names = plan.mesh.names
    pinned = {a: int(n) for a, n in (pinned or {}).items() if a in names}
    for a, n in pinned.items():
        if n < 2:
            raise DiagnosticError([Diagnostic(Code.BAD_DEVICES, f"--set {a}={n}: a measurement needs at least 2 devices on "
                                              "each axis", plan.span)])
    if len(names) == 1:
        n = pinned.get(names[0], devices if devices is not None else 2)
        if devices is not None and devices != n:
            raise DiagnosticError([Diagnostic(Code.BAD_DEVICES, f"--devices {devices} and --set {names[0]}={n} disagree: the "
                                              f"mesh of plan '{plan.name}' has one axis, run with {n} devices",
                                              plan.span)])
        if n < 2:
            raise DiagnosticError([Diagnostic(Code.BAD_DEVICES, f"--devices {n}: a measurement needs at least 2 devices", plan.span)])
        return {names[0]: n}
    sizes = {a: pinned.get(a, 2) for a in names}
    want = 1
    for n in sizes.values():
        want *= n
    if devices is not None and devices != want:
        each = "each run with 2 devices" if not pinned else \
            "run with " + ", ".join(f"{a}={n}" for a, n in sizes.items())
        raise DiagnosticError([Diagnostic(
            Code.BAD_DEVICES, f"--devices {devices}: the mesh of plan '{plan.name}' has {len(names)} axes, {each}, "
            f"so it needs {want}", plan.span)])
    return sizes


@dataclass(frozen=True)
class Prepared:
    plan: ir.Plan
    realisation: Realisation
    shape: TinyShape
    prediction: Prediction


def prepare(spec: ir.Spec, name: str, devices: int | None = None, steps: int = DEFAULT_STEPS,
            pinned: Mapping[str, int] | None = None) -> Prepared | MeasureReport:
    """Everything decided before a run for one plan: its realisation, tiny shape and prediction, or
    the report of a plan that cannot run (unrealised, or no numeric prediction). ``pinned``:
    axis sizes given on the command line (``mesh_sizes``)."""
    try:
        plan = spec.plan(name)
    except KeyError:
        known = ", ".join(p.name for p in spec.plans) or "none"
        raise DiagnosticError([Diagnostic(Code.UNKNOWN_PLAN, f"no plan named '{name}' (plans: {known})")]) from None
    sizes = mesh_sizes(plan, devices, pinned)
    mesh = tuple((a, sizes[a]) for a in plan.mesh.names)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    if isinstance(r, Unrealised):
        return MeasureReport(spec.file, name, Outcome.UNREALISED, mesh, steps, reasons=r.reasons)
    try:
        shape = scale_down(plan, run_bindings(spec, sizes), sizes, r.tensor_axis, r.stages, r.chunks, r.expert_axis)
        prediction = predict(spec, plan, shape, sizes, r.optimizer, widths_of(r))
    except (ShapeError, UnboundPrediction) as exc:
        return MeasureReport(spec.file, name, Outcome.UNREALISED, mesh, steps, implementation=r.implementation,
                             reasons=(f"no numeric prediction for the scaled-down run: {exc}",))
    return Prepared(plan, r, shape, prediction)


def measure(spec: ir.Spec, plans: list[str], devices: int | None = None, steps: int = DEFAULT_STEPS,
            launcher: Callable = launch, with_checker: bool = True,
            progress: Callable[[int, int, str], None] | None = None,
            pinned: Mapping[str, int] | None = None) -> list[MeasureReport]:
    """Measure the named plans of one spec; ``pinned``: axis sizes to run at (``mesh_sizes``)."""
    return measure_many([(spec, name) for name in plans], devices, steps, launcher, with_checker, progress, pinned)


def measure_many(items: list[tuple[ir.Spec, str]], devices: int | None = None, steps: int = DEFAULT_STEPS,
                 launcher: Callable = launch, with_checker: bool = True,
                 progress: Callable[[int, int, str], None] | None = None,
                 pinned: Mapping[str, int] | None = None) -> list[MeasureReport]:
    """Measure (spec, plan) pairs; plans of the same world size share one launch of ranks.
    ``progress(done, total, what)`` is called as each plan is prepared, launched and compared
    (two steps a plan)."""
    total, done = 2 * len(items), 0

    def tick(n: int, what: str) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total, what)

    if steps < 1:
        raise DiagnosticError([Diagnostic(Code.BAD_STEPS, f"--steps {steps}: at least one step is needed")])
    reports: dict[int, MeasureReport] = {}  # by the item's index: two specs may share a file name
    prepared: dict[int, list[tuple[int, ir.Spec, Prepared]]] = {}
    for i, (spec, name) in enumerate(items):
        tick(0, f"preparing {name}")
        muon = _matrix_wise(spec, name, devices, steps, with_checker, pinned)
        if muon is not None:
            reports[i] = muon
            tick(2, f"{name} done")
            continue
        p = prepare(spec, name, devices, steps, pinned)
        if isinstance(p, MeasureReport):
            reports[i] = p
            tick(2, f"{name}: not realisable" if not p.implementation else f"{name}: no prediction")
        else:
            prepared.setdefault(p.realisation.world, []).append((i, spec, p))
            tick(1, f"{name} prepared")
    if prepared:
        require_torch()
    for world, group in prepared.items():
        jobs = [Job(f"job{i}", p.realisation, p.shape, steps) for i, (_, _, p) in enumerate(group)]
        tick(0, f"running {world} ranks: " + ", ".join(p.plan.name for _, _, p in group))
        try:
            results = launcher(jobs, world)
        except LaunchError as exc:
            for i, spec, p in group:
                reports[i] = MeasureReport(
                    spec.file, p.plan.name, Outcome.FAILED, p.realisation.mesh, steps,
                    implementation=p.realisation.implementation, reasons=(str(exc),))
            tick(len(group), "launch failed")
            continue
        for job, (i, spec, p) in zip(jobs, group):
            tick(0, f"comparing {p.plan.name}")
            reports[i] = _report(spec, p, results[job.key], steps, with_checker)
            tick(1, f"{p.plan.name} done")
    return [reports[i] for i in range(len(items))]


def _matrix_wise(spec: ir.Spec, name: str, devices: int | None, steps: int, with_checker: bool,
                 pinned: Mapping[str, int] | None) -> MeasureReport | None:
    """A plan with a matrix-wise optimizer runs as measure.optimizer_muon realises it (None: any other plan)."""
    from . import optimizer_muon

    plan = next((p for p in spec.plans if p.name == name), None)
    if plan is None or not optimizer_muon.applies(plan):
        return None
    sizes = mesh_sizes(plan, devices, pinned)
    if isinstance(optimizer_muon.scheme(plan), tuple):
        require_torch()
    return optimizer_muon.measure(spec, plan, sizes, steps, with_checker)


def _report(spec: ir.Spec, p: Prepared, results: list[dict], steps: int, with_checker: bool) -> MeasureReport:
    r = p.realisation
    base = dict(file=spec.file, plan=p.plan.name, mesh=r.mesh, steps=steps, implementation=r.implementation,
                prediction_source=p.prediction.source, shape=tuple(p.shape.as_dict().items()),
                approximations=r.approximations)
    errors = [f"rank {res['rank']}: {res['error']}" for res in results if "error" in res]
    if errors:
        return MeasureReport(outcome=Outcome.FAILED, reasons=tuple(errors), **base)
    rows, eq = compare(p.prediction, r, results, p.shape)
    checker = checker_view(spec, p.plan.name, r.sizes) if with_checker else None
    if not eq.within:
        outcome = Outcome.DIVERGED
    elif any(row.status == RowStatus.DIFFERS for row in rows):
        outcome = Outcome.MISMATCH
    else:
        outcome = Outcome.MATCHED
    reasons: tuple[str, ...] = ()
    if outcome is Outcome.MATCHED and checker is not None and checker.available and checker.verdict == Verdict.REFUTED.word:
        # the run agreed with single-device training and with the prediction, but the checker refutes the plan at
        # these very sizes: the run did not exercise the failure, or did not run what the spec says
        outcome = Outcome.MISMATCH
        found = "; ".join(checker.summary[:2]) or "an obligation refuted"
        reasons = (f"the checker refutes this plan at the run's sizes ({found}), yet the run stayed within "
                   "tolerance of single-device training: the run did not exercise the failure (for example equal "
                   "token counts on every rank) or did not run the plan as written; a refuted plan is never a "
                   "match",)
    notes = ((f"equivalence tolerance {TOLERANCES[r.param_bytes]:g} relative ({DTYPE_NAMES[r.param_bytes]}), "
              f"{GRAD_TOLERANCES[r.param_bytes]:g} for the first step's gradients",
              _token_note(r, results)) + _widths_note(r) + _setup_note(results)
             + peak_note(results))
    return MeasureReport(outcome=outcome, rows=tuple(rows), equivalence=eq, checker=checker, notes=notes,
                         reasons=reasons, **base)


def _widths_note(r: Realisation) -> tuple[str, ...]:
    """The byte widths that ran and were predicted, when they are not fp32 without a master copy."""
    if r.param_bytes == 4 and not r.master_copy:
        return ()
    w = widths_of(r)
    state = " + ".join(x for x in ("an fp32 master copy (4)" if r.master_copy else "",
                                   {"adam": "Adam's two fp32 moments (8)", "sgd_momentum": "an fp32 momentum (4)",
                                    "sgd": ""}[r.optimizer]) if x)
    return (f"byte widths as the spec states them, run and predicted: params {w['params']} B and grads {w['grads']} B "
            f"per element ({DTYPES[r.param_bytes]}), optimizer {w['optimizer']} B per parameter ({state})",)


def _setup_note(results: list[dict]) -> tuple[str, ...]:
    """The one-time set-up collectives (DDP's bucket rebuild), which no compared step contains."""
    seen = []
    for k, step in enumerate(results[0]["collectives"]):
        seen += [f"{rec['kind']} of {rec['bytes']} B in step {k + 1}" for rec in step if rec.get("phase") == SETUP]
    if not seen:
        return ()
    return ("one-time set-up collectives, left out of the compared step (DDP's bucket rebuild after the first "
            "backward), rank 0: " + ", ".join(seen),)


def _token_note(r: Realisation, results: list[dict]) -> str:
    """Valid (unpadded) tokens of each data-parallel rank, by step: the counts a per-device mean weighs."""
    seen: dict[int, list[int]] = {}
    for res in results:
        index = 0
        for a in r.data_axes:
            index = index * r.sizes[a] + res["coords"][a]
        seen.setdefault(index, res.get("tokens", []))
    steps = "; ".join(f"step {k + 1}: " + ", ".join(str(seen[i][k]) for i in sorted(seen))
                      for k in range(len(next(iter(seen.values())))))
    return f"valid tokens per data-parallel rank (variable-length sequences, padding masked): {steps}"
