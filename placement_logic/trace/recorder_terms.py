"""The loss's extra terms and masks, as one rank records them (torch; read by ``lift_terms``).

* Every cross-entropy (``F.cross_entropy``, wrapped in ``bootstrap``) gets on its ``nll`` record the
  ``label_smoothing`` it was called with, its whole value (smoothing included), the vocabulary size
  (``classes``) and the width of the logits' local slice (``width``: the vocabulary slice of a tensor rank
  under ``loss_parallel``), and ``stats``: over the labelled positions, Σ lse² and Σ (lse − mean logit), lse
  the log-sum-exp over the whole vocabulary (``true``) and over the local slice (``local``; the smoothing's
  mean over the local slice). The lift compares an added term's value with them. The collectives whose
  output the logits hold (followed through views, copies and constant scales) are listed
  (``input_collectives``): a sequence all-gathered before the loss (``lift_gathered``).
* The cross-entropy's output carries a ``loss_ce`` event (``Events``), which follows it through views and
  constant scales; a forward ``add`` of a one-element value that carries it and one that does not records
  the two operands' values (``terms``): the cross-entropy part and the term added to it.
* A forward all-reduce of one vector of 2 to 256 values records its input (``vector_in``).
* A softmax in forward over the last dimension of a 2-D float tensor of at most 256 columns (a router's
  probabilities, E experts) records ``router`` on the step (its width, rows and column sums) and carries
  ``router``; a ``topk`` of it adds k and each column's count of the chosen indices (``lift_auxloss``), a later
  ``topk`` over the token dimension of the call's shape its capacity step (``recorder_capacity``).
* A per-token cross-entropy (``reduction='none'``) carries ``loss_tok``; a forward ``mul`` of it by a
  0/1 tensor of the same size (a loss mask) records on the ``nll`` record (``mask``) the mask's sum, the
  positions it keeps whose label is not ignored (``labelled``) and the masked losses' sum.
"""

from __future__ import annotations

import torch

from .recorder_capacity import note_capacity, note_router_mask
from .recorder_events import _user_frames
from .recorder_router import note_router_choice, note_router_input, note_router_op, note_sums

CE = ("loss_ce",)
TOKENS = ("loss_tok",)
ROUTER = ("router",)


def _value(t) -> float:
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    return float(local.detach().float().sum())


def _stats(input, target, ignore: int) -> dict | None:
    """Σ lse² and Σ (lse − mean logit) over the labelled positions, whole vocabulary and local slice."""
    from torch.distributed.tensor import DTensor

    if input.dim() != 2 or target.dim() != 1 or not input.is_floating_point():
        return None
    local = input.to_local() if isinstance(input, DTensor) else input
    whole = input.full_tensor() if isinstance(input, DTensor) else input
    labels = target.to_local() if isinstance(target, DTensor) else target
    keep = labels != ignore
    whole, local = whole.detach().float()[keep], local.detach().float()[keep]
    lse = whole.logsumexp(-1)
    lse_local = local.logsumexp(-1)
    return {"zsq_true": float((lse * lse).sum()), "zsq_local": float((lse_local * lse_local).sum()),
            "smooth_true": float((lse - whole.mean(-1)).sum()), "smooth_local": float((lse - local.mean(-1)).sum())}


def _real(*ts) -> bool:
    """Tensors with values (no meta or fake tensor, a DTensor's local one included)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.tensor import DTensor

    for t in ts:
        local = t.to_local() if isinstance(t, DTensor) else t
        if not isinstance(local, torch.Tensor) or local.is_meta or isinstance(local, FakeTensor):
            return False
    return True


class Terms:
    """Recorder mixin: the cross-entropy's own terms and what is added to it."""

    def note_cross_entropy(self, input, target, kwargs: dict, out, before: int) -> None:
        """After ``F.cross_entropy`` (called in forward): complete the record its ``nll_loss`` made (or the one
        the DTensor path appended), tag its output."""
        from torch.distributed.tensor import DTensor

        nll = self.step_record()["nll"]
        if len(nll) <= before or not _real(input, target, out):
            return  # a schedule's shape inference runs the loss on tensors without values
        entry = nll[-1]
        smoothing = float(kwargs.get("label_smoothing", 0.0) or 0.0)
        local = input.to_local() if isinstance(input, DTensor) else input
        entry["classes"] = int(input.shape[1] if input.dim() >= 2 else input.shape[0])
        entry["width"] = int(local.shape[1] if local.dim() >= 2 else local.shape[0])
        if smoothing:
            entry["label_smoothing"] = smoothing
        self._busy = True
        try:
            entry["input_collectives"] = sorted({ev[1] for ev in self._events_of(local) if ev[0] == "collective"})
            if entry.get("reduction") in ("mean", "sum"):
                entry["value"] = _value(out)  # the whole cross-entropy, its smoothing included
                stats = _stats(input, target, int(kwargs.get("ignore_index", -100)))
                if stats is not None:
                    entry["stats"] = stats
            labels = target.to_local() if isinstance(target, DTensor) else target
            self._ce_labels = (labels.detach(), int(kwargs.get("ignore_index", -100)))  # a loss mask's labelled part
            tag = out.to_local() if isinstance(out, DTensor) else out
            self._add(tag, CE if entry.get("reduction") in ("mean", "sum") else TOKENS)
        finally:
            self._busy = False

    def note_vector(self, rec: dict, inputs) -> None:
        """A forward all-reduce of one vector of 2 to 256 values: its input (``vector_in``, lift_auxloss)."""
        if self.phase == "forward" and rec["kind"] == "all_reduce" and 1 < rec["numel"] <= 256 and len(inputs) == 1 \
                and _real(inputs[0]):
            rec["vector_in"] = inputs[0].detach().float().reshape(-1).tolist()
        if rec["kind"] in ("all_reduce", "reduce_scatter") and _real(*[t for t in inputs if isinstance(t, torch.Tensor)]):
            note_sums(self, rec, inputs)  # an all-reduced activation's summands (recorder_router)

    def follow_router(self, name: str, args, out) -> None:
        """A router's probabilities (a 2-D softmax of at most 256 columns) and the top-k chosen from them."""
        if name == "_softmax" and isinstance(args[0], torch.Tensor) and args[0].dim() == 2 \
                and 2 <= args[0].shape[1] <= 256 and int(args[1]) in (-1, 1) and args[0].is_floating_point() \
                and isinstance(out, torch.Tensor) and _real(args[0]):
            probs = out.detach().float()
            self.step_record().setdefault("router", []).append({
                "width": int(probs.shape[1]), "rows": int(probs.shape[0]), "colsum": probs.sum(0).tolist(),
                "micro": self.micro_step(), "stack": _user_frames()})
            note_router_input(self, self.step_record()["router"][-1])  # its input and noise (recorder_router)
            self._add(out, ROUTER)
        elif name == "topk" and len(args) >= 3 and int(args[2]) == 0 and isinstance(args[0], torch.Tensor) \
                and args[0].dim() == 2 and args[0].is_floating_point() and isinstance(out, (tuple, list)) \
                and _real(args[0]):
            note_capacity(self.step_record().get("router") or [], self.micro_step(), args[0], int(args[1]), out[0])
        elif name == "topk" and len(args) >= 2 and isinstance(args[0], torch.Tensor) \
                and ROUTER in self._events_of(args[0]) and isinstance(out, (tuple, list)) and len(out) == 2:
            entry = next((e for e in reversed(self.step_record().get("router") or [])
                          if e["rows"] == args[0].shape[0] and e["width"] == args[0].shape[-1]), None)
            if entry is not None and "counts" not in entry:
                entry["top_k"] = int(args[1])
                entry["counts"] = torch.bincount(out[1].reshape(-1), minlength=entry["width"]).tolist()
                note_router_choice(entry, out)

    def follow_terms(self, name: str, args, out) -> None:
        """A forward ``add`` of a term to the cross-entropy; a forward ``mul`` of the per-token losses by a mask."""
        if name in ("_softmax", "topk"):
            self.follow_router(name, args, out)
            return
        note_router_op(self, name, args, out)  # the router linear's input, the noise drawn (recorder_router)
        if name in ("add", "add_") and len(args) >= 2 and all(isinstance(a, torch.Tensor) and a.numel() == 1
                                                            and a.is_floating_point() for a in args[:2]) \
                and _real(*args[:2]):
            tagged = [CE in self._events_of(a) for a in args[:2]]
            if tagged.count(True) == 1:
                ce, other = (args[0], args[1]) if tagged[0] else (args[1], args[0])
                rec = self.step_record()
                rec.setdefault("terms", []).append({"ce": float(ce.detach()), "other": float(other.detach()),
                                                    "micro": self.micro_step(), "stack": _user_frames()})
            if any(tagged) and isinstance(out, torch.Tensor):
                self._add(out, CE)
            return
        if name in ("mul", "mul_") and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2]):
            a, b = args[0], args[1]
            if self.step_record().get("router") and _real(a, b):  # a padding mask on a routing map
                note_router_mask(self.step_record()["router"], self.micro_step(), a, b)
            tagged = [TOKENS in self._events_of(t) for t in (a, b)]
            if tagged.count(True) != 1:
                return
            losses, mask = (a, b) if tagged[0] else (b, a)
            if mask.numel() != losses.numel() or mask.is_complex() or not _real(losses, mask):
                return
            m = mask.detach().float()
            if not bool(((m == 0) | (m == 1)).all()):
                return
            nll = self.step_record()["nll"]
            entry = next((n for n in reversed(nll) if n.get("reduction") == "none"), None)
            if entry is None or "mask" in entry:
                return
            m = m.reshape(-1)
            labelled = int(m.sum())
            labels, ignore = getattr(self, "_ce_labels", (None, -100))
            if labels is not None and labels.numel() == m.numel():
                labelled = int(((labels.reshape(-1) != ignore) & (m == 1)).sum())
            entry["mask"] = {"sum": int(m.sum()), "labelled": labelled,
                             "value": float((losses.detach().float().reshape(-1) * m).sum()), "stack": _user_frames()}
