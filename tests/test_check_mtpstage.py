"""The embedding copy of a multi-token-prediction block on a middle pipeline stage (``embedding: mtp_stage``)
and an embedding group of the first and last stage only (``embedding: group_first_last``): the checker against
the concrete simulator (tests/simulator_state.py, ``mtp_copy_violations``, which places the block on a random
middle stage and sums each group's copies), the replay's arithmetic, and the statements' errors."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator_state

from placement_logic.check import mtpstage
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_spec
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
NAMES = ("GI grads[embedding]", "SC grads[embedding]", mtpstage.ASPECT)


def spec_of(tmp_path, tied: bool, lines: str, mtp: int = 1):
    f = tmp_path / "m.place"
    f.write_text("from std.data import ddp\nfrom std.pipeline import gpipe\n\nmodel {\n  transformer {\n"
                 "    hidden = 1024\n    layers = 12\n    heads = 16\n    ffn = 4096\n    vocab = 32000\n"
                 f"    mtp_layers = {mtp}\n    tied_embeddings = {'true' if tied else 'false'}\n  }}\n"
                 "  microbatches = 4\n}\n\nmesh {\n  dp = 2\n  pp = 4\n}\n\n"
                 f"plan p {{\n  dp: ddp\n  pp: gpipe\n{lines}}}\n")
    spec = load_spec(f)
    return spec, spec.plans[0]


STAGE = "  override embedding: mtp_stage over (pp)\n"
GROUP = "  override embedding: group_first_last over (pp)\n"


@pytest.mark.slow
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("lines", [STAGE, STAGE + GROUP], ids=["derived_group", "first_last"])
def test_agrees_with_the_simulator(tmp_path, tied, lines):
    """pp of 1..4 stages (each divides the 12 layers), dp of 1..2: the embedding's gradient integrity, its
    replicas' consistency and the MTP-stage aspect are refuted exactly where the simulator finds a copy short of
    the whole gradient or two copies apart (the first-and-last group with a middle MTP stage, pp >= 3)."""
    spec, p = spec_of(tmp_path, tied, lines)
    rng = random.Random(3)
    for dp, pp in product((1, 2), (1, 2, 3, 4)):
        sizes = {"dp": dp, "pp": pp, "microbatches": 1}
        found = set().union(*(simulator_state.mtp_copy_violations(p, sizes, rng) for _ in range(8)))
        v = {o.name: o.verdict for o in check_plan(SESSION, spec, p, sizes).obligations if o.name in NAMES}
        assert set(v) == set(NAMES)
        expect = {"GI grads[embedding]": ("gi",) in found, mtpstage.ASPECT: ("gi",) in found,
                  "SC grads[embedding]": ("replica",) in found}
        assert {n: x is Verdict.REFUTED for n, x in v.items()} == expect, sizes


def test_replay_by_hand():
    """Copies' own gradients 1 (first stage), 2 (the MTP stage, stage 1), 4 (the tied last stage): Megatron Core's
    group sums all three, 1 + 2 + 4 = 7 everywhere; the first-and-last group gives 1 + 4 = 5 on stages 0 and 3 and
    leaves 2 on the MTP stage. Untied, the last stage holds no copy: 1 on stage 0, 2 on stage 1, the whole 3."""
    assert mtpstage.copies(4, True, grouped=True) == {0: 7, 1: 7, 3: 7}
    assert mtpstage.copies(4, True, grouped=False) == {0: 5, 1: 2, 3: 5}
    assert mtpstage.copies(3, False, grouped=False) == {0: 1, 1: 2}
    assert mtpstage.copies(3, False, grouped=True) == {0: 3, 1: 3}


def test_counterexample_is_at_three_stages(tmp_path):
    spec, p = spec_of(tmp_path, True, STAGE + GROUP)
    ob = next(o for o in check_plan(SESSION, spec, p, {}).obligations if o.name == mtpstage.ASPECT)
    assert ob.verdict is Verdict.REFUTED and dict(ob.counterexample.sizes)["pp"] >= 3
    assert "group_first_last" in ob.counterexample.diagnosis[0]


@pytest.mark.parametrize("lines,code,words", [
    (GROUP, "PL506", "changes nothing"),
    ("  override embedding: mtp_stage over (dp)\n", "PL296", "'dp' is not a pipeline axis"),
    ("  override embedding: mtp_stage over (pp, pp)\n", "PL296", "two axes"),
])
def test_statements_that_cannot_hold(tmp_path, lines, code, words):
    spec, p = spec_of(tmp_path, True, lines)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    d = e.value.diagnostics[0]
    assert d.code == code and words in d.message


def test_no_mtp_block(tmp_path):
    spec, p = spec_of(tmp_path, True, STAGE, mtp=0)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL296" and "mtp_layers" in e.value.diagnostics[0].message
