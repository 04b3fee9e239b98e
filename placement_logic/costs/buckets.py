"""DeepSpeed's runtime buffers as transient memory (``model { buckets { ... } }``).

Input: the settings a spec states (``ir.Model.buckets``, DeepSpeed's config names), the plan's
reconstruction unit and gathered model per device (parameters), the shape's groups. Output:
the transient terms that replace the engine's own working set where DeepSpeed decides it
(docs/costs.md, "DeepSpeed's buckets"), each an exact sympy expression:

* ZeRO-3 gathered parameters (``runtime/zero/partitioned_param_coordinator.py``,
  ``fetch_sub_module``/``__params_to_release``): the module being run is gathered whatever the
  limits; parameters reused within ``max_reuse_distance`` elements of the trace are not released
  (at most that many, and no more than the rest of the model); the prefetch then adds at most
  ``min(max_live_parameters − available, prefetch_bucket_size)`` elements, and only while fewer
  than ``max_live_parameters`` are available; every step consumes one module and prefetches up
  to the bucket again, so a bucket larger than a module runs the window up to the live limit.
  Per device, with U the unit (one layer), M the gathered model and r = min(max_reuse_distance
  / 2, M − U): window = min(M, U + r) without prefetch (bucket 0), else
  min(M, max(max_live_parameters, U + r) + prefetch_bucket_size).
* The gradient reduction bucket (``stage_1_and_2.py`` ``backward``: one buffer of
  ``reduce_bucket_size`` elements in the parameters' dtype, two with ``overlap_comm``;
  ``stage3.py``: one flat ``__ipg_bucket_flat_buffer``).
* Parameters of at most ``param_persistence_threshold`` elements kept whole
  (``parameter_offload.py`` ``mark_persistent_parameters``: ``ds_numel <= param_threshold``):
  the groups whose every tensor is that small, held whole over the gathered axes.
"""

from __future__ import annotations

import sympy

from .. import ir
from .sizes import Shape, Split
from .symbolic import symbol, to_sympy

# DeepSpeed's defaults (``runtime/zero/config.py``, DeepSpeedZeroConfig); overlap_comm: stage 3 only
DEFAULTS = {"reduce_bucket_size": 500_000_000, "prefetch_bucket_size": 50_000_000,
            "max_live_parameters": 1_000_000_000, "max_reuse_distance": 1_000_000_000,
            "param_persistence_threshold": 100_000, "contiguous_gradients": 1}
# the largest tensor of each group DeepSpeed may persist: norms and biases h (a layernorm's weight
# and bias each h), the query/key norms one head's width, the router h × experts
SMALL_GROUPS = ("norms", "final_norm", "biases", "mlp_biases", "expert_biases", "qk_norms", "router")


def settings(model: ir.Model, stage3: bool) -> dict | None:
    """The stated settings over DeepSpeed's defaults (None: no ``buckets`` block)."""
    if model.buckets is None:
        return None
    out = {k: sympy.Integer(v) for k, v in DEFAULTS.items()}
    out["overlap_comm"] = sympy.Integer(int(stage3))  # DeepSpeedZeroConfig.overlap_comm_valid
    out.update({k: to_sympy(v) for k, v in model.buckets})
    return out


def gathered_window(cfg: dict, unit: sympy.Expr, model: sympy.Expr) -> sympy.Expr:
    """Gathered parameter elements alive at once per device (see the module's docstring)."""
    kept = sympy.Min(cfg["max_reuse_distance"] / 2, sympy.Max(model - unit, 0))
    prefetch = cfg["prefetch_bucket_size"]
    held = unit + kept
    if prefetch.is_number and prefetch == 0:  # no prefetch at all (``if self.__prefetch_bucket_sz > 0``)
        return sympy.Min(model, held)
    return sympy.Min(model, sympy.Max(cfg["max_live_parameters"], held) + prefetch)


def reduce_buffers(cfg: dict, stage3: bool) -> sympy.Expr:
    """How many reduction buckets are alive: two under ``overlap_comm`` at stages 1-2 (the double
    buffer), one otherwise."""
    return sympy.Integer(1) if stage3 else sympy.Integer(1) + cfg["overlap_comm"]


def _tensor(sh: Shape, name: str) -> sympy.Expr | None:
    if name == "qk_norms":
        return sh.h / sh.a
    if name == "router":
        return sh.h * sh.experts
    return sh.h


def persisted(cfg: dict, sh: Shape, split: Split, rest: tuple[str, ...], gathered: tuple[str, ...],
              notes: list[str]) -> tuple[sympy.Expr, tuple[str, ...]]:
    """Parameters per device DeepSpeed keeps whole over the gathered axes beyond their shard:
    the small groups whose largest tensor is at most the threshold (decided where both are
    numbers; a note otherwise)."""
    threshold = cfg["param_persistence_threshold"]
    total, names = sympy.Integer(0), []
    n = sympy.Mul(*(symbol(a) for a in gathered))
    for g in sh.groups:
        if g.name not in SMALL_GROUPS or g.group.user:
            continue
        size = _tensor(sh, g.name)
        small = size - threshold
        if not small.is_number:
            notes.append(f"buckets: whether group {g.name}'s tensors ({size} elements) stay under "
                         f"param_persistence_threshold is not decided with symbols; they are taken as sharded")
            continue
        if small > 0:
            continue
        whole = g.count * split.share(g, rest, sh.kv)
        total += whole - whole / n
        names.append(g.name)
    return total, tuple(names)
