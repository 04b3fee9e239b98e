"""Hugging Face config.json in: `placement import hf` and `model from "config.json"`.

Oracle: the parameter counts the model authors publish (the safetensors totals of the model
cards: Llama-3-8B, Mistral-7B-v0.1, Qwen2.5-7B, Qwen3-8B, Mixtral-8x7B, Qwen1.5-MoE-A2.7B,
Qwen3-30B-A3B, DeepSeek-V2-Lite, Gemma-7B, Gemma-2-9B, GPT-2; Pythia-160M's total from the
Pythia paper's table of models) and, for DeepSeek-V3, the hand-enumerated checkpoint of
tests/test_models.py with its MTP module. One config per supported family. The
configs under tests/data/hf/ are written from the published architecture descriptions."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_models import deepseek_v3

from placement_logic import costs
from placement_logic.cli import main
from placement_logic.frontend.loader import load_spec, load_string

DATA = Path(__file__).resolve().parent / "data" / "hf"

PUBLISHED = {
    "llama3_8b": 8_030_261_248,
    "qwen25_7b": 7_615_616_512,
    "mixtral_8x7b": 46_702_792_704,
    "qwen15_moe_a27b": 14_315_784_192,
    "gemma_7b": 8_537_680_896,
    "gpt2": 124_439_808,
    "deepseek_v3": deepseek_v3(mtp=1),
    "mistral_7b": 7_241_732_096,
    "qwen3_8b": 8_190_735_360,
    "qwen3_30b_a3b": 30_532_122_624,
    "gemma2_9b": 9_241_705_984,
    "pythia_160m": 162_322_944,
    "deepseek_v2_lite": 15_706_484_224,
}


def test_every_family_has_a_shipped_config_with_a_published_count():
    import json

    from placement_logic.frontend.hf import FAMILIES

    shipped = {json.loads((DATA / f"{name}.json").read_text())["model_type"] for name in PUBLISHED}
    assert shipped == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_import_prints_a_block_with_the_published_count(capsys, name):
    assert main(["import", "hf", str(DATA / f"{name}.json")]) == 0
    block = capsys.readouterr().out
    assert f"# Ψ = {PUBLISHED[name]:,} parameters" in block
    spec = load_string(block + "mesh { dp = 2 }\nfrom std.data import ddp\nplan p { dp: ddp }\n")
    assert costs.derive(spec.plans[0]).shape.psi == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_model_from_a_config_in_a_spec(tmp_path, name):
    shutil.copy(DATA / f"{name}.json", tmp_path / "config.json")
    f = tmp_path / "s.place"
    f.write_text('from std.data import zero3\nmodel from "config.json" {\n  seq = 4096\n  microbatch = 1\n}\n'
                 "mesh { dp = 8 }\nplan p { dp: zero3 }\n")
    assert costs.derive(load_spec(f).plans[0]).shape.psi == PUBLISHED[name]


def test_active_parameters_of_qwen_moe_match_its_name(capsys):
    """Qwen1.5-MoE-A2.7B: "2.7B activated"; Qwen3-30B-A3B: "3.3B activated" (every tensor but the
    120 unrouted experts of each of the 48 layers: 30,532,122,624 − 48·120·3·2048·768)."""
    main(["import", "hf", str(DATA / "qwen15_moe_a27b.json")])
    assert "(2,689,173,504 active per token)" in capsys.readouterr().out
    main(["import", "hf", str(DATA / "qwen3_30b_a3b.json")])
    assert f"({30_532_122_624 - 48 * 120 * 3 * 2048 * 768:,} active per token)" in capsys.readouterr().out


def test_verbose_lists_the_keys_that_change_no_cost(capsys):
    assert main(["import", "hf", str(DATA / "llama3_8b.json"), "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "ignored (no effect on memory or communication):" in err
    for key in ("rope_theta", "rms_norm_eps", "bos_token_id", "max_position_embeddings"):
        assert key in err.split("ignored")[1]
    assert "hidden_size" in err.split("ignored")[0]


@pytest.mark.parametrize("name,line,words", [
    ("unknown_family", 3, 'unsupported model_type "falcon"'),
    ("missing_key", 1, "the config has no 'intermediate_size'"),
    ("bad_value", 4, "'num_hidden_layers' must be an integer"),
])
def test_bad_configs_are_located_diagnostics(capsys, name, line, words):
    assert main(["import", "hf", str(DATA / f"{name}.json")]) == 2
    err = capsys.readouterr().err
    assert f"{name}.json:{line}:" in err and words in err and "[PL140]" in err and "Traceback" not in err


def test_a_bad_config_in_a_spec_does_not_cascade(tmp_path, capsys):
    shutil.copy(DATA / "unknown_family.json", tmp_path / "config.json")
    f = tmp_path / "s.place"
    f.write_text('from std.data import zero3\nmodel from "config.json" { }\nmesh { dp = 8 }\nplan p { dp: zero3 }\n')
    assert main(["cost", str(f)]) == 2
    err = capsys.readouterr().err
    assert "s.place:2:7" in err and "config.json:3:3" in err and "plans need a model block" not in err


def test_a_transformer_section_beside_from_is_an_error(tmp_path, capsys):
    shutil.copy(DATA / "gpt2.json", tmp_path / "config.json")
    f = tmp_path / "s.place"
    f.write_text('from std.data import ddp\nmodel from "config.json" {\n  transformer { hidden = 8  layers = 1  '
                 'heads = 1  vocab = 8 }\n}\nmesh { dp = 8 }\nplan p { dp: ddp }\n')
    assert main(["cost", str(f)]) == 2
    assert "[PL119]" in capsys.readouterr().err


def test_an_edited_config_is_not_served_from_the_cost_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PLACEMENT_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    shutil.copy(DATA / "llama3_8b.json", tmp_path / "config.json")
    f = tmp_path / "s.place"
    f.write_text('from std.data import zero3\nmodel from "config.json" { }\nmesh { dp = 8 }\nplan p { dp: zero3 }\n')
    main(["cost", str(f)])
    first = capsys.readouterr().out
    shutil.copy(DATA / "qwen25_7b.json", tmp_path / "config.json")
    main(["cost", str(f)])
    assert capsys.readouterr().out != first


def _qwen3_moe_layers(moe: list[bool]) -> int:
    """Qwen3-30B-A3B's tensors with only the layers marked MoE (the others a dense MLP of
    intermediate_size 6144), written from its architecture."""
    h, a, kv, dh, V, E, fe, f = 2048, 32, 4, 128, 151936, 128, 768, 6144
    attention = h * a * dh + 2 * h * kv * dh + a * dh * h + 2 * h + 2 * dh  # q, k, v, o, two norms, q/k norms
    mlp = [E * 3 * h * fe + h * E if m else 3 * h * f for m in moe]
    return len(moe) * attention + sum(mlp) + 2 * V * h + h


@pytest.mark.parametrize("step,only", [(1, []), (2, []), (2, [0, 1]), (3, [0]), (1, [0, 1, 2])])
def test_qwen_moe_on_some_layers(tmp_path, capsys, step, only):
    """Qwen's rule: layer i is MoE unless listed in mlp_only_layers, when (i + 1) mod decoder_sparse_step = 0."""
    import json

    cfg = json.loads((DATA / "qwen3_30b_a3b.json").read_text())
    cfg["decoder_sparse_step"], cfg["mlp_only_layers"] = step, only
    (tmp_path / "c.json").write_text(json.dumps(cfg, indent=2))
    assert main(["import", "hf", str(tmp_path / "c.json")]) == 0
    want = _qwen3_moe_layers([i not in only and (i + 1) % step == 0 for i in range(48)])
    assert f"# Ψ = {want:,} parameters" in capsys.readouterr().out


def test_deepseek_moe_layer_freq(tmp_path, capsys):
    """DeepSeek's rule: layer i is MoE when i >= first_k_dense_replace and i mod moe_layer_freq = 0.
    DeepSeek-V2-Lite with moe_layer_freq 2: MoE on layers 2, 4, …, 26 (13), dense on the other 14."""
    import json

    cfg = json.loads((DATA / "deepseek_v2_lite.json").read_text())
    cfg["moe_layer_freq"] = 2
    (tmp_path / "c.json").write_text(json.dumps(cfg, indent=2))
    assert main(["import", "hf", str(tmp_path / "c.json")]) == 0
    h, V = 2048, 102400
    attention = h * 16 * 192 + h * (512 + 64) + 512 + 512 * 16 * 256 + 16 * 128 * h + 2 * h
    moe = 64 * 3 * h * 1408 + 2 * 3 * h * 1408 + 64 * h
    dense = 3 * h * 10944
    want = 27 * attention + 13 * moe + 14 * dense + 2 * V * h + h
    assert f"# Ψ = {want:,} parameters" in capsys.readouterr().out


def test_dense_layers_that_are_not_the_first_are_refused(tmp_path, capsys):
    import json

    cfg = json.loads((DATA / "qwen3_30b_a3b.json").read_text())
    cfg["mlp_only_layers"] = [0, 5]
    (tmp_path / "c.json").write_text(json.dumps(cfg, indent=2))
    assert main(["import", "hf", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "[PL140]" in err and "c.json:" in err and "dense layers [0, 5] that are not the first" in err


def test_model_from_without_a_block(tmp_path, capsys):
    """`model from "config.json"` alone reads the same model as with an empty block: Llama-3-8B's
    published 8,030,261,248 parameters; fmt writes the empty block as the bare line, and the
    bare line stays as it is."""
    shutil.copy(DATA / "llama3_8b.json", tmp_path / "config.json")
    bare = 'from std.data import zero3\n\nmodel from "config.json"\n\nmesh {\n  dp = 8\n}\n\nplan p {\n  dp: zero3\n}\n'
    f = tmp_path / "s.place"
    f.write_text(bare)
    from placement_logic.ir.summary import parameter_counts

    assert parameter_counts(load_spec(f))["params"] == PUBLISHED["llama3_8b"]
    f.write_text(bare.replace('"config.json"\n', '"config.json" { }\n'))
    assert main(["fmt", str(f)]) == 0
    assert capsys.readouterr().out == bare
    f.write_text(bare)
    assert main(["fmt", str(f)]) == 0
    assert capsys.readouterr().out == bare


def test_a_bare_model_line_is_no_model_without_from(tmp_path, capsys):
    f = tmp_path / "s.place"
    f.write_text("model\nmesh { dp = 8 }\n")
    assert main(["check", str(f)]) == 2
    assert "s.place:2:1" in capsys.readouterr().err
