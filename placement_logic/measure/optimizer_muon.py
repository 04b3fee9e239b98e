"""Distributed Muon on real ranks: the whole-matrix optimizer schemes realised and compared.

Input: a spec and one of its plans whose ``optimizer`` section puts Muon on weight-matrix groups
(``ir.optimizers.whole_needed``), with the run's axis sizes. Output: a ``MeasureReport`` — the
bytes of every collective of the first step against the cost engine's prediction, and the first
step's parameter update against one process running whole-matrix Muon (AdamW on the rest) from
the same seed and data — or ``unrealised`` with the reason. Pure data and orchestration: the
ranks (``ranks/muon.py``) import torch.

Schemes, on one data axis of n ranks (docs/validation.md, "Matrix-wise optimizers"):

| plan's data axis (params, optimizer, grads) | override | realised |
|---|---|---|
| (R, R, R) | none | gradients all-reduced; every rank orthogonalises every whole matrix |
| (R, S, R) | ``optimizer[G]: gather over (d)`` | ZeRO-1 by parameter group: each group's flat gradient reduce-scattered into n slices, the slice's momentum all-gathered into each whole matrix (one all-gather per group), orthogonalised on every rank, each keeping its slice of the update; updated slices all-gathered |
| (R, S, R) | ``optimizer[G]: round_robin over (d)`` | the same reduce-scatter with each group's slices made of whole matrices, matrix k owned by rank k mod n, which orthogonalises it; updated slices all-gathered |
| (R, S, R) | none (the shard-local bug) | the same reduce-scatter with each Muon group's slices made of the n-th row blocks of its matrices (a per-parameter shard, which cuts every matrix); each rank orthogonalises its row blocks |

Each group's flat layout: its matrices row by row (the fused q/k/v projection split into its
q, k and v matrices, a gated MLP's first layer into gate and up), then its vectors (column
biases, AdamW). Newton–Schulz: ``ns_steps`` quintic steps X ← aX + (bA + cA²)X, A = XXᵀ, with the
checker's coefficients (``check.matrixwise.NS_COEFFS``), X = M / ‖M‖_F, transposed when taller
than wide; the update is −lr · max(1, rows/cols)^½ · X on momentum (β = 0.95, first step: the
gradient).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from .. import ir
from ..ir import optimizers as opt
from ..ir import views
from ..ir.overrides import OverrideVerb
from ..outcome import Verdict
from .report import Equivalence, MeasureReport, Outcome, Row, RowStatus

M = ir.Mode
GROUPS = ("attention", "kv", "mlp", "embedding", "head")  # groups the harness lays out as matrices
TOLERANCE = 1e-4  # relative to the largest reference update: fp32 Newton-Schulz on reordered sums
LR, BETA = 0.02, 0.95


@dataclass(frozen=True)
class Entry:
    group: str
    param: str  # the module parameter's name
    rows: tuple[int, ...] | None  # rows of the parameter making this matrix or vector (None: all)
    dims: tuple[int, ...]  # (rows, cols) of a matrix, (k,) of a vector


@dataclass(frozen=True)
class MuonJob:
    key: str
    plan: str
    scheme: str  # replicated | gather | round_robin | local
    muon: tuple[tuple[str, int], ...]  # group -> ns_steps
    shape: object  # TinyShape
    entries: tuple[Entry, ...]
    world: int
    seed: int = 0


def entries(shape) -> tuple[Entry, ...]:
    """Every parameter of the tiny model (ranks/model.py) as the engine's groups see it."""
    h, d, qpk = shape.hidden, shape.head_dim, shape.heads // shape.kv_heads
    out = [Entry("embedding", "embed.weight", None, (shape.vocab, h))]
    per = (qpk + 2) * d  # rows of one kv group in the fused projection

    def qkv_rows(part: int) -> tuple[int, ...]:
        lo, n = (0, qpk * d) if part == 0 else (qpk * d + (part - 1) * d, d)
        return tuple(g * per + lo + i for g in range(shape.kv_heads) for i in range(n))

    f, blocks = shape.ffn, shape.groups
    for i in range(shape.layers):
        b = f"blocks.{i}."
        norms = ("weight", "bias") if shape.norm == "layernorm" else ("weight",)
        out += [Entry("norms", b + f"norm1.{w}", None, (h,)) for w in norms]
        q, k, v = qkv_rows(0), qkv_rows(1), qkv_rows(2)
        out += [Entry("attention", b + "attn.qkv.weight", q, (len(q), h)),
                Entry("kv", b + "attn.qkv.weight", k, (len(k), h)), Entry("kv", b + "attn.qkv.weight", v, (len(v), h))]
        if shape.has_qkv_bias:
            out += [Entry("attention", b + "attn.qkv.bias", q, (len(q),)),
                    Entry("kv", b + "attn.qkv.bias", k, (len(k),)), Entry("kv", b + "attn.qkv.bias", v, (len(v),))]
        out.append(Entry("attention", b + "attn.proj.weight", None, (h, shape.heads * d)))
        if shape.bias:
            out.append(Entry("biases", b + "attn.proj.bias", None, (h,)))
        out += [Entry("norms", b + f"norm2.{w}", None, (h,)) for w in norms]
        if shape.gated_mlp:
            w = f // blocks
            gate = tuple(j * 2 * w + x for j in range(blocks) for x in range(w))
            up = tuple(j * 2 * w + w + x for j in range(blocks) for x in range(w))
            parts = [gate, up]
        else:
            parts = [None]
        out += [Entry("mlp", b + "mlp.fc1.weight", r, (f, h)) for r in parts]
        if shape.bias:
            out += [Entry("mlp", b + "mlp.fc1.bias", r, (f,)) for r in parts]
        out.append(Entry("mlp", b + "mlp.fc2.weight", None, (h, f)))
        if shape.bias:
            out.append(Entry("biases", b + "mlp.fc2.bias", None, (h,)))
    norms = ("weight", "bias") if shape.norm == "layernorm" else ("weight",)
    out += [Entry("final_norm", f"norm.{w}", None, (h,)) for w in norms]
    if not shape.tied_embeddings:
        out.append(Entry("head", "head.weight", None, (shape.vocab, h)))
    return tuple(out)


def size(e: Entry) -> int:
    n = 1
    for x in e.dims:
        n *= x
    return n


def group_order(es: tuple[Entry, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e.group for e in es))


def owned(es: tuple[Entry, ...], group: str, n: int) -> list[list[Entry]]:
    """Round robin: the group's matrices, then its vectors, each k-th to rank k mod n."""
    own: list[list[Entry]] = [[] for _ in range(n)]
    mats = [e for e in es if e.group == group and len(e.dims) == 2]
    vecs = [e for e in es if e.group == group and len(e.dims) == 1]
    for k, e in enumerate(mats):
        own[k % n].append(e)
    for k, e in enumerate(vecs):
        own[k % n].append(e)
    return own


def row_block(e: Entry, j: int, n: int) -> Entry:
    """The j-th of n row blocks of a matrix entry (of n element blocks of a vector): a rank's
    piece of a parameter sharded by rows, as a per-parameter ZeRO/FSDP shard holds it."""
    rows = e.rows if e.rows is not None else tuple(range(e.dims[0]))
    k = len(rows) // n
    return Entry(e.group, e.param, rows[j * k:(j + 1) * k], (k,) + e.dims[1:])


def applies(plan: ir.Plan) -> bool:
    """Whether the plan states an optimizer other than the element-wise default on some group."""
    return any(c.algorithm not in ("adamw", "adam") for _, c in plan.optimizers)


def scheme(plan: ir.Plan) -> tuple[str, tuple[tuple[str, int], ...]] | list[str]:
    """(scheme, ((group, ns_steps), ...)) the harness runs for ``plan``, or the reasons it cannot."""
    reasons: list[str] = []
    bad = sorted({c.text() for _, c in plan.optimizers if c.algorithm not in ("adamw", "adam", "muon")})
    if bad:
        reasons.append(f"optimizer {', '.join(bad)}: only Muon (and AdamW) is realised by the harness")
    whole = opt.whole_needed(plan)
    muon = tuple((g, c.arg("ns_steps")) for g, c in whole if c.algorithm == "muon")
    for g, _ in muon:
        if g not in GROUPS:
            reasons.append(f"optimizer[{g}]: Muon is realised on the groups {', '.join(GROUPS)}")
    t = plan.model.transformer
    if t is None or t.mla or (t.experts is not None and not (isinstance(t.experts, ir.Const) and t.experts.value == 1)):
        reasons.append("Muon is realised on a dense transformer without latent attention")
    roles = {a: views.view(plan).role(a) for a in plan.mesh.names}
    data = [a for a, r in roles.items() if r is ir.Role.DATA]
    if len(roles) != 1 or len(data) != 1:
        reasons.append("distributed Muon is realised on one data axis (the mesh has " +
                       ", ".join(f"{a} ({r.value})" for a, r in roles.items()) + ")")
        return reasons
    d = data[0]
    modes = tuple(plan.placement(s).mode(d) for s in (ir.State.PARAMS, ir.State.OPTIMIZER, ir.State.GRADS))
    other = [o for o in plan.overrides if not opt.is_placement(o)]
    if other:
        reasons.append(f"override {other[0].target}: {other[0].verb} is not realised beside Muon")
    verbs = set()
    for g, _ in muon:
        gather, owner = opt.stated(plan, OverrideVerb.GATHER, g)[0], opt.stated(plan, OverrideVerb.ROUND_ROBIN, g)[0]
        if (gather and gather != (d,)) or (owner and owner != (d,)) or (gather and owner):
            reasons.append(f"optimizer[{g}]: only one gather or round_robin over ({d}) is realised")
        verbs.add(OverrideVerb.GATHER if gather else OverrideVerb.ROUND_ROBIN if owner else "")
    if len(verbs) > 1:
        reasons.append("the Muon groups reach their whole matrices differently: realised only when all alike")
    verb = verbs.pop() if verbs else ""
    if modes == (M.R, M.R, M.R) and not verb:
        name = "replicated"
    elif modes == (M.R, M.S, M.R):
        name = str(verb) if verb else "local"  # gather, round_robin: the realised layout is named by the verb
    else:
        reasons.append(f"data axis '{d}' (params, optimizer, grads) = ({', '.join(m.value for m in modes)})"
                       + (f" with optimizer: {verb}" if verb else "") + ": Muon is realised on DDP (R, R, R) and "
                       "ZeRO-1 (R, S, R) only")
        name = ""
    return reasons or (name, muon)


IMPLEMENTATION = {
    "replicated": "gradients all-reduced; every rank runs whole-matrix Muon on every matrix",
    "gather": "ZeRO-1 by parameter group; each Muon group's momentum all-gathered into whole matrices, "
              "orthogonalised on every rank, each keeping its slice",
    "round_robin": "ZeRO-1 by parameter group with whole-matrix slices (matrix k owned by rank k mod n), "
                   "each owner orthogonalising its matrices",
    "local": "ZeRO-1 by parameter group, each matrix sharded by rows; each rank orthogonalises its own rows of "
             "every matrix (no gather)",
}


def _unrealised(spec: ir.Spec, plan: ir.Plan, mesh, steps: int, reasons, implementation: str = "") -> MeasureReport:
    return MeasureReport(spec.file, plan.name, Outcome.UNREALISED, mesh, steps, implementation=implementation,
                         reasons=tuple(reasons))


def measure(spec: ir.Spec, plan: ir.Plan, sizes: dict[str, int], steps: int, with_checker: bool,
            launcher=None) -> MeasureReport:
    """Realise ``plan``'s distributed Muon at ``sizes``, run it, and compare (one first step)."""
    from .predict import UnboundPrediction, predict, scaled_plan
    from .shape import ShapeError, scale_down
    from .verdict import checker_view, run_bindings

    mesh = tuple((a, sizes[a]) for a in plan.mesh.names)
    decided = scheme(plan)
    if isinstance(decided, list):
        return _unrealised(spec, plan, mesh, steps, decided)
    name, muon = decided
    world = mesh[0][1]
    try:
        shape = scale_down(plan, run_bindings(spec, sizes), sizes, None, 1, 1, None)
        prediction = predict(spec, plan, shape, sizes, "adam")
    except (ShapeError, UnboundPrediction) as exc:
        return _unrealised(spec, plan, mesh, steps, (f"no numeric prediction for the scaled-down run: {exc}",))
    es = entries(shape)
    reasons = _layout_reasons(plan, shape, sizes, es, name, world, scaled_plan)
    if reasons:
        return _unrealised(spec, plan, mesh, steps, reasons, IMPLEMENTATION[name])
    job = MuonJob("muon", plan.name, name, muon, shape, es, world)
    from .runner import LaunchError

    try:
        results = (launcher or launch)(job)
    except LaunchError as exc:
        return MeasureReport(spec.file, plan.name, Outcome.FAILED, mesh, steps, implementation=IMPLEMENTATION[name],
                             reasons=(str(exc),))
    base = dict(file=spec.file, plan=plan.name, mesh=mesh, steps=1, implementation=IMPLEMENTATION[name],
                prediction_source=prediction.source, shape=tuple(shape.as_dict().items()))
    errors = [f"rank {r['rank']}: {r['error']}" for r in results if "error" in r]
    if errors:
        return MeasureReport(outcome=Outcome.FAILED, reasons=tuple(errors), **base)
    rows = collective_rows(prediction, results)
    first = results[0]
    eq = Equivalence(steps=1, param_abs=first["update_abs"], param_rel=first["update_rel"],
                     param_worst=first["update_worst"], loss_abs=0.0, loss_rel=0.0,
                     replicas_agree=all(r["digest"] == first["digest"] for r in results), tolerance=TOLERANCE,
                     grad_unavailable="the Muon harness compares the first step's update, not the loss or gradients")
    checker = checker_view(spec, plan.name, sizes) if with_checker else None
    outcome = Outcome.DIVERGED if not eq.within else (
        Outcome.MISMATCH if any(r.status == RowStatus.DIFFERS for r in rows) else Outcome.MATCHED)
    out_reasons: tuple[str, ...] = ()
    if outcome is Outcome.MATCHED and checker is not None and checker.available and checker.verdict == Verdict.REFUTED.word:
        outcome = Outcome.MISMATCH
        out_reasons = ("the checker refutes this plan at the run's sizes, yet its first Muon update equals one "
                       "process's: the run did not run the plan as written; a refuted plan is never a match",)
    notes = ("first-step parameter update against one process's whole-matrix Muon (ns_steps "
             + ", ".join(f"{g} {s}" for g, s in muon) + f"; AdamW on the rest), within {TOLERANCE:g} relative "
             "to the largest reference update; fp32; one step run and compared, whatever --steps says",
             "the loss is not compared (the same forward on every scheme); memory rows are not compared for Muon")
    return MeasureReport(outcome=outcome, rows=tuple(rows), equivalence=eq, checker=checker, notes=notes,
                         reasons=out_reasons, **base)


def _layout_reasons(plan, shape, sizes, es, name: str, world: int, scaled_plan) -> list[str]:
    """Why the harness's layout cannot be this plan's: its groups disagree with the engine's
    counts, a group's flat does not divide over the ranks, or round robin gives uneven owners."""
    from ..costs.sizes import shape_of

    small = scaled_plan(plan, shape, sizes, "adam")
    counts = {g.name: g.count for g in shape_of(small.model).groups}
    mine: dict[str, int] = {}
    for e in es:
        mine[e.group] = mine.get(e.group, 0) + size(e)
    if {k: int(v) for k, v in counts.items() if v != 0} != mine:
        return [f"the harness's parameter groups {mine} are not the engine's {dict(counts)}"]
    out = [f"group {g} ({n} elements) does not divide over {world} ranks" for g, n in mine.items() if n % world]
    if name == "local":
        muon = dict(scheme(plan)[1])
        out += [f"{e.param} ({e.dims[0]} rows) does not divide over {world} ranks" for e in es
                if e.group in muon and e.dims[0] % world]
    if name == "round_robin":
        for g, _ in scheme(plan)[1]:
            parts = [sum(size(e) for e in own) for own in owned(es, g, world)]
            if len(set(parts)) != 1:
                out.append(f"round_robin on {g}: whole matrices give the {world} owners {parts} elements, uneven: "
                           "ZeRO-1's equal reduce-scatter slices cannot hold them")
    return out


def collective_rows(prediction, results: list[dict]) -> list[Row]:
    """One row per predicted collective (kind, phase, what it carries) beside rank 0's measured bytes."""
    measured: dict[tuple[str, str, str], int] = {}
    for rec in results[0]["collectives"]:
        key = (rec["kind"], rec["phase"], rec["what"])
        measured[key] = measured.get(key, 0) + rec["bytes"]
    rows = []
    seen = set()
    for c in prediction.collectives:
        key = (c.kind, c.phase, c.description)
        seen.add(key)
        got = measured.get(key)
        status = RowStatus.MATCH if got is not None and Fraction(got) == c.buffer_bytes else RowStatus.DIFFERS
        rows.append(Row("collectives", f"{c.kind} over ({', '.join(c.axes)}), {c.phase}: {c.description}",
                        c.buffer_bytes, None if got is None else Fraction(got), status,
                        "" if got is not None else "not issued by the run"))
    for key, got in measured.items():
        if key not in seen:
            rows.append(Row("collectives", f"{key[0]}, {key[1]}: {key[2]}", None, Fraction(got), RowStatus.DIFFERS,
                            "issued by the run, not predicted"))
    return rows


def launch(job: MuonJob) -> list[dict]:
    """Run ``job`` on ``job.world`` rank processes (``python -m placement_logic.measure.ranks.muon``)."""
    from .runner import LaunchError, free_port, wait_for

    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="placement-muon-") as outdir:
        Path(outdir, "job.pkl").write_bytes(pickle.dumps(job))
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "placement_logic.measure.ranks.muon", outdir, str(rank),
                                   str(job.world), str(port)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for rank in range(job.world)]
        wait_for(procs, outdir)
        out = []
        for rank in range(job.world):
            path = Path(outdir, f"muon.{rank}.json")
            if not path.exists():
                raise LaunchError(f"rank {rank} wrote no result")
            out.append(json.loads(path.read_text()))
        return out
