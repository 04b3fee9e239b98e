"""Checked IR: resolved, typed, immutable plans.

Input: nothing (definitions). Output: the frozen dataclasses that ``resolve`` builds
from the syntax tree and that the cost engine, the checker and the renderers consume.
Names are resolved, units normalised to bytes, strategies expanded to one placement
mode per state per mesh axis. This module knows nothing of lark, sympy or z3.

Value expressions (``Const``, ``Sym``, ``Op``, ``Query``) live in ``ir.values`` and are
re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..diagnostics import Span
from .machine import Hardware, LinkClass
from .overrides import OVERRIDE_VERBS, PARAM_GROUPS
from .values import Const, Op, Query, Sym, Value, _span, const, symbols, walk

__all__ = [
    "State",
    "STATES",
    "Mode",
    "Hardware",
    "LinkClass",
    "Role",
    "Residency",
    "Recompute",
    "ScheduleKind",
    "Dim",
    "Const",
    "Sym",
    "Op",
    "Query",
    "Value",
    "walk",
    "symbols",
    "const",
    "TransformerShape",
    "GroupDecl",
    "Model",
    "Axis",
    "Mesh",
    "Placement",
    "Binding",
    "Schedule",
    "Override",
    "OVERRIDE_VERBS",
    "PARAM_GROUPS",
    "Plan",
    "Question",
    "Spec",
]


class State(str, Enum):
    PARAMS = "params"
    OPTIMIZER = "optimizer"
    GRADS = "grads"
    ACTIVATIONS = "activations"


STATES: tuple[State, ...] = (State.PARAMS, State.OPTIMIZER, State.GRADS, State.ACTIVATIONS)


class Mode(str, Enum):
    R = "R"  # replicated
    S = "S"  # sharded, never reassembled
    S_STAR = "S*"  # sharded, gathered one reconstruction unit at a time
    M = "M"  # materialized: transient only
    O = "O"  # offloaded: partitioned like S over the axis, resident off-device

    @property
    def shards(self) -> bool:
        return self in (Mode.S, Mode.S_STAR, Mode.O)


class Role(str, Enum):
    DATA = "data"
    TENSOR = "tensor"
    SEQUENCE = "sequence"  # Megatron sequence parallelism lives on the tensor axis
    CONTEXT = "context"  # context parallel: the sequence split across devices
    PIPELINE = "pipeline"
    EXPERT = "expert"


class Residency(str, Enum):
    DEVICE = "device"
    HOST = "host"
    NVME = "nvme"


class Recompute(str, Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class ScheduleKind(str, Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZEROPP = "zeropp"


class Dim(str, Enum):
    """The type of a value expression: a plain count, or bytes."""

    COUNT = "count"
    BYTES = "bytes"


# --------------------------------------------------------------------------- model and mesh


@dataclass(frozen=True)
class TransformerShape:
    """A transformer shape; Ψ is derived from it exactly when ``Model.params`` is None."""

    hidden: Value
    layers: Value
    heads: Value
    kv_heads: Value
    ffn: Value
    vocab: Value
    tied_embeddings: bool = False
    experts: Value = field(default_factory=lambda: const(1))
    top_k: Value = field(default_factory=lambda: const(1))
    gated_mlp: bool = False  # SwiGLU-style MLP: three h x ffn matrices instead of two
    norm: str = "layernorm"  # layernorm (weight + bias) or rmsnorm (weight only)
    bias: bool = True  # linear-layer biases
    capacity_factor: Value = field(default_factory=lambda: const(1))
    span: Span = _span()
    # attention and embedding variants (None: the plain default)
    head_dim: Value | None = None  # per-head width (default hidden / heads)
    qkv_bias: bool | None = None  # biases on q, k, v only (Qwen2); default: the same as `bias`
    position_embeddings: Value | None = None  # a learned position table of this many rows (GPT-2/3)
    # multi-head latent attention (DeepSeek-V2/V3): present when kv_lora_rank is given
    q_lora_rank: Value | None = None
    kv_lora_rank: Value | None = None
    qk_rope_dim: Value | None = None
    qk_nope_dim: Value | None = None
    v_head_dim: Value | None = None
    # mixture-of-experts layout
    expert_ffn: Value | None = None  # width of one routed expert (default ffn)
    shared_experts: Value | None = None  # shared experts per MoE layer (always active)
    shared_expert_ffn: Value | None = None  # width of one shared expert (default expert_ffn)
    dense_layers: Value | None = None  # the first k layers have a dense MLP of width ffn
    moe_every: Value | None = None  # MoE only on layers i (from 0) with i mod moe_every = moe_offset (after dense_layers)
    moe_offset: Value | None = None  # default 0 (DeepSeek's moe_layer_freq); Qwen's decoder_sparse_step: every - 1
    mtp_layers: Value | None = None  # multi-token-prediction modules (each one layer + 2 norms + 2h·h)
    shared_expert_gate: bool = False  # a sigmoid gate h -> 1 on the shared experts' output (Qwen-MoE)
    router_bias: bool = False  # a bias per expert in the router (DeepSeek-V3's load-balancing correction)
    drop_renormalise: bool = False  # a token's kept experts' gate weights renormalised after the capacity step drops some
    qk_norm: bool = False  # a norm of head_dim on each query and key head (Qwen3)
    norms_per_layer: Value | None = None  # norms per layer (default 2; Gemma-2 has 4)
    vocab_multiple: Value | None = None  # the vocabulary padded up to a multiple of this (Megatron-LM: 128·t)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None


@dataclass(frozen=True)
class GroupDecl:
    """``group NAME { ... }`` in the model block: a parameter group of the user's own (a count
    or a fraction of Ψ), or a built-in group restated (its tensor rule or its own modes).

    ``modes`` holds, per model state, the (axis, mode) pairs that replace the plan's
    placement for this group's parameters on those axes.
    """

    name: str
    count: Value | None = None  # parameters in the group
    fraction: Value | None = None  # ... or this fraction of Ψ
    tensor: str | None = None  # groups.Holding SPLIT | WHOLE: how a tensor axis holds it
    stage: str | None = None  # groups.Stage LAYERS | FIRST | LAST: which pipeline stages hold it
    experts: bool | None = None  # divided over expert axes
    like: str | None = None  # the built-in gradient class (groups.GradClass) it follows in the checker
    sees: str | None = None  # groups.Holding WHOLE | HEADS: the activations a tensor axis gives it (HEADS: partial)
    modes: tuple[tuple[State, tuple[tuple[str, Mode], ...]], ...] = ()
    roles: tuple[tuple[str, "Role"], ...] = ()  # folding: the role an axis plays for this group
    span: Span = _span()


@dataclass(frozen=True)
class Model:
    """Sizes. Byte widths are bytes per element; ``params`` is Ψ (None: derive from shape)."""

    params: Value | None
    bytes_params: Value
    bytes_grads: Value
    bytes_optimizer: Value
    bytes_activations: Value
    seq: Value | None = None
    microbatch: Value | None = None
    microbatches: Value = field(default_factory=lambda: const(1))
    transformer: TransformerShape | None = None
    span: Span = _span()
    groups: tuple[GroupDecl, ...] = ()  # the model block's ``group`` declarations
    tied_embeddings: bool = False  # without a transformer shape: the embedding tied across the pipeline stages
    # accounting conventions (``conventions { ... }``): which per-layer activation count, and a
    # factor the activations are multiplied by (an estimator's allowance)
    activation_count: str = "shape"  # shape | korthikanti | megatron | llm_analysis | pytorch_eager
    activation_allowance: Value = field(default_factory=lambda: const(1))
    bytes_logits: Value = field(default_factory=lambda: const(4))  # the logits kept for the loss (fp32)
    reserve: Value = field(default_factory=lambda: const(0))  # bytes per device the runtime keeps (CUDA context)
    reserve_fraction: Value = field(default_factory=lambda: const(0))  # allocator allowance, a fraction of the rest
    attention_flops: str = "causal"  # causal (masked blocks skipped) | full: how the time model counts attention
    compute_time: str | None = None  # kernels | mfu: how compute is timed (None: kernels unless the mesh states mfu)
    # exposed | overlapped: whether the tensor-parallel backward's column-parallel collectives run during
    # the weight- and input-gradient products (Megatron-LM's asynchronous backward) or after them
    tensor_backward: str = "exposed"
    # host memory while the model is built, per device (bytes; None: nothing), or the whole model in fp32
    # (4 bytes × Ψ); the host holds the larger of it and the offloaded states, times host_buffer_factor
    host_construction: Value | None = None
    host_construction_model: bool = False
    host_buffer_factor: Value = field(default_factory=lambda: const(1))
    # the byte widths the spec states in its ``bytes`` section (the others are the defaults); not
    # part of the model's value: a stated width equal to its default is the same model
    bytes_stated: tuple[str, ...] = field(default=(), compare=False)
    # loss terms besides the main loss (``losses { aux = per_microbatch_mean }``, ``ir.losses``):
    # (term, objective normalisation, span of its line)
    loss_terms: tuple[tuple[str, str, Span], ...] = ()
    # the group of tokens the aux term's routing statistics are taken over (``losses { aux_stats = SCOPE }``,
    # ir.losses.STATS_OBJECTIVES, check.auxstats): (scope, span of its line); None: not stated
    aux_stats: tuple[str, Span] | None = None
    # the rows pack several documents of free lengths (``losses { aux_packed = true }``, check.auxpacked): the span of
    # its line; None: each row is one sequence
    aux_packed: Span | None = None
    # the cross entropy's extra terms the objective states (``losses { label_smoothing = true  logit_z_loss = true }``,
    # ir.losses.CE_TERMS): (key, span of its line) for each stated true
    ce_terms: tuple[tuple[str, Span], ...] = ()
    # DeepSpeed's runtime buffers (``buckets { reduce_bucket_size = N ... }``, ``costs.buckets``): the
    # stated settings by name (counts; flags as 0/1); None: no block, the engine's own working set
    buckets: tuple[tuple[str, Value], ...] | None = None
    # sliding-window attention (``attention { window = W }``, check.cpwindow): (W, span of its line); None: causal
    attention_window: tuple[Value, Span] | None = None
    # chunked (local) attention (``attention { chunk = C }``, check.cpchunk): (C, span of its line); None: causal
    attention_chunk: tuple[Value, Span] | None = None


@dataclass(frozen=True)
class Axis:
    """A mesh axis: its name (also the symbol of its size), size and link."""

    name: str  # the axis name is also the symbol of its size
    size: Value
    link: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class Mesh:
    """The device mesh: its axes in order, and the hardware if the spec names it."""

    axes: tuple[Axis, ...]
    span: Span = _span()
    hardware: Hardware | None = None

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Placement:
    """How one state is placed: a mode per mesh axis, plus residency and gather options."""

    state: State
    modes: tuple[tuple[str, Mode], ...]  # (axis, mode), in mesh order, every axis present
    residency: Residency = Residency.DEVICE
    unit: str = "layer"  # reconstruction unit of an S* state: layer, block, chunk, model
    prefetch: int = 1  # gathered units alive at once (current + prefetched)
    reshard_after_forward: bool = True  # S*: freed after forward, gathered again in backward
    span: Span = _span()

    def mode(self, axis: str) -> Mode:
        for a, m in self.modes:
            if a == axis:
                return m
        raise KeyError(axis)

    def axes_with(self, *modes: Mode) -> tuple[str, ...]:
        return tuple(a for a, m in self.modes if m in modes)

    @property
    def offloaded(self) -> bool:
        return self.residency is not Residency.DEVICE


@dataclass(frozen=True)
class Binding:
    """A library or user strategy bound to one or more mesh axes.

    ``product``: a one-axis strategy bound to several axes (``[a, b]: megatron_tp``), which act
    as one axis of size a·b: the same modes on each, and one group over all of them for the
    strategy's collectives."""

    strategy: str  # qualified name, e.g. std.zero.zero3
    axes: tuple[str, ...]
    roles: tuple[tuple[str, Role], ...]  # (axis, role)
    span: Span = _span()
    product: bool = False


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule on an axis, with its model chunks per stage and scheduling unit."""

    kind: ScheduleKind
    axis: str  # the pipeline axis
    chunks: Value = field(default_factory=lambda: const(1))  # v: model chunks per stage
    unit: Value = field(default_factory=lambda: const(1))  # U: microbatches per scheduling unit
    span: Span = _span()


@dataclass(frozen=True)
class Override:
    """A statement of what a real system does, replacing the derived behaviour.

    ``target`` is a state or quantity (grads, clip_norm, loss, tokens, dropout_seed,
    overflow, params, embedding, ...), ``group`` an optional parameter group (norms,
    biases, experts, embedding, dense, all), ``verb`` what happens, ``axes`` the
    mesh axes it happens over (in order; repetition means it happens twice) and ``by``
    a divisor or factor. ``OVERRIDE_VERBS`` lists what is accepted.
    """

    target: str
    group: str | None
    verb: str
    axes: tuple[str, ...] | None = None
    by: Value | None = None
    span: Span = _span()
    ranks: tuple[Value, ...] | None = None  # ``ranks (...)``: the ranks of the axis a per-rank operation is on
    sizes: tuple[Value, ...] | None = None  # ``by (S1, ...)``: the sizes of consecutive groups (reduce_groups)
    sets: tuple[tuple[Value, ...], ...] | None = None  # ``ranks ([R, ...], ...)``: rank sets (reduce_sets)


@dataclass(frozen=True)
class Plan:
    """A resolved plan: mesh, model, axis bindings, a placement per state, and its options."""

    name: str
    mesh: Mesh
    model: Model
    bindings: tuple[Binding, ...]
    placements: tuple[Placement, ...]  # one per state, in STATES order
    recompute: Recompute = Recompute.NONE
    flash_attention: bool = False
    sequence_parallel: bool = False  # Megatron SP on the tensor axis
    schedule: Schedule | None = None
    overrides: tuple[Override, ...] = ()
    unobserved: tuple[tuple[str, Span], ...] = ()  # ``unobserved "..."``: facts of the step the plan does not state
    span: Span = _span()
    # ``optimizer { GROUP = ALGORITHM(...) }``: (group, ir.optimizers.Choice); groups not named: AdamW
    optimizers: tuple[tuple[str, object], ...] = ()

    def placement(self, state: State | str) -> Placement:
        state = State(state)
        for p in self.placements:
            if p.state is state:
                return p
        raise KeyError(state)

    def role(self, axis: str) -> Role:
        for b in self.bindings:
            for a, r in b.roles:
                if a == axis:
                    return r
        raise KeyError(axis)

    def axes_with_role(self, *roles: Role) -> tuple[str, ...]:
        return tuple(a.name for a in self.mesh.axes if self.role(a.name) in roles)

    def groups_with_role(self, *roles: Role) -> tuple[tuple[str, ...], ...]:
        """The axes with one of ``roles`` as the groups their collectives run over, in mesh
        order: the axes of a product binding together, every other axis on its own."""
        out: list[tuple[str, ...]] = []
        for a in self.axes_with_role(*roles):
            b = next((b for b in self.bindings if a in b.axes), None)
            group = tuple(x for x in self.mesh.names if x in b.axes) if b is not None and b.product else (a,)
            if group not in out:
                out.append(group)
        return tuple(out)

    def overrides_for(self, target: str) -> tuple[Override, ...]:
        return tuple(o for o in self.overrides if o.target == target)

    def __getstate__(self) -> dict:
        """The fields alone: the plan's view (``ir.views``) is rebuilt where it is read."""
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}


@dataclass(frozen=True)
class Question:
    """An ``assert`` (must hold for the bound values) or a ``claim`` (a statement to examine)."""

    kind: str  # assert | claim
    op: str  # == != < <= > >=
    left: Value
    right: Value
    dim: Dim
    label: str | None = None
    span: Span = _span()
    expect: str | None = None  # outcome.QuestionVerdict.FAILS: a claim the spec expects to fail (``expect fails``)
    unless: tuple[tuple[str, Value], ...] = ()  # ... and to hold with these names re-bound


@dataclass(frozen=True)
class Spec:
    """A resolved spec file: bindings and their types, model, mesh, plans and questions."""

    file: str
    bindings: tuple[tuple[str, Value], ...]  # let values and axis sizes, in definition order
    dims: tuple[tuple[str, Dim], ...]  # the type of every bound symbol
    model: Model | None
    mesh: Mesh | None
    plans: tuple[Plan, ...]
    questions: tuple[Question, ...] = ()
    strategies: tuple[str, ...] = ()  # names of strategies visible in the file
    inputs: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)  # other files read
    # (a model's config.json): name -> text, so results derived from the spec depend on them too

    def plan(self, name: str) -> Plan:
        for p in self.plans:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def binding_map(self) -> dict[str, Value]:
        return dict(self.bindings)
