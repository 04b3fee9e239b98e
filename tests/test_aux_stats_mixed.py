"""The aux load-balancing loss's statements of every kind in one plan: the cells' weights and capacity
(test_aux_stats_cells) beside P over groups of its own, padding counted and equal counts
(test_aux_stats_padding, test_aux_stats_split). Each generated plan's ``GI aux_stats`` against the concrete
simulator (tests/simulator_auxstats.py) over sizes 1-2 and every layout the plan admits, and a refutation's
values recomputed by the simulator on the routing and layout its counterexample describes."""

from __future__ import annotations

import random
import re

import pytest
import test_aux_stats_cells as cells
import test_aux_stats_split as split
from test_aux_stats_padding import PAD

from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict


def _random_case(rng: random.Random):
    axes, sp, scope, body = cells._random_case(rng)
    token = [a for a in axes if a != "tp" or sp]
    if rng.random() < 0.7:
        body += split.probs("probs_" + rng.choice(split.VERBS), ", ".join(a for a in token if rng.random() < 0.5))
    if rng.random() < 0.3:
        body += PAD
    if rng.random() < 0.3:
        body += split.EQ
    return axes, sp, scope, body, rng.choice((1, 2)), rng.choice((None, "1", "3/2"))


@pytest.mark.parametrize("seed", range(16))
def test_mixed_statements_agree_with_the_simulator(seed):
    axes, sp, scope, body, sequences, cf = _random_case(random.Random(700 + seed))
    text = cells.text_of(scope, {"p": body}, cf, sp=sp, axes=axes, sequences=sequences)
    try:
        spec = load_string(text, "mixed.place")
        ob = cells._ob(spec, "p")
    except DiagnosticError:
        pytest.skip("statements the path cannot read together (a located error, tested beside each statement)")
    bad = split.simulated(spec.plan("p"), scope, sequences=sequences)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (axes, sp, scope, body, sequences, cf)
    if bad:
        uneven = re.search(r"at \w+=0 hold one real token", dict(ob.counterexample.values)["routing"])
        stated, simulated = (split if uneven else cells)._replayed(ob, spec.plan("p"), scope, sequences)
        assert stated == simulated and stated[0] != stated[1]
