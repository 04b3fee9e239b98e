"""The engine's single-device memory against one GPU's allocator, at the spec's own sizes.

``placement measure`` checks plans on 2 to 64 ranks at a tiny shape, where the caching
allocator's peak is dominated by its rounding. This module answers the other question on a
machine with one GPU: at the *spec's own* dimensions (optionally fewer layers, on both sides),
does one device hold what the engine says it holds? The plan is run with every mesh axis at
size 1 (one device; every collective is a no-op), the model of ``measure.ranks.model`` is built
at the full shape in the realised byte widths (``widths.realised_widths``), and K training steps
run with the realised optimizer. Per step it reads ``torch.cuda.memory_allocated`` and
``max_memory_allocated`` at each phase boundary, and counts the bytes each state holds
(parameters, gradients, optimizer state: distinct storages) and the activations saved for
backward (``ranks.activations.SavedActivations``).

Input: a spec, a plan name, optional layers. Output: a ``DevicePeakReport`` (rows of predicted
against measured bytes, exact integers) rendered as Markdown. The persistent states are compared
exactly (status ``match`` or ``differs``); the allocator's peaks are ``reported`` beside the
engine's peak with their difference: they also hold the allocator's block rounding, the
library's workspaces and the optimizer's temporaries, which the engine counts only where its
transient terms say so.

Runs as ``python -m placement_logic.measure.device_peak SPEC --plan NAME [--layers L] [--steps K]``.
Needs the torch extra and, for the allocator rows, a CUDA device (on CPU the allocator rows are
``not available`` and the rest runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from .. import ir
from .eager_rows import EAGER_COUNTS
from .report import RowStatus
from .shape import ShapeError, TinyShape, value_of


class Unrealised(Exception):
    """What the full-scale run does not build, named."""


def full_shape(plan: ir.Plan, bindings, layers: int | None = None) -> TinyShape:
    """The plan's transformer at its own dimensions (``layers`` replacing its layer count when given)."""
    tf = plan.model.transformer
    if tf is None:
        raise Unrealised("the model states no transformer shape")

    def num(v, what: str) -> int:
        try:
            x = value_of(v, bindings)
        except ShapeError as exc:
            raise Unrealised(f"{what} has no value: {exc}") from None
        if x.denominator != 1 or x < 1:
            raise Unrealised(f"{what} = {x} is not a positive integer")
        return int(x)

    try:
        experts = int(value_of(tf.experts, bindings)) if tf.experts is not None else 1
    except ShapeError:
        experts = 1
    if experts > 1:
        raise Unrealised("a mixture of experts (the full-scale run builds dense blocks only)")
    hidden, heads = num(tf.hidden, "hidden"), num(tf.heads, "heads")
    if hidden % heads:
        raise Unrealised(f"hidden {hidden} is not a multiple of heads {heads}")
    kv = num(tf.kv_heads, "kv_heads") if tf.kv_heads is not None else heads
    model = plan.model
    micro = num(model.microbatches, "microbatches") if model.microbatches is not None else 1
    return TinyShape(
        hidden=hidden, layers=layers if layers is not None else num(tf.layers, "layers"), heads=heads, kv_heads=kv,
        ffn=num(tf.ffn, "ffn") if tf.ffn is not None else 4 * hidden, vocab=num(tf.vocab, "vocab"),
        seq=num(model.seq, "seq"), microbatch=num(model.microbatch, "microbatch"),
        tied_embeddings=bool(tf.tied_embeddings), gated_mlp=bool(tf.gated_mlp), norm=tf.norm or "layernorm",
        bias=bool(tf.bias), qkv_bias=tf.qkv_bias, groups=1, microbatches=micro)


@dataclass(frozen=True)
class Row:
    what: str
    predicted: Fraction | None
    measured: int | None
    status: RowStatus  # match | differs | reported

    @property
    def difference(self) -> Fraction | None:
        if self.predicted is None or self.measured is None:
            return None
        return self.measured - self.predicted


@dataclass
class DevicePeakReport:
    spec: str
    plan: str
    shape: dict
    widths: dict
    device: str
    steps: int
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timing: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(r.status is RowStatus.DIFFERS for r in self.rows)


def _gib(n) -> str:
    return f"{float(n) / 2**30:.3f} GiB"


def render(report: DevicePeakReport) -> str:
    out = [f"## {report.spec} — plan `{report.plan}` on one device ({report.device})", "",
           "shape: " + ", ".join(f"{k} {v}" for k, v in report.shape.items()),
           "widths: " + ", ".join(f"{k} {v}" for k, v in report.widths.items()) + f"; {report.steps} steps", "",
           "| quantity | engine (bytes) | measured (bytes) | measured − engine | status |", "|---|---:|---:|---:|---|"]
    for r in report.rows:
        pred = "—" if r.predicted is None else f"{r.predicted} ({_gib(r.predicted)})"
        meas = "—" if r.measured is None else f"{r.measured} ({_gib(r.measured)})"
        diff = r.difference
        d = "—" if diff is None else f"{'+' if diff >= 0 else ''}{diff} ({100 * float(diff) / float(r.predicted or 1):+.2f} %)"
        out.append(f"| {r.what} | {pred} | {meas} | {d} | {r.status} |")
    out += [""] + [f"- {n}" for n in report.notes]
    return "\n".join(out) + "\n"


def plan_named(spec: ir.Spec, plan_name: str) -> ir.Plan:
    plan = next((p for p in spec.plans if p.name == plan_name), None)
    if plan is None:
        raise Unrealised(f"no plan '{plan_name}' (plans: {', '.join(p.name for p in spec.plans)})")
    return plan


def prepare(spec: ir.Spec, plan_name: str, layers: int | None, cuda: bool = False):
    """(plan, shape, widths, prediction) for ``plan_name`` on one device: every mesh axis at size 1.
    Under an eager count the prediction counts the kernels of the device that runs
    (``pytorch_eager_cuda`` on CUDA, ``pytorch_eager`` on the CPU: docs/costs.md, "Conventions")."""
    from .predict import predict
    from .widths import realised_widths

    plan = plan_named(spec, plan_name)
    if plan.model.activation_count in EAGER_COUNTS:
        plan = dataclasses.replace(plan, model=dataclasses.replace(
            plan.model, activation_count=EAGER_COUNTS[1] if cuda else EAGER_COUNTS[0]))
    from .verdict import run_bindings

    sizes = {a: 1 for a in plan.mesh.names}
    bindings = run_bindings(spec, sizes)
    shape = full_shape(plan, bindings, layers)
    widths = realised_widths(plan.model, bindings)
    if isinstance(widths, str):
        raise Unrealised(widths)
    pred = predict(spec, plan, shape, sizes, widths.optimizer, widths.as_dict())
    return plan, shape, widths, pred


def engine_step_seconds(spec: ir.Spec, plan: ir.Plan, shape: TinyShape, widths, device: str) -> Fraction | None:
    """The engine's step time (docs/time.md) of ``plan`` on one catalogue ``device`` at ``shape``:
    every axis at size 1, one microbatch per step as the run takes it; None where it is not a number."""
    from .. import costs
    from ..costs import steptime
    from ..costs.extrema import exact_at
    from ..costs.symbolic import resolve_bindings
    from .predict import scaled_plan

    sizes = {a: 1 for a in plan.mesh.names}
    sized = scaled_plan(plan, shape, sizes, widths.optimizer, widths.as_dict())
    pc = costs.derive(sized, sized=True)
    hwr = steptime.catalogue_hardware(pc.plan, device, pc.plan.mesh.hardware)
    st = steptime.step_time(pc, hwr) if hwr is not None else None
    if st is None:
        return None
    subs = resolve_bindings(spec.bindings, overrides={k: Fraction(v) for k, v in sizes.items()})
    try:
        value = st.step.xreplace(subs)
        return Fraction(int(value.p), int(value.q)) if value.is_Rational else Fraction(exact_at(value, {}))
    except Exception:  # a form the exact evaluator does not take: reported as not available
        return None


def run(spec_path: str, plan_name: str, layers: int | None = None, steps: int = 3, seed: int = 0,
        timed: int = 0, catalogue: str | None = None) -> DevicePeakReport:
    from ..frontend.loader import load_spec
    from .session import require_torch

    spec = load_spec(spec_path)  # the file's diagnostics and an unknown plan come first, with or without torch
    plan_named(spec, plan_name)
    require_torch()
    import torch

    from .ranks import model as tiny
    from .ranks.activations import SavedActivations
    from .ranks.common import make_training_optimizer, param_dtype
    from .ranks.training import _batch, _loss_sum, held_bytes, tokens_of

    cuda = torch.cuda.is_available()
    plan, shape, widths, pred = prepare(spec, plan_name, layers, cuda)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    report = DevicePeakReport(spec_path, plan_name, dataclasses.asdict(shape) | {"params": shape.param_count()},
                              {"params/grads": widths.params, "optimizer": widths.optimizer,
                               "master copy": widths.master_copy},
                              torch.cuda.get_device_name(0) if cuda else "cpu", steps)
    torch.manual_seed(seed)
    m = tiny.build(shape, seed).to(device, param_dtype(widths.params))
    opt = make_training_optimizer(widths.optimizer, m.parameters(), widths.master_copy)
    mb, micro = shape.microbatch, shape.microbatches
    phases: dict[str, int] = {}
    saved = SavedActivations()
    held = None
    baseline = int(torch.cuda.memory_allocated(device)) if cuda else None
    for step in range(steps):
        x, y = _batch(shape, mb * micro, seed, step)
        x, y = x.to(device), y.to(device)
        norm = tokens_of(y)
        last = step == steps - 1
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        for k in range(micro):
            with saved.recording(m) if last and k == 0 else _null():
                loss = _loss_sum(m(x[k * mb:(k + 1) * mb]), y[k * mb:(k + 1) * mb]) / norm
            loss.backward()
            del loss
        if cuda and last:
            torch.cuda.synchronize(device)
            phases["forward and backward peak"] = int(torch.cuda.max_memory_allocated(device))
            phases["after backward"] = int(torch.cuda.memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
        opt.step()
        if cuda and last:
            torch.cuda.synchronize(device)
            phases["optimizer step peak"] = int(torch.cuda.max_memory_allocated(device))
            phases["after the step"] = int(torch.cuda.memory_allocated(device))
        if last:
            held = held_bytes(list(m.parameters()), opt.state)
        opt.zero_grad()
        del x, y
    times = []
    for step in range(timed):  # timed steps: no hooks, no allocator statistics read
        x, y = _batch(shape, mb * micro, seed, steps + step)
        x, y = x.to(device), y.to(device)
        norm = tokens_of(y)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for k in range(micro):
            loss = _loss_sum(m(x[k * mb:(k + 1) * mb]), y[k * mb:(k + 1) * mb]) / norm
            loss.backward()
            del loss
        opt.step()
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    if times:
        ordered = sorted(times)
        median = ordered[len(ordered) // 2]
        engine = engine_step_seconds(spec, plan, shape, widths, catalogue) if catalogue else None
        report.notes.append(f"step time over {len(times)} timed steps (after {steps} untimed): median "
                            f"{median * 1e3:.2f} ms, min {ordered[0] * 1e3:.2f} ms, max {ordered[-1] * 1e3:.2f} ms"
                            + (f"; the engine on `{catalogue}`: {float(engine) * 1e3:.2f} ms "
                               f"(measured / engine = {median / float(engine):.3f})" if engine else ""))
        report.timing = {"median_s": median, "min_s": ordered[0], "max_s": ordered[-1],
                         "engine_s": None if engine is None else str(engine), "catalogue": catalogue}
    act = saved.bytes()
    states = pred.states
    for key in ("params", "grads", "optimizer"):
        got = held[key][0]
        report.rows.append(Row(f"{key} (distinct storages)", states[key], got,
                               RowStatus.MATCH if states[key] == got else RowStatus.DIFFERS))
    persistent = sum(states.values(), Fraction(0))
    if pred.activations_per_layer is not None:
        predicted_act = pred.activations_per_layer * shape.layers + pred.activations_outside
        saved_total = sum(act.values())
        report.rows.append(Row(f"saved activations, one microbatch ({plan.model.activation_count})", predicted_act, saved_total,
                               RowStatus.MATCH if predicted_act == saved_total else RowStatus.DIFFERS))
    counters = held["optimizer_step_counters"][0]
    if counters:
        report.notes.append(f"the optimizer's step counters hold {counters} bytes (one scalar per parameter tensor), "
                            "outside the engine's per-parameter optimizer width")
    if pred.device_peak is not None and pred.activations_per_layer is not None:
        report.notes.append(f"the engine's peak = persistent states {persistent} + saved activations "
                            f"{predicted_act} + transients {pred.device_peak - persistent - predicted_act}")
    if cuda:
        report.rows.append(Row("allocated after the step, before zero_grad (persistent states)", persistent,
                               phases["after the step"], RowStatus.REPORTED))
        report.rows.append(Row("allocator peak, forward and backward", pred.device_peak,
                               phases["forward and backward peak"], RowStatus.REPORTED))
        report.rows.append(Row("allocator peak, optimizer step", pred.device_peak, phases["optimizer step peak"],
                               RowStatus.REPORTED))
        report.notes.append(f"before the first step the allocator held {baseline} bytes (the model and nothing "
                            "else); the peaks are over the last step, reset before it and before its optimizer step")
    else:
        report.notes.append("allocator peak: not available (no CUDA device; CPU tensors have no allocator statistics)")
    report.notes.append(f"saved activations by kind: {json.dumps(act)}")
    return report


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m placement_logic.measure.device_peak",
                                 description="the engine's single-device memory against one device at the spec's sizes")
    ap.add_argument("file")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--layers", type=int, default=None, help="layers on both sides (default: the spec's)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--time", type=int, default=0, metavar="K", help="time K further steps")
    ap.add_argument("--catalogue-device", default=None, metavar="NAME",
                    help="the catalogue device whose engine step time is set beside the timed steps (e.g. h100_sxm)")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    from ..diagnostics import DiagnosticError
    from ..snippets import render as render_diagnostic

    if args.json and Path(args.json).resolve() == Path(args.file).resolve():
        sys.stderr.write(f"error: --json {args.json} would replace the input\n")
        return 2
    try:
        report = run(args.file, args.plan, args.layers, args.steps, timed=args.time,
                     catalogue=args.catalogue_device)
    except DiagnosticError as exc:
        try:
            source = Path(args.file).read_text()
        except OSError:
            source = None
        for diag in exc.diagnostics:
            sys.stderr.write(render_diagnostic(diag, source) + "\n")
        return 2
    except Unrealised as exc:
        sys.stderr.write(f"{args.file}: plan '{args.plan}' unrealised: {exc}\n")
        return 4
    sys.stdout.write(render(report))
    if args.json:
        rows = [{"what": r.what, "predicted": None if r.predicted is None else str(r.predicted),
                 "measured": r.measured, "status": r.status.value} for r in report.rows]
        from ..atomic import write_atomic

        write_atomic(args.json, json.dumps({"spec": report.spec, "plan": report.plan, "device": report.device,
                                            "shape": report.shape, "rows": rows, "notes": report.notes,
                                            "timing": report.timing}, indent=1, default=str))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
