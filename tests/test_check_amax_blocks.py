"""Per-block and per-row fp8 scales taken from each rank's own shard (check.amax_blocks: ``amax[g]: blockwise
over (AXES) by B`` / ``rowwise over (AXES)``): the checker's verdicts on ``SC amax`` against the independent
simulator (tests/simulator_amax_blocks.py, brute force over a concrete tensor) and hand-derived answers, the
replayed block recomputed by hand, located input errors and fmt."""

from __future__ import annotations

import random

import pytest
import simulator_amax_blocks

from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import Code, DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)


def _src(body: str, *, sp: bool = False, cp: bool = False, kv: int = 4, seq: int = 96, ffn: int = 768) -> str:
    tensor = "megatron_sp" if sp else "megatron_tp"
    ctx = "from std.context import context_parallel\n" if cp else ""
    return (f"from std.data import ddp\nfrom std.tensor import {tensor}\n{ctx}\nmodel {{\n  transformer {{\n"
            f"    hidden = 256\n    layers = 2\n    heads = 4\n    kv_heads = {kv}\n    ffn = {ffn}\n"
            f"    vocab = 1024\n  }}\n  seq = {seq}\n}}\n\nmesh {{\n  dp = 2\n  tp = 2\n"
            + ("  cp = 2\n" if cp else "") + "}\n\nplan p {\n  dp: ddp\n"
            f"  tp: {tensor}\n" + ("  cp: context_parallel\n" if cp else "") + f"  {body}\n}}\n")


def _check(src: str):
    spec = load_string(format_source(src, "t.place"), "t.place")
    p = spec.plans[0]
    report = check_plan(SESSION, spec, p, {})
    return p, next(o for o in report.obligations if o.name.startswith("SC amax"))


# (body, options, the sizes the simulator sweeps (those the model's shapes take), hand-derived: does it hold).
# By hand (head_dim 256 / 4 = 64): tp divides the 4 heads, so tp is 1, 2 or 4; the MLP width 768 gives shards of
# 768, 384, 192, the query width 4 x 64 shards of 256, 128, 64 and the 2 kv heads 128 or one copied head of 64.
CASES = [
    ("override amax[dense]: blockwise over (tp) by 64", {}, {"tp": (1, 2, 4)}, True),
    ("override amax[dense]: blockwise over (tp) by 128", {}, {"tp": (1, 2, 4)}, False),  # 192 at tp = 4
    ("override amax[dense]: blockwise over (tp) by 64", {"kv": 2}, {"tp": (1, 2, 4)}, True),  # a copied kv head: 64
    ("override amax[dense]: blockwise over (tp) by 128", {"kv": 2, "ffn": 1024}, {"tp": (1, 2, 4)}, False),  # q: 64
    ("override amax[dense]: rowwise over (tp)", {}, {"tp": (1, 2)}, False),  # a row-parallel row cut in two
    ("override amax[embedding]: blockwise over (tp) by 256", {}, {"tp": (1, 2, 4)}, True),  # vocabulary 1024
    ("override amax[embedding]: blockwise over (tp) by 512", {}, {"tp": (1, 2, 4)}, False),
    # sequence parallel: the tensor ranks hold seq / tp = 48 or 24 tokens of 96
    ("override amax[dense]: blockwise over (tp) by 32", {"sp": True}, {"tp": (1, 2)}, False),
    ("override amax[dense]: blockwise over (tp) by 8", {"sp": True}, {"tp": (1, 2, 4)}, True),
    # context parallel, the load-balanced layout: 2c chunks of 64 / 2c tokens (8 at c = 4)
    ("override amax[dense]: blockwise over (cp) by 16", {"cp": True, "seq": 64}, {"cp": (1, 2, 4), "tp": (1,)}, False),
    ("override amax[dense]: blockwise over (cp) by 1", {"cp": True, "seq": 64}, {"cp": (1, 2, 4), "tp": (1,)}, True),
]


@pytest.mark.parametrize("body,opts,sweep,ok", CASES, ids=[str(i) for i in range(len(CASES))])
def test_agrees_with_the_simulator_and_by_hand(body, opts, sweep, ok):
    p, ob = _check(_src(body, **opts))
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (ob.verdict, ob.reason)
    found = False
    for tp in sweep.get("tp", (1, 2)):
        for cp in sweep.get("cp", (1,)):
            sizes = {"dp": 2, "tp": tp, "cp": cp}
            for seed in range(3):
                found |= bool(simulator_amax_blocks.violations(p, sizes, random.Random(seed)))
    assert found is (not ok)


def test_the_replayed_block():
    """tp = 4 (the only refuting size): the MLP width 768 in shards of 192; the boundary at 192 lies in the block
    [128, 256) of 128; element 191 = 1 on tp 0, 192 = 2 on tp 1; scales 448 / 1 = 448 and 448 / 2 = 224, one device
    224."""
    _, ob = _check(_src("override amax[dense]: blockwise over (tp) by 128"))
    cex = ob.counterexample
    assert dict(cex.sizes)["tp"] == 4
    assert "block of 128 [128, 256) of the MLP width" in cex.equation, cex.equation
    assert "scales by 448" in cex.equation and "scale 224" in cex.equation
    assert "191 = 1 on (dp=0, tp=0), 192 = 2 on (dp=0, tp=1)" in dict(cex.values)["element"]
    assert "shards of 192 elements" in cex.diagnosis[0]


@pytest.mark.parametrize("body,code,words", [
    ("override amax: blockwise over (dp) by 64", Code.OVERRIDE_NO_EFFECT, "changes nothing over dp"),
    ("override amax: blockwise over (tp, tp) by 64", Code.OVERRIDE_NO_EFFECT, "the second time it names tp"),
    ("override amax[dense]: rowwise over (dp)", Code.OVERRIDE_NO_EFFECT, "changes nothing over dp"),
    ("override amax: blockwise over (tp) by 1/2", Code.AMAX_BLOCK_SIZE, "not a positive integer"),
    ("override amax: blockwise over (tp) by 64.5", Code.AMAX_BLOCK_SIZE, "not a positive integer"),
])
def test_located_errors(tmp_path, capsys, body, code, words):
    f = tmp_path / "a.place"
    f.write_text(format_source(_src(body), "a.place"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, x in enumerate(f.read_text().splitlines(), 1) if "override amax" in x)
    assert f"{f}:{line}:3: error:" in err and words in err and f"[{code}]" in err, err


def test_a_model_without_shapes_is_located(tmp_path, capsys):
    f = tmp_path / "a.place"
    f.write_text("from std.data import ddp\nfrom std.tensor import megatron_tp\n\nmodel {\n  params = 7e9\n}\n\n"
                 "mesh {\n  dp = 2\n  tp = 4\n}\n\nplan p {\n  dp: ddp\n  tp: megatron_tp\n"
                 "  override amax: blockwise over (tp) by 128\n}\n")
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert f"{f}:16:3: error:" in err and f"[{Code.AMAX_BLOCKS_NO_SHAPES}]" in err, err


def test_the_per_tensor_statement_is_untouched():
    """A granularity statement beside ``local``: each gives its own obligation."""
    p, _ = _check(_src("override amax[dense]: blockwise over (tp) by 64"))
    spec = load_string(format_source(_src("override amax[dense]: blockwise over (tp) by 64\n  override amax: local over (tp)"),
                                     "t.place"), "t.place")
    names = [o.name for o in check_plan(SESSION, spec, spec.plans[0], {}).obligations if o.name.startswith("SC amax")]
    assert sorted(names) == ["SC amax", "SC amax[dense]"]


def test_fmt_round_trips_the_statement():
    out = format_source(_src("override  amax[dense] :blockwise over(tp)  by 128"))
    assert "  override amax[dense]: blockwise over (tp) by 128\n" in out, out
    assert format_source(out) == out
    out = format_source(_src("override amax[dense]:rowwise over( tp )"))
    assert "  override amax[dense]: rowwise over (tp)\n" in out and format_source(out) == out


def test_errors_are_diagnostics_not_tracebacks():
    with pytest.raises(DiagnosticError):
        _check(_src("override amax: blockwise over (dp) by 64"))


def _random_cases(n: int):
    rng = random.Random(25)
    out = []
    for _ in range(n):
        verb = rng.choice(["blockwise", "blockwise", "rowwise"])
        by = f" by {rng.choice([8, 16, 32, 64, 128, 256])}" if verb == "blockwise" else ""
        group = rng.choice(["dense", "embedding"]) if verb == "blockwise" else "dense"
        opts = {"sp": rng.random() < 0.4, "kv": rng.choice([1, 2, 4]), "ffn": rng.choice([192, 384, 640, 768, 1024]),
                "seq": rng.choice([32, 64, 96, 128])}
        out.append((f"override amax[{group}]: {verb} over (tp){by}", opts))
    return out


@pytest.mark.parametrize("body,opts", _random_cases(12), ids=[str(i) for i in range(12)])
def test_random_statements_agree_with_the_simulator(body, opts):
    """The sizes the model's shapes take: tp divides the 4 heads, the MLP width and, sequence-parallel, the
    sequence."""
    p, ob = _check(_src(body, **opts))
    sweep = [t for t in (1, 2, 4) if opts["ffn"] % t == 0 and (not opts["sp"] or opts["seq"] % t == 0)]
    found = any(simulator_amax_blocks.violations(p, {"dp": 2, "tp": t}, random.Random(seed))
                for t in sweep for seed in range(2))
    assert (ob.verdict is Verdict.REFUTED) is found, (body, opts, ob.verdict)
    assert ob.verdict in (Verdict.PROVED, Verdict.REFUTED)


@pytest.mark.parametrize("first,last,ok", [
    # by hand: blocks of 64 divide every shard (MLP 768/4 = 192, query 256/4 = 64, vocabulary 1024/4 = 256) ...
    ("override amax: blockwise over (tp) by 128", "override amax[all]: blockwise over (tp) by 64", True),
    # ... blocks of 128 do not (192 at tp = 4)
    ("override amax[all]: blockwise over (tp) by 64", "override amax: blockwise over (tp) by 128", False),
])
def test_amax_and_amax_all_are_one_key(first, last, ok):
    """``amax`` and ``amax[all]`` both state every group's granularity: the last is in force, one ``SC amax``
    judging it, its note naming the statement it replaces."""
    spec = load_string(format_source(_src(f"{first}\n  {last}"), "t.place"), "t.place")
    p = spec.plans[0]
    obs = [o for o in check_plan(SESSION, spec, p, {}).obligations if o.name.startswith("SC amax")]
    assert [o.name for o in obs] == ["SC amax"]
    assert obs[0].verdict is (Verdict.PROVED if ok else Verdict.REFUTED)
    assert any(n.startswith(f"replaces {first}") for n in obs[0].notes), obs[0].notes
    found = any(simulator_amax_blocks.violations(p, {"dp": 2, "tp": t}, random.Random(s)) for t in (1, 2, 4)
                for s in range(2))
    assert found is (not ok)
