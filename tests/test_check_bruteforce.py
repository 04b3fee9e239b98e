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
from irkit import ov, plan
from tiers import examples

from placement_logic import ir
from placement_logic.check import steps
from placement_logic.check.report import Verdict
from placement_logic.check.run import check_plan
from placement_logic.solver.session import Session

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


@settings(max_examples=examples(60), deadline=None, derandomize=True)
@given(hs.sampled_from(LOSSES), hs.integers(0, 2), hs.sampled_from(DIVISORS), hs.booleans(),
       hs.integers(1, 3), hs.integers(1, 2))
@example("global_mean", 1, None, True, 3, 2)  # correct: proved
@example("per_device_mean", 1, None, True, 3, 1)  # exact only with equal counts: refuted
@example("per_device_mean", 1, None, True, 1, 2)  # one device: its own token mean is global: proved
@example("global_mean", 2, "dp", True, 2, 2)  # reduced twice then averaged: the errors cancel, proved with a note
def test_gi_verdict_matches_brute_force(loss, k, divisor, accumulate, n, m):
    """The whole-plan GI obligation is decided by the brute force of the whole plan; when it
    is refuted, each per-aspect finding isolates one aspect (the others as a correct system
    does them) and the brute force of that isolated plan decides it."""
    spec, p = build(loss, k, divisor, accumulate)
    # the divisor "dp*m" uses the model's microbatches symbol m: it is the pinned size
    report = check_plan(Session(timeout=10), spec, p, {"dp": n, steps.MICROBATCHES: m})
    gi = {o.name: o for o in report.obligations if o.name.startswith("GI grads[dense]")}
    # the whole plan: its verdict is the brute force of the whole plan (errors may cancel)
    whole_ok = brute_force_ok(loss, k, divisor, accumulate, n, m)
    assert gi["GI grads[dense]"].verdict is (Verdict.PROVED if whole_ok else Verdict.REFUTED)
    oracle = {
        "GI grads[dense] over dp": brute_force_ok("global_mean", k, None, True, n, m),
        "GI grads[dense] over microbatches": brute_force_ok("global_mean", 1, None, accumulate, n, m),
        "GI grads[dense] normalisation": brute_force_ok(loss, 1, divisor, True, n, m),
    }
    if whole_ok:
        # departures that cancel are notes of the proof, not refutations
        assert all(gi[name].verdict is Verdict.PROVED for name in oracle if name in gi)
        if not all(oracle.values()):
            assert any("errors cancel" in note for note in gi["GI grads[dense]"].notes)
        return
    assert set(gi) == {"GI grads[dense]"} | set(oracle)
    for name, ok in oracle.items():
        ob = gi[name]
        assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), ob
        if not ok:
            assert dict(ob.counterexample.sizes) == {"dp": n, steps.MICROBATCHES: m}


def brute_force_norms_ok(sp: bool, k_dp: int, k_tp: int, n: int, t: int, m: int) -> bool:
    """LayerNorm gradients on a dp × tp mesh, global token mean, by direct enumeration.

    With sequence parallelism each tp rank sees its own sequence slice (its own
    contribution); without it every tp rank computes the same contribution."""
    slices = t if sp else 1
    shards = list(product(range(n), range(slices), range(m)))
    for counts in product((1, 2), repeat=n * m):
        total = sum(counts)
        for star in shards:
            def local(i, j, u):
                return Fraction(int((i, j if sp else 0, u) == star), total)

            for i, j in product(range(n), range(t)):
                acc = Fraction(0)
                for u in range(m):
                    # reduce over dp k_dp times, then over tp k_tp times
                    def over_dp(jj):
                        if k_dp == 0:
                            return local(i, jj, u)
                        return n ** (k_dp - 1) * sum(local(e, jj, u) for e in range(n))

                    if k_tp == 0:
                        acc += over_dp(j)
                    else:
                        acc += t ** (k_tp - 1) * sum(over_dp(jj) for jj in range(t))
                if acc != Fraction(1, total):
                    return False
    return True


@settings(max_examples=examples(40), deadline=None, derandomize=True)
@given(hs.booleans(), hs.integers(0, 2), hs.integers(0, 2), hs.integers(1, 2), hs.integers(1, 3), hs.integers(1, 2))
@example(True, 1, 1, 2, 2, 1)  # sequence parallel, reduced over both: proved
@example(True, 1, 0, 2, 2, 1)  # sequence parallel, tp reduction missing: refuted
@example(False, 1, 1, 2, 2, 1)  # no sequence parallel, reduced over tp anyway: refuted over tp
@example(True, 2, 0, 2, 2, 1)  # sequence parallel, dp doubled and tp missing: each refuted on its own axis
@example(False, 1, 0, 1, 3, 2)  # no sequence parallel, dp only: proved
def test_norms_verdict_matches_brute_force(sp, k_dp, k_tp, n, t, m):
    o = ov("grads", "reduce", "norms", ("dp",) * k_dp + ("tp",) * k_tp)
    spec, p = plan("p", {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}, sp=sp, overrides=(o,))
    report = check_plan(Session(timeout=10), spec, p, {"dp": n, "tp": t, steps.MICROBATCHES: m})
    gi = {x.name: x for x in report.obligations if x.name.startswith("GI grads[norms]")}
    right_tp = 1 if sp else 0  # a correct system reduces over tp only under sequence parallel
    oracle = {"GI grads[norms] over dp": brute_force_norms_ok(sp, k_dp, right_tp, n, t, m),
              "GI grads[norms] over tp": brute_force_norms_ok(sp, 1, k_tp, n, t, m)}
    # tp has an obligation where the contribution is split over it or the plan reduces over it
    assert ("GI grads[norms] over tp" in gi) == (sp or k_tp >= 1)
    for name, ok in oracle.items():
        if name in gi:
            assert gi[name].verdict is (Verdict.PROVED if ok else Verdict.REFUTED), gi[name]
        else:
            assert ok
    for name in ("GI grads[norms] over microbatches", "GI grads[norms] normalisation"):
        assert gi[name].verdict is Verdict.PROVED
    if all(oracle.values()):
        assert brute_force_norms_ok(sp, k_dp, k_tp, n, t, m)


def brute_force_clip_ok(zero: bool, clip_axes: tuple[str, ...], filtered: tuple[str, ...], n: int, t: int) -> bool:
    """Global grad norm on a dp × tp mesh by enumeration: dense weights split over tp,
    LayerNorm weights replicated over tp; with ZeRO-2 gradients also split over dp.
    A device adds the squares it holds (a replicated group only where its coordinate on
    every filtered axis it is replicated on is 0: the stated duplicate filter), then
    all-reduces over clip_axes, a plain sum: a group's copies on an unfiltered axis all count."""
    groups = {"dense": ("tp",) + (("dp",) if zero else ()), "norms": ("dp",) if zero else ()}
    size = {"dp": n, "tp": t}
    pieces = [(g, tuple(product(*[range(size[a]) for a in ax]))) for g, ax in groups.items()]
    keys = [(g, s) for g, shards in pieces for s in shards]
    for values in product((0, 1), repeat=len(keys)):
        q = dict(zip(keys, values))
        total = sum(values)
        devices = list(product(range(n), range(t)))

        def local(dev):
            coord = {"dp": dev[0], "tp": dev[1]}
            out = 0
            for g, ax in groups.items():
                if all(coord[a] == 0 for a in filtered if a not in ax):
                    out += q[(g, tuple(coord[a] for a in ax))]
            return out

        buf = {d: local(d) for d in devices}
        for a in clip_axes:
            i = 0 if a == "dp" else 1
            sums: dict = {}
            for d, v in buf.items():
                sums[d[:i] + d[i + 1:]] = sums.get(d[:i] + d[i + 1:], 0) + v
            buf = {d: sums[d[:i] + d[i + 1:]] for d in buf}
        if any(v != total for v in buf.values()):
            return False
    return True


@settings(max_examples=examples(40), deadline=None, derandomize=True)
@given(hs.booleans(), hs.sampled_from([(), ("dp",), ("tp",), ("dp", "tp"), ("tp", "tp")]), hs.booleans(),
       hs.integers(1, 2), hs.integers(1, 3))
@example(True, ("dp", "tp"), True, 2, 2)  # ZeRO-2 + TP, summed over both, norms filtered over tp: proved
@example(True, ("dp", "tp"), False, 2, 2)  # the same as a plain sum: the norms' tp copies all count, refuted
@example(True, ("tp",), True, 2, 2)  # ZeRO-2 shards not summed over dp: refuted
@example(False, ("tp",), True, 2, 3)  # plain DP + TP: dp copies are whole, tp with the filter: proved
@example(False, ("tp",), False, 2, 3)  # plain DP + TP, no filter: norms counted 3 times, refuted
@example(False, ("dp", "tp"), False, 2, 2)  # plain DP + TP summed over dp too: dp copies counted twice, refuted
def test_clip_verdict_matches_brute_force(zero, clip_axes, filter_stated, n, t):
    """A written `clip_norm: reduce over (AXES)` is a plain sum; with `filter_stated` the plan also
    states `clip_norm[g]: dedupe over (tp)` where tp is summed, for the groups replicated there."""
    dp_modes = "R,S,S,R" if zero else "R,R,R,R"
    filtered = ("tp",) if filter_stated and "tp" in clip_axes else ()
    o = (ov("clip_norm", "reduce", None, clip_axes),) + tuple(
        ov("clip_norm", "dedupe", g, filtered) for g in ("norms", "biases") if filtered)
    spec, p = plan("p", {"dp": ("data", dp_modes), "tp": ("tensor", "S,S,S,S")}, overrides=o)
    report = check_plan(Session(timeout=10), spec, p, {"dp": n, "tp": t, steps.MICROBATCHES: 1})
    sc = [x for x in report.obligations if x.name == "SC clip_norm"][0]
    # the checker's plan also has biases and embedding groups: biases behave like norms (and are
    # filtered alike), the embedding like dense, so the two-group oracle decides the same question
    ok = brute_force_clip_ok(zero, clip_axes, filtered, n, t)
    assert sc.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), sc
