"""The strategy each data (or context) axis of a traced step is lifted as.

Input: the step's data axes, the observer's parameters and collectives, the mesh layout.
Output: the binding of each axis (``ddp``, ``zero1``, ``zero3``, ``fsdp_shard_grad_op``,
``context_parallel``), the script frames each was lifted from, and the axes whose updated
optimizer shards are never sent back; what cannot be lifted is added to ``items``.
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames, _Layout, _optimizer_sharded, _placement_axes, _stepped_differently


def data_bindings(data_axes, params, layout: _Layout, step_colls, axes, cp, step, observer: int,
                  items: list[Unliftable], script: str):
    """(bindings, binding frames, no_regather) of the data axes."""
    bindings: dict[str, str] = {}
    no_regather: list[tuple[str, list[dict]]] = []
    binding_frames: dict[str, list[dict]] = {}
    for a in data_axes:
        sharded = any(a in _placement_axes(p, layout) for p in params)
        over = [c for c in step_colls if a in axes(c)]
        binding_frames[a] = _frames((c["stack"] for c in over), script)
        if a == cp:
            bindings[a] = "context_parallel"
            if sharded or _optimizer_sharded(step, layout, observer, a):
                items.append(Unliftable((observer,), -1, f"axis {a}", "parameters or optimizer state sharded over "
                                        "the context axis are not lifted (context_parallel replicates them)", ()))
        elif sharded:
            regather = any(c["kind"] == "all_gather" and c["phase"] == "backward" and a in axes(c) for c in step_colls)
            bindings[a] = "zero3" if regather else "fsdp_shard_grad_op"
        elif _optimizer_sharded(step, layout, observer, a):
            bindings[a] = "zero1"
            # the updated shards must come back: broadcasts or all-gathers over the axis after the step
            synced = [c for c in step_colls if c["phase"] == "optimizer" and c["kind"] in ("broadcast", "all_gather")
                      and a in axes(c)]
            if not synced:
                no_regather.append((a, _frames([step[observer]["optimizer"].get("stack", [])], script)))
        else:
            bindings[a] = "ddp"
            if _stepped_differently(step, layout, observer, a):
                items.append(Unliftable((observer, layout.neighbour(observer, a)), -1, f"the optimizer over {a}",
                                        f"ranks along {a} step different parameters with optimizers of their own "
                                        "(optimizer state sharded by hand): which shard each rank updates, and "
                                        "whether the updated shards are sent back, is not lifted",
                                        tuple(step[observer]["optimizer"].get("stack", []))))
    return bindings, binding_frames, no_regather
