"""Per-storage gradient events of a recorded rank: what follows the data, and the helpers it reads.

The ``Events`` mixin holds, for every tensor storage region, the ordered events that reached it
(``Recorder`` in ``recorder`` is the dispatch mode that feeds it)."""

from __future__ import annotations

import hashlib
import os
import traceback
from fractions import Fraction

import torch

from .lift_facts import LOCAL_OVERFLOW

TORCH_DIR = os.path.dirname(torch.__file__)
PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STDLIB_DIRS = tuple({os.path.dirname(os.__file__)})
STACK_FRAMES = 4  # user frames kept per call, innermost first

# ops whose output holds (a view or a copy of) the input's values: events follow them
_FOLLOW = {
    "clone", "_to_copy", "detach", "alias", "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose",
    "permute", "contiguous", "expand", "squeeze", "unsqueeze", "flatten", "slice", "select", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "cat", "_chunk_cat", "chunk_cat", "split_with_sizes_copy", "view_as",
    "lift_fresh", "to", "add_", "_foreach_add_",
}
_SCALE = {"mul", "mul_", "div", "div_", "_foreach_mul_", "_foreach_div_", "_foreach_mul", "_foreach_div"}
_COPY = {"copy_", "copy"}
_NLL = {"nll_loss_forward", "nll_loss2d_forward"}
_PHASE_REDUCE_OPS = {"sum", "avg", "premul_sum"}


def _key(t: torch.Tensor):
    try:
        st = t.untyped_storage()
        st.data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without real storage (a subclass, meta)
        return -id(t), 0, 0, None
    off = t.storage_offset() * t.element_size()
    span = t.numel() * t.element_size()
    if t.numel() and not t.is_contiguous():
        span = (sum((s - 1) * st_ for s, st_ in zip(t.shape, t.stride())) + 1) * t.element_size()
    return st.data_ptr(), off, off + span, st


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _user_frames(limit: int = STACK_FRAMES) -> list[dict]:
    out = []
    for fr in reversed(traceback.extract_stack()[:-1]):
        if fr.filename.startswith("<"):
            continue
        f = os.path.abspath(fr.filename)
        if f.startswith((TORCH_DIR, PKG_DIR)) or f.startswith(STDLIB_DIRS) or "site-packages" in f:
            continue
        out.append({"file": os.path.relpath(f), "line": fr.lineno, "function": fr.name, "code": (fr.line or "").strip()})
        if len(out) >= limit:
            break
    return out


def _reduce_op(op) -> str:
    if op is None:
        return "sum"
    name = getattr(op, "name", None) or str(op)
    return str(name).split(".")[-1].lower()


def _fraction(x) -> Fraction | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return Fraction(x)
    if isinstance(x, float):
        return Fraction(x).limit_denominator(1 << 20)
    return None


def _checksum(t: torch.Tensor) -> str:
    data = t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha1(data).hexdigest()[:16]



class Events:
    """Events on storage regions: added, read, and carried through copies, views and scaling."""

    def _events_of(self, t: torch.Tensor) -> list[tuple]:
        ptr, lo, hi, _ = _key(t)
        seen, out = set(), []
        for a, b, ev in self.events.get(ptr, ()):
            if a < hi and lo < b and ev not in seen:
                seen.add(ev)
                out.append(ev)
        return out

    def _add(self, t: torch.Tensor, ev: tuple, lo_hi=None) -> None:
        ptr, lo, hi, st = _key(t)
        if lo_hi is not None:
            lo, hi = lo_hi
        if st is None:
            return
        self.events.setdefault(ptr, []).append((lo, hi, ev))
        self.alive[ptr] = st

    def _set(self, t: torch.Tensor, evs: list[tuple], replace: bool) -> None:
        ptr, lo, hi, st = _key(t)
        if st is None:
            return
        lst = self.events.setdefault(ptr, [])
        if replace:
            lst[:] = [x for x in lst if not (lo <= x[0] and x[1] <= hi)]
        have = {x[2] for x in lst if x[0] < hi and lo < x[1]}
        for ev in evs:
            if ev not in have:
                lst.append((lo, hi, ev))
        self.alive[ptr] = st


    def _follow(self, name: str, args, kwargs, out) -> None:
        if name in _NLL and self.phase == "forward":
            target, reduction, ignore = args[1], int(args[3]), int(args[4])
            valid = int((target != ignore).sum())
            entry = {"reduction": {0: "none", 1: "mean", 2: "sum"}.get(reduction, str(reduction)),
                     "tokens": valid, "positions": int(target.numel()),
                     "value": float(out[0].detach().float().sum()), "stack": _user_frames()}
            if 0 < target.numel() <= 4096 and not target.is_floating_point():
                entry["target"] = target.detach().reshape(-1).tolist()  # the labels (lift_cplayout)
            self.step_record()["nll"].append(entry)
            return
        if name == "_amp_foreach_non_finite_check_and_unscale_":
            # GradScaler's unscale: every gradient multiplied by 1 / scale (a power of two, constant within the step)
            # and a found-inf flag set from this rank's own gradients; whether a collective then reduces the flag
            # is read from the collectives (``override overflow``), a check left local is lifted as ``loss_scale: local``
            self._scale("_foreach_mul_", (args[0], float(args[2])), kwargs, None)
            self.note_unmodelled(LOCAL_OVERFLOW, "GradScaler's found-inf flag is set from each rank's own gradients")
            return
        if name in ("add", "add_") and self.phase == "after_backward" and len(args) > 1 \
                and isinstance(args[1], float) and args[1] != 0.0 and isinstance(args[0], torch.Tensor) \
                and args[0].numel() == 1 and args[0].is_floating_point():
            # a constant added to a one-element value after backward (an epsilon on a squared norm): read where
            # the value is then all-reduced (``offset`` on the collective's record)
            self._add(args[0] if name == "add_" else out, ("offset", float(args[1]), self._at()))
        if not self.events and name not in _SCALE:
            return
        if name in _COPY:
            dst, src = args[0], args[1]
            if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor):
                evs = self._events_of(src)
                if evs:
                    # a copy of a value with a history replaces the destination's; a copy of a fresh
                    # value into a collective's buffer is that collective completing (gloo's
                    # asynchronous work copies its result out when waited on) and keeps it
                    whole = dst.numel() * dst.element_size() == dst.untyped_storage().nbytes()
                    self._set(dst, evs, replace=whole)
            return
        in_place = name.endswith("_") or "out" in kwargs
        if name in _SCALE and (self.phase == "after_backward" or (self.phase == "backward" and in_place)):
            # in backward only scaling into an existing buffer (DDP's and FSDP's divisions):
            # autograd's own arithmetic makes fresh tensors and is no step of the gradient program
            self._scale(name, args, kwargs, out)
            return
        if name in _FOLLOW or name in _SCALE:
            ins = [t for t in _tensors(args) if t.numel()]
            evs = []
            for t in ins:
                for ev in self._events_of(t):
                    if ev not in evs and ev[0] != "param":
                        evs.append(ev)
            if evs:
                # a view shares its input's memory, whose regions carry their own histories already:
                # giving it the whole input's history would spread one region's reductions to its
                # neighbours (a parameter's gradient viewed out of a DDP bucket)
                shared = {_key(t)[0] for t in ins}
                for t in _tensors(out):
                    if t.numel() and (name == "add_" or name == "_foreach_add_" or _key(t)[0] not in shared):
                        self._set(t, evs, replace=False)

    def _scale(self, name: str, args, kwargs, out) -> None:
        inplace = name.endswith("_")
        foreach = name.startswith("_foreach")
        targets = list(args[0]) if foreach else [args[0]]
        other = args[1] if len(args) > 1 else None
        outs = targets if inplace else (list(out) if foreach else [out])
        for i, (src, dst) in enumerate(zip(targets, outs)):
            if not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
                continue
            o = other[i] if foreach and isinstance(other, (list, tuple)) else other
            f = _fraction(o)
            if f is None and isinstance(o, torch.Tensor) and o.numel() == 1 and (
                    self.phase == "backward" or not o.is_floating_point()):
                # a scalar the framework wrapped (DDP's 1/world) or an integer count: a constant
                f = _fraction(o.item() if not o.is_floating_point() else float(o))
            if f is None and isinstance(o, torch.Tensor) and o.numel() == 1:
                # its value too: ranks holding replicas must apply the same coefficient (``lift_clipvalues``)
                ev = ("dynamic", self.phase, self._at(), float(o.detach().reshape(())))
            elif f is not None and f != 0:
                # the backward pass it belongs to (0-based within the step): equal scales on two
                # accumulated micro-steps are two events, not one
                ev = ("scale", f if name.startswith(("mul", "_foreach_mul")) else 1 / f, self._at(), self.micro_step())
            else:
                continue
            if not inplace:
                self._set(dst, self._events_of(src), replace=False)
            self._add(dst, ev)

    def _at(self) -> tuple[str, int, str]:
        frames = _user_frames(1)
        return (frames[0]["file"], frames[0]["line"], frames[0]["code"]) if frames else ("", 0, "")
