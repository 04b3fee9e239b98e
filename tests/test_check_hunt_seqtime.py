"""A hunt for false proofs: a loss term of the user's own (per sequence or per token) beside the statements of time
within and across steps, against the independent simulators.

Each plan has a data axis ``dp`` (DDP, ZeRO-1/2/3 or FSDP) and maybe a tensor axis ``tp``, a term ``kl`` with a
random objective and path (``loss[kl]``, ``tokens[kl]: reduce over``, ``tokens[kl]: equal``), and two or three of
``grads: sync_before_last``, ``reduce_every_microbatch``, ``no_accumulation_buffer``, ``grads[g]: no_zero_grad``,
``optimizer[g]: step_every_microbatch``, ``accumulation: ...``, ``tokens: equal / clamp_before_reduce / reduce over``.
The checker's verdicts are compared, at every size 1..2 of each axis and 1..2 microbatches, with:

- the term's obligations (``GI loss[kl]`` and ``GI loss[kl] grads[g]``: its weights with the reductions as derived)
  against tests/simulator_seqterms.py;
- each group's whole-plan gradient integrity, replicas, norm and overflow against tests/simulator.py (on the plan
  without the term, which adds nothing to the main loss's gradient) and tests/simulator_state.py (the sync armed
  early, the buffer carried across steps, the update taken after every micro-step);
- the aspects ``GI grads[g] update over microbatches`` and ``GI grads[g] across steps`` against the state simulator.

As in tests/test_check_hunt_steps.py: a simulator violation is never behind a proof; a refutation is confirmed by the
simulator at some size 1..3 per axis and 1..3 microbatches; unknown or a located diagnostic makes no claim. ``SAMPLE``
seeds run in the quick tier, ``SWEEP`` is slow."""

from __future__ import annotations

import random
from dataclasses import replace
from fractions import Fraction
from itertools import product

import pytest
import simulator
import simulator_seqterms as seqsim
import simulator_state
from irkit import ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)
DATA = {"ddp": "R,R,R,R", "zero1": "R,S,R,R", "zero2": "R,S,S,R", "zero3": "S*,S,S,R", "fsdp": "S*,S*,S,R"}
OBJECTIVES = ("per_sequence_mean", "per_sequence_sum", "global_mean")
PATHS = (None, "global_mean", "per_microbatch_mean", "per_device_mean", "sum", "per_sequence_mean",
         "per_sequence_sum")
GROUPS = (None, "dense", "norms")
UPDATE, CARRY = " update over microbatches", " across steps"


def _time(rng: random.Random, pipelined: bool) -> ir.Override:
    kind = rng.randrange(9)
    if kind == 5 and not pipelined:  # nested accumulation: the rounds of a pipeline schedule
        kind = rng.randrange(5)
    if kind == 0:
        return ov("grads", "sync_before_last")
    if kind == 1:
        return ov("grads", "reduce_every_microbatch")
    if kind == 2:
        return ov("grads", "no_accumulation_buffer")
    if kind == 3:
        return ov("grads", "no_zero_grad", rng.choice(GROUPS))
    if kind == 4:
        return ov("optimizer", "step_every_microbatch", rng.choice(GROUPS))
    if kind == 5:
        verb = rng.choice(["outer_undivided", "inner_undivided", "rescaled_every_round"])
        return ov("accumulation", verb, None, by=ir.Const(Fraction(2)))
    if kind == 6:
        return ov("tokens", "equal")
    if kind == 7:
        return ov("tokens", "clamp_before_reduce")
    return ov("tokens", "reduce", None, ("dp",))


def generated(seed: int) -> tuple[ir.Spec, ir.Plan, tuple]:
    """(spec, plan, the term: (objective, path, count axes, equal))."""
    rng = random.Random(seed)
    axes = {"dp": ("data", DATA[rng.choice(["ddp", "ddp", "zero1", "zero1", "zero2", "zero3", "fsdp"])])}
    other = rng.choice([None, None, "tp", "pp"])  # a tensor or pipeline axis: its ranks hold the same sequences
    if other:
        axes[other] = ("tensor" if other == "tp" else "pipeline", "S,S,S,S")
    objective, path = rng.choice(OBJECTIVES), rng.choice(PATHS)
    counted = (path or objective) in ("global_mean", "per_sequence_mean", "per_sequence_sum")  # else PL506
    count = rng.choice([None, ("dp",), tuple(axes)]) if counted else None
    equal = (path or objective) in ("per_device_mean", "per_microbatch_mean") and rng.random() < 0.5
    term = ([ov("loss", path, "kl")] if path else []) + ([ov("tokens", "reduce", "kl", count)] if count else []) + (
        [ov("tokens", "equal", "kl")] if equal else [])
    time = [_time(rng, other == "pp") for _ in range(rng.randint(2, 3))]
    if any(o.target == "accumulation" for o in time):  # the levels divide a per-microbatch mean
        time.append(ov("loss", "per_microbatch_mean"))
    overrides = tuple(term) + tuple(time)
    spec, p = plan("p", axes, overrides=overrides)
    model = replace(p.model, loss_terms=(("kl", objective, p.span),))
    p = replace(p, model=model)
    return replace(spec, model=model, plans=(p,)), p, (objective, path or objective, count, equal)


def checker_keys(report) -> dict[tuple, Verdict]:
    out = {}
    for o in report.obligations:
        name = o.name
        if name == "GI loss[kl]":
            out[("term",)] = o.verdict
        elif name.startswith("GI loss[kl] grads["):
            out[("term", name[len("GI loss[kl] grads["):-1])] = o.verdict
        elif name.startswith("GI grads[") and name.endswith(UPDATE):
            out[("update", name[len("GI grads["):-len("]" + UPDATE)])] = o.verdict
        elif name.startswith("GI grads[") and name.endswith(CARRY):
            out[("carry", name[len("GI grads["):-len("]" + CARRY)])] = o.verdict
        elif name.startswith("GI grads[") and "] " not in name:
            out[("gi", name[len("GI grads["):-1])] = o.verdict
        elif name.startswith("SC grads["):
            out[("replica", name[len("SC grads["):-1])] = o.verdict
        elif name in ("SC clip_norm", "SC overflow"):
            out[("clip",) if name == "SC clip_norm" else ("overflow",)] = o.verdict
    return out


class _One:
    def __init__(self, ob):
        self.obligations = (ob,)


def found_at(p: ir.Plan, term: tuple, sizes: dict, seed: int) -> set:
    """Every key some simulator finds violated at ``sizes``."""
    rng = random.Random(seed)
    bare = replace(p, model=replace(p.model, loss_terms=()))
    out = {k for k in simulator.violations(bare, sizes, rng, {}, trials=2) if k[0] in ("gi", "clip", "overflow")}
    if any(o.target == "grads" and o.verb == "sync_before_last" for o in p.overrides):
        out |= simulator_state.early_sync_violations(p, sizes, rng)  # the sync armed on micro-step 1 of m
    for k in simulator_state.stale_buffer_violations(p, sizes, rng):
        out |= {k, ("carry", k[1])} if k[0] == "gi" else {k}
    for _ in range(4):  # a difference for some data
        for k in simulator_state.microstep_update_violations(p, sizes, rng):
            out |= {k, ("gi", k[1])}
    objective, path, count, equal = term
    # the simulator's second axis "tp" stands for either: ranks holding the same sequences, no token axis
    other = sizes.get("tp", sizes.get("pp", 1))
    count = tuple("tp" if a == "pp" else a for a in count) if count else None
    terms_sizes = {"dp": sizes["dp"], "tp": other, "microbatches": sizes["microbatches"]}
    if seqsim.violation(objective, path, terms_sizes, count, None, equal, rng, tries=12):
        out |= {("term",), ("term", "dense")}
    return out


def _term_oracle(p: ir.Plan, term: tuple) -> bool:
    """Whether simulator_seqterms decides the term: its equal cells hold as many sequences, not as many tokens, so a
    per-token term's local mean beside ``tokens: equal`` (equal token counts, which the term's tokens share) is
    left to tests/test_check_losses.py."""
    objective, path, _, _ = term
    local = path in ("per_device_mean", "per_microbatch_mean") and objective not in seqsim.SEQUENCE
    return not (local and any(o.target == "tokens" and o.group is None and o.verb == "equal" for o in p.overrides))


def disagreements(spec: ir.Spec, p: ir.Plan, term: tuple, seed: int = 0) -> list:
    try:
        report = check_plan(SESSION, spec, p, {})
    except DiagnosticError:
        return []  # a located diagnostic is an answer
    verdicts = checker_keys(report)
    names = p.mesh.names
    witness = {k: dict(o.counterexample.sizes) for o in report.obligations if o.counterexample is not None
               for k in checker_keys(_One(o))}

    def found(ranges, ms) -> set:
        out: set = set()
        for sizes in product(*[ranges] * len(names)):
            for m in ms:
                out |= found_at(p, term, {**dict(zip(names, sizes)), "microbatches": m}, seed)
        return out

    small = found((1, 2), (1, 2))
    wide = None
    out = []
    decided = _term_oracle(p, term)
    for key, verdict in verdicts.items():
        if key[0] == "term" and not decided:
            continue
        if verdict is Verdict.PROVED and key in small:
            out.append((key, "proved", "simulator violated"))
        elif verdict is Verdict.REFUTED and key not in small:
            wide = found((1, 2, 3), (1, 2, 3)) if wide is None else wide
            cex = witness.get(key)  # the counterexample's sizes (a whole number of rounds of M microbatches)
            if key not in wide and not (cex and any(key in found_at(p, term, {**cex, "microbatches": cex.get(
                    "microbatches", 1)}, s) for s in range(4))):
                out.append((key, "refuted", "simulator ok", cex))
    return out


# quick: a per-sequence term with the update after every micro-step and a clamped count (14), a per-sequence path on
# a per-token term beside a carried buffer and the sync armed early (15), reductions after every micro-step (7)
SAMPLE = (14, 15, 7)
SWEEP = range(30, 600)


@pytest.mark.parametrize("seed", SAMPLE)
def test_terms_beside_time_statements_never_prove_what_the_simulators_break(seed):
    spec, p, term = generated(seed)
    assert not disagreements(spec, p, term, seed), (p.placements, p.overrides, term)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SWEEP)
def test_terms_beside_time_statements_sweep(seed):
    spec, p, term = generated(seed)
    assert not disagreements(spec, p, term, seed), (p.placements, p.overrides, term)
