"""Witness sizes the model takes (check.encode_shapefacts).

Resolution refuses sizes that split the transformer unevenly (PL130: 32 heads over tp = 3). The
checker holds every query's sizes, and every witness variant the replay is shown, to the same
facts, so a counterexample is a configuration a user could run. The oracle for "the model takes
these sizes" is resolution itself: the plan checked with the sizes pinned raises PL130 or not."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import pytest

from placement_logic.check import encode_shapefacts as shapefacts
from placement_logic.check import run
from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.resolve.validate import rebinding_diagnostics

SPEC = """from std.data import ddp
from std.tensor import megatron_tp
from std.pipeline import one_f_one_b

model {{
  transformer {{
    hidden = 4096
    layers = {layers}
    heads = 32
    kv_heads = {kv}
    ffn = 16384
    vocab = 50304
  }}
  seq = 2048
  microbatch = 1
  microbatches = 2
}}

mesh {{
  dp = 2
  tp = 2
  pp = 2
}}

plan p {{
  dp: ddp
  tp: megatron_tp
  pp: one_f_one_b
{body}}}
"""
# a divisor on ranks 0 and 1 of tp: every rank at tp = 2, some of them from tp = 3 on (check.rankset)
RANKS = "  override grads: divide_on_ranks over (tp) ranks (0, 1) by 2\n"


def _spec(body: str = RANKS, layers: int = 32, kv: int = 8):
    return load_string(SPEC.format(body=body, layers=layers, kv=kv), "shapes.place")


def _resolves(spec, sizes: dict[str, int]) -> bool:
    """The oracle: resolution's own checks of the spec with these sizes written in (no PL130)."""
    diags = rebinding_diagnostics(spec, {k: Fraction(v) for k, v in sizes.items()})
    assert all(d.code == "PL130" for d in diags), diags
    return not diags


@pytest.mark.parametrize("layers,kv", [(32, 8), (30, 8), (32, 2)])
def test_the_facts_agree_with_resolution(layers, kv):
    """For every tp and pp up to 8 (kv = 2: heads copied from tp = 4 on), the facts hold exactly where
    resolution accepts the sizes."""
    spec = _spec("", layers, kv)
    found = shapefacts.facts(spec.plan("p"), dict(spec.bindings))
    for tp, pp in product(range(1, 9), range(1, 9)):
        sizes = {"dp": 1, "tp": tp, "pp": pp}
        assert shapefacts.holds(found, sizes) is _resolves(spec, sizes), (layers, kv, tp, pp)


def _refutations(report) -> dict[str, tuple[Verdict, dict[str, int]]]:
    return {o.name: (o.verdict, dict(o.counterexample.sizes) if o.counterexample else {}) for o in report.obligations}


def test_a_witness_that_landed_on_tp_3_now_lands_on_sizes_the_model_takes(monkeypatch):
    """The divisor on tp ranks (0, 1) splits the ranks first at tp = 3, which 32 heads refuse: the
    witness used to show tp = 3. With the facts it shows sizes resolution accepts, and no verdict changes."""
    spec = _spec()
    now = _refutations(check_spec(spec, ["p"], timeout=20).plans[0])
    monkeypatch.setattr(run.shapefacts, "facts", lambda plan, bindings: ())
    before = _refutations(check_spec(spec, ["p"], timeout=20).plans[0])
    assert {k: v[0] for k, v in now.items()} == {k: v[0] for k, v in before.items()}
    assert before["SC update[dense]"][0] is Verdict.REFUTED and before["SC update[dense]"][1]["tp"] == 3
    for name, (verdict, sizes) in now.items():
        if verdict is Verdict.REFUTED:
            assert _resolves(spec, {a: sizes[a] for a in ("dp", "tp", "pp")}), (name, sizes)
    assert now["SC update[dense]"][1]["tp"] == 4


def test_the_facts_are_stated_in_the_assumptions():
    report = check_spec(_spec(""), ["p"], timeout=20).plans[0]
    text = "; ".join(report.assumed)
    assert "tp divides the attention heads (32)" in text and "pp divides the layer count (32)" in text
    assert "tp divides the kv heads (8) (or a multiple of it: copies)" in text



ULYSSES = """from std.data import ddp
from std.tensor import megatron_tp
from std.context import context_parallel

model {{
  transformer {{
    hidden = 4096
    layers = 32
    heads = 32
    kv_heads = {kv}
    ffn = 16384
    vocab = 50304
  }}
  seq = 2048
  microbatch = 1
  microbatches = 2
}}

mesh {{
  dp = 2
  tp = 2
  cp = 2
}}

plan p {{
  dp: ddp
  tp: megatron_tp
  cp: context_parallel
  override activations[context]: all_to_all over (cp)
  override activation_grads[context]: all_to_all over (cp)
}}
"""


@pytest.mark.parametrize("kv", [8, 2])
def test_the_ulysses_group_facts_agree_with_resolution(kv):
    """PL197: Ulysses' group over cp divides each tensor rank's heads (and its kv heads, or is a multiple of
    them): the facts hold exactly where resolution accepts tp and cp up to 8."""
    spec = load_string(ULYSSES.format(kv=kv), "ulysses.place")
    found = shapefacts.facts(spec.plan("p"), dict(spec.bindings))
    assert any(f.axes == ("tp", "cp") for f in found)
    for tp, cp in product(range(1, 9), range(1, 9)):
        sizes = {"dp": 1, "tp": tp, "cp": cp}
        diags = rebinding_diagnostics(spec, {k: Fraction(v) for k, v in sizes.items()})
        assert shapefacts.holds(found, sizes) is (not diags), (kv, tp, cp, [d.message for d in diags])
