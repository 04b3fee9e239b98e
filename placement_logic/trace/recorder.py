"""Record what one rank of a training script really does (torch).

Installed through documented PyTorch hooks: a ``TorchDispatchMode`` sees every c10d op
(the classic ``torch.distributed`` collectives and the DDP reducer's) and every
functional collective (``_c10d_functional``, what DTensor and FSDP2 issue); the global
module forward pre-hook marks the start of a step and collects the modules that name
the parameters; the global optimizer step pre- and post-hooks
(``register_optimizer_step_pre_hook``) read the optimizer's view of every parameter.
``torch.Tensor.backward`` and ``torch.autograd.backward`` are wrapped to tell the
phases apart (forward, backward, after backward, optimizer step), and the Python
collective entry points (``dist.all_reduce``...) to read the reduce op, which the c10d
op receives as an opaque object; a collective issued from C++ (the DDP reducer) is a sum.

Gradient programs: every tensor storage region carries the ordered events that reached
it (a collective, a constant scale, a data-dependent scale such as a clip coefficient).
Events follow the data through copies, views, concatenations, accumulation and scaling
(nothing else: a matmul starts a fresh value); a view shares its input's regions and their
histories rather than taking the whole input's (a gradient viewed out of a DDP bucket keeps
its own reductions, not its neighbours'), so at the optimizer step the events on a
parameter's gradient are exactly the reductions and divisions it went through, whether
PyTorch (DDP buckets, FSDP2 reduce-scatter, DTensor redistribution) or the user's own
code issued them. Parameter storages carry their names, so the all-gathers of FSDP2
are attributed to the parameters they gather. Storages with events are kept alive until
the step ends, so no address is reused within a step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from ..measure.ranks.counter import c10d_collective, functional_collective, group_ranks
from .recorder_checkpoint import Checkpoints
from .recorder_events import Events, _checksum, _fraction, _key, _reduce_op, _tensors, _user_frames  # noqa: F401
from .recorder_grads import grads_before, inputs_read, tag_grads
from .recorder_modules import Modules
from .recorder_padding import call_kwargs, note_attention_mask
from .recorder_partial import note_origin
from .recorder_terms import Terms

VALUES_MAX = 4096  # the most elements of a token-id tensor whose values are recorded


def _small_ids(t) -> bool:
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool and t.dim() >= 1 \
        and 0 < t.numel() <= VALUES_MAX and not isinstance(t, FakeTensor)


class Recorder(Events, Modules, Checkpoints, Terms, TorchDispatchMode):
    """One rank's recorder; ``result()`` is the rank's part of the trace (docs/json.md)."""

    def __init__(self, rank: int, world: int) -> None:
        super().__init__()
        self.rank, self.world = rank, world
        self.collectives: list[dict] = []
        self.unrecognised: list[dict] = []
        self.steps: list[dict] = []
        self.meshes: list[dict] = []
        self.events: dict[int, list[tuple[int, int, tuple]]] = {}  # storage ptr -> [(lo, hi, event)]
        self.alive: dict[int, object] = {}  # storage ptr -> storage, kept until the step ends
        self.modules: dict[int, object] = {}  # id -> module seen in forward
        self.phase = "idle"
        self.pending_op: str | None = None
        self.current: dict | None = None
        self.pending: list[dict] = []
        self.scalars: list[tuple[dict, torch.Tensor]] = []
        self._opt_depth = 0  # nested optimizer steps (an optimizer that steps another)
        self._inner: list = []  # one-element all-reduces, their result read at the step  # collectives issued between steps, numbered when the next one starts
        self._busy = False
        self._init_modules()
        self._init_checkpoints()

    # ------------------------------------------------------------------ steps and phases
    def step_record(self) -> dict:
        if self.current is None:
            self.current = {"step": len(self.steps), "inputs": [], "nll": [], "losses": [], "seed": torch.initial_seed()}
            self.steps.append(self.current)
        return self.current

    def micro_step(self) -> int:
        """The accumulated micro-step running (0-based): the backward passes of the step so far,
        the running one included; a forward is the next one's."""
        done = len(self.step_record()["losses"])
        return max(0, done - 1) if self.phase in ("backward", "after_backward", "optimizer") else done

    def on_forward(self, module, args) -> None:
        if self._busy:
            return
        if self.phase in ("idle", "optimizer_done"):
            self.phase = "forward"
            self.current = None
            self.settle_rng()  # a resume's RNG state, read before the step draws
            self._tag_params(module)
            rec = self.step_record()
            for c in self.pending:
                if rec["step"] > 0:  # before the first forward: set-up, outside every step
                    c["step"] = rec["step"]
                else:
                    c["phase"] = "setup"
            self.pending.clear()
        elif self.phase == "after_backward":
            # the next micro-step of an accumulated step: forward again, in the same step
            self.phase = "forward"
        elif self.phase == "backward" and (next(module.parameters(recurse=False), None) is not None or any(
                isinstance(v, DTensor) for v in vars(module).values())):
            # a layer with weights (parameters, or DTensors held as attributes, as DDP over
            # tensor-parallel modules has them) running its forward inside backward: activation
            # checkpointing recomputes it (a checkpointed function of no layer is not seen)
            seen = self.step_record().setdefault("recomputed", [])
            if len(seen) < 64:
                seen.append({"module": type(module).__name__, "stack": _user_frames()})
        rec = self.step_record()
        self.modules.setdefault(id(module), module)
        if not self.module_stack and self.phase == "forward":  # the model the script calls: its attention mask
            self._busy = True  # the mask's values read without recording the ops that read them
            try:
                note_attention_mask(rec, self.micro_step(), args, call_kwargs(module))
            finally:
                self._busy = False
        self.push_module(module, args)
        if not rec["inputs"]:
            tensors = [a.to_local() if isinstance(a, DTensor) else a for a in args if isinstance(a, torch.Tensor)]
            if tensors:
                local = tensors[0]
                entry = {"module": type(module).__name__, "shape": list(local.shape), "checksum": _checksum(local)}
                # token ids, and a second integer argument read as position ids: their values where small (the
                # chunks of each sequence a context rank holds, lift_cplayout)
                ids = [t for t in tensors[:2] if _small_ids(t)]
                if ids and ids[0] is local:
                    entry["values"] = local.detach().reshape(-1).tolist()
                    entry["stack"] = _user_frames()
                    if len(ids) == 2 and ids[1].numel() in (local.numel(), local.shape[-1]):
                        entry["position_ids"] = ids[1].detach().reshape(-1).tolist()
                rec["inputs"].append(entry)

    def on_backward(self, tensor) -> None:
        rec = self.step_record()
        # the step's first backward: were the buffers cleared since the last step? a later one (the next
        # accumulated micro-step): since the previous backward?
        self._busy = True
        try:
            seen = grads_before(list(self.modules.values()), self._param_names(), self._storage_names)
            if "grads_before" not in rec:
                rec["grads_before"] = seen
            else:
                rec.setdefault("grads_between", []).append(seen["carried"])
        finally:
            self._busy = False
        if isinstance(tensor, torch.Tensor) and tensor.numel() == 1:
            local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            rec["losses"].append({"value": float(local.detach().float().sum()), "stack": _user_frames()})

    def on_backward_done(self) -> None:
        """A backward pass returned: its gradient buffers tagged with the micro-step (``recorder_grads``)."""
        self._busy = True
        try:
            tag_grads(self, list(self.modules.values()), self.micro_step())
        finally:
            self._busy = False

    def on_step_pre(self, optimizer) -> None:
        rec = self.step_record()
        names = self._param_names()
        self._opt_depth += 1
        self.optimizers.setdefault(id(optimizer), optimizer)
        if self._opt_depth > 1:
            # an optimizer stepped by another (ZeroRedundancyOptimizer's local optimizer): the
            # parameters this rank really updates
            held = [names.get(id(p), "<unnamed>") for g in optimizer.param_groups for p in g["params"]]
            rec["optimizer"].setdefault("inner", []).append({"class": type(optimizer).__name__, "params": held})
            self._inner.append(optimizer)
            return
        self.phase = "optimizer"
        for c, t in self.scalars:
            c["value_out"] = float(t.detach().float().sum())
        self.scalars.clear()
        params = []
        storage = None
        if any(id(p) not in names for g in optimizer.param_groups for p in g["params"]):
            storage = self._storage_names()
        for group in optimizer.param_groups:
            for p in group["params"]:
                params.append(self._param_view(p, self._name_of(p, names, storage, f"<unnamed {len(params)}>")))
        rec["optimizer"] = {"class": type(optimizer).__name__, "stack": _user_frames(), "params": params}

    def on_step_post(self, optimizer) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth:
            return
        rec = self.step_record()
        opt = rec.get("optimizer")
        if opt is not None:
            state_bytes, elements = 0, 0
            for o in self._inner or [optimizer]:
                for group in o.param_groups:
                    for p in group["params"]:
                        local = p.to_local() if isinstance(p, DTensor) else p
                        elements += local.numel()
                        for k, v in o.state.get(p, {}).items():
                            if isinstance(v, torch.Tensor) and k != "step":
                                v = v.to_local() if isinstance(v, DTensor) else v
                                state_bytes += v.numel() * v.element_size()
            opt["state_bytes"] = state_bytes
            opt["param_elements"] = elements
        self._inner = []
        self.mark_rng()
        self.phase = "optimizer_done"
        self.events.clear()
        self.alive.clear()

    # ------------------------------------------------------------------ parameters
    def _param_names(self) -> dict[int, str]:
        """Parameter id -> fully qualified name, from the outermost module that holds it."""
        from torch.nn.parallel import DistributedDataParallel

        best: dict[int, str] = {}
        for m in list(self.modules.values()):
            if isinstance(m, DistributedDataParallel):
                continue
            for name, p in m.named_parameters(remove_duplicate=False):
                if len(name) > len(best.get(id(p), "")):
                    best[id(p)] = name
        return best

    def _storage_names(self) -> dict[tuple, str]:
        """(data pointer, shape, stride) -> name, for the modules' plain parameters and the local shards of the
        DTensors they hold as plain attributes. PyTorch's DDP + tensor-parallel path
        (``_pre_dp_module_transform``) gives the optimizer plain local ``Parameter``s and, before each forward,
        sets DTensors over them on the modules in their place (attributes, no longer parameters): the
        optimizer's tensor is still the module's parameter of that name, over the same storage."""
        from torch.nn.parallel import DistributedDataParallel

        out: dict[tuple, str] = {}

        def put(name: str, t) -> None:
            if t.numel() == 0:
                return
            key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()))
            if len(name) > len(out.get(key, "")):
                out[key] = name

        for m in list(self.modules.values()):
            if isinstance(m, DistributedDataParallel):
                continue
            for name, p in m.named_parameters(remove_duplicate=False):
                if not isinstance(p, DTensor):
                    put(name, p)
            for prefix, sub in m.named_modules(remove_duplicate=False):
                for attr, v in vars(sub).items():
                    if isinstance(v, DTensor):
                        put(f"{prefix}.{attr}" if prefix else attr, v._local_tensor)
        return out

    def _name_of(self, p, names: dict[int, str], storage: dict[tuple, str] | None, default: str) -> str:
        if id(p) in names:
            return names[id(p)]
        if storage and not isinstance(p, DTensor) and p.numel():
            return storage.get((p.data_ptr(), tuple(p.shape), tuple(p.stride())), default)
        return default

    def _tag_params(self, module) -> None:
        names = self._param_names() if self.modules else {}
        for m in [module, *self.modules.values()]:
            for name, p in m.named_parameters():
                local = p.to_local() if isinstance(p, DTensor) else p
                self._add(local, ("param", names.get(id(p), name)))

    def _param_view(self, p, name: str) -> dict:
        view = {"name": name, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", "")}
        local = p
        if isinstance(p, DTensor):
            local = p.to_local()
            mesh = p.device_mesh
            view["mesh_dims"] = list(mesh.mesh_dim_names or [f"dim{i}" for i in range(mesh.ndim)])
            view["placements"] = [str(pl) for pl in p.placements]
        view["local_shape"] = list(local.shape)
        view["checksum"] = _checksum(local)
        g = p.grad
        if g is None:
            view["grad"] = None
            return view
        glocal = g.to_local() if isinstance(g, DTensor) else g
        grad = {"checksum": _checksum(glocal), "collectives": [], "scales": [], "dynamic_scales": [], "dynamic_at": [],
                "dynamic_values": []}
        if isinstance(g, DTensor):
            grad["placements"] = [str(pl) for pl in g.placements]
        for ev in self._events_of(glocal):
            if ev[0] == "collective":
                grad["collectives"].append(ev[1])
            elif ev[0] == "scale":
                grad["scales"].append({"factor": str(ev[1]),
                                       "at": {"file": ev[2][0], "line": ev[2][1], "code": ev[2][2]},
                                       "micro": ev[3]})
            elif ev[0] == "dynamic":
                grad["dynamic_scales"].append(ev[1])
                grad["dynamic_at"].append({"file": ev[2][0], "line": ev[2][1], "code": ev[2][2]})
                grad["dynamic_values"].append(ev[3])
        view["grad"] = grad
        return view

    # ------------------------------------------------------------------ dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        if any(issubclass(t, FakeTensor) for t in types):
            # metadata propagation (DTensor's sharding rules run ops on fake tensors): no values
            return func(*args, **kwargs)
        packet = func.overloadpacket
        namespace = getattr(packet, "_qualified_op_name", str(packet)).split("::")[0]
        name = packet.__name__
        if self._busy:
            return func(*args, **kwargs)
        if namespace in ("c10d", "_c10d_functional"):
            return self._collective(func, namespace, name, args, kwargs)
        out = func(*args, **kwargs)
        self._busy = True
        try:
            self._follow(name, args, kwargs, out)
            if self.phase == "forward":
                self.follow_terms(name, args, out)  # terms added to the loss, loss masks (recorder_terms)
                note_origin(self.origins, name, args, out)  # the op that wrote each value (recorder_partial)
        finally:
            self._busy = False
        return out

    def _collective(self, func, namespace: str, name: str, args, kwargs):
        found = c10d_collective(name, args) if namespace == "c10d" else functional_collective(name, args, kwargs)
        if found is None:
            if name not in ("wait_tensor", "barrier", "monitored_barrier_", "_wrap_tensor_autograd"):
                self.unrecognised.append({"seq": len(self.collectives) + len(self.unrecognised), "op": f"{namespace}.{name}",
                                          "phase": self.phase, "stack": _user_frames()})
            return func(*args, **kwargs)
        kind, nbytes, group = found
        if kind in ("send", "recv"):
            me, peer = dist.get_rank(), dist.get_global_rank(
                dist.ProcessGroup.unbox(group) if isinstance(group, torch.ScriptObject) else group, int(args[2]))
            ranks = (me, peer) if kind == "send" else (peer, me)
        else:
            ranks = group_ranks(group)
        if namespace == "_c10d_functional" and name.startswith(("all_reduce", "reduce_scatter")):
            op = str(args[1]).lower()
        elif kind in ("all_reduce", "reduce_scatter", "reduce"):
            op = self.pending_op or "sum"
        else:
            op = ""
        self.pending_op = None
        inputs, outputs = self._buffers(namespace, name, args)
        first = next(iter(inputs), None)
        seq = len(self.collectives) + len(self.unrecognised)
        between = self.phase in ("idle", "optimizer_done")  # before the next forward: counted in the next step
        rec = {"seq": seq, "step": -1 if between or not self.current else self.current["step"],
               "phase": "before_forward" if between else self.phase, "kind": kind, "ranks": list(ranks),
               "dtype": str(first.dtype).replace("torch.", "") if first is not None else "", "bytes": nbytes,
               "numel": sum(t.numel() for t in inputs), "op": op, "api": f"{namespace}.{name}",
               "carried": [], "stack": _user_frames()}
        if self.current is not None and not between:
            rec["micro"] = self.micro_step()
        if self.running_module() is not None:
            rec["_module"] = self.running_module()
        self.summand_origin(rec, first)
        if self.phase == "backward" and kind not in ("send", "recv"):  # a ring's or a pipeline's exchange is lifted
            fn = self.custom_backward()
            if fn is not None:
                rec["custom_backward"] = fn
                self.note_unmodelled(f"a collective ({kind}) in the backward of the custom autograd function {fn}",
                                     "a collective a custom autograd function issues in its backward is not lifted")
        self._busy = True
        try:
            in_events: list[tuple] = []
            for t in inputs:
                for ev in self._events_of(t):
                    if ev not in in_events:
                        in_events.append(ev)
            rec["carried"] = sorted({ev[1] for ev in in_events if ev[0] == "param"})
            inputs_read(rec, in_events, self.phase)
            if rec["numel"] == 1 and first is not None:
                rec["value_in"] = float(first.detach().float().sum())
                offsets = [ev for ev in in_events if ev[0] == "offset"]
                if offsets:  # constants added to the value before this collective (an epsilon per rank)
                    rec["offset"] = {"value": sum(ev[1] for ev in offsets),
                                     "at": {"file": offsets[0][2][0], "line": offsets[0][2][1],
                                            "code": offsets[0][2][2]}}
            self.note_vector(rec, inputs)  # a vector of statistics (a balancing loss's counts: recorder_terms)
        finally:
            self._busy = False
        out = func(*args, **kwargs)
        self._busy = True
        try:
            ev = ("collective", seq)
            carry = [e for e in in_events if e[0] != "param"]
            if namespace == "_c10d_functional":
                res = [t for t in _tensors(out)]
                for t in res:
                    self._set(t, carry + [ev], replace=False)

            else:
                in_place = {id(t) for t in inputs} == {id(t) for t in outputs}
                for t in outputs:
                    # in place (an all-reduce of a bucket): each region keeps its own history
                    self._set(t, ([] if in_place else carry) + [ev], replace=False)
                if rec["numel"] == 1 and outputs and kind == "all_reduce":
                    self.scalars.append((rec, outputs[0]))  # read once the caller has waited
        finally:
            self._busy = False
        self.collectives.append(rec)
        if between:
            self.pending.append(rec)
        return out

    @staticmethod
    def _buffers(namespace: str, name: str, args):
        """(input tensors, in-place output tensors) of a collective."""
        if namespace == "_c10d_functional":
            return list(_tensors(args[0])), []
        if name in ("allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_"):
            ts = list(_tensors(args[0]))
            return ts, ts
        if name in ("_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_", "allgather_coalesced_",
                    "_reduce_scatter_base_", "reduce_scatter_", "reduce_scatter_tensor_coalesced_",
                    "alltoall_base_", "alltoall_"):
            return list(_tensors(args[1])), list(_tensors(args[0]))
        ts = list(_tensors(args[0]))
        return ts, ts

    # ------------------------------------------------------------------ result
    def result(self) -> dict:
        self.resolve_modules()
        self.settle_rng()
        return {
            "rank": self.rank,
            "world": self.world,
            "meshes": self.meshes,
            "collectives": self.collectives,
            "unrecognised": self.unrecognised,
            "steps": self.steps,
            "unmodelled": self.unmodelled,
            "seeds": self.seeds,
            "asserted": self.asserted,
            "dropouts": self.dropouts,
            "checkpoints": self.checkpoints,
            "registration": self.registration(),
        }
