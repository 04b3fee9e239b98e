"""Cost-engine test corpus: IR builders, spec texts and published values.

Input: nothing. Output: helpers that build ``ir.Spec`` / ``ir.Plan`` objects directly
(independent of the front end) and the published numbers the cost tests check against.
"""

from __future__ import annotations

from fractions import Fraction

from placement_logic import ir
from placement_logic.ir import Mode, Role

R, S, SS, M, O = Mode.R, Mode.S, Mode.S_STAR, Mode.M, Mode.O

# ZeRO (Rajbhandari et al., 2020), Figure 1 and Table 1: per-device model-state memory in GB
# (1 GB = 1e9 bytes) for DP, Pos, Pos+g, Pos+g+p.  Table 1 columns: Pos, Pos+g, Pos+g+p.
ZERO_FIGURE1 = {"dp": Fraction(120), "zero1": Fraction("31.4"), "zero2": Fraction("16.6"), "zero3": Fraction("1.9")}
ZERO_TABLE1 = {
    # (psi, N_d): (Pos, Pos+g, Pos+g+p) as printed
    (Fraction("7.5e9"), 1): ("120", "120", "120"),
    (Fraction("7.5e9"), 4): ("52.5", "41.3", "30"),
    (Fraction("7.5e9"), 16): ("35.6", "21.6", "7.5"),
    (Fraction("7.5e9"), 64): ("31.4", "16.6", "1.88"),
    (Fraction("7.5e9"), 256): ("30.4", "15.4", "0.47"),
    (Fraction("7.5e9"), 1024): ("30.1", "15.1", "0.12"),
    (Fraction("128e9"), 1): ("2048", "2048", "2048"),
    (Fraction("128e9"), 4): ("896", "704", "512"),
    (Fraction("128e9"), 16): ("608", "368", "128"),
    (Fraction("128e9"), 64): ("536", "284", "32"),
    (Fraction("128e9"), 256): ("518", "263", "8"),
    (Fraction("128e9"), 1024): ("513", "257", "2"),
    (Fraction("1e12"), 1): ("16000", "16000", "16000"),
    (Fraction("1e12"), 4): ("7000", "5500", "4000"),
    (Fraction("1e12"), 16): ("4750", "2875", "1000"),
    (Fraction("1e12"), 64): ("4187", "2218", "250"),
    (Fraction("1e12"), 256): ("4046", "2054", "62.5"),
    (Fraction("1e12"), 1024): ("4011", "2013", "15.6"),
}

LLAMA2_70B_PARAMS = 68_976_648_192

ZERO_STAGES = {
    "dp": (R, R, R, R),
    "zero1": (R, S, R, R),
    "zero2": (R, S, S, R),
    "zero3": (SS, S, S, R),
}


def c(x) -> ir.Const:
    return ir.Const(Fraction(x))


def sym(name: str) -> ir.Sym:
    return ir.Sym(name)


def model(params=None, *, bp=2, bg=2, K=None, ba=2, seq=None, mb=None, m=1, transformer=None) -> ir.Model:
    return ir.Model(
        params=params,
        bytes_params=c(bp),
        bytes_grads=c(bg),
        bytes_optimizer=K if isinstance(K, (ir.Sym, ir.Op)) else c(K if K is not None else 12),
        bytes_activations=c(ba),
        seq=seq if seq is None or not isinstance(seq, int) else c(seq),
        microbatch=mb if mb is None or not isinstance(mb, int) else c(mb),
        microbatches=m if not isinstance(m, int) else c(m),
        transformer=transformer,
    )


def mesh(*axes) -> ir.Mesh:
    """axes: (name, link) pairs; every size is the axis symbol."""
    return ir.Mesh(tuple(ir.Axis(n, ir.Sym(n), link) for n, link in axes))


def plan(name, mesh_, model_, per_axis: dict, roles: dict, *, residency=None, unit="layer", prefetch=1,
         reshard=True, **kw) -> ir.Plan:
    """per_axis: axis -> 4-tuple of modes over (params, optimizer, grads, activations)."""
    residency = residency or {}
    placements = []
    for i, st in enumerate(ir.STATES):
        placements.append(ir.Placement(
            st, tuple((a, per_axis[a][i]) for a in mesh_.names),
            residency=residency.get(st, ir.Residency.DEVICE), unit=unit, prefetch=prefetch,
            reshard_after_forward=reshard))
    bindings = tuple(ir.Binding(f"test.{roles[a].value}", (a,), ((a, roles[a]),)) for a in mesh_.names)
    return ir.Plan(name, mesh_, model_, bindings, tuple(placements), **kw)


def zero_spec(psi=Fraction("7.5e9"), K=12, dp=64, m=1) -> ir.Spec:
    """The ZeRO paper's Figure 1 setup, built directly as IR."""
    msh = mesh(("dp", "inter_node"))
    mdl = model(sym("psi"), K=sym("K"), m=m)
    plans = tuple(plan(n, msh, mdl, {"dp": modes}, {"dp": Role.DATA}) for n, modes in ZERO_STAGES.items())
    return ir.Spec("<zero>", (("psi", c(psi)), ("K", c(K)), ("dp", c(dp))),
                   (("psi", ir.Dim.COUNT), ("K", ir.Dim.COUNT), ("dp", ir.Dim.COUNT)), mdl, msh, plans)


def llama70b_shape(**kw) -> ir.TransformerShape:
    args = dict(hidden=c(8192), layers=c(80), heads=c(64), kv_heads=c(8), ffn=c(28672), vocab=c(32000),
                tied_embeddings=False, gated_mlp=True, norm="rmsnorm", bias=False)
    args.update(kw)
    return ir.TransformerShape(**args)
