"""The single-device check at full size (``measure.device_peak``) and the ``pytorch_eager_cuda``
activation count.

The oracle for the CUDA count is a measurement: the distinct storages autograd kept for one
block and the output layer on an NVIDIA H100 80GB HBM3 (PyTorch 2.11.0+cu130, CUDA 13.0,
2026-11-26), read by walking the autograd graph of the measure harness's model (every node's
saved tensors, distinct storages, parameters excluded), and the per-block figures of the
full-size runs (docs/validation.md, "One device at full size"). The CPU figures beside them were
read the same way on the CPU (PyTorch 2.13), where ``pytorch_eager`` is the count.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from placement_logic.frontend.loader import load_spec
from placement_logic.measure.device_peak import Unrealised, full_shape, prepare

ROOT = Path(__file__).resolve().parents[2]
ONE_DEVICE = ROOT / "examples/measure/one_device.place"
FSDP_TP = ROOT / "examples/measure/fsdp_tp.place"
GRAD_SYNC = ROOT / "examples/measure/grad_sync_bugs.place"

# (spec, plan, layers): per block and outside the blocks, bytes saved for one microbatch,
# measured at the spec's own sizes on the H100 (cuda) and on the CPU
MEASURED = [
    # bf16, grouped-query attention (cuDNN attention), fused RMSNorm on CUDA
    (ONE_DEVICE, "bf16_adam", None, {"cuda": (293_896_192, 557_858_820), "cpu": (394_559_488, 608_190_468)}),
    # fp32, grouped-query attention: SDPA's math path on CUDA (the s^2 probabilities)
    (FSDP_TP, "fsdp_tp", 4, {"cuda": (1_275_084_800, 329_261_060)}),
    # fp32 multi-head attention with LayerNorm: the same on both
    (GRAD_SYNC, "ddp_ok", None, {"cuda": (268_763_136, 557_875_204), "cpu": (268_763_136, 557_875_204)}),
    # the same in bf16 with an fp32 master copy: CUDA's LayerNorm keeps fp32 statistics
    ("bf16", "ddp_ok", None, {"cuda": (134_545_408, 541_097_988)}),
]


def _spec(path):
    if path != "bf16":
        return load_spec(path)
    from placement_logic.frontend.loader import load_string

    text = GRAD_SYNC.read_text().replace("params = 4\n    grads = 4\n    optimizer = 4",
                                         "params = 2\n    grads = 2\n    optimizer = 12")
    assert "optimizer = 12" in text
    return load_string(text, "bf16.place", GRAD_SYNC.parent)


@pytest.mark.parametrize("path,plan,layers,figures", MEASURED, ids=[f"{m[1]}-{Path(str(m[0])).stem}" for m in MEASURED])
def test_eager_counts_match_the_measured_storages(path, plan, layers, figures):
    spec = _spec(path)
    for kernels, (per_block, outside) in figures.items():
        _, _, _, pred = prepare(spec, plan, layers, cuda=kernels == "cuda")
        assert (pred.activations_per_layer, pred.activations_outside) == (per_block, outside), kernels


# one block and the output layer at a sequence of 256 and one sequence per microbatch: the
# totals of the graph walk on the H100 (cuda) and the CPU
SMALL = [
    (ONE_DEVICE, "bf16_adam", {"cuda": 53_234_692, "cpu": 62_671_876}),
    (FSDP_TP, "fsdp_tp", {"cuda": 141_822_980, "cpu": 139_758_596}),
    (GRAD_SYNC, "ddp_ok", {"cuda": 51_664_900, "cpu": 51_664_900}),
    ("bf16", "ddp_ok", {"cuda": 42_227_716, "cpu": 42_224_644}),
]


@pytest.mark.parametrize("path,plan,figures", SMALL, ids=[f"{m[1]}-{Path(str(m[0])).stem}" for m in SMALL])
def test_eager_counts_at_a_short_sequence(path, plan, figures):
    from placement_logic.measure.predict import predict

    spec = _spec(path)
    for kernels, total in figures.items():
        p, shape, widths, _ = prepare(spec, plan, 1, cuda=kernels == "cuda")
        shape = dataclasses.replace(shape, seq=256, microbatch=1)
        pred = predict(spec, p, shape, {a: 1 for a in p.mesh.names}, widths.optimizer, widths.as_dict())
        assert pred.activations_per_layer + pred.activations_outside == total, kernels


def test_the_cuda_count_differs_only_where_the_kernels_do():
    """The CUDA count's terms: no fp32 copy of an RMSNorm input; the math path only in fp32 with
    grouped-query attention."""
    spec = load_spec(ONE_DEVICE)
    _, _, _, cpu = prepare(spec, "bf16_adam", 1)
    _, _, _, cuda = prepare(spec, "bf16_adam", 1, cuda=True)
    assert "normalised norm inputs" in dict(cpu.activation_layer_terms)
    assert "normalised norm inputs" not in dict(cuda.activation_layer_terms)
    assert "attention probabilities" not in dict(cuda.activation_layer_terms)  # 16-bit: a fused kernel
    _, shape, _, fp32 = prepare(load_spec(FSDP_TP), "fsdp_tp", 1, cuda=True)
    terms = dict(fp32.activation_layer_terms)
    tokens = shape.seq * shape.microbatch
    assert terms["attention probabilities"] == tokens * shape.seq * shape.heads * 4
    assert terms["expanded keys and values"] == 2 * tokens * shape.hidden * 4
    assert "attention log-sum-exp" not in terms


def test_full_shape_is_the_specs_own():
    spec = load_spec(FSDP_TP)
    plan = next(p for p in spec.plans if p.name == "fsdp_tp")
    from placement_logic.measure.verdict import run_bindings

    shape = full_shape(plan, run_bindings(spec, {"dp": 1, "tp": 1}))
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.ffn, shape.vocab, shape.seq) == \
        (4096, 32, 32, 8, 14336, 32000, 2048)
    # Mistral-7B's layout (GQA with 8 K/V heads, SwiGLU of 14,336, untied head): its published 7,241,732,096
    assert shape.param_count() == 7_241_732_096


def test_a_mixture_of_experts_is_unrealised():
    spec = load_spec(ROOT / "examples/mixtral_4d.place")
    with pytest.raises(Unrealised, match="mixture of experts"):
        prepare(spec, spec.plans[0].name, 1)


@pytest.mark.torch
def test_a_cpu_run_matches_the_engine_exactly(tmp_path):
    pytest.importorskip("torch")
    from placement_logic.measure.device_peak import run

    src = tmp_path / "s.place"
    src.write_text(ONE_DEVICE.read_text().replace("hidden = 2048", "hidden = 256").replace("ffn = 5632", "ffn = 704")
                   .replace("vocab = 32000", "vocab = 512").replace("seq = 2048", "seq = 64"))
    report = run(str(src), "bf16_adam", layers=2, steps=2)
    rows = {r.what.split(" (")[0]: r for r in report.rows}
    assert {k: r.status for k, r in rows.items()} == {
        "params": "match", "grads": "match", "optimizer": "match", "saved activations, one microbatch": "match"}
    from placement_logic.measure.ranks import model as tiny

    psi = sum(p.numel() for p in tiny.build(full_shape_of(src), 0).parameters())
    assert rows["params"].measured == 2 * psi and rows["optimizer"].measured == 12 * psi
    assert any("not available" in n for n in report.notes)  # no allocator statistics on the CPU


def full_shape_of(path):
    spec = load_spec(path)
    plan = spec.plans[0]
    from placement_logic.measure.verdict import run_bindings

    return dataclasses.replace(full_shape(plan, run_bindings(spec, {"dp": 1})), layers=2)


def test_the_command_line(tmp_path, capsys):
    from placement_logic.measure.device_peak import main

    bad = tmp_path / "bad.place"
    bad.write_text("model {\n  seq = \n}\n")
    assert main([str(bad), "--plan", "p"]) == 2
    err = capsys.readouterr().err
    assert "bad.place:" in err and "Traceback" not in err
    assert main([str(ONE_DEVICE), "--plan", "nope"]) == 4
    assert "no plan 'nope'" in capsys.readouterr().err
    assert main([str(ONE_DEVICE), "--plan", "bf16_adam", "--json", str(ONE_DEVICE)]) == 2


@pytest.mark.torch
def test_the_command_line_runs_and_writes_json(tmp_path, capsys):
    pytest.importorskip("torch")
    import json

    from placement_logic.measure.device_peak import main

    src = tmp_path / "s.place"
    src.write_text(GRAD_SYNC.read_text().replace("hidden = 1024", "hidden = 128").replace("ffn = 4096", "ffn = 512")
                   .replace("vocab = 32000", "vocab = 256").replace("seq = 1024", "seq = 32"))
    out = tmp_path / "r.json"
    assert main([str(src), "--plan", "ddp_ok", "--layers", "1", "--steps", "1", "--time", "1",
                 "--catalogue-device", "h100_sxm", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| params (distinct storages) |" in text and "match" in text
    data = json.loads(out.read_text())
    assert {r["status"] for r in data["rows"]} == {"match"}
    assert data["timing"]["engine_s"] is not None and data["timing"]["median_s"] > 0


# step times measured on the H100 (median of the timed steps, ms), the four runs the CUDA count was read
# from and the four held-out shapes; the engine's on `h100_sxm` (eager PyTorch's fused attention kernels
# and foreach optimizer step, docs/time.md "Eager PyTorch") must stay within 20 % of each: before those two
# were modelled the ratios measured / engine were 0.69-1.20, after 0.87-1.16
TIMED = [(ONE_DEVICE, "bf16_adam", None, 42.88), (GRAD_SYNC, "ddp_ok", None, 84.17), ("bf16", "ddp_ok", None, 19.49),
         (FSDP_TP, "fsdp_tp", 4, 307.97), ("gpt2_bf16", "p", None, 31.55), ("qwen_bf16", "p", None, 30.65),
         ("gqa_fp32", "p", None, 60.17), ("mha_bf16_long", "p", None, 29.05),
         # predicted before they ran (108.15 and 178.46 ms): measured / engine 0.907 and 0.924
         ("llama_gqa_bf16", "p", None, 98.12), ("sgd_fp32_mha", "p", None, 164.94)]


@pytest.mark.parametrize("path,plan,layers,measured", TIMED, ids=[f"{m[1]}-{Path(str(m[0])).stem}" for m in TIMED])
def test_the_engines_step_time_against_the_h100(path, plan, layers, measured):
    from placement_logic.frontend.loader import load_string
    from placement_logic.measure.device_peak import engine_step_seconds

    if path in HELD_OUT:
        spec = load_string(_HELD_OUT_TEMPLATE.format(**HELD_OUT[path][0]), f"{path}.place", ROOT / "examples")
    else:
        spec = _spec(path)
    p, shape, widths, _ = prepare(spec, plan, layers, cuda=True)
    engine = float(engine_step_seconds(spec, p, shape, widths, "h100_sxm")) * 1e3
    assert 1 / 1.2 <= measured / engine <= 1.2, (measured, engine)


def test_fp32_activations_time_matrix_products_at_the_fp32_peak():
    import dataclasses as dc

    from placement_logic import costs, hardware
    from placement_logic.costs import steptime
    from placement_logic.measure.predict import scaled_plan

    spec = load_spec(FSDP_TP)
    p, shape, widths, _ = prepare(spec, "fsdp_tp", 1, cuda=True)
    pc = costs.derive(scaled_plan(p, shape, {"dp": 1, "tp": 1}, widths.optimizer, widths.as_dict()), sized=True)
    base = steptime.catalogue_hardware(pc.plan, "h100_sxm")
    chosen = steptime.matmul_precision(pc, base)
    assert (chosen.precision, chosen.flops.value) == ("fp32", hardware.device("h100_sxm").flops["fp32"])
    stated = dc.replace(base, precision_stated=True)
    assert steptime.matmul_precision(pc, stated) is stated  # a stated precision is kept
    bf16 = costs.derive(scaled_plan(p, shape, {"dp": 1, "tp": 1}, "adam", {**widths.as_dict(), "activations": 2}),
                        sized=True)
    assert steptime.matmul_precision(bf16, base).precision == "bf16"


# the allocator's peaks on the H100 (forward and backward; optimizer step), bytes
PEAKS = [(ONE_DEVICE, "bf16_adam", None, 10_912_322_560, 11_873_927_168),
         (GRAD_SYNC, "ddp_ok", None, 5_157_340_160, 2_068_111_360),
         ("bf16", "ddp_ok", None, 5_064_676_352, 4_064_854_016),
         (FSDP_TP, "fsdp_tp", 4, 21_152_441_344, 22_759_063_552)]


@pytest.mark.parametrize("path,plan,layers,backward,step", PEAKS, ids=[f"{m[1]}-{Path(str(m[0])).stem}" for m in PEAKS])
def test_the_engines_peak_against_the_h100(path, plan, layers, backward, step):
    """With the loss backward's two logits-wide gradients the engine's peak lies within 1 % below
    and 12 % above the allocator's higher peak; the forward-and-backward peak alone it covers."""
    spec = _spec(path)
    _, shape, _, pred = prepare(spec, plan, layers, cuda=True)
    assert 0.99 <= pred.device_peak / max(backward, step) <= 1.12
    assert pred.device_peak >= backward
    tokens = shape.seq * shape.microbatch
    assert pred.device_peak - sum(pred.states.values()) - pred.activations_per_layer * shape.layers \
        - pred.activations_outside == 2 * 4 * tokens * shape.vocab


# Held-out shapes: four models the CUDA count was not built from, run at full size on the same
# H100 (2026-11-26, PyTorch 2.11.0+cu130) after the count was written; per block and outside
# the blocks, bytes autograd saved for one microbatch (distinct storages).
_HELD_OUT_TEMPLATE = """from std.data import ddp
model {{
  transformer {{
    hidden = {hidden}
    layers = {layers}
    heads = {heads}
    kv_heads = {kv}
    ffn = {ffn}
    vocab = {vocab}
{extra}
  }}
{widths}
  seq = {seq}
  microbatch = {mb}
  conventions {{
    activations = pytorch_eager_cuda
  }}
}}
mesh {{
  dp = 8
}}
plan p {{
  dp: ddp
}}
"""
_BF16 = "  bytes {\n    params = 2\n    grads = 2\n    optimizer = 12\n  }"
_GATED_RMS = "    gated_mlp\n    norm = rmsnorm\n    bias = false"
HELD_OUT = {
    # GPT-2 medium-like: bf16, multi-head attention, LayerNorm with biases, GELU MLP, tied embeddings
    "gpt2_bf16": (dict(hidden=1024, layers=8, heads=16, kv=16, ffn=4096, vocab=50304, extra="    tied_embeddings",
                       widths=_BF16, seq=1024, mb=8), (269_090_816, 1_681_981_444)),
    # Qwen2-1.5B-like: bf16, 12 query heads on 2 K/V heads, q/k/v biases, a 151,936-word tied vocabulary
    "qwen_bf16": (dict(hidden=1536, layers=4, heads=12, kv=2, ffn=8960, vocab=151936,
                       extra=_GATED_RMS + "\n    qkv_bias\n    tied_embeddings", widths=_BF16, seq=2048, mb=1),
                  (186_761_216, 1_257_250_820)),
    # fp32 grouped-query attention at another ratio (16 on 8) and a shorter sequence
    "gqa_fp32": (dict(hidden=1024, layers=4, heads=16, kv=8, ffn=2816, vocab=32000, extra=_GATED_RMS,
                      widths="", seq=1024, mb=4), (587_235_328, 557_858_820)),
    # bf16 multi-head attention at a sequence of 4,096
    "mha_bf16_long": (dict(hidden=2048, layers=4, heads=16, kv=16, ffn=5632, vocab=32000, extra=_GATED_RMS,
                           widths=_BF16, seq=4096, mb=1), (319_062_016, 557_858_820)),
    # after the time model's eager kernels were written: a 1.39 B Llama-like bf16 GQA shape (24 on 8 heads, a
    # 128,256-word vocabulary, seq 4,096) and a 124 M GPT-2-small-like fp32 one with SGD and momentum
    "llama_gqa_bf16": (dict(hidden=3072, layers=6, heads=24, kv=8, ffn=8192, vocab=128256, extra=_GATED_RMS,
                            widths=_BF16, seq=4096, mb=1), (436_633_600, 2_151_694_340)),
    "sgd_fp32_mha": (dict(hidden=768, layers=12, heads=12, kv=12, ffn=3072, vocab=50304, extra="    tied_embeddings",
                          widths="  bytes {\n    params = 4\n    grads = 4\n    optimizer = 4\n  }", seq=1024, mb=8),
                     (403_177_472, 1_698_758_660)),
}


@pytest.mark.parametrize("name", sorted(HELD_OUT))
def test_cuda_count_on_held_out_shapes(name):
    from placement_logic.frontend.loader import load_string

    fields, (per_block, outside) = HELD_OUT[name]
    spec = load_string(_HELD_OUT_TEMPLATE.format(**fields), f"{name}.place", ROOT / "examples")
    _, _, _, pred = prepare(spec, "p", None, cuda=True)
    assert (pred.activations_per_layer, pred.activations_outside) == (per_block, outside)


def _foreach_bytes(kind: str, n: int) -> int:
    """HBM bytes torch.optim's default (foreach) step touches on one fp32 tensor of n elements, counted by
    wrapping every torch._foreach_* call (each distinct tensor argument read once, an in-place op's first list
    and an out-of-place op's result written once); the first step (state creation) is not counted."""
    import torch

    p = torch.nn.Parameter(torch.ones(n))
    # the harness's optimizers (measure.ranks.common.make_optimizer), with the foreach implementation that
    # torch.optim takes by default for CUDA tensors (on the CPU it defaults to a loop over the tensors)
    opt = (torch.optim.Adam([p], lr=1e-3, foreach=True) if kind == "adam"
           else torch.optim.SGD([p], lr=1e-2, momentum=0.9, foreach=True))
    p.grad = torch.full((n,), 0.5)
    opt.step()
    total = 0
    real = {name: getattr(torch, name) for name in dir(torch) if name.startswith("_foreach_")}

    def tensors(x):
        if isinstance(x, (list, tuple)):
            return [t for e in x for t in tensors(e)]
        return [x] if isinstance(x, torch.Tensor) and x.numel() == n else []

    def nbytes(ts):  # one tensor passed twice (addcmul's grad · grad) is read from memory once
        return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in ts}.values())

    def wrap(name, fn):
        def counted(*args, **kwargs):
            nonlocal total
            out = fn(*args, **kwargs)
            total += nbytes(tensors(args)) + nbytes(tensors(out if not name.endswith("_") else args[0]))
            return out
        return counted

    try:
        for name, fn in real.items():
            setattr(torch, name, wrap(name, fn))
        opt.step()
    finally:
        for name, fn in real.items():
            setattr(torch, name, fn)
    return total


@pytest.mark.parametrize("kind,state", [("adam", 8), ("sgd_momentum", 4)])
def test_eager_optimizer_bytes_are_torch_optims_foreach_passes(kind, state):
    pytest.importorskip("torch")
    import sympy

    from placement_logic import ir
    from placement_logic.costs import eager

    n = 1000
    counted = _foreach_bytes(kind, n)
    sh = type("Sh", (), {"bytes": {ir.State.PARAMS: sympy.Integer(4), ir.State.GRADS: sympy.Integer(4),
                                   ir.State.OPTIMIZER: sympy.Integer(state)}})()
    assert eager.optimizer_bytes(sh, {ir.State.OPTIMIZER: sympy.Integer(state * n)}) == counted
    # with 16-bit parameters and an fp32 master copy: the gradient cast up (2 + 4) and the update cast down (4 + 2)
    sh.bytes = {ir.State.PARAMS: sympy.Integer(2), ir.State.GRADS: sympy.Integer(2),
                ir.State.OPTIMIZER: sympy.Integer(state + 4)}
    assert eager.optimizer_bytes(sh, {ir.State.OPTIMIZER: sympy.Integer((state + 4) * n)}) == counted + 12 * n
