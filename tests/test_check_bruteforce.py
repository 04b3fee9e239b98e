"""The checker's gradient-integrity verdict against an independent brute force.

For data-parallel plans with every combination of loss normalisation, reduction
multiplicity, divisor and accumulation, on small pinned meshes, a direct loop over
devices, microbatches, token counts (1 or 2 per shard) and unit gradient contributions
decides whether the distributed gradient always equals the global-batch mean; the
solver's verdict must agree, and a refutation's counterexample must be a real one."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

from hypothesis import example, given, settings
from hypothesis import strategies as hs

from placement_logic import ir
from placement_logic.check import steps as st
from placement_logic.check.report import Verdict
from placement_logic.check.run import check_plan
from placement_logic.check.session import Session

from irkit import ov, plan

LOSSES = ("global_mean", "per_device_mean", "per_microbatch_mean")
DIVISORS = (None, "1", "dp", "dp*m")


def brute_force_ok(loss: str, k: int, divisor: str | None, accumulate: bool, n: int, m: int) -> bool:
    if divisor is None:
        D = {"global_mean": 1, "per_device_mean": n, "per_microbatch_mean": n * m}[loss]
    else:
        D = {"1": 1, "dp": n, "dp*m": n * m}[divisor]
    shards = list(product(range(n), range(m)))
    for counts in product((1, 2), repeat=len(shards)):
        c = dict(zip(shards, counts))
        total = sum(counts)
        for star in shards:
            s = {sh: Fraction(int(sh == star)) for sh in shards}

            def weight(d, t):
                if loss == "global_mean":
                    return Fraction(1, total)
                if loss == "per_device_mean":
                    return Fraction(1, sum(c[(d, u)] for u in range(m)))
                return Fraction(1, c[(d, t)])

            local = {(d, t): s[(d, t)] * weight(d, t) for d, t in shards}
            for d in range(n):
                def reduced(t):
                    if k == 0:
                        return local[(d, t)]
                    return n ** (k - 1) * sum(local[(e, t)] for e in range(n))

                acc = sum(reduced(t) for t in range(m)) if accumulate else reduced(m - 1)
                if acc / D != Fraction(1, total):
                    return False
    return True


def build(loss, k, divisor, accumulate):
    overrides = [ov("grads", "reduce", None, ("dp",) * k)]
    if loss != "global_mean":
        overrides.append(ov("loss", loss))
    if divisor is not None:
        value = {"1": ir.Const(Fraction(1)), "dp": ir.Sym("dp"),
                 "dp*m": ir.Op("*", (ir.Sym("dp"), ir.Sym("m")))}[divisor]
        overrides.append(ov("grads", "divide", None, by=value))
    if not accumulate:
        overrides.append(ov("grads", "no_accumulation_buffer"))
    return plan("p", {"dp": ("data", "R,R,R,R")}, overrides=tuple(overrides))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(hs.sampled_from(LOSSES), hs.integers(0, 2), hs.sampled_from(DIVISORS), hs.booleans(),
       hs.integers(1, 3), hs.integers(1, 2))
@example("global_mean", 1, None, True, 3, 2)  # correct: proved
@example("per_device_mean", 1, None, True, 3, 1)  # exact only with equal counts: refuted
@example("per_device_mean", 1, None, True, 1, 2)  # one device: its own token mean is global: proved
@example("global_mean", 2, "dp", True, 2, 2)  # reduced twice then averaged: proved (by accident)
def test_gi_verdict_matches_brute_force(loss, k, divisor, accumulate, n, m):
    spec, p = build(loss, k, divisor, accumulate)
    # the divisor "dp*m" uses the let symbol m, which must equal the pinned microbatches
    spec = ir.Spec(spec.file, (("dp", ir.Const(Fraction(n))), ("m", ir.Const(Fraction(m)))), (), spec.model,
                   spec.mesh, spec.plans)
    report = check_plan(Session(timeout=10), spec, p, {"dp": n, st.MICROBATCHES: m})
    gi = [o for o in report.obligations if o.name == "GI grads[dense]"][0]
    ok = brute_force_ok(loss, k, divisor, accumulate, n, m)
    assert gi.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), gi
    if not ok:
        sizes = dict(gi.counterexample.sizes)
        assert sizes == {"dp": n, st.MICROBATCHES: m}
