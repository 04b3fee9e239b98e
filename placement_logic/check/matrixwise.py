"""The optimizer step of an update that needs whole matrices (Muon, Shampoo, SOAP).

Input: the plan (its ``optimizer`` section and ``optimizer[G]: gather`` / ``round_robin``
overrides, ``ir.optimizers``) and the replay ``Context``. Output: one ``Obligation`` per
parameter group whose algorithm is matrix-wise or block-wise: every rank's update of the
group sees each whole matrix (block). The axes that cut it (``ir.optimizers.cuts``: a tensor
axis splitting the weights, a flat ZeRO/FSDP shard of the optimizer state) less those the plan
gathers or owns whole (``uncut``) are the violation; the negation is "one of them has two or
more ranks". The replay runs Newton–Schulz in exact rationals on a small matrix, once on the
whole matrix and once on each rank's piece, and shows the two updates of the same element.

A block-wise update cut by a shard is left unknown: whether the shard boundaries fall on the
B×B block boundaries is a fact of the implementation the plan does not state.
"""

from __future__ import annotations

from fractions import Fraction

from ..diagnostics import NO_SPAN
from ..ir import optimizers as opt
from ..ir.nodes import Role
from ..ir.overrides import OverrideVerb
from . import encode as en
from .replay import Context
from .report import Counterexample
from .rules import STATE_CONSISTENCY

# Muon's quintic Newton–Schulz coefficients (Jordan et al. 2024, zeropower_via_newtonschulz5), exact
NS_COEFFS = (Fraction(34445, 10000), Fraction(-47750, 10000), Fraction(20315, 10000))

Matrix = list[list[Fraction]]


def _mul(a: Matrix, b: Matrix) -> Matrix:
    return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0)) for j in range(len(b[0]))]
            for i in range(len(a))]


def _t(a: Matrix) -> Matrix:
    return [list(r) for r in zip(*a)]


def newton_schulz(m: Matrix, steps: int) -> Matrix:
    """Muon's orthogonalisation: X = M / s (s = the sum of |entries| ≥ ‖M‖_F, rational where Muon
    divides by ‖M‖_F), transposed when taller than wide, then ``steps`` times X ← aX + (bA + cA²)X
    with A = XXᵀ, in exact rationals."""
    a, b, c = NS_COEFFS
    s = sum((abs(v) for r in m for v in r), Fraction(0)) or Fraction(1)
    tall = len(m) > len(m[0])
    x = [[v / s for v in r] for r in (_t(m) if tall else m)]
    for _ in range(steps):
        A = _mul(x, _t(x))
        B = [[b * A[i][j] + c * sum(A[i][k] * A[k][j] for k in range(len(A))) for j in range(len(A))]
             for i in range(len(A))]
        BX = _mul(B, x)
        x = [[a * x[i][j] + BX[i][j] for j in range(len(x[0]))] for i in range(len(x))]
    return _t(x) if tall else x


def obligations(plan, ctx: Context, obligation) -> list:
    """``obligation``: the ``Obligation`` constructor (obligations.py owns it)."""
    obs = []
    for g, c in opt.whole_needed(plan):
        cut = opt.cuts(plan, g, ctx.bindings)
        given = opt.uncut(plan, g)
        unsure = [a for a in opt.unsure_cuts(plan, g, ctx.bindings) if a not in given]
        bad = [a for a in cut if a not in given and a not in unsure]
        what = "matrix" if c.locality == opt.MATRIX else f"{c.arg('block')}×{c.arg('block')} block"
        span = c.span if c.span != NO_SPAN else plan.span
        notes: tuple[str, ...] = ()
        if not cut:
            notes = (f"vacuous: no axis cuts a {g} matrix (whole on every rank that updates it)",)
        elif given:
            how = []
            for verb in (OverrideVerb.GATHER, OverrideVerb.ROUND_ROBIN):
                axes, where = opt.stated(plan, verb, g)
                if axes:
                    how.append(f"{verb} over ({', '.join(axes)}) at line {where.line}")
            notes = ("the whole matrix is given to the update by " + "; ".join(how),)
        ob = obligation(
            f"SC optimizer[{g}] whole {'matrices' if c.locality == opt.MATRIX else 'blocks'}", STATE_CONSISTENCY,
            span,
            f"{c.text()} updates each {g} {what} as a function of the whole {what}: every rank's update sees it "
            "whole (not cut by a tensor split or a flat optimizer shard), or the plan gathers it or gives it to one "
            "owner rank",
            lambda env, bad=tuple(bad): en.axes_negation(env, "matrixwise", [(a, env.sess.true()) for a in bad]),
            lambda w, g=g, c=c: replay(ctx, plan, g, c, w), notes, groups=(g,))
        if bad and c.locality == opt.BLOCK:
            ob.unknown = (f"{g} is cut over ({', '.join(bad)}); the missing fact: whether every shard boundary falls on "
                          f"a {c.arg('block')}×{c.arg('block')} block boundary (state 'override optimizer[{g}]: gather "
                          f"over ({', '.join(bad)})' if the implementation gathers)")
            ob.encode = lambda env: ([env.sess.true()], lambda model: {})
        if unsure and not bad:
            ob.unknown = (f"{g} is split by heads over ({', '.join(unsure)}) unless the model has one K/V head, and "
                          f"kv_heads is not a number here; the missing fact: whether it is 1 (each tensor rank then "
                          f"holds the whole K/V matrices); state it as a number, or 'override optimizer[{g}]: gather "
                          f"over ({', '.join(unsure)})' if the implementation gathers")
            ob.encode = lambda env: ([env.sess.true()], lambda model: {})
        obs.append(ob)
    return obs


def _show(x: Fraction) -> str:
    return f"{float(x):.4f}"


def replay(ctx: Context, plan, group: str, c: opt.Choice, w: dict) -> Counterexample | None:
    """Two ranks over the witnessed axis: a matrix cut by columns (a tensor split) or by rows (a
    flat shard of the row-major buffer), each piece orthogonalised on its own, against the whole."""
    sizes, axis = w["sizes"], w["axis"]
    n = sizes[axis]
    if n < 2:
        return None
    steps = c.arg("ns_steps") or 5
    g = opt.group_of(plan, group)
    from ..ir.views import role_of

    columns = role_of(plan, g, axis) in (Role.TENSOR, Role.SEQUENCE)
    rows, cols = (2, n) if columns else (n, 2)
    m = [[Fraction(i * cols + j + 1) for j in range(cols)] for i in range(rows)]
    whole = newton_schulz(m, steps)
    if columns:
        piece = newton_schulz([[m[i][0]] for i in range(rows)], steps)  # rank 0: column 0
        got, want, elem = piece[0][0], whole[0][0], "(0, 0)"
    else:
        piece = newton_schulz([m[0]], steps)  # rank 0: row 0 (the first 2 of the 2n elements)
        got, want, elem = piece[0][0], whole[0][0], "(0, 0)"
    if got == want:
        return None
    held = "column 0" if columns else "row 0"
    shape = f"{rows}×{cols}"
    cut = (f"the tensor split over {axis} gives rank 0 {held}" if columns else
           f"the flat optimizer shard over {axis} gives rank 0 the first {cols} of {rows * cols} elements ({held})")
    return Counterexample(
        ctx.sizes_tuple(sizes), (("observer", f"({axis}=0)"),),
        (("momentum matrix", "[" + "; ".join(", ".join(str(v) for v in r) for r in m) + "]"),
         ("whole-matrix update (single device), row 0", ", ".join(_show(v) for v in whole[0])),
         (f"rank ({axis}=0)'s update of its piece", ", ".join(_show(v) for v in piece[0])),
         ("Newton–Schulz", f"{steps} quintic steps, exact rationals (shown to 4 places)")),
        f"update element {elem} on ({axis}=0) = {_show(got)}, single device = {_show(want)}",
        (f"{c.text()} orthogonalises each {group} matrix as a whole (a {shape} one here), but {cut}: orthogonalising a "
         "piece is not the piece of the orthogonalised matrix",),
        ctx.command(sizes),
        (f"fix: override optimizer[{group}]: gather over ({axis}) (every rank gathers each matrix and keeps its part "
         f"of the update), or round_robin over ({axis}) (one owner per matrix, results sent back)",))
