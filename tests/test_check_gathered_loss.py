"""The loss computed on the sequence gathered over context axes (``override loss: on_gathered_sequence over
(AXES)``, check.gathered): the checker against the concrete simulator (tests/simulator_gi.py, whose ranks of a
gathered axis count the whole sequence's tokens) at sizes 1 to 3, the replayed counterexample (values by hand),
the diagnostics (PL292, PL293, PL506) and the format round trip."""

from __future__ import annotations

import io
import json
import random
import re
from fractions import Fraction
from itertools import product

import pytest
import simulator
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DP_SP = {"dp": ("data", "R,R,R,R"), "sp": ("context", "R,R,R,R")}
DP_CP_SP = {"dp": ("data", "R,R,R,R"), "cp": ("context", "R,R,R,R"), "sp": ("context", "R,R,R,R")}
DP_TP_SP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S"), "sp": ("context", "R,R,R,R")}
ON_SP = ov("loss", "on_gathered_sequence", None, ("sp",))
ON_CP_SP = ov("loss", "on_gathered_sequence", None, ("cp", "sp"))


def tokens(*axes: str):
    return ov("tokens", "reduce", None, axes)


CASES = [
    # (axes, overrides, whether every group's gradient is wrong)
    (DP_SP, (ON_SP,), False),  # the derived count: over dp only, the gather summing sp
    (DP_SP, (ON_SP, tokens("dp", "sp")), True),  # verl#1963: every token counted sp times
    (DP_SP, (ON_SP, tokens("dp")), False),  # verl#3691's fix
    (DP_SP, (tokens("dp"),), True),  # without the gather the count misses sp (cp_tokens_dp_only)
    (DP_SP, (ON_SP, tokens("dp", "sp"), ov("tokens", "equal")), True),  # equal counts do not help
    (DP_SP, (ON_SP, tokens("sp")), True),  # sp counted twice, dp not at all
    # the count summed over sp too, and the loss multiplied by sp to make up for it: exact
    (DP_SP, (ON_SP, tokens("dp", "sp"), ov("grads", "divide", None, by=ir.Op("/", (ir.Const(Fraction(1)), ir.Sym("sp"))))),
     False),
    (DP_SP, (ON_SP, tokens("dp", "sp"), ov("grads", "divide", None, by=ir.Sym("sp"))), True),  # divided, not multiplied
    # a mean of per-device means over the whole sequence: exact for equal counts, divided by dp only
    (DP_SP, (ON_SP, ov("loss", "per_device_mean"), ov("tokens", "equal")), False),
    (DP_SP, (ON_SP, ov("loss", "per_microbatch_mean"), ov("tokens", "equal")), False),
    (DP_SP, (ON_SP, ov("loss", "per_device_mean")), True),
    # ring (cp) and Ulysses (sp) together, the loss gathered over the Ulysses group only or over both
    (DP_CP_SP, (ON_SP, tokens("dp", "cp", "sp")), True),
    (DP_CP_SP, (ON_SP, tokens("dp", "cp")), False),
    (DP_CP_SP, (ON_CP_SP, tokens("dp", "cp")), True),
    (DP_CP_SP, (ON_CP_SP, tokens("dp")), False),
    (DP_TP_SP, (ON_SP, tokens("dp", "sp")), True),
    (DP_TP_SP, (ON_SP, tokens("dp")), False),
]


def _gi(report) -> dict[str, Verdict]:
    return {o.name[len("GI grads["):-1]: o.verdict for o in report.obligations
            if o.name.startswith("GI grads[") and "] " not in o.name}


def _simulated(p, seed: int) -> set:
    """The groups whose gradient the simulator finds wrong at some size of 1 to 3 per axis and 1 or 2 microbatches."""
    rng = random.Random(seed)
    found: set = set()
    for sizes in product((1, 2, 3), repeat=len(p.mesh.names)):
        for m in (1, 2):
            found |= simulator.violations(p, {**dict(zip(p.mesh.names, sizes)), "microbatches": m}, rng, {}, trials=2)
    return {k[1] for k in found if k[0] == "gi"}


@pytest.mark.slow
@pytest.mark.parametrize("axes,overrides,wrong", CASES, ids=lambda x: None if isinstance(x, (dict, bool)) else
                         "+".join(f"{o.target}:{o.verb}{'(' + ','.join(o.axes) + ')' if o.axes else ''}" for o in x))
def test_checker_and_simulator_agree(axes, overrides, wrong):
    spec, p = plan("p", axes, overrides=overrides)
    v = _gi(check_plan(SESSION, spec, p, {}))
    assert v and all((x is Verdict.REFUTED) == wrong for x in v.values()), v
    assert _simulated(p, seed=11) == (set(v) if wrong else set())


def test_the_simulator_counts_the_whole_sequence_on_each_gathered_rank():
    """The oracle alone at dp = 1, sp = 2, one microbatch: the count reduced over (dp, sp) is wrong exactly when
    the loss is gathered; over (dp) exactly when it is not."""
    sizes = {"dp": 1, "sp": 2, "microbatches": 1}
    rng = random.Random(3)
    for overrides, wrong in (((ON_SP, tokens("dp", "sp")), True), ((ON_SP, tokens("dp")), False),
                             ((tokens("dp", "sp"),), False), ((tokens("dp"),), True)):
        _, p = plan("p", DP_SP, overrides=overrides)
        assert (("gi", "dense") in simulator.violations(p, sizes, rng, trials=4)) is wrong, overrides


def test_the_counterexample_is_sp_times_too_small():
    spec, p = plan("p", DP_SP, overrides=(ON_SP, tokens("dp", "sp")))
    ob = {o.name: o for o in check_plan(SESSION, spec, p, {}).obligations}["GI grads[dense] normalisation"]
    assert ob.verdict is Verdict.REFUTED
    cex = ob.counterexample
    sp = dict(cex.sizes)["sp"]
    found = re.search(r"\) = (-?\d+(?:/\d+)?), but the global-batch gradient is (-?\d+(?:/\d+)?)", cex.equation)
    got, want = Fraction(found.group(1)), Fraction(found.group(2))
    # by hand: each sp rank's count is the whole sequence's T, summed over sp: sp·T for T, so the gradient is 1/sp of it
    assert sp >= 2 and got * sp == want
    assert "gathered over (sp)" in cex.diagnosis[0] and "sp times" in cex.diagnosis[0]


def _error(overrides, axes=DP_SP) -> str:
    spec, p = plan("p", axes, overrides=overrides)
    with pytest.raises(DiagnosticError) as e:
        check_plan(SESSION, spec, p, {})
    return e.value.diagnostics[0].code


@pytest.mark.parametrize("overrides,axes,code", [
    ((ov("loss", "on_gathered_sequence", None, ("dp",)),), DP_SP, "PL292"),  # a data axis holds whole sequences
    ((ov("loss", "on_gathered_sequence", None, ("tp",)),), DP_TP_SP, "PL292"),
    ((ov("loss", "on_gathered_sequence", None, ("sp", "sp")),), DP_SP, "PL292"),
    ((ov("loss", "on_gathered_sequence", None, ()),), DP_SP, "PL506"),
    ((ON_SP, ov("loss", "sum")), DP_SP, "PL506"),
    ((ON_SP, ov("tokens", "clamp_before_reduce")), DP_SP, "PL293"),
    ((ON_SP, ov("tokens", "count_ignored")), DP_SP, "PL293"),
])
def test_diagnostics(overrides, axes, code):
    assert _error(overrides, axes) == code


SRC = ("from std.data import ddp\nfrom std.context import context_parallel\n\nmodel {\n  params = 1000000000\n"
       "  seq = 32768\n  microbatch = 1\n}\n\nmesh {\n  dp = 4\n  sp = 2\n}\n\nplan p {\n  dp: ddp\n"
       "  sp: context_parallel\n{lines}}\n")


def test_a_located_diagnostic_in_the_language():
    src = SRC.replace("{lines}", "  override loss: on_gathered_sequence over (dp)\n")
    with pytest.raises(DiagnosticError) as e:
        load_string(src, "bad.place")
    d = e.value.diagnostics[0]
    assert (d.code, d.span.line, d.span.column) == ("PL292", 18, 3)
    # a loss term's path does not take it (the statement is the main loss's)
    term = SRC.replace("{lines}", "  override loss[mtp]: on_gathered_sequence over (sp)\n").replace(
        "params = 1000000000", "params = 1000000000\n  losses {\n    mtp = global_mean\n  }")
    with pytest.raises(DiagnosticError) as e:
        load_string(term)
    assert e.value.diagnostics[0].code == "PL122"


def test_format_round_trip():
    src = SRC.replace("{lines}", "  override loss: on_gathered_sequence over (sp)\n  override tokens: reduce over (dp)\n")
    assert format_source(src, "x.place") == src
    assert format_source(src.replace("over (sp)", "over(sp )"), "x.place") == src


COST_SRC = ("from std.data import ddp\nfrom std.context import context_parallel\n\nmodel {\n  params = 1000000000\n"
            "  seq = 32768\n  microbatch = 2\n  microbatches = 4\n}\n\nmesh {\n  dp = 4\n  cp = 2\n  sp = 2\n}\n\n"
            "plan p {\n  dp: ddp\n  cp: context_parallel\n  sp: context_parallel\n{lines}}\n")


def _gathers(tmp_path, lines: str) -> list[dict]:
    path = tmp_path / "g.place"
    path.write_text(COST_SRC.replace("{lines}", lines))
    out, err = io.StringIO(), io.StringIO()
    assert main(["cost", str(path), "--format", "json"], out=out, err=err) == 0, err.getvalue()
    colls = json.loads(out.getvalue())["plans"][0]["communication"]["collectives"]
    return [c for c in colls if c["kind"] == "all_gather" and c["state"] == "activations"]


def test_the_gather_is_priced_exactly(tmp_path):
    """seq 32768 over cp·sp = 4 context ranks: 8192 positions per rank, b = 2, one fp32 value per token: a
    shard of 8192·2·4 = 65536 B, 131072 B gathered over sp = 2; a ring all-gather sends (2 − 1)/2 of it, once
    per microbatch (4): 65536·4 = 262144 B per device, volume 131072·4 = 524288 B. Its backward moves nothing."""
    colls = _gathers(tmp_path, "  override loss: on_gathered_sequence over (sp)\n  override tokens: reduce over (dp, cp)\n")
    assert len(colls) == 1 and colls[0]["axes"] == ["sp"] and colls[0]["phase"] == "forward", colls
    assert (colls[0]["count"], colls[0]["bytes_per_device"], colls[0]["volume"]) == (4, 262144, 524288)


@pytest.mark.slow
def test_the_gather_over_both_context_axes_and_none(tmp_path):
    # over both context axes: 8192·2·4·4 = 262144 B gathered, (4 − 1)/4 of it sent: 196608 B per microbatch
    colls = _gathers(tmp_path, "  override loss: on_gathered_sequence over (cp, sp)\n  override tokens: reduce over (dp)\n")
    assert len(colls) == 1 and colls[0]["bytes_per_device"] == 196608 * 4, colls
    assert _gathers(tmp_path, "") == []


TERM_SRC = SRC.replace("params = 1000000000", "params = 1000000000\n  losses {\n    {term} = global_mean\n  }")


def _term_counts(gathered: bool, dp: int, sp: int, parts: list[list[int]]) -> tuple[int, int]:
    """(the count a rank divides the term by under ``tokens[kl]: reduce over (dp, sp)``, the global count T) where
    ``parts[d][s]`` is the number of kl tokens of data rank d's sequence on sp rank s: the term computed on the
    gathered sequence counts the whole sequence on every sp rank, else each rank its own part."""
    local = [[sum(parts[d]) if gathered else parts[d][s] for s in range(sp)] for d in range(dp)]
    return sum(sum(row) for row in local), sum(sum(row) for row in parts)


@pytest.mark.parametrize("term", ["kl", "mtp"])
def test_a_term_beside_a_gathered_loss_is_unknown(term):
    """A term beside the gathered main loss: by hand (dp = 2, sp = 2, parts (1, 3) and (2, 2): T = 8),
    ``tokens[kl]: reduce over (dp, sp)`` divides by 1 + 3 + 2 + 2 = 8 = T where each rank counts its own part,
    and by 4·2 + 4·2 = 16 = 2T where the term is computed on the gathered sequence (the loss sp = 2 times too
    small, verl-project/verl#1963's count on the kl term). No statement says which: unknown, the fact named."""
    assert _term_counts(False, 2, 2, [[1, 3], [2, 2]]) == (8, 8)
    assert _term_counts(True, 2, 2, [[1, 3], [2, 2]]) == (16, 8)
    lines = f"  override loss: on_gathered_sequence over (sp)\n  override tokens[{term}]: reduce over (dp, sp)\n"
    src = TERM_SRC.replace("{term}", term)
    spec = load_string(src.replace("{lines}", lines), "t.place")
    report = check_plan(SESSION, spec, spec.plans[0], {})
    got = [o for o in report.obligations if o.name.startswith(f"GI loss[{term}]")]
    assert got and all(o.verdict is Verdict.UNKNOWN for o in got)
    assert all(f"whether the {term} term is computed on the sequence gathered over (sp)" in o.reason for o in got)
    # without the gather the kl term's own count over (dp, sp) is T: proved
    if term == "kl":
        plain = load_string(src.replace("{lines}", "  override tokens[kl]: reduce over (dp, sp)\n"), "t.place")
        got = [o for o in check_plan(SESSION, plain, plain.plans[0], {}).obligations if o.name.startswith("GI loss[kl]")]
        assert got and all(o.verdict is Verdict.PROVED for o in got)


def test_a_router_term_beside_a_gathered_loss_keeps_its_verdict():
    """The aux term is computed from the router's statistics on each rank's own tokens, whatever the loss's outputs
    are gathered over: its natural path (one value per device of the data and expert axes and microbatch, the sp
    ranks' parts of it summed once) is proved with the gather as without it, and names no gathered fact."""
    from dataclasses import replace

    axes = {"dp": ("data", "R,R,R,R"), "sp": ("context", "R,R,R,R"), "ep": ("expert", "S,S,S,R")}
    for extra in ((), (ON_SP,)):
        spec, p = plan("p", axes, overrides=extra, experts=4)
        model = replace(p.model, loss_terms=(("aux", "per_microbatch_mean", p.span),))
        p = replace(p, model=model)
        got = [o for o in check_plan(SESSION, replace(spec, model=model, plans=(p,)), p, {}).obligations
               if o.name.startswith("GI loss[aux]")]
        assert got and all(o.verdict is Verdict.PROVED for o in got), [(o.name, o.verdict) for o in got]
