"""A concrete simulator of the vocabulary-parallel cross entropy with label smoothing and an output
z-loss, written from docs/semantics.md ("Activations and their gradients": the cross entropy's extra
terms) without the checker's code (it imports nothing from ``placement_logic.check`` or
``placement_logic.ir.actflow``; the mesh and the stated overrides are read with the activation
simulator's helpers).

Every device holds, per token of its samples (four tokens, its samples named by its coordinates on
the non-tensor axes), the integer logits of its vocabulary block (two words per tensor rank) and the
token's target. The tokens' logits differ enough that the blocks' maxima differ already on a mesh of
one sample (with two tokens every block of sample 0 had the same max, so a per-rank max passed there). The loss per token is

    (1 - α)·(lse - z_target) + α·(lse - Σ_w z_w / V) + β·lse²,  lse = log Σ_w 2^(z_w) (base 2),

label smoothing's term present where the model states ``label_smoothing``, the z-loss where it
states ``logit_z_loss``. A device computes: its local max logit, all-reduced MAX over the passes
``activations[loss]: reduce_max`` states (derived: the tensor axes), the target's shifted logit and
the sum of exponentials 2^(z - m) of its block summed over ``reduce_target`` / ``reduce_sumexp``,
the sum of its block's logits over ``reduce_smoothing`` (divided by the whole vocabulary V), and the
z-loss's own sum of exponentials 2^(z - m) over ``reduce_zloss`` (its lse is m + log of it). Label
smoothing's vocabulary size is each device's count of its block's words (2) summed over ``smoothing_vocab``
(derived: the tensor axes, 2·t = V); the smoothing term's mean and its gradient's α/V divide by it. Every
reduction runs over the real device groups (the devices that agree off its axes).

The loss is a function of exact numbers: 2^(lse - z_t) = S·2^(-t), the mean logit Σ z / V and 2^lse;
it equals the single-device loss for all α, β when they do (and differs for some α, β when one
differs). Its gradient with respect to the device's logits is (1 - α)(p_w - [w = target]) + α(p_w - 1/V)
+ 2β·lse·p_w: it equals the single-device one for all α, β exactly when the softmax p of the block
does, with label smoothing the counted V does, and, with the z-loss, 2^lse does.

``violations(plan, sizes)``: ``("act", "loss")`` (some device's loss differs) and ``("grad", "loss")``.
"""

from __future__ import annotations

from fractions import Fraction

from simulator_act import Mesh, _per_pass, _stated

from placement_logic import ir

TERMS = ("label_smoothing", "logit_z_loss")


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    mesh = Mesh(plan, sizes)
    if not mesh.tensor or plan.placement(ir.State.PARAMS).mode(mesh.tensor[0]) not in (
            ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O):
        return set()  # the output layer is whole on every rank: no vocabulary-parallel cross entropy
    stated = {k for k, _ in plan.model.ce_terms}
    n = mesh.tp(mesh.devices[0])[1]
    seq, per = 4, 2
    V = per * n
    tensor = tuple(mesh.tensor)

    def reduce(vals, verb, op):
        o = _stated(plan, "activations", "loss", (verb,))
        for _, axes in (_per_pass("x", o.axes) if o else [("x", tensor)]):
            vals = {mesh.key(d): [op(col) for col in zip(*(vals[k] for k in mesh.group(d, axes)))]
                    for d in mesh.devices}
        return vals

    two = Fraction(2)
    z, target, block = {}, {}, {}
    for d in mesh.devices:
        k, s, r = mesh.key(d), mesh.sample(d), mesh.tp(d)[0]
        z[k] = [[(5 * i + 3 * w * w + 11 * s) % 9 - 4 for w in range(V)] for i in range(seq)]
        target[k] = [(3 * i + s + 1) % V for i in range(seq)]
        block[k] = range(r * per, (r + 1) * per)
    m = reduce({k: [max(z[k][i][w] for w in block[k]) for i in range(seq)] for k in z}, "reduce_max", max)
    t = reduce({k: [z[k][i][target[k][i]] - m[k][i] if target[k][i] in block[k] else 0 for i in range(seq)]
                for k in z}, "reduce_target", sum)
    S = reduce({k: [sum((two ** (z[k][i][w] - m[k][i]) for w in block[k]), Fraction(0)) for i in range(seq)]
                for k in z}, "reduce_sumexp", sum)
    sm = reduce({k: [sum((Fraction(z[k][i][w]) for w in block[k]), Fraction(0)) for i in range(seq)] for k in z},
                "reduce_smoothing", sum)
    Sz = reduce({k: [sum((two ** (z[k][i][w] - m[k][i]) for w in block[k]), Fraction(0)) for i in range(seq)]
                 for k in z}, "reduce_zloss", sum)
    counted = reduce({k: [Fraction(len(block[k]))] * seq for k in z}, "smoothing_vocab", sum)
    found = set()
    for k in z:
        for i in range(seq):
            row = z[k][i]
            whole = sum((two ** v for v in row), Fraction(0))
            got = [S[k][i] * two ** -t[k][i]]
            want = [whole * two ** -row[target[k][i]]]
            if "label_smoothing" in stated:
                got.append(sm[k][i] / counted[k][i])
                want.append(Fraction(sum(row), V))
            lse_got, lse_want = two ** m[k][i] * Sz[k][i], whole
            if "logit_z_loss" in stated:
                got.append(lse_got)
                want.append(lse_want)
            if got != want:
                found.add(("act", "loss"))
            p_got = [two ** (row[w] - m[k][i]) / S[k][i] for w in block[k]]
            p_want = [two ** row[w] / whole for w in block[k]]
            if p_got != p_want or ("logit_z_loss" in stated and lse_got != lse_want) or (
                    "label_smoothing" in stated and counted[k][i] != V):
                found.add(("grad", "loss"))
    return found
