"""Operations on a partial activation: the row-parallel output of a layer region (``attention``,
``mlp``) operated on while its sum over the tensor axes is still pending; the embedding's masked lookup,
the experts' partial output and the linear scale that commutes with every such sum are
check.actpartial_regions'.

A row-parallel linear leaves each of the t ranks of its tensor group a summand p_1, ..., p_t of the
output y = Σ p_i; the all-reduce (a reduce-scatter under sequence parallelism) after it sums them.
An operation applied to each summand before that sum is exact only where it commutes with the sum:

* ``override activations[R]: bias_before_reduce over (AXES)``: the linear's bias b added on every
  rank (a fused GEMM + bias, ``F.linear(x, w, bias)`` before the all-reduce): Σ (p_i + b) = y + t·b;
* ``residual_before_reduce``: the residual r (the region's input, replicated over the tensor group)
  added on every rank before the sum: y + t·r;
* ``nonlinear_before_reduce``: a non-additive function f (an activation, a norm, dropout's mask) applied
  to each summand: Σ f(p_i), where the single device computes f(Σ p_i).

In backward the column-parallel linear's input gradient is partial before its all-reduce the same
way: ``override activation_grads[R]: residual_before_reduce over (AXES)`` adds the residual's
gradient (the output gradient dy, whole on every rank) on each rank, summed t times. The backward
of an activation, a norm or dropout is linear in the gradient (the forward's statistics are whole),
so it commutes with the sum; the input gradient has no bias: neither is a verb of
``activation_grads``.

Each is wrong on every named tensor axis of two or more ranks (the bias and residual nonzero, f any
non-additive function: the checker models it as an unknown function and never assumes it additive).
One obligation per region and verb, ``GI activations[R]: bias_before_reduce`` (and so on): its z3
negation is that some named axis has two ranks or more, its replay runs the region on the n ranks of
that axis with exact numbers (f(v) = v², a witness of a non-additive function). None of these moves
a byte: the region's collectives are as derived (or as its other statements say, judged by ``GI
activations[R]``), so the cost schedule is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..ir import actflow as af
from ..ir.overrides import OverrideTarget, OverrideVerb

REGIONS = ("attention", "mlp", "embedding", "experts")  # the regions with a partial output (check.actpartial_regions)
WHAT = {OverrideVerb.BIAS_BEFORE_REDUCE: "the row-parallel linear's bias added on each of the {t} tensor ranks before "
                                         "the reduction: the sum holds {t}·b instead of b",
        OverrideVerb.RESIDUAL_BEFORE_REDUCE: "the residual added on each of the {t} tensor ranks before the "
                                             "reduction: the sum holds {t}·residual instead of the residual",
        OverrideVerb.NONLINEAR_BEFORE_REDUCE: "a nonlinear operation (activation, norm or dropout) applied to each "
                                              "of the {t} tensor ranks' partial sums before the reduction: "
                                              "f(p_1) + ... + f(p_t) instead of f(p_1 + ... + p_t)"}
# in backward: the column-parallel linear's input gradient, partial before its all-reduce
BACK = "the residual's gradient (the output gradient dy, whole on every rank) added on each of the {t} tensor " \
       "ranks to the partial input gradient before its all-reduce: the sum holds {t}·dy instead of dy"


@dataclass(frozen=True)
class PartialOp:
    target: str  # activations | activation_grads
    region: str
    verb: str
    axes: tuple[str, ...]  # the named tensor axes the value is partial over
    span: Span


def _err(o, why: str, code: Code = Code.OVERRIDE_NO_EFFECT) -> DiagnosticError:
    grp = f"[{o.group}]" if o.group else ""
    return DiagnosticError([Diagnostic(code, f"override {o.target}{grp}: {o.verb} over ({', '.join(o.axes or ())}) "
                                             f"changes nothing: {why}" if code == Code.OVERRIDE_NO_EFFECT else
                                       f"override {o.target}{grp}: {o.verb}: {why}", o.span)])


def model(plan) -> tuple[PartialOp, ...]:
    """The stated operations per region (one per region and verb, its axes the union of its statements'),
    or a located error for one that changes nothing (PL506), names a region without a partial output
    (PL278) or an operation its partial value does not have (PL279)."""
    from . import actpartial_regions as ar

    stated = [o for o in plan.overrides if o.target in af.TARGETS and o.verb in af.PARTIAL_OPS]
    if not stated:
        return ()
    out: dict[tuple[str, str, str], PartialOp] = {}
    for o in stated:
        if o.group not in (None,) + REGIONS:
            raise _err(o, f"the {o.group} region has no row-parallel linear whose output is summed over the tensor "
                          "group (only attention and mlp: their output projection and fc2, the embedding's masked "
                          "lookup and the experts' fc2)", Code.PARTIAL_OP_REGION)
        regions = (o.group,) if o.group else ar.DEFAULT.get(o.verb, ("attention", "mlp"))
        for region in regions:
            if o.verb not in ar.VERBS[region] or (o.target == OverrideTarget.ACTIVATION_GRADS
                                                  and region not in ("attention", "mlp")):
                raise _err(o, f"not an operation on the {region} region's partial "
                              f"{'input gradient' if o.target == OverrideTarget.ACTIVATION_GRADS else 'output'} "
                              f"(its operations: {', '.join(ar.VERBS[region])})", Code.PARTIAL_OP_VERB)
        _no_effect(plan, o, ar, regions)
        axes = tuple(o.axes or ())
        for region in regions:
            tensor = ar.partial_axes(plan, region)
            off = [a for a in axes if a not in tensor]
            if off:
                raise _err(o, f"{', '.join(off)} is not a tensor axis of the {region} region (its output is whole "
                              f"or a sample of its own on every rank of {', '.join(off)}, and nothing sums it there)")
            old = out.get((o.target, region, o.verb))
            merged = tuple(dict.fromkeys((old.axes if old else ()) + axes))
            out[(o.target, region, o.verb)] = PartialOp(o.target, region, o.verb, merged, old.span if old else o.span)
    return tuple(out.values())


def _no_effect(plan, o, ar, regions) -> None:
    """PL506: no partial value to operate on, no bias, or no axis named."""
    t = plan.model.transformer
    if "experts" in regions and not ar.has_experts(plan):
        raise _err(o, "the model has no experts (experts = 1)")
    if not any(ar.partial_axes(plan, r) for r in regions):
        raise _err(o, "no tensor-parallel axis splits the experts, so their output is whole" if regions == ("experts",)
                   else "no tensor-parallel axis splits the layers, so no region's output is partial")
    if o.verb == OverrideVerb.BIAS_BEFORE_REDUCE and t is not None and not t.bias:
        raise _err(o, "the model's linear layers have no bias (bias = false)")
    if not o.axes:
        raise _err(o, "it names no axis, so no rank adds to a partial value")


def name(op: PartialOp) -> str:
    """``GI activations[R]: VERB``, as the statement reads (a whole-value obligation of its own, beside the
    region's collectives' ``GI activations[R]``)."""
    return f"GI {op.target}[{op.region}]: {op.verb}"


def _what(op: PartialOp, t, zero: bool = False) -> str:
    from .actpartial_regions import RMSNORM, what

    if op.target == OverrideTarget.ACTIVATION_GRADS:
        return BACK.format(t=t)
    if zero:
        return RMSNORM.format(t=t)
    return what(op.region, op.verb, t) or WHAT[op.verb].format(t=t)


def obligations(plan, ctx, obligation) -> list:
    from . import encode as en
    from .actpartial_regions import VALUE, zero_preserving
    from .rules import GRADIENT_INTEGRITY

    out = []
    for op in model(plan):
        value = ("column-parallel linear's input gradient" if op.target == OverrideTarget.ACTIVATION_GRADS
                 else VALUE[op.region])
        zero = op.target == OverrideTarget.ACTIVATIONS and zero_preserving(plan, op.region, op.verb)
        verdict = ("linear: it commutes with the sum on every axis" if op.verb == OverrideVerb.SCALE_BEFORE_REDUCE
                   else "exact: one summand nonzero and f(0) = 0" if zero else "wrong wherever t ≥ 2")
        what = (f"the {op.region} region's {value} is operated on only after its sum over {', '.join(op.axes)}, "
                f"or by an operation that commutes with it; stated: {_what(op, 't', zero)}, {verdict}")
        out.append(obligation(
            name(op), GRADIENT_INTEGRITY, op.span, what,
            lambda env, op=op, zero=zero: _negation(en, env, op, zero),
            lambda w, op=op, zero=zero: replay(ctx, op, w, zero)))
    return out


def _negation(en, env, op: PartialOp, zero: bool = False):
    """Some named axis has two ranks or more; the witness names it ``partial_axis`` (not ``axis``, which
    the shrinking keeps at its size: any two ranks show the defect). ``zero``: RMSNorm on the masked lookup,
    the owner's f(e) = u plus t - 1 rows normalised from zero, f(0) = z = 0: u + (t - 1)·z ≠ u has no solution."""
    extra = {a: env.sess.true() for a in op.axes}
    if op.verb == OverrideVerb.SCALE_BEFORE_REDUCE:  # a linear scale: c·(u + v) ≠ c·u + c·v has no solution
        c, u, v = (env.sess.real(f"actpartial_{k}") for k in ("c", "u", "v"))
        extra = {a: c * (u + v) != c * u + c * v for a in op.axes}
    elif zero:
        u, z = env.sess.real("actpartial_fe"), env.sess.num(0)  # z = f(0) = 0
        extra = {a: u + (env.size(a) - 1) * z != u for a in op.axes}
    cons, extract = en.axes_negation(env, "actpartial", list(extra.items()))

    def named(model) -> dict:
        w = extract(model)
        w["partial_axis"] = w.pop("axis")
        return w

    return cons, named


def run(verb: str, n: int, back: bool = False) -> tuple[Fraction, Fraction, dict[str, str]]:
    """(the reduced value at position 0, the single-device value, the inputs) for n tensor ranks: the
    input x = 3, column j of the column-parallel weight a_j = j + 2 and row j of the row-parallel weight
    b_j = (3j + 1)/2 on rank j, so rank j's summand is p_j = x·a_j·b_j; the bias 1, the residual x, f(v) = v².
    ``back``: the output gradient dy = 3 in place of x, rank j's summand of the input gradient dy·b_j·a_j."""
    x, bias = Fraction(3), Fraction(1)
    p = [x * (j + 2) * Fraction(3 * j + 1, 2) for j in range(n)]
    y = sum(p, Fraction(0))
    xs = "dy" if back else "x"
    inputs = {xs: "3", "a (column j on rank j)": "[" + ", ".join(str(j + 2) for j in range(n)) + "]",
              "b (row j on rank j)": "[" + ", ".join(str(Fraction(3 * j + 1, 2)) for j in range(n)) + "]",
              f"partial p_j = {xs}·a_j·b_j": "[" + ", ".join(str(v) for v in p) + "]"}
    if verb == OverrideVerb.BIAS_BEFORE_REDUCE:
        inputs["bias"] = "1"
        return sum((v + bias for v in p), Fraction(0)), y + bias, inputs
    if verb == OverrideVerb.RESIDUAL_BEFORE_REDUCE:
        inputs["the residual's gradient (dy)" if back else "residual (the input x)"] = "3"
        return sum((v + x for v in p), Fraction(0)), y + x, inputs
    inputs["f"] = "v² (a function with f(u) + f(v) ≠ f(u + v), as GeLU, SiLU, a norm or dropout's rescaled mask)"
    return sum((v * v for v in p), Fraction(0)), y * y, inputs


def replay(ctx, op: PartialOp, w: dict, zero: bool = False):
    from .report import Counterexample

    axis = w["partial_axis"]
    sizes = {k: (v if k == axis or k in ctx.pinned else 1) for k, v in w["sizes"].items()}
    n = sizes[axis]
    if n < 2 or axis not in op.axes or op.verb == OverrideVerb.SCALE_BEFORE_REDUCE:
        return None
    if zero:  # exact (the negation has no solution): nothing to replay
        return None
    if any(sizes.get(a, 1) > 1 for a in op.axes if a != axis):
        return None
    back = op.target == OverrideTarget.ACTIVATION_GRADS
    from .actpartial_regions import run as run_region

    got, want, inputs = run_region(op.region, op.verb, n) or run(op.verb, n, back)
    if got == want:
        return None
    eq = (f"{'input gradient' if back else 'output'} of the {op.region} region at position 0 after the reduction "
          f"over {axis} = {got}, single-device = {want}")
    fix = ("apply it after the all-reduce" if op.verb == OverrideVerb.NONLINEAR_BEFORE_REDUCE else
           "add it once, after the all-reduce (or on one rank only)")
    diag = (f"the root cause is {_what(op, n)} (override {op.target}[{op.region}]: {op.verb} over "
            f"({', '.join(op.axes)}) at line {op.span.line}); {fix}",
            "every layer before it, and the weight gradients computed from it, receive the wrong gradient" if back
            else "every value after it, the loss and so every gradient of the step, are computed from it")
    devices = (("rank 0", f"{axis}=0"),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, tuple(inputs.items()), eq, diag, ctx.command(sizes))
