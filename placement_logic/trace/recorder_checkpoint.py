"""What the script's checkpoint calls save, load and restore, per rank (the recorder's ``checkpoints``).

Each ``torch.save`` / ``torch.load`` and ``torch.distributed.checkpoint`` save or load from the user's code is
recorded with the file it names (an absolute path; none for a file object or a storage writer without a path)
and the states the object holds: ``params`` (the model's parameters, found by the storage of the tensors the
modules seen in forward hold), ``optimizer`` (the tensors under ``"state"`` of an optimizer state dict: a dict
with ``"state"`` and ``"param_groups"``, or an optimizer's own state tensors), ``rng`` (a generator state: a
uint8 tensor named ``rng`` or of the CPU generator's 5056 bytes). A state saved as DTensors with a ``Shard``
placement is ``sharded`` (FSDP2's state dicts hold each rank's shard). ``torch.set_rng_state`` records the
checksum of the state set; the RNG states saved and loaded carry theirs, so the lift tells whose state a rank
restored. Each save and load also carries the checksum of the generators' states (``torch.get_rng_state()``,
and every CUDA device's where CUDA is initialised) the rank held before the save (``rng_before``: at the save,
or for a rank that saves nothing at its last optimizer step's end or save before the load) and, on a load, the
state the rank resumes from (``rng_after``: read at the next step's first forward, the next save or the end of
the run, so a ``set_rng_state`` or a generator's ``set_state`` after the load counts, and a skipped RNG load
does not). ``Module.load_state_dict``, ``Optimizer.load_state_dict`` and torch.distributed.checkpoint's
``set_state_dict`` family record the states a resume puts back (``restore``). The lift (``lift_checkpoint``)
reads them; this module imports torch.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

from .recorder_events import _checksum, _user_frames

CPU_RNG_BYTES = 5056  # torch.get_rng_state() of the CPU generator (mt19937)
MAX_RECORDS = 64


def _generators() -> str:
    """The checksum of the CPU generator's state and, where CUDA is initialised, every CUDA device's (dropout on a
    GPU draws from its device's generator: one left at its seed changes the checksum too)."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += list(torch.cuda.get_rng_state_all())
    return _checksum(torch.cat(states)) if len(states) > 1 else _checksum(states[0])


def _path(f) -> str:
    """The absolute path a save or load names, or '' (a file object, a storage writer without a path)."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f))
    return ""


def _local(t):
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor
        return t, False
    if isinstance(t, DTensor):
        return t._local_tensor, any(p.is_shard() for p in t.placements)
    return t, False


def _kind(loc, key: str, under_optimizer: bool, params: dict, opt: dict, loaded: bool) -> str | None:
    """The state a saved tensor (its local part) is: rng, optimizer, params (the model's, or with ``loaded`` a
    loaded floating-point tensor outside an optimizer's state), or None (an optimizer's step count, other)."""
    if loc.dtype == torch.uint8 and ("rng" in key.lower() or loc.numel() == CPU_RNG_BYTES):
        return "rng"
    if under_optimizer or (loc.numel() and loc.data_ptr() in opt):
        return "optimizer" if not key.endswith(".step") else None
    if loc.numel() and loc.data_ptr() in params:
        return "params"
    if loaded and loc.is_floating_point():
        return "params"  # a loaded model state: floating-point tensors outside an optimizer's state
    return None


class Checkpoints:
    """The recorder's checkpoint records (mixed into ``Recorder``; ``modules`` and ``optimizers`` are its)."""

    def _init_checkpoints(self) -> None:
        self.checkpoints: list[dict] = []
        self.optimizers: dict[int, object] = {}  # id -> optimizer stepped
        self._rng_mark: str | None = None  # the CPU generator's state at the last step's end or save
        self._rng_waiting: list[dict] = []  # loads whose resumed RNG state is not read yet

    def mark_rng(self) -> None:
        """The CPU generator's state at an optimizer step's end: the state a save right after it holds."""
        self._rng_mark = _generators()

    def settle_rng(self) -> None:
        """The state the loads since the last save resume from: read before the next step draws anything."""
        if self._rng_waiting:
            now = _generators()
            for e in self._rng_waiting:
                e["rng_after"] = now
            self._rng_waiting.clear()

    def _known(self) -> tuple[dict, dict]:
        """Storage pointer -> elements, of the parameters of every module seen and of every optimizer's state
        tensors (this rank's: its shards where the strategy shards them)."""
        params, opt = {}, {}
        for m in list(self.modules.values()):
            for p in m.parameters():
                loc, _ = _local(p)
                if loc.numel():
                    params[loc.data_ptr()] = loc.numel()
        for o in list(self.optimizers.values()):
            for inner in (o, getattr(o, "optim", None)):
                for st in (getattr(inner, "state", None) or {}).values():
                    for k, v in (st.items() if isinstance(st, dict) else ()):
                        if isinstance(v, torch.Tensor) and k != "step":
                            loc, _ = _local(v)
                            if loc.numel():
                                opt[loc.data_ptr()] = loc.numel()
        return params, opt

    def _contents(self, obj, known: tuple[dict, dict] | None) -> dict:
        """The states an object holds, which of them are sharded DTensors, their elements (and, beside them, the
        elements of the states this rank holds: more saved than held is a gathered copy), and the RNG states'
        checksums."""
        states, sharded, rng, elements = set(), set(), [], {}
        params, opt = known or ({}, {})

        def walk(x, key: str, under_optimizer: bool, depth: int) -> None:
            if depth > 12:
                return
            if isinstance(x, torch.Tensor):
                loc, shard = _local(x)
                kind = _kind(loc, key, under_optimizer, params, opt, known is None)
                if kind == "rng":
                    rng.append(_checksum(loc))
                if kind:
                    states.add(kind)
                    elements[kind] = elements.get(kind, 0) + loc.numel()
                    if shard and kind != "rng":
                        sharded.add(kind)
                return
            if isinstance(x, dict):
                opt_dict = "state" in x and "param_groups" in x
                for k, v in list(x.items())[:100000]:
                    if opt_dict and k == "param_groups":
                        continue
                    walk(v, f"{key}.{k}", under_optimizer or (opt_dict and k == "state"), depth + 1)
            elif isinstance(x, (list, tuple)):
                for i, v in enumerate(x[:100000]):
                    walk(v, f"{key}.{i}", under_optimizer, depth + 1)
            elif hasattr(x, "state_dict") and callable(x.state_dict) and depth == 0:
                walk(x.state_dict(), key, under_optimizer, depth + 1)  # a Stateful handed to dcp

        walk(obj, "", False, 0)
        out = {"states": sorted(states), "sharded": sorted(sharded), "rng": rng, "elements": elements}
        if known is not None:
            out["held"] = {"params": sum(params.values()), "optimizer": sum(opt.values())}
        return out

    def note_checkpoint(self, op: str, api: str, path: str, obj, known: bool, states: tuple = ()) -> None:
        if len(self.checkpoints) >= MAX_RECORDS:
            return
        try:
            contents = ({"states": list(states), "sharded": [], "rng": []} if states
                        else self._contents(obj, self._known() if known else None))
        except Exception:  # an object the walk cannot read: its states stay unknown (the lift reports it)
            contents = {"states": [], "sharded": [], "rng": [], "unread": True}
        e = {"op": op, "api": api, "file": path, **contents,
             "step": self.current["step"] if self.current is not None else -1, "stack": _user_frames()}
        if op == "save":
            self.settle_rng()
            self._rng_mark = _generators()
        if op in ("save", "load") and self._rng_mark is not None:
            e["rng_before"] = self._rng_mark
        if op == "load":
            self._rng_waiting.append(e)
        self.checkpoints.append(e)


def _wrap(rec, caller_is_user, owner, name: str, api: str, op: str, path_of, obj_of, after: bool) -> None:
    """Note the user's calls of ``owner.name`` (a save or load), before the call or, with ``after``, after it."""
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "_placement_noted", False):
        return

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        user = caller_is_user()
        if user and not after:
            rec.note_checkpoint(op, api, path_of(args, kwargs), obj_of(args, kwargs), known=True)
        out = fn(*args, **kwargs)
        if user and after:
            rec.note_checkpoint(op, api, path_of(args, kwargs), out if op == "load" else obj_of(args, kwargs),
                                known=op != "load")
        return out
    wrapper._placement_noted = True
    setattr(owner, name, wrapper)


def _restores(rec, caller_is_user, owner, name: str, api: str, states: tuple) -> None:
    """A state dict put back into the model or the optimizer (``restore``: which states a resume sets)."""
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "_placement_noted", False):
        return

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if caller_is_user():
            rec.note_checkpoint("restore", api, "", None, known=False, states=states)
        return fn(*args, **kwargs)
    wrapper._placement_noted = True
    setattr(owner, name, wrapper)


def _arg(i, name):
    return lambda a, k: k[name] if name in k else (a[i] if len(a) > i else None)


def _dcp_path(a, k) -> str:
    p = k.get("checkpoint_id")
    writer = k.get("storage_writer") or k.get("storage_reader")
    if p is None and writer is not None:
        p = getattr(writer, "path", None)
    return _path(p) if p is not None else ""


def _install_restores(rec, caller_is_user) -> None:
    """Wrap the model's, the optimizers' and the distributed state dicts' loads of a state dict."""
    restores = functools.partial(_restores, rec, caller_is_user)
    restores(torch.nn.Module, "load_state_dict", "Module.load_state_dict", ("params",))
    try:
        importlib.import_module("torch.distributed.optim")  # ZeroRedundancyOptimizer: its own load_state_dict
    except ImportError:  # a torch without distributed optimizers
        pass
    pending = [torch.optim.Optimizer]
    while pending:  # the optimizers that define their own load_state_dict, too
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is torch.optim.Optimizer or "load_state_dict" in vars(cls):
            restores(cls, "load_state_dict", f"{cls.__name__}.load_state_dict", ("optimizer",))
    try:
        import torch.distributed.checkpoint.state_dict as sd
    except ImportError:  # a torch without distributed state dicts
        sd = None
    if sd is not None:
        restores(sd, "set_state_dict", "set_state_dict", ("params", "optimizer"))
        restores(sd, "set_model_state_dict", "set_model_state_dict", ("params",))
        restores(sd, "set_optimizer_state_dict", "set_optimizer_state_dict", ("optimizer",))


def install(rec, caller_is_user) -> None:
    """Wrap torch.save/load, torch.distributed.checkpoint's save and load, and set_rng_state."""
    wrap = functools.partial(_wrap, rec, caller_is_user)
    _install_restores(rec, caller_is_user)
    wrap(torch, "save", "torch.save", "save", lambda a, k: _path(_arg(1, "f")(a, k)), _arg(0, "obj"), False)
    wrap(torch, "load", "torch.load", "load", lambda a, k: _path(_arg(0, "f")(a, k)), lambda a, k: None, True)
    try:
        import torch.distributed.checkpoint as dcp
    except ImportError:  # a torch without distributed checkpointing
        dcp = None
    if dcp is not None:
        for name in ("save", "async_save", "save_state_dict"):
            wrap(dcp, name, f"torch.distributed.checkpoint.{name}", "save", _dcp_path, _arg(0, "state_dict"), False)
        for name in ("load", "load_state_dict"):
            # dcp loads in place: the states the object held before the load are the ones read
            wrap(dcp, name, f"torch.distributed.checkpoint.{name}", "load", _dcp_path, _arg(0, "state_dict"), False)
    for owner, prefix in ((torch, "torch"), (torch.random, "torch.random")):
        wrap(owner, "set_rng_state", f"{prefix}.set_rng_state", "set_rng_state", lambda a, k: "",
             lambda a, k: {"rng": _arg(0, "new_state")(a, k)}, False)
