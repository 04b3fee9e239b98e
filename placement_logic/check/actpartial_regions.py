"""The partial activations of the vocabulary-parallel embedding and of the experts under an expert
tensor group, and the linear operations that commute with any partial value's sum (check.actpartial).

* ``embedding``: each of the t ranks of the tensor group holds a slice of the vocabulary and looks
  up the tokens of its slice, zero rows for the others (Megatron-LM's masked lookup), so its output
  is partial until the all-reduce (a reduce-scatter under sequence parallelism). For every position
  exactly one rank holds the token's row e and the others hold 0. Operations on it before the sum:
  ``positional_before_reduce``, the positional embedding q added on every rank: e + t·q;
  ``nonlinear_before_reduce``, a function f applied to each rank's row (an embedding LayerNorm,
  BLOOM's ``word_embeddings_layernorm``, of the model's ``norm`` kind): f(e) + (t-1)·f(0), wrong
  wherever f(0) ≠ 0 (LayerNorm's shift β, ``norm = layernorm``); exact for RMSNorm (``norm =
  rmsnorm``: a weight and no bias, so f(0) = 0·g/sqrt(0 + ε) = 0), the one function the checker
  assumes zero at zero (``zero_preserving``);
  ``scale_before_reduce``, a linear scale (Gemma's and T5's ``embed_scale`` = sqrt(hidden), dropout
  whose mask is the same on every tensor rank: a diagonal scale by mask/keep): c·Σ p_i = Σ c·p_i.
* ``experts``: each expert's fc2 is row-parallel over the expert tensor axes (the expert group's
  tensor axes under parallel folding, else the tensor axes that split the layers: Megatron-LM's
  expert tensor parallelism defaults to the tensor group), so the routed output is partial until its
  reduce-scatter (all-reduce). ``bias_before_reduce`` (the expert's fc2 bias, GPT-OSS's
  ``mlp2_bias``), ``residual_before_reduce`` and ``shared_before_reduce`` (the shared expert's output,
  whole on every rank after its own all-reduce) add a whole value on every rank: y + t·v;
  ``nonlinear_before_reduce``: Σ f(p_i); ``scale_before_reduce`` (the combine's weighting by the
  router's gate probabilities, a routed scaling factor): linear.

A linear scale commutes with the sum on every axis: its obligation is proved (the solver checks
c·(u + v) = c·u + c·v; by induction over the ranks for any t); a scale that differs per rank is not a
scale of the whole value and is not this verb. Every other operation here is wrong on every named
axis of two ranks or more. The replays use exact numbers (``run``).
"""

from __future__ import annotations

from fractions import Fraction

from ..ir import actflow as af
from ..ir import views
from ..ir.nodes import Role
from ..ir.overrides import OverrideVerb as V
from ..ir.values import Const

# the operations each region's partial value may state (a statement without a region: attention and mlp,
# positional embeddings the embedding, the shared expert the experts)
VERBS = {"attention": (V.BIAS_BEFORE_REDUCE, V.RESIDUAL_BEFORE_REDUCE, V.NONLINEAR_BEFORE_REDUCE,
                       V.SCALE_BEFORE_REDUCE),
         "embedding": (V.POSITIONAL_BEFORE_REDUCE, V.NONLINEAR_BEFORE_REDUCE, V.SCALE_BEFORE_REDUCE),
         "experts": (V.BIAS_BEFORE_REDUCE, V.RESIDUAL_BEFORE_REDUCE, V.SHARED_BEFORE_REDUCE,
                     V.NONLINEAR_BEFORE_REDUCE, V.SCALE_BEFORE_REDUCE)}
VERBS["mlp"] = VERBS["attention"]
DEFAULT = {V.POSITIONAL_BEFORE_REDUCE: ("embedding",), V.SHARED_BEFORE_REDUCE: ("experts",)}
VALUE = {"attention": "row-parallel output", "mlp": "row-parallel output",
         "embedding": "masked lookup (each rank's vocabulary slice, zero rows for the others)",
         "experts": "routed output (each expert's row-parallel fc2)"}
EMBEDDING = {V.POSITIONAL_BEFORE_REDUCE: "the positional embedding added on each of the {t} tensor ranks to the "
                                         "masked lookup before the reduction: the sum holds {t}·pos instead of pos",
             V.NONLINEAR_BEFORE_REDUCE: "a function f (an embedding LayerNorm) applied to each of the {t} tensor "
                                        "ranks' masked lookups before the reduction: f(e) + ({t}-1)·f(0) instead of "
                                        "f(e), the ranks without the token adding f(0) (LayerNorm's shift β)"}
EXPERTS = {V.BIAS_BEFORE_REDUCE: "the expert's fc2 bias added on each of the {t} expert tensor ranks before the "
                                 "reduction: the sum holds {t}·b instead of b",
           V.RESIDUAL_BEFORE_REDUCE: "the residual added on each of the {t} expert tensor ranks to the routed "
                                     "output before the reduction: the sum holds {t}·residual",
           V.SHARED_BEFORE_REDUCE: "the shared expert's output, already whole (reduced), added on each of the {t} "
                                   "expert tensor ranks to the partial routed output before the reduction: the sum "
                                   "holds {t}·shared instead of shared"}
SCALE = "a linear scale c applied to each of the {t} ranks' summands before the reduction: c·p_1 + ... + c·p_t = " \
        "c·(p_1 + ... + p_t)"


def has_experts(plan) -> bool:
    t = plan.model.transformer
    return t is not None and not (isinstance(t.experts, Const) and t.experts.value <= 1)


def expert_axes(plan, flows) -> tuple[str, ...]:
    """The axes the experts' fc2 output is partial over: the expert group's tensor axes (parallel
    folding), else the tensor axes that split the layers (the expert tensor group is the tensor group)."""
    fold = views.expert_group(plan)
    if fold is not None:
        return tuple(views.group_axes(plan, fold, Role.TENSOR))
    return tuple(dict.fromkeys(a for f in flows if f.region == "mlp" for a in f.tensor))


def partial_axes(plan, region: str) -> tuple[str, ...]:
    """The tensor axes the region's partial value is summed over."""
    flows = [f for f in af.flows(plan) if f.region in ("attention", "mlp", "embedding")]
    if region == "experts":
        return expert_axes(plan, flows) if has_experts(plan) else ()
    return tuple(dict.fromkeys(a for f in flows if f.region == region for a in f.tensor))


def zero_preserving(plan, region: str, verb: str) -> bool:
    """Whether the operation is the model's RMSNorm (f(0) = 0) on the embedding's masked lookup, where every
    rank but the token's owner holds a zero row: Σ f(p_i) = f(e) + (t-1)·f(0) = f(e), exact. Only there: on a
    dense partial (attention, mlp, experts) no summand is zero and RMSNorm is as wrong as any nonlinearity."""
    t = plan.model.transformer
    return (region == "embedding" and verb == V.NONLINEAR_BEFORE_REDUCE and t is not None
            and t.norm == "rmsnorm")


RMSNORM = "the model's RMSNorm applied to each of the {t} tensor ranks' masked lookups before the reduction: " \
          "f(e) + ({t}-1)·f(0) = f(e), every rank without the token normalising a zero row to zero (no shift)"


def what(region: str, verb: str, t) -> str | None:
    """The words for the region's operation (None: the dense regions' own)."""
    if verb == V.SCALE_BEFORE_REDUCE:
        return SCALE.format(t=t)
    table = EMBEDDING if region == "embedding" else EXPERTS if region == "experts" else {}
    return table[verb].format(t=t) if verb in table else None


def run(region: str, verb: str, n: int):
    """(the reduced value at position 0, the single-device value, the inputs) for n ranks, or None where the
    dense regions' numbers apply. The embedding: the table E[v] = v + 2 of 2n words, rank j holding words 2j
    and 2j + 1, the token word 3 (on rank 1: e = 5, zero rows on the others), the positional embedding 1,
    f(v) = v² + 1 (a LayerNorm's shift β = 1: f(0) ≠ 0). The experts' shared expert: its whole output 2."""
    if region == "embedding":
        e = Fraction(5)
        p = [e if j == 1 else Fraction(0) for j in range(n)]
        inputs = {"token": "word 3 (vocabulary slice of rank 1: words 2, 3)", "E[3]": "5",
                  "masked lookup p_j": "[" + ", ".join(str(v) for v in p) + "]"}
        if verb == V.POSITIONAL_BEFORE_REDUCE:
            inputs["positional embedding of position 0"] = "1"
            return sum((v + 1 for v in p), Fraction(0)), e + 1, inputs
        inputs["f"] = "v² + 1 (f(0) = 1 ≠ 0, as a LayerNorm's shift β)"
        return sum((v * v + 1 for v in p), Fraction(0)), e * e + 1, inputs
    if region == "experts" and verb == V.SHARED_BEFORE_REDUCE:
        x = Fraction(3)
        p = [x * (j + 2) * Fraction(3 * j + 1, 2) for j in range(n)]
        inputs = {"x": "3", "partial p_j = x·a_j·b_j": "[" + ", ".join(str(v) for v in p) + "]",
                  "shared expert's output (whole)": "2"}
        return sum((v + 2 for v in p), Fraction(0)), sum(p, Fraction(0)) + 2, inputs
    return None
