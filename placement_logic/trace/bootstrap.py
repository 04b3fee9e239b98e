"""One rank of ``placement trace``: run the user's script under the recorder (torch).

``python -m placement_logic.trace.bootstrap OUT_JSON SCRIPT ARGS...``, started by
``launch`` with the environment torchrun gives a rank (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT). The script runs as ``__main__`` (``runpy``) with its own
``sys.argv``; the recorder is active from its first line to its end, and its part of the
trace is written to OUT_JSON even when the script raises (the error is recorded too); the
rank then exits at once, without the interpreter's teardown.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import runpy
import sys
import traceback
import warnings


def _install(rec) -> list:
    """Hooks that feed the recorder; returns the handles to remove."""
    import torch
    import torch.distributed as dist
    from torch.distributed import device_mesh as dm
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from .recorder import _reduce_op
    from .recorder_events import _user_frames

    handles = [
        register_module_forward_pre_hook(lambda m, a: rec.on_forward(m, a)),
        register_module_forward_hook(lambda m, a, o: rec.pop_module(m, o), always_call=True),
        register_optimizer_step_pre_hook(lambda opt, a, k: rec.on_step_pre(opt)),
        register_optimizer_step_post_hook(lambda opt, a, k: rec.on_step_post(opt)),
    ]

    def phased(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if rec.phase == "backward":  # Tensor.backward calls autograd.backward
                return fn(*args, **kwargs)
            first = args[0] if args else kwargs.get("tensors")
            rec.on_backward(first[0] if isinstance(first, (list, tuple)) and first else first)
            rec.phase = "backward"
            try:
                return fn(*args, **kwargs)
            finally:
                rec.phase = "after_backward"
                rec.on_backward_done()
        return wrapper

    torch.Tensor.backward = phased(torch.Tensor.backward)
    torch.autograd.backward = phased(torch.autograd.backward)

    # a cross entropy over DTensors (vocabulary-parallel, under loss_parallel) never reaches the
    # recorder's mode as nll_loss_forward: DTensor computes it from other ops. Read it where it is
    # called instead; over plain tensors the mode records it.
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Replicate

    cross_entropy = F.cross_entropy

    signature = inspect.signature(cross_entropy)

    @functools.wraps(cross_entropy)
    def observed_cross_entropy(input, target, *args, **kwargs):
        before = len(rec.step_record()["nll"]) if rec.phase == "forward" else None
        out = cross_entropy(input, target, *args, **kwargs)
        if before is not None:
            bound = signature.bind(input, target, *args, **kwargs)
            bound.apply_defaults()
            kwargs = dict(bound.arguments)
        if isinstance(input, DTensor) and rec.phase == "forward":
            reduction = kwargs.get("reduction", "mean")
            ignore = kwargs.get("ignore_index", -100)
            local = target.to_local() if isinstance(target, DTensor) else target
            value = out
            if isinstance(out, DTensor):
                value = out.to_local() if all(isinstance(p, Replicate) for p in out.placements) else None
            if value is not None and reduction in ("mean", "sum"):
                rec.step_record()["nll"].append({"reduction": reduction, "tokens": int((local != ignore).sum()),
                                                 "positions": int(local.numel()),
                                                 "value": float(value.detach().float().sum()),
                                                 "stack": _user_frames()})
        if before is not None:  # the smoothing, the value, the logits' statistics (recorder_terms)
            rec.note_cross_entropy(input, target, kwargs, out, before)
        return out

    F.cross_entropy = observed_cross_entropy

    def with_op(fn):
        position = list(inspect.signature(fn).parameters).index("op")

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            op = kwargs.get("op", args[position] if len(args) > position else None)
            rec.pending_op = _reduce_op(op)
            return fn(*args, **kwargs)
        return wrapper

    for name in ("all_reduce", "reduce_scatter_tensor", "reduce_scatter", "reduce_scatter_single",
                 "all_reduce_coalesced", "reduce"):
        fn = getattr(dist, name, None)
        if fn is not None and "op" in inspect.signature(fn).parameters:
            setattr(dist, name, with_op(fn))

    # a communication hook's continuation (DDP: ``fut.then(divide)``) may run on a c10d
    # thread, where the recorder's mode (thread-local) is not installed: run it under it
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    then = torch._C.Future.then

    def recorded_then(self, callback):
        def under_recorder(fut):
            if any(m is rec for m in _get_current_dispatch_mode_stack()):
                return callback(fut)
            with rec:
                return callback(fut)
        return then(self, under_recorder)

    torch._C.Future.then = recorded_then

    original = dm.init_device_mesh

    @functools.wraps(original)
    def init_device_mesh(*args, **kwargs):
        mesh = original(*args, **kwargs)
        try:
            names = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)])
            rec.meshes.append({"shape": list(mesh.mesh.shape), "dim_names": names, "ranks": mesh.mesh.tolist()})
        except Exception:  # an unusual mesh is still traced; lifting falls back to the groups seen
            pass
        return mesh

    dm.init_device_mesh = init_device_mesh
    torch.distributed.device_mesh.init_device_mesh = init_device_mesh
    _install_unmodelled(rec)
    return handles


def _install_unmodelled(rec) -> None:
    """Wrap the calls the lift reads beside the step: checkpoint save and load and the RNG state set
    (``checkpoints``), the RNG seeded (``seeds``), DTensor.from_local, dropout."""
    import torch

    from .recorder_checkpoint import install
    from .recorder_modules import caller_is_user

    install(rec, caller_is_user)  # checkpoint save and load, the RNG state set: what each holds (lift_checkpoint)
    seed = torch.manual_seed

    @functools.wraps(seed)
    def manual_seed(value):
        if caller_is_user():
            rec.note_seed(value)
        return seed(value)

    torch.manual_seed = manual_seed
    torch.random.manual_seed = manual_seed
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor
        return
    from_local = DTensor.from_local
    if getattr(from_local, "_placement_noted", False):
        return

    @functools.wraps(from_local)
    def asserted_from_local(local_tensor, device_mesh=None, placements=None, *args, **kwargs):
        if caller_is_user() and device_mesh is not None and placements is not None:
            rec.note_from_local(local_tensor, device_mesh, placements)
        return from_local(local_tensor, device_mesh, placements, *args, **kwargs)
    asserted_from_local._placement_noted = True
    DTensor.from_local = staticmethod(asserted_from_local)
    _install_dropout(rec)


def _install_dropout(rec) -> None:
    """Every dropout in forward (``nn.Dropout`` calls ``F.dropout``): checksums of its input and output on each
    rank, which the lift compares between the tensor ranks (the masks drawn from each rank's generator)."""
    import torch.nn.functional as F

    dropout = F.dropout
    if getattr(dropout, "_placement_noted", False):
        return

    @functools.wraps(dropout)
    def recorded_dropout(input, p=0.5, training=True, inplace=False):
        before = rec.dropout_input(input, p, training)
        out = dropout(input, p, training, inplace)
        if before is not None:
            rec.note_dropout(before, out, p)
        return out
    recorded_dropout._placement_noted = True
    F.dropout = recorded_dropout


def main(out_path: str, script: str, argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    import torch

    from .recorder import Recorder

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rec = Recorder(rank, world)
    handles = _install(rec)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status, error = 0, None
    try:
        with rec:
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # the script's own failure: recorded, the rank exits 1
        status = 1
        tb = traceback.extract_tb(exc.__traceback__)
        user = [f for f in tb if os.path.abspath(f.filename) == os.path.abspath(script)]
        where = (user or tb)[-1]
        error = {"message": f"{type(exc).__name__}: {exc}", "file": os.path.relpath(where.filename), "line": where.lineno}
    finally:
        for h in handles:
            h.remove()
    result = rec.result()
    result["exit_status"] = status
    result["torch_version"] = torch.__version__
    if error:
        result["error"] = error
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    return status


if __name__ == "__main__":
    _status = main(sys.argv[1], sys.argv[2], sys.argv[3:])
    # The trace is written: leave without the interpreter's teardown, where a c10d or gloo
    # thread still alive can abort the process ("terminate called without an active
    # exception") after a run that went well. The script's atexit handlers do not run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_status)
