"""One rank of a distributed Muon run (torch): ``python -m placement_logic.measure.ranks.muon OUTDIR RANK WORLD PORT``.

Input: a ``MuonJob`` (``measure.optimizer_muon``: scheme, Muon groups, tiny shape, the model's
parameters as group entries). Output: ``OUTDIR/muon.RANK.json`` with the collectives of the first
step (kind, bytes, phase, what they carry, from ``CollectiveCounter``), a digest of the updated
parameters (every rank must hold the same) and, on rank 0, the largest difference between the
distributed first update and one process's (whole-matrix Muon on the Muon groups, AdamW on the rest).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
import sys
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...check.matrixwise import NS_COEFFS
from ..optimizer_muon import LR, group_order, owned, row_block, size
from .counter import CollectiveCounter
from .model import build
from .shutdown import finish

ADAM_LR, EPS, B1, B2 = 1e-3, 1e-8, 0.9, 0.999


def newton_schulz(m: torch.Tensor, steps: int, scale: float | None = None) -> torch.Tensor:
    """The checker's quintic iteration (``check.matrixwise.newton_schulz``) from X = M / ‖M‖_F, as
    Muon starts (``scale``: another divisor, e.g. the checker's sum of |entries|)."""
    a, b, c = (float(x) for x in NS_COEFFS)
    tall = m.shape[0] > m.shape[1]
    x = (m.t() if tall else m) / (scale if scale is not None else m.norm() + 1e-7)
    for _ in range(steps):
        A = x @ x.t()
        x = a * x + (b * A + c * A @ A) @ x
    return x.t() if tall else x


def muon_update(m: torch.Tensor, steps: int) -> torch.Tensor:
    return -LR * max(1.0, m.shape[0] / m.shape[1]) ** 0.5 * newton_schulz(m, steps)


def adam_update(g: torch.Tensor) -> torch.Tensor:
    """AdamW's first step (bias-corrected moments of one gradient), element-wise."""
    m, v = (1 - B1) * g / (1 - B1), (1 - B2) * g * g / (1 - B2)
    return -ADAM_LR * m / (v.sqrt() + EPS)


def _data(shape, seed: int, index: int):
    g = torch.Generator().manual_seed(seed * 1000 + index + 1)
    tokens = torch.randint(0, shape.vocab, (shape.microbatch, shape.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _gradients(job, model, indices: list[int], scale: float) -> dict[str, torch.Tensor]:
    for i in indices:
        tokens, targets = _data(job.shape, job.seed, i)
        loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), targets.flatten()) * scale
        loss.backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def _take(e, tensors) -> torch.Tensor:
    t = tensors[e.param]
    return (t if e.rows is None else t[list(e.rows)]).reshape(-1)


class Layout:
    """Each group's flat (its entries in order; round robin: by owner) and its n equal slices."""

    def __init__(self, job):
        self.job, n = job, job.world
        muon = dict(job.muon)
        self.groups = group_order(job.entries)
        self.order = {}
        for g in self.groups:
            mine = [e for e in job.entries if e.group == g]
            if job.scheme == "round_robin" and g in muon:
                mine = [e for own in owned(job.entries, g, n) for e in own]
            elif job.scheme == "local" and g in muon:
                mine = [e for j in range(n) for e in (row_block(x, j, n) for x in mine)]
            self.order[g] = mine
        self.total = {g: sum(size(e) for e in self.order[g]) for g in self.groups}
        self.piece = {g: self.total[g] // n for g in self.groups}
        self.shard = sum(self.piece.values())

    def flat(self, g, tensors) -> torch.Tensor:
        return torch.cat([_take(e, tensors) for e in self.order[g]])

    def rank_major(self, tensors) -> torch.Tensor:
        flats = {g: self.flat(g, tensors) for g in self.groups}
        return torch.cat([flats[g][j * self.piece[g]:(j + 1) * self.piece[g]]
                          for j in range(self.job.world) for g in self.groups])

    def group_slices(self, shard: torch.Tensor) -> dict[str, torch.Tensor]:
        out, at = {}, 0
        for g in self.groups:
            out[g], at = shard[at:at + self.piece[g]], at + self.piece[g]
        return out

    def segments(self, g, lo: int, hi: int):
        """(entry, start, end within the entry, position in [lo, hi)) of the entries overlapping it."""
        at = 0
        for e in self.order[g]:
            a, b = max(lo, at), min(hi, at + size(e))
            if a < b:
                yield e, a - at, b - at, a - lo
            at += size(e)


def _group_update(layout: Layout, g: str, steps: int | None, grad: torch.Tensor, lo: int,
                  whole: torch.Tensor | None) -> torch.Tensor:
    """The update of group ``g``'s elements [lo, lo + len(grad)) of its flat: AdamW, or Muon on its
    matrices (``whole``: the whole group's momentum; None: only the slice's own)."""
    upd = adam_update(grad)
    if steps is None:
        return upd
    for e, a, b, pos in layout.segments(g, lo, lo + grad.numel()):
        if len(e.dims) != 2:
            continue
        r, c = e.dims
        if whole is not None:
            start = pos + lo - a
            u = muon_update(whole[start:start + r * c].view(r, c), steps).reshape(-1)[a:b]
        elif a == 0 and b == r * c:
            u = muon_update(grad[pos:pos + r * c].view(r, c), steps).reshape(-1)
        else:  # a piece of a matrix: orthogonalised as the rows it holds (or one row of elements)
            piece = grad[pos:pos + b - a]
            rows = (b - a) // c if a % c == 0 and (b - a) % c == 0 else 1
            u = muon_update(piece.view(rows, -1), steps).reshape(-1)
        upd[pos:pos + b - a] = u
    return upd


def run(job, rank: int) -> dict:
    n, muon = job.world, dict(job.muon)
    model = build(job.shape, job.seed)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    mb = job.shape.microbatches
    grads = _gradients(job, model, [rank * mb + k for k in range(mb)], 1.0 / mb)
    layout = Layout(job)
    counter, labels = CollectiveCounter(), []
    with counter:
        if job.scheme == "replicated":
            whole = torch.cat([layout.flat(g, grads) for g in layout.groups])
            counter.phase = "grad_sync"
            labels.append("accumulated gradients")
            dist.all_reduce(whole)
            whole /= n
            at, new = 0, []
            for g in layout.groups:
                gw, at = whole[at:at + layout.total[g]], at + layout.total[g]
                new.append(layout.flat(g, before) + _group_update(layout, g, muon.get(g), gw, 0, gw))
            gathered = torch.cat(new)
        else:
            shard = torch.empty(layout.shard)
            counter.phase = "grad_sync"
            labels.append("accumulated gradients")
            dist.reduce_scatter_tensor(shard, layout.rank_major(grads))
            shard /= n
            mine, params = layout.group_slices(shard), layout.group_slices(layout.rank_major(before)[
                rank * layout.shard:(rank + 1) * layout.shard])
            new = []
            for g in layout.groups:
                whole = None
                if job.scheme == "gather" and g in muon:
                    whole = torch.empty(layout.total[g])
                    counter.phase = "optimizer"
                    labels.append(f"{g} gradient matrices")
                    dist.all_gather_into_tensor(whole, mine[g].contiguous())  # momentum of step 1: the gradient
                lo = rank * layout.piece[g]
                new.append(params[g] + _group_update(layout, g, muon.get(g), mine[g], lo, whole))
            gathered_rm = torch.empty(layout.shard * n)
            counter.phase = "refresh"
            labels.append("updated parameters")
            dist.all_gather_into_tensor(gathered_rm, torch.cat(new))
            gathered = _from_rank_major(layout, gathered_rm)
    counter.check()
    if len(counter.records) != len(labels):
        raise RuntimeError(f"{len(counter.records)} collectives counted for {len(labels)} issued")
    out = {"rank": rank, "collectives": [{"kind": r.kind, "bytes": r.bytes, "phase": r.phase, "what": w}
                                         for r, w in zip(counter.records, labels)],
           "digest": hashlib.sha256(gathered.numpy().tobytes()).hexdigest()}
    if rank == 0:
        out.update(_against_one_process(job, layout, before, gathered))
    return out


def _unflat(layout: Layout, flats: torch.Tensor, template) -> dict[str, torch.Tensor]:
    """The parameter tensors holding the groups' flats (one after another, in the layout's order)."""
    out = {k: t.clone() for k, t in template.items()}
    at = 0
    for g in layout.groups:
        for e in layout.order[g]:
            piece, at = flats[at:at + size(e)], at + size(e)
            t = out[e.param]
            if e.rows is None:
                t.copy_(piece.view_as(t))
            else:
                t[list(e.rows)] = piece.view((len(e.rows),) + tuple(t.shape[1:]))
    return out


def _from_rank_major(layout: Layout, buf: torch.Tensor) -> torch.Tensor:
    """The groups' flats, one after another, from the ranks' concatenated slices."""
    parts, off = [], 0
    offsets = {}
    for g in layout.groups:
        offsets[g], off = off, off + layout.piece[g]
    for g in layout.groups:
        parts += [buf[j * layout.shard + offsets[g]:j * layout.shard + offsets[g] + layout.piece[g]]
                  for j in range(layout.job.world)]
    return torch.cat(parts)


def _against_one_process(job, layout: Layout, before, gathered: torch.Tensor) -> dict:
    """One process: the whole batch's gradient, whole-matrix Muon on the Muon groups, AdamW elsewhere."""
    model = build(job.shape, job.seed)
    total = job.world * job.shape.microbatches
    grads = _gradients(job, model, list(range(total)), 1.0 / total)
    muon = dict(job.muon)
    after = _unflat(layout, gathered, before)
    natural = Layout(dataclasses.replace(job, scheme="replicated"))
    worst, big, where = 0.0, 0.0, ""
    for g in natural.groups:
        gw = natural.flat(g, grads)
        ref = _group_update(natural, g, muon.get(g), gw, 0, gw)
        got = natural.flat(g, after) - natural.flat(g, before)
        diff = float((got - ref).abs().max())
        big = max(big, float(ref.abs().max()))
        if diff > worst:
            worst, where = diff, g
    return {"update_abs": worst, "update_rel": worst / big if big else worst, "update_worst": where}


def main(outdir: str, rank: int, world: int, port: int) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    job = pickle.loads(Path(outdir, "job.pkl").read_bytes())
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=timedelta(seconds=120))
    try:
        result = run(job, rank)
    except Exception as exc:  # reported as the run's failure, not a traceback of the tool
        result = {"rank": rank, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    Path(outdir, f"muon.{rank}.json").write_text(json.dumps(result))
    finish(outdir, rank)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
