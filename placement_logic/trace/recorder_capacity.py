"""The MoE dispatch's capacity step, as one rank records it (torch; read by ``lift_capacity``).

After a router call's top-k (``recorder_terms``: its ``router`` record has k and each expert's count), a
``topk`` over the token dimension (dim 0) of a float tensor of the call's shape (rows R, E columns: the
router's scores on its routing map, each expert's column) is the capacity step: it keeps, for each expert, the
C = k tokens of the highest scores. On the call's record it adds ``capacity`` (C), ``kept`` (each expert's
count of the kept entries whose score is positive: the tokens it processes), ``entered`` (the rows with a
positive score in some column: the positions routed into the step; a row the script masked has none) and
``capacity_stack``. Before it, a forward ``mul`` of a float tensor of the call's shape by a 0/1 tensor of R
elements (the padding mask applied to the routing map or the probabilities) records the rows it zeroes
(``masked``). The padded positions are read from these and the cross-entropy's labels (``lift_capacity``).
"""

from __future__ import annotations

from .recorder_events import _user_frames

ROWS = 65536  # the most positions of a router call whose rows are listed


def note_capacity(routers: list[dict], micro: int, scores, capacity: int, values) -> None:
    """A ``topk`` of ``capacity`` over dim 0 of ``scores`` (R×E), ``values`` its kept scores (C×E)."""
    rows, width = int(scores.shape[0]), int(scores.shape[1])
    entry = next((e for e in reversed(routers) if e.get("micro", 0) == micro and "counts" in e
                  and e["rows"] == rows and e["width"] == width and "capacity" not in e), None)
    if entry is None or not 0 < capacity <= rows or rows > ROWS:
        return
    s = scores.detach().float()
    entry["capacity"] = int(capacity)
    entry["kept"] = [int(x) for x in (values.detach().float() > 0).sum(0).tolist()]
    entry["entered"] = [int(i) for i in (s > 0).any(1).nonzero().flatten().tolist()]
    entry["capacity_stack"] = _user_frames()


def note_router_mask(routers: list[dict], micro: int, a, b) -> None:
    """A forward ``mul`` of ``a`` (R×E, a router call's shape) by ``b`` (0/1, R elements), either order."""
    import torch

    for x, m in ((a, b), (b, a)):
        if not (isinstance(x, torch.Tensor) and isinstance(m, torch.Tensor) and x.dim() == 2
                and x.is_floating_point() and m.numel() == x.shape[0] and x.shape[0] <= ROWS):
            continue
        entry = next((e for e in reversed(routers) if e.get("micro", 0) == micro and "counts" in e
                      and e["rows"] == x.shape[0] and e["width"] == x.shape[1] and "capacity" not in e), None)
        mask = m.detach().float().reshape(-1)
        if entry is not None and bool(((mask == 0) | (mask == 1)).all()):
            entry["masked"] = sorted(set(entry.get("masked", [])) | set((mask == 0).nonzero().flatten().tolist()))
            return
