"""What the tests of ignored tokens share (tests/test_check_ignored_tokens.py: counted in the normaliser;
tests/test_check_ignored_terms.py: their terms summed into the loss): the hand-built plans' axes, the
checker's GI verdicts against the concrete simulator's (tests/simulator.py) on small meshes, the PL122 of
a statement naming a loss term, and the format round trip of a statement."""

from __future__ import annotations

import random
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DP = {"dp": ("data", "R,R,R,R")}
DP_CP = {"dp": ("data", "R,R,R,R"), "cp": ("context", "R,R,R,R")}
DP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}


def gi(report) -> dict[str, Verdict]:
    """The verdict of each group's whole-gradient obligation (``GI grads[g]``, not its aspects)."""
    return {o.name[len("GI grads["):-1]: o.verdict for o in report.obligations
            if o.name.startswith("GI grads[") and "] " not in o.name}


def simulated(p, seed: int) -> set:
    """The groups whose gradient the simulator finds wrong at every size 1 or 2 and 1 or 2 microbatches."""
    rng = random.Random(seed)
    found: set = set()
    for sizes in product((1, 2), repeat=len(p.mesh.names)):
        for m in (1, 2):
            found |= simulator.violations(p, {**dict(zip(p.mesh.names, sizes)), "microbatches": m}, rng, {}, trials=2)
    return {k[1] for k in found if k[0] == "gi"}


def check_against_the_simulator(axes: dict, overrides: tuple, wrong: bool, seed: int) -> None:
    """Every group refuted iff the plan is ``wrong``, and the simulator finds exactly those groups wrong."""
    spec, p = plan("p", axes, overrides=overrides)
    v = gi(check_plan(SESSION, spec, p, {}))
    found = simulated(p, seed)
    assert v and all((x is Verdict.REFUTED) == wrong for x in v.values()), v
    assert found == (set(v) if wrong else set())


def check_a_term_statement_is_pl122(verb: str) -> None:
    """``override tokens[mtp]: VERB`` names a loss term, which the statement does not take: PL122 at check (a
    hand-built plan) and at resolve (the language)."""
    spec, p = plan("p", DP, overrides=(ov("tokens", verb, "mtp"),))
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    assert e.value.diagnostics[0].code == "PL122"
    src = ("from std.data import ddp\nmodel {\n  params = 1e9\n  losses {\n    mtp = global_mean\n  }\n}\n"
           f"mesh {{\n  dp = 2\n}}\nplan p {{\n  dp: ddp\n  override tokens[mtp]: {verb}\n}}\n")
    with pytest.raises(DiagnosticError) as e:
        load_string(src)
    assert e.value.diagnostics[0].code == "PL122"


SRC = ("from std.data import ddp\n\nmodel {\n  params = 1000000000\n  seq = 4096\n  microbatch = 1\n}\n\n"
       "mesh {\n  dp = 8\n}\n\nplan p {\n  dp: ddp\n{lines}}\n")


def check_format_round_trip(verb: str) -> None:
    """``override tokens: VERB`` is canonical as written, and its spacing is normalised to it."""
    src = SRC.replace("{lines}", f"  override tokens: {verb}\n")
    assert format_source(src, "x.place") == src
    assert format_source(src.replace(f"tokens: {verb}", f"tokens :{verb}"), "x.place") == src
