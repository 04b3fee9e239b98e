"""What the recorder reads around the collectives: which module's forward is running, each layer's
input and output on the ranks, and what a script does that the lift does not model (torch).

The ``Modules`` mixin keeps the stack of running module forwards (the global forward pre-hook
pushes, the global forward hook pops), so every collective names the innermost module whose
forward issued it; for every layer with weights it records, once per step (the first forward of
the step), a checksum of its input and of its output and the collectives issued inside its
forward. A row-parallel layer's output is a partial sum until it is all-reduced over the tensor
ranks: the lift compares these checksums between ranks.

``unmodelled`` collects the calls whose effect on the step no plan statement reads (a collective
in the backward of a custom autograd function; checkpoints and the RNG state restored are
``recorder_checkpoint``'s): each is named by the lift, so the verdict is unknown rather than silently
ignoring them.
"""

from __future__ import annotations

import inspect
import os
import sys

import torch
from torch.distributed.tensor import DTensor

from .recorder_events import TORCH_DIR, _checksum, _user_frames
from .recorder_partial import note_reduced, origin_of, partial_ops, statistic_of

MAX_MODULES = 256  # layer records per step


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for y in x:
            t = _first_tensor(y)
            if t is not None:
                return t
    if isinstance(x, dict):
        return _first_tensor(list(x.values()))
    return None


def _sum_of(t) -> str | None:
    if t is None:
        return None
    local = t.to_local() if isinstance(t, DTensor) else t
    try:
        return _checksum(local)
    except (RuntimeError, TypeError, ValueError):  # a tensor without values (meta, fake)
        return None


def _defined_at(module) -> dict | None:
    """The ``def forward`` line of the module's class, when the user wrote it (not torch's own layers)."""
    fn = getattr(type(module), "forward", None)
    try:
        path = inspect.getsourcefile(fn)
        lines, line = inspect.getsourcelines(fn)
    except (TypeError, OSError):
        return None
    if not path or os.path.abspath(path).startswith(TORCH_DIR):
        return None
    return {"file": os.path.relpath(path), "line": line, "function": "forward", "code": lines[0].strip()}


class Modules:
    """The running module forwards, the layers' inputs and outputs, and the unmodelled calls."""

    def _init_modules(self) -> None:
        self.module_stack: list[tuple[int, dict | None, int]] = []  # (module id, layer record, first call seq)
        self.unmodelled: list[dict] = []
        self.seeds: list[dict] = []
        self.asserted: list[dict] = []  # DTensor.from_local calls: the placements asserted, the local values
        self.dropouts: list[dict] = []  # dropouts in forward: their input and output checksums
        self._class_of: dict[int, str] = {}
        self.origins: dict[int, tuple] = {}  # storage ptr -> (the forward op that wrote it, its copy's source)

    @staticmethod
    def _has_weights(module) -> bool:
        return next(module.parameters(recurse=False), None) is not None or any(
            isinstance(v, DTensor) for v in vars(module).values())

    def push_module(self, module, args) -> None:
        rec = None
        self._class_of.setdefault(id(module), type(module).__name__)
        step = self.current
        if self.phase == "forward" and step is not None and self._has_weights(module) and not step["losses"]:
            seen = step.setdefault("modules", [])
            if len(seen) < MAX_MODULES and all(m["_id"] != id(module) for m in seen):
                rec = {"_id": id(module), "class": type(module).__name__, "input": _sum_of(_first_tensor(args)),
                       "output": None, "collectives": [], "stack": _user_frames(), "_args": args}
                at = _defined_at(module)
                if at:
                    rec["at"] = at
                seen.append(rec)
        self.module_stack.append((id(module), rec, len(self.collectives) + len(self.unrecognised)))

    def pop_module(self, module, output) -> None:
        for i in range(len(self.module_stack) - 1, -1, -1):
            if self.module_stack[i][0] == id(module):
                _, rec, first = self.module_stack[i]
                del self.module_stack[i:]
                opened = getattr(self, "_router_open", None)  # a router call's forward ended (recorder_router)
                if opened is not None and i < len(opened[1]):
                    self._router_open = None
                if rec is not None:
                    rec["output"] = _sum_of(_first_tensor(output))
                    rec["collectives"] = [c["seq"] for c in self.collectives if c["seq"] >= first]
                    args = rec.pop("_args", ())
                    reduced = any(c["seq"] >= first and c.get("_module") == id(module) and c["kind"] == "all_reduce"
                                  and c.get("op", "sum") == "sum" for c in self.collectives)
                    scattered = any(c["seq"] >= first and c.get("_module") == id(module)
                                    and c["kind"] == "reduce_scatter" and c.get("op", "sum") == "sum"
                                    for c in self.collectives)
                    reduced = "scatter" if scattered and not reduced else reduced
                    partial = self._partial_ops(module, args, output, reduced)
                    if partial is not None:
                        rec["partial"] = partial
                return

    def _partial_ops(self, module, args, output, reduced: bool | str) -> dict | None:
        """The fingerprints of a layer that all-reduced a sum in its own forward, or of one with a bias
        (``recorder_partial``)."""
        self._busy = True  # the recomputed product is none of the script's ops
        try:
            return partial_ops(module, args, output, reduced)
        except (RuntimeError, TypeError, ValueError):  # a tensor without values (meta, fake)
            return {"recomputed": False} if reduced else None
        finally:
            self._busy = False

    def summand_origin(self, rec: dict, first) -> None:
        """A forward all-reduce or reduce-scatter: the op that wrote its input (``origin``, through copies)."""
        if self.phase == "forward" and rec["kind"] in ("all_reduce", "reduce_scatter"):
            rec["origin"] = origin_of(self.origins, first)
            of = statistic_of(self.origins, first)
            if of:
                rec["statistic_of"] = of  # the statistic's own input: an addition's result or not
            if rec["kind"] == "all_reduce" and rec.get("op", "sum") == "sum" and rec["api"].startswith("c10d."):
                note_reduced(self.origins, first)

    def running_module(self) -> int | None:
        return self.module_stack[-1][0] if self.module_stack else None

    def note_unmodelled(self, what: str, detail: str = "") -> None:
        if len(self.unmodelled) < 64:
            self.unmodelled.append({"what": what, "detail": detail, "phase": self.phase,
                                    "step": self.current["step"] if self.current is not None else -1,
                                    "stack": _user_frames()})

    def note_seed(self, seed) -> None:
        if len(self.seeds) < 64:
            self.seeds.append({"seed": str(seed), "step": self.current["step"] if self.current is not None else -1,
                               "stack": _user_frames()})

    def note_from_local(self, local, mesh, placements) -> None:
        """A ``DTensor.from_local`` from the user's code: the placements it asserts, the ranks of each mesh
        dimension's group, and a checksum of this rank's local values (compared between the ranks by the lift)."""
        import torch.distributed as dist

        if len(self.asserted) >= 64:
            return
        groups = []
        for i in range(mesh.ndim):
            try:
                groups.append([int(r) for r in dist.get_process_group_ranks(mesh.get_group(i))])
            except (RuntimeError, ValueError, AttributeError):  # a mesh dimension without a group here
                groups.append([])
        mid = self.running_module()
        self.asserted.append({"placements": [str(p) for p in placements], "groups": groups,
                              "checksum": _sum_of(local), "phase": self.phase,
                              "step": self.current["step"] if self.current is not None else -1,
                              "_module": mid, "stack": _user_frames()})

    def dropout_input(self, t, p, training) -> str | None:
        """The checksum of a dropout's input where it draws a mask in a step's forward, else None."""
        if not training or not p or self.current is None or self.phase != "forward" or len(self.dropouts) >= 64:
            return None
        return _sum_of(t) or ""

    def note_dropout(self, before: str, out, p) -> None:
        self.dropouts.append({"p": float(p), "input": before, "output": _sum_of(out) or "",
                              "step": self.current["step"], "_module": self.running_module(),
                              "stack": _user_frames()})

    def custom_backward(self) -> str | None:
        """The custom autograd function whose ``backward`` (user code) is running, if any."""
        f = sys._getframe(1)
        while f is not None:
            if f.f_code.co_name == "backward" and not os.path.abspath(f.f_code.co_filename).startswith(TORCH_DIR):
                ctx = f.f_locals.get("ctx")
                if ctx is not None:
                    return type(ctx).__name__.removesuffix("Backward")
            f = f.f_back
        return None

    def module_names(self) -> dict[int, str]:
        """Module id -> fully qualified name, from the outermost module that holds it."""
        from torch.nn.parallel import DistributedDataParallel

        best: dict[int, str] = {}
        for m in list(self.modules.values()):
            if isinstance(m, DistributedDataParallel):
                continue
            for name, sub in m.named_modules(remove_duplicate=False):
                if name and len(name) > len(best.get(id(sub), "")):
                    best[id(sub)] = name
        return best

    def registration(self) -> list[dict]:
        """Every DistributedDataParallel module seen: its parameters' names and shapes in registration order (the
        order DDP lays its gradient buckets out from, and pairs by index across the ranks)."""
        from torch.nn.parallel import DistributedDataParallel

        return [{"params": [[n, list(p.shape)] for n, p in m.module.named_parameters()]}
                for m in self.modules.values() if isinstance(m, DistributedDataParallel)][:4]

    def resolve_modules(self) -> None:
        """Replace the recorded module ids by their names (at the end of the run)."""
        names = self.module_names()
        for c in self.collectives:
            mid = c.pop("_module", None)
            if mid is not None:
                c["module"] = names.get(mid, self._class_of.get(mid, "<module>"))
        for a in self.asserted + self.dropouts:
            mid = a.pop("_module", None)
            if mid is not None:
                a["module"] = names.get(mid, self._class_of.get(mid, "<module>"))
        for st in self.steps:
            for m in st.get("modules", []):
                mid = m.pop("_id", None)
                m.pop("_args", None)
                m["name"] = names.get(mid, m["class"])


def caller_is_user(depth: int = 2) -> bool:
    """Whether the caller ``depth`` frames up is the user's code (not torch calling itself)."""
    f = sys._getframe(depth)
    return f is not None and not os.path.abspath(f.f_code.co_filename).startswith(TORCH_DIR)
