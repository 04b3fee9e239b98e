"""Every configuration reader bounded and typed: hostile JSON, TOML, argument and trace files
give a located diagnostic (exit 2), never a traceback, a hang or the internal-error status."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from placement_logic.cli import main

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "tests" / "data" / "hf"
TRACE = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    return main([str(a) for a in argv], out, err), out.getvalue(), err.getvalue()


def _refused(argv, code: str, words: str, where: str | None = None):
    status, out, err = _run(argv)
    assert status == 2, (status, err)
    assert f"[{code}]" in err and words in err, err
    assert "Traceback" not in err + out and "internal error" not in err
    if where is not None:
        assert where in err, err


DEEP_JSON = "[" * 100_000 + "]" * 100_000
LONG_INT = "9" * 4_001

# (importer, file name, text, extra arguments, code, words, location)
CASES = [
    ("hf", "c.json", DEEP_JSON, (), "PL140", "nested deeper than 64", None),
    ("hf", "c.json", '{"model_type": "llama", "hidden_size": ' + LONG_INT + "}", (), "PL140", "4001 digits", None),
    ("hf", "c.json", '{"model_type": "llama", "hidden_size": NaN}', (), "PL140", "NaN is not a number", None),
    ("deepspeed", "ds.json", DEEP_JSON, ("--devices", "8", "--params", "10"), "PL141", "nested deeper", None),
    ("deepspeed", "ds.json", '{"zero_optimization": {"stage": 3.0}}', ("--devices", "8", "--params", "10"),
     "PL141", "stage must be an integer from 0 to 3, not 3.0", "ds.json:1:24"),
    ("deepspeed", "ds.json", '{"zero_optimization": {"stage": 2,\n "offload_optimizer": "cpu"}}',
     ("--devices", "8", "--params", "10"), "PL141", "offload_optimizer must be a table", "ds.json:2:2"),
    ("deepspeed", "ds.json", '{"bf16": true}', ("--devices", "8", "--params", "10"), "PL141",
     "bf16 must be a table", "ds.json:1:2"),
    ("deepspeed", "ds.json", '{"train_micro_batch_size_per_gpu": ' + LONG_INT + "}",
     ("--devices", "8", "--params", "10"), "PL141", "digits", None),
    ("torchtitan", "job.toml", "parallelism = 5\n", ("--devices", "8", "--params", "10"), "PL141",
     "parallelism must be a table", "job.toml:1:1"),
    ("torchtitan", "job.toml", "training = []\n", ("--devices", "8", "--params", "10"), "PL141",
     "training must be a table", None),
    ("torchtitan", "job.toml", "[training]\nlocal_batch_size = 0\nglobal_batch_size = 64\n",
     ("--devices", "8", "--params", "10"), "PL141", "training.local_batch_size must be a positive integer", "job.toml:2:1"),
    ("torchtitan", "job.toml", "x = " + "[" * 100_000 + "]" * 100_000 + "\n", ("--devices", "8", "--params", "10"),
     "PL141", "nested deeper", None),
    ("torchtitan", "job.toml", "[parallelism]\ntensor_parallel_degree = " + LONG_INT + "\n",
     ("--devices", "8", "--params", "10"), "PL141", "more than 30 digits", "job.toml:2:26"),
    ("megatron", "m.args", "--num-layers 'abc\n", ("--devices", "8"), "PL141", "No closing quotation", None),
    ("deepspeed", "ds.json", '{"zero_optimisation": {"stage": 2}}', ("--devices", "8", "--params", "10"), "PL141",
     "unknown key zero_optimisation", "ds.json:1:2"),
    ("deepspeed", "ds.json", '{"zero_optimization": {"stgae": 2}}', ("--devices", "8", "--params", "10"), "PL141",
     "unknown key zero_optimization.stgae", "ds.json:1:24"),
    ("torchtitan", "job.toml", "[parallelism]\ntensor_paralel_degree = 2\n", ("--devices", "8", "--params", "10"),
     "PL141", "unknown key parallelism.tensor_paralel_degree", "job.toml:2:1"),
    ("megatron", "m.args", "--num-layers 2 --tensor-model-paralel-size 8\n", ("--devices", "8"), "PL141",
     "unknown argument --tensor-model-paralel-size", "m.args:1:16"),
    ("megatron", "m.args", "--padded-vocab-size " + LONG_INT + "\n", ("--devices", "8"), "PL141",
     "positive integer of at most 30 digits", None),
]


@pytest.mark.parametrize("kind,name,text,extra,code,words,where", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_hostile_configuration(tmp_path, kind, name, text, extra, code, words, where):
    f = tmp_path / name
    f.write_text(text)
    _refused(["import", kind, f, *extra], code, words, where)


def test_relations_between_hf_counts(tmp_path):
    cfg = json.loads((HF / "deepseek_v3.json").read_text())
    cfg["first_k_dense_replace"] = 1000
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg, indent=1))
    _refused(["import", "hf", f], "PL140", "'first_k_dense_replace' (1000) cannot exceed the model's layers")
    cfg = json.loads((HF / "mixtral_8x7b.json").read_text())
    cfg["num_experts_per_tok"] = 3
    cfg["num_local_experts"] = 2
    f.write_text(json.dumps(cfg, indent=1))
    _refused(["import", "hf", f], "PL140", "'num_experts_per_tok' (3) cannot exceed the model's experts (2)")


@pytest.mark.parametrize("field,value,bound", [("top_k", 3, "experts (2)"), ("dense_layers", 10, "layers (4)"),
                                               ("kv_heads", 16, "heads (8)")])
def test_relations_between_shape_fields(tmp_path, field, value, bound):
    fields = {"hidden": 1024, "layers": 4, "heads": 8, "ffn": 4096, "vocab": 1000, "experts": 2, "top_k": 1,
              field: value}
    body = "\n".join(f"    {k} = {v}" for k, v in fields.items())
    f = tmp_path / "m.place"
    f.write_text(f"model {{\n  transformer {{\n{body}\n  }}\n}}\n")
    line = 3 + list(fields).index(field)
    _refused(["inspect", f], "PL114", f"{field} ({value}) cannot exceed {bound}", f"m.place:{line}:")


def _trace():
    return json.loads(TRACE.read_text())


@pytest.mark.parametrize("edit,words", [
    (lambda t: t["ranks"][0]["collectives"][0].__setitem__("kind", 5),
     "ranks[0].collectives[0].kind: expected a string, found 5"),
    (lambda t: t["ranks"][1]["collectives"][0].__setitem__("ranks", "all"),
     "ranks[1].collectives[0].ranks: expected a list of an integer"),
    (lambda t: t["ranks"][0]["collectives"][0].pop("stack"), "ranks[0].collectives[0]: missing stack"),
    (lambda t: t["ranks"][0].__setitem__("steps", [{"step": "one"}]), "ranks[0].steps[0].step: expected an integer"),
    (lambda t: t["ranks"][0]["collectives"][0]["stack"].append({"file": 3, "line": 1}),
     "stack[1].file: expected a string"),
    (lambda t: t.__setitem__("world", True), "one entry per rank"),
])
def test_hostile_trace_entries(tmp_path, edit, words):
    trace = _trace()
    edit(trace)
    f = tmp_path / "t.json"
    f.write_text(json.dumps(trace))
    _refused(["lift", f], "PL612", words)


def test_stored_traces_conform():
    for f in (ROOT / "tests" / "data" / "traces").glob("*.json"):
        status, out, err = _run(["lift", f])
        assert status in (0, 1, 3) and "[PL612]" not in err, (f, err)


def test_lift_reads_no_fifo_and_no_device(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _refused(["lift", fifo], "PL006", "not a regular file")
    if Path("/dev/zero").exists():
        _refused(["lift", "/dev/zero"], "PL006", "not a regular file")


def test_deep_trace_json(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(DEEP_JSON)
    _refused(["lift", f], "PL612", "nested deeper")


CLAIMS = """\
from std.data import ddp
from std.pipeline import gpipe, one_f_one_b

model {
  transformer { hidden = 1024  layers = 8  heads = 8  vocab = 1000 }
  seq = 1024
  microbatch = 1
  microbatches = 8
}

mesh {
  dp = 2
  pp = 4
}

plan a {
  dp: ddp
  pp: gpipe
}

plan b {
  dp: ddp
  pp: one_f_one_b
}

claim memory(a) / memory(b) == 2
claim memory(a) == memory(b)
"""


@pytest.mark.slow
def test_claims_sympy_cannot_solve_answer(tmp_path):
    """Two pipeline plans compared: sympy's solvers give up on the Max/Min forms; the claims are
    decided or unknown, never a crash."""
    f = tmp_path / "claims.place"
    f.write_text(CLAIMS)
    status, out, err = _run(["prove", f, "--only", "claims", "--format", "json"])
    assert status in (0, 1, 3) and "internal error" not in err and "Traceback" not in err + out, err
    doc = json.loads(out)
    mine = [c for c in doc["claims"] if c["file"].endswith("claims.place")]
    assert len(mine) == 2 and all(c["holds"] in ("always", "never", "conditional", "unknown") for c in mine)


NEG = "from std.data import ddp\nlet psi = {psi}\nmodel {{\n  params = psi\n}}\nmesh {{\n  dp = 8\n}}\nplan p {{\n  dp: ddp\n}}\n"


@pytest.mark.parametrize("command", ["cost", "check", "inspect"])
def test_a_negative_count_is_an_error_written_or_set(tmp_path, command):
    f = tmp_path / "neg.place"
    f.write_text(NEG.format(psi=-5))
    _refused([command, f], "PL114", "'params' must be positive, not -5", "neg.place:4:12")
    f.write_text(NEG.format(psi="7e9"))
    if command == "check":  # check's --set takes positive integers only
        _refused([command, f, "--set", "psi=-5"], "PL301", "--set psi=-5")
    else:
        _refused([command, f, "--set", "psi=-5"], "PL114", "'params' must be positive, not -5", "neg.place:4:12")


@pytest.mark.parametrize("field,value", [("hidden", -64), ("layers", 0), ("vocab", -128)])
def test_shape_fields_are_held_to_their_range(tmp_path, field, value):
    fields = {"hidden": 64, "layers": 2, "heads": 4, "vocab": 128, field: value}
    body = "  ".join(f"{k} = {v}" for k, v in fields.items())
    f = tmp_path / "m.place"
    f.write_text(f"model {{\n  transformer {{ {body} }}\n}}\n")
    _refused(["inspect", f], "PL114", f"{field} must be", "m.place:2:")


def test_a_file_that_is_no_json_is_not_echoed(tmp_path):
    secret = tmp_path / "secrets"
    secret.write_text("API_TOKEN=hunter2\n")
    f = tmp_path / "s.place"
    f.write_text(f'model from "{secret}"\n')
    status, out, err = _run(["inspect", f])
    assert status == 2 and "[PL140]" in err and "hunter2" not in err + out


@pytest.mark.parametrize("args,words", [("v = 0.0, U = 4", "v (model chunks per pipeline rank) must be a positive "
                                         "integer, not 0"),
                                        ("v = 1.5, U = 4", "not 1.5"), ("v = 2, U = 0", "U (the scheduling unit)")])
def test_schedule_arguments_are_positive_integers(tmp_path, args, words):
    """A fuzzed ZeroPP spec with v = 0.0 once made compare divide by zero inside sympy (exit 70)."""
    text = (ROOT / "examples" / "library" / "zeropp_zero1.place").read_text().replace("v = 2, U = 4", args)
    f = tmp_path / "z.place"
    f.write_text(text)
    for command in ("cost", "compare", "check"):
        _refused([command, f], "PL114", words)


WHOLE = ("from std.data import ddp\nlet n = {n}\nmodel {{\n  transformer {{\n    hidden = 1024\n    layers = n\n"
         "    heads = 16\n    ffn = 4096\n    vocab = 32000\n    capacity_factor = 1.25\n  }}\n  seq = 1024\n"
         "  microbatch = {mb}\n}}\nmesh {{\n  dp = 8\n}}\nplan p {{\n  dp: ddp\n}}\n")


@pytest.mark.parametrize("command", ["cost", "inspect"])
def test_a_count_must_be_a_whole_number_written_or_set(tmp_path, command):
    f = tmp_path / "whole.place"
    # a capacity factor may be a fraction; a layer count or a microbatch may not
    f.write_text(WHOLE.format(n=8, mb=2))
    assert _run([command, f])[0] == 0
    f.write_text(WHOLE.format(n="7/2", mb=2))
    _refused([command, f], "PL114", "layers counts whole layers: it must be a whole number, not 3.5", "whole.place:6:14")
    f.write_text(WHOLE.format(n=8, mb=2))
    _refused([command, f, "--set", "n=3.5"], "PL114", "it must be a whole number, not 3.5", "whole.place:6:14")
    f.write_text(WHOLE.format(n=8, mb="n / 3"))
    _refused([command, f], "PL114", "'microbatch' counts whole sequences: it must be a whole number, not 8/3")
