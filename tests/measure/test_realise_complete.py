"""Measure runs exactly the spec or says it cannot: every model field, group restatement,
placement option and override of a plan is either realised (it changes what runs) or makes
the plan unrealised with a reason naming it; none is dropped. No torch: the realisation
is pure data.

The oracle is behavioural: a construct is realised when the harness's tiny model
(``scale_down``) or its ``Realisation`` changes with it; otherwise ``realise`` must return
``Unrealised``. The lists of constructs below must cover the language's vocabulary
(``ir.TransformerShape``'s and ``ir.Model``'s fields, ``ir.OVERRIDE_VERBS``), so a construct
added to the language fails here until the harness runs it or refuses it.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from placement_logic import ir
from placement_logic.frontend.loader import load_string
from placement_logic.measure.predict import scaled_plan
from placement_logic.measure.realise import Realisation, Unrealised, realise
from placement_logic.measure.session import mesh_sizes, run_bindings
from placement_logic.measure.shape import scale_down

BASE = ("from std.data import ddp\nfrom std.tensor import megatron_tp\nmodel {{\n  transformer {{ hidden = 64  "
        "layers = 4  heads = 4  ffn = 256  vocab = 128 }}\n  seq = 32\n  microbatch = 2\n}}\n"
        "mesh {{ dp = 2  tp = 2 }}\nplan p {{\n  dp: ddp\n  tp: megatron_tp\n{body}}}\n")


MOE = ("from std.data import ddp\nmodel {{\n  transformer {{ hidden = 64  layers = 4  heads = 4  ffn = 256  "
       "vocab = 128  experts = 4  top_k = 1 }}\n  seq = 32\n  microbatch = 2\n}}\nmesh {{ dp = 2 }}\n"
       "plan p {{\n  dp: ddp\n{body}}}\n")
# the fields of a mixture of experts: built (or refused) on a model with experts
MOE_FIELDS = {"top_k", "capacity_factor", "expert_ffn", "shared_experts", "shared_expert_ffn", "shared_expert_gate",
              "router_bias", "dense_layers", "moe_every", "moe_offset"}


def _plan(body: str = "", base: str = BASE):
    spec = load_string(base.format(body=body), file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    return spec, plan, sizes


def _outcome(spec, plan, sizes):
    r = realise(plan, sizes, run_bindings(spec, sizes))
    shape = scale_down(plan, run_bindings(spec, sizes), sizes, r.tensor_axis) if isinstance(r, Realisation) else None
    return r, shape


def _c(x) -> ir.Value:
    return ir.const(Fraction(x))


# a value other than the default for every field of the transformer shape
TRANSFORMER_VALUES = {
    "hidden": _c(96), "layers": _c(8), "heads": _c(8), "kv_heads": _c(2), "ffn": _c(128), "vocab": _c(1000),
    "tied_embeddings": True, "experts": _c(4), "top_k": _c(2), "gated_mlp": True, "norm": "rmsnorm",
    "bias": False, "capacity_factor": _c(2), "head_dim": _c(32), "qkv_bias": True,
    "position_embeddings": _c(32), "q_lora_rank": _c(16), "kv_lora_rank": _c(16), "qk_rope_dim": _c(8),
    "qk_nope_dim": _c(8), "v_head_dim": _c(8), "expert_ffn": _c(64), "shared_experts": _c(1),
    "shared_expert_ffn": _c(64), "dense_layers": _c(1), "moe_every": _c(2), "moe_offset": _c(1), "mtp_layers": _c(1),
    "shared_expert_gate": True, "router_bias": True, "qk_norm": True, "norms_per_layer": _c(4),
    "vocab_multiple": _c(128), "drop_renormalise": True,
}
# sizes the scale-down replaces by its own (docs/validation.md, "How the model is scaled down")
SCALED_AWAY = {"layers", "vocab"}


def test_every_transformer_field_is_listed():
    fields = set(ir.TransformerShape.__dataclass_fields__) - {"span"}
    assert fields == set(TRANSFORMER_VALUES), fields ^ set(TRANSFORMER_VALUES)


@pytest.mark.parametrize("name", sorted(TRANSFORMER_VALUES))
def test_a_transformer_field_is_built_or_the_plan_is_unrealised(name):
    spec, plan, sizes = _plan(base=MOE if name in MOE_FIELDS else BASE)
    before, shape = _outcome(spec, plan, sizes)
    assert isinstance(before, Realisation)
    tf = dataclasses.replace(plan.model.transformer, **{name: TRANSFORMER_VALUES[name]})
    changed = dataclasses.replace(plan, model=dataclasses.replace(plan.model, transformer=tf))
    after, new_shape = _outcome(spec, changed, sizes)
    if isinstance(after, Unrealised):
        assert after.reasons
        return
    # realised: the harness's model is another model (the field is built), or the field is a size
    # the scale-down replaces by its own
    assert name in SCALED_AWAY or new_shape != shape, f"{name} is dropped: neither built nor refused"


def test_a_head_width_equal_to_hidden_over_heads_is_the_plain_model():
    spec, plan, sizes = _plan()
    tf = dataclasses.replace(plan.model.transformer, head_dim=_c(16))  # 64 / 4
    r, _ = _outcome(spec, dataclasses.replace(plan, model=dataclasses.replace(plan.model, transformer=tf)), sizes)
    assert isinstance(r, Realisation)


@pytest.mark.parametrize("snippet,reason", [
    ("  losses { aux = per_microbatch_mean }", "loss terms besides the language-model loss (aux)"),
    ("  bytes { logits = 2 }", "logits of 2 bytes"),
])
def test_model_constructs_the_harness_does_not_run_are_unrealised(snippet, reason):
    text = BASE.format(body="").replace("  microbatch = 2\n", f"  microbatch = 2\n{snippet}\n")
    if "losses" in text:  # a loss term needs a model with experts: the aux loss is the router's
        text = text.replace("vocab = 128 }", "vocab = 128  experts = 4  top_k = 2 }")
    spec = load_string(text, file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    assert isinstance(r, Unrealised) and any(reason in x for x in r.reasons), r


def test_activation_conventions_are_carried_into_the_prediction():
    """The prediction is the spec's: its activation count and allowance are not dropped."""
    text = BASE.format(body="").replace("  microbatch = 2\n", "  microbatch = 2\n  conventions { activations = "
                                        "megatron  activation_allowance = 1.25 }\n")
    spec = load_string(text, file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    shape = scale_down(plan, run_bindings(spec, sizes), sizes, "tp")
    small = scaled_plan(plan, shape, sizes, "adam")
    assert small.model.activation_count == "megatron"
    assert small.model.activation_allowance == plan.model.activation_allowance != ir.const(1)


@pytest.mark.parametrize("option,reason", [
    ("unit = model", "unit = model"),
    ("unit = stage", "unit = stage"),
    ("prefetch = 2", "prefetch = 2"),
])
def test_gather_options_the_harness_does_not_run_are_unrealised(option, reason):
    spec = load_string("from std.data import zero3\nmodel {\n  transformer { hidden = 64  layers = 4  heads = 4  "
                       "vocab = 128 }\n  seq = 32\n  microbatch = 2\n}\nmesh { dp = 2 }\nplan p {\n  dp: zero3\n"
                       f"  params: S* ({option})\n}}\n", file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    assert isinstance(r, Unrealised) and any(reason in x for x in r.reasons), r


OFFLOAD = ("from std.data import zero3\nmodel {{\n  transformer {{ hidden = 64  layers = 4  heads = 4  "
           "vocab = 128 }}\n  seq = 32\n  microbatch = 2\n}}\nmesh {{ dp = 2 }}\nplan p {{\n  dp: zero3\n{body}}}\n")


def _offload_realisation(body: str):
    spec = load_string(OFFLOAD.format(body=body), file="<t>")
    plan = spec.plan("p")
    sizes = mesh_sizes(plan, None)
    return realise(plan, sizes, run_bindings(spec, sizes))


def test_the_plan_without_offload_is_realised():
    assert isinstance(_offload_realisation(""), Realisation)


@pytest.mark.parametrize("state,body", [
    ("optimizer", "  optimizer: O (residency = host)\n"),
    ("params", "  params: S* (residency = host)\n"),
    ("optimizer", "  optimizer: O (residency = nvme)\n"),
])
def test_offloaded_states_are_unrealised_naming_the_offload(state, body):
    """An offloaded parameter or optimizer state is never run as if it stayed on the device: the
    plan is unrealised, the reason names the state, where it goes, and why (the harness moves no
    state off the device it computes on; a CPU run has no separate device memory)."""
    r = _offload_realisation(body)
    assert isinstance(r, Unrealised), r
    mine = [x for x in r.reasons if x.startswith(f"{state} is offloaded to ")]
    assert len(mine) == 1, r.reasons
    assert "not realised" in mine[0] and "no separate device memory" in mine[0]


def test_two_specs_sharing_a_file_name_get_their_own_reports():
    """measure_many reports each (spec, plan) it is given, even where two specs carry one file name."""
    from placement_logic.measure.session import measure_many

    specs = [load_string(OFFLOAD.format(body=body), file="<same>")
             for body in ("  optimizer: O (residency = host)\n", "  params: S* (residency = host)\n")]
    reports = measure_many([(sp, "p") for sp in specs], with_checker=False)
    assert [rep.outcome.value for rep in reports] == ["unrealised", "unrealised"]
    assert any(x.startswith("optimizer is offloaded") for x in reports[0].reasons)
    assert any(x.startswith("params is offloaded") for x in reports[1].reasons)
    assert not any(x.startswith("params is offloaded") for x in reports[0].reasons)


# overrides that restate what the plain dp × tp plan already does (realised by running the plan as is)
# (the loss is a global mean; every gradient, the norms' too, is reduced over dp: without sequence
# parallelism the norms' gradients are equal on every tensor rank)
RESTATEMENTS = {(None, "loss", "global_mean"), (None, "grads", "reduce"), ("norms", "grads", "reduce")}


@pytest.mark.parametrize("target,verb", sorted((t, v) for t, verbs in ir.OVERRIDE_VERBS.items() for v in verbs))
@pytest.mark.parametrize("group", [None, "norms"])
def test_every_override_is_realised_or_the_plan_is_unrealised(target, verb, group):
    """Each verb of the vocabulary, on the whole model and on a group, over the data axis (or by
    3): the realisation changes (the harness runs it), or the plan is unrealised with a reason."""
    spec, plan, sizes = _plan()
    before, _ = _outcome(spec, plan, sizes)
    over, by = ir.OVERRIDE_VERBS[target][verb]
    o = ir.Override(target, group, verb, axes=("dp",) if over else None, by=_c(3) if by else None)
    after, _ = _outcome(spec, dataclasses.replace(plan, overrides=(o,)), sizes)
    if isinstance(after, Unrealised):
        assert after.reasons
        return
    assert after != before or (group, target, verb) in RESTATEMENTS, \
        f"override {target}[{group}]: {verb} is neither run nor refused"


@pytest.mark.parametrize("axes,realised", [("(dp)", False), ("(dp, cp)", True), ("(cp, dp)", True), ("(dp, dp)", False)])
def test_a_gradient_reduction_leaving_out_the_context_axis_is_not_run_as_ddp_over_both(axes, realised):
    # the harness's DDP reduces over the data and the context axis (each context rank holds its own sequence
    # block's gradient): `reduce over (dp)` beside a context axis was run as DDP over (dp, cp), i.e. as the fix
    spec = load_string(f"""
from std.data import ddp
from std.context import context_parallel
model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  ffn = 256  vocab = 128 }}
  seq = 64
  microbatch = 1
}}
mesh {{ dp = 2  cp = 2 }}
plan p {{
  dp: ddp
  cp: context_parallel
  override grads: reduce over {axes}
}}
""", "ctx.place")
    plan = spec.plans[0]
    sizes = mesh_sizes(plan, None)
    r = realise(plan, sizes, run_bindings(spec, sizes))
    if realised:
        assert isinstance(r, Realisation), getattr(r, "reasons", r)
    else:
        assert isinstance(r, Unrealised) and any("data and context axes" in x for x in r.reasons), r
