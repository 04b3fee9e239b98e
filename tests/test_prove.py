"""placement prove: every theorem proved by z3 and cvc5, witnesses shown and independently
re-checked, the ZeRO abstract's and ZeroPP's claims reported with exact conditions, and
the committed SMT-LIB files up to date."""

from __future__ import annotations

import io
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest
import sympy

from placement_logic import costs
from placement_logic.check.report import Verdict
from placement_logic.cli import main
from placement_logic.costs.symbolic import symbol
from placement_logic.frontend.loader import load_spec
from placement_logic.prove import engine, prove, render
from placement_logic.prove.derivations import MEMORY, N, _plan_cost, psi
from placement_logic.prove.published import published_spec
from placement_logic.prove.symbolic_ob import INT, POS, relation
from placement_logic.solver import backends as solvers

ROOT = Path(__file__).resolve().parent.parent
SMT2 = ROOT / "proofs" / "smt2"
STDLIB = ROOT / "placement_logic" / "stdlib"


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def run_all():
    """One full run (the work of `placement prove examples/zero_paper.place`), shared."""
    report, texts = prove([load_spec(ROOT / "examples" / "zero_paper.place")])
    return report, texts


@pytest.fixture(scope="module")
def full(run_all):
    report, _ = run_all
    errors = "".join(f"error: {r.key}: {r.error}\n" for r in report.errors)
    return report.exit_status, json.loads(json.dumps(render.to_json(report))), errors


def by_key(report: dict) -> dict[str, dict]:
    return {o["key"]: o for o in report["obligations"]}


def rows(ob: dict) -> dict[str, str]:
    return {w["label"]: w["value"] for w in ob["detail"] + ob["witness"]}


def test_every_obligation_as_expected_with_both_solvers(full):
    code, report, err = full
    assert code == 0, err
    assert report["verdict"] == "proved"
    assert report["counts"]["unknown"] == 0 and report["counts"]["error"] == 0
    for ob in report["obligations"]:
        verdicts = {s["solver"]: s["verdict"] for s in ob["solvers"]}
        assert set(verdicts) == {"z3", "cvc5"}, ob["key"]
        assert verdicts["z3"] == verdicts["cvc5"] == ob["expect"], (ob["key"], verdicts)
        assert ob["ok"], ob["key"]


def test_theorem_groups_present(full):
    keys = by_key(full[1])
    groups = {k.split("/")[0] for k in keys}
    assert {"memory", "comm", "correctness", "composition", "claims"} <= groups


def test_published_memory_forms_are_the_ones_stated(full):
    names = {o["name"] for o in full[1]["obligations"] if o["theorem"] == MEMORY}
    for text in ("DP model state = (4 + K)Ψ", "ZeRO-1 model state = 4Ψ + KΨ/N",
                 "ZeRO-2 model state = 2Ψ + (2 + K)Ψ/N", "ZeRO-3 model state = (2 + 2 + K)Ψ/N",
                 "ZeRO-3 model state = 16Ψ/N with K = 12"):
        assert text in names


def test_gi_necessity_witness_recomputed_by_hand(full):
    ob = by_key(full[1])["correctness/gi-necessary"]
    assert ob["status"] == "witness found"
    r = rows(ob)
    assert r["checker, SC"] == "all proved" and r["checker, GI"] == "refuted"
    cell = re.compile(r"\(dp=(\d+), microbatches=(\d+)\): (-?[\d/]+)")
    counts = {(int(a), int(b)): Fraction(v) for a, b, v in cell.findall(r["token counts"])}
    sums = {(int(a), int(b)): Fraction(v) for a, b, v in cell.findall(r["gradient sums"])}
    # Per-device mean loss, then the DDP all-reduce average over dp = 2: a mean of means.
    per_device = [sum(sums[d, m] for m in range(2)) / sum(counts[d, m] for m in range(2)) for d in range(2)]
    mean_of_means = sum(per_device) / 2
    global_mean = sum(sums.values()) / sum(counts.values())
    used, single = re.fullmatch(r"(\S+) \(single device: (\S+)\)", r["gradient used"]).groups()
    assert Fraction(used) == mean_of_means and Fraction(single) == global_mean
    assert mean_of_means != global_mean
    assert r["θ after, single device"] != r["θ after, updating device"]


def test_sc_necessity_witness_shows_a_stale_replica(full):
    ob = by_key(full[1])["correctness/sc-necessary"]
    assert ob["status"] == "witness found"
    r = rows(ob)
    assert r["checker, GI"] == "all proved" and r["checker, SC"] == "refuted"
    theta = Fraction(r["θ before"])
    stale = Fraction(r["θ after, replica across dp"].split()[0])
    assert stale == theta  # never re-gathered
    assert Fraction(r["θ after, single device"]) != theta


@pytest.mark.parametrize("code", [f"CR0{i}" for i in range(1, 9)])
def test_each_broken_rule_is_refuted_with_a_counterexample(full, code):
    ob = by_key(full[1])[f"composition/breaks-{code}"]
    assert ob["status"] == "witness found"
    r = rows(ob)
    assert code in r["rules the checker refutes"].split(", ")
    assert "sizes" in r and "fails" in r


def _library_names(module: str) -> list[str]:
    return re.findall(r"^strategy (\w+)", (STDLIB / f"{module}.place").read_text(), re.M)


def test_compositions_cover_the_library_pairs(full):
    obs = by_key(full[1])
    listing = rows(obs["composition/pairs-data-tensor-safe"])["compositions"].split("; ")
    data = [n for n in _library_names("data") + _library_names("offload") if n != "hybrid_shard"]
    tensor = _library_names("tensor")
    expected = {f"{d} + {t}" for d in data for t in tensor} | {f"{t} + {d}" for d in data for t in tensor}
    assert len(listing) == len(data) * len(tensor)
    assert set(listing) <= expected
    triples = rows(obs["composition/triples-data-pipeline-tensor-safe"])["compositions"].split("; ")
    assert len(triples) == len(data) * len(tensor) * len(_library_names("pipeline"))
    for key, ob in obs.items():
        if key.startswith("composition/") and not key.startswith("composition/breaks"):
            assert ob["status"] == "proved"


def test_zero_abstract_claims_exact_conditions(full):
    claims = {(c["file"], c["label"]): c for c in full[1]["claims"]}
    mem = claims[("zero-abstract.place", "ZeRO-3 uses 8x less memory than DP")]
    assert mem["holds"] == "conditional" and mem["condition"] == "dp = 8"
    assert mem["at_values"].startswith("false at dp = 64")
    # brute force from the published accounting: the ratio is N, so 8x exactly at N = 8
    for n in range(1, 65):
        ratio = Fraction(16) / (Fraction(16) / n)
        assert (ratio == 8) == (n == 8)
    for label in ("at 1.5x communication cost (ZeRO volume)", "at 1.5x communication cost (ring bytes)"):
        assert claims[("zero-abstract.place", label)]["holds"] == "always"
    # the spec file given on the command line is analysed the same way
    ex = [c for c in full[1]["claims"] if c["file"].endswith("zero_paper.place")]
    assert [c["holds"] for c in ex] == ["conditional", "always"]


def test_zeropp_condition_on_the_scheduling_unit(full):
    claim = next(c for c in full[1]["claims"] if c["file"] == "zeropp-vs-tp.place")
    assert claim["holds"] == "conditional"
    m = re.match(r"(\d+)/(\d+) < U", claim["condition"])
    threshold = Fraction(int(m.group(1)), int(m.group(2)))
    # evaluate the two plans' traffic at whole U around the threshold, without any solving
    spec = published_spec("zeropp-vs-tp")
    values = {symbol(n): sympy.Rational(v.value.numerator, v.value.denominator)
              for n, v in spec.bindings if hasattr(v, "value")}
    z = costs.derive(spec.plan("zeropp")).communication.total_bytes
    t = costs.derive(spec.plan("megatron")).communication.total_bytes
    for u in range(1, 33):
        at = {**values, symbol("U"): sympy.Integer(u)}
        assert bool(z.xreplace(at) < t.xreplace(at)) == (u > threshold), u


def test_smt2_files_are_not_stale(run_all):
    files = {f"{key}.smt2": text for key, text in run_all[1].items() if not key.startswith("claims/zero-paper")}
    committed = {str(p.relative_to(SMT2)) for p in SMT2.rglob("*.smt2")}
    assert committed == set(files), "run: placement prove --export proofs/smt2"
    for rel, text in files.items():
        old = (SMT2 / rel).read_text()
        assert old == text, f"{rel} is stale: placement prove --export proofs/smt2"


def test_smt2_file_rechecks_with_cvc5_from_the_text_alone():
    text = (SMT2 / "memory" / "zero3-k12.smt2").read_text()
    assert "(set-info :status unsat)" in text
    assert solvers.run_cvc5(text, 10).verdict is Verdict.PROVED


def test_a_wrong_formula_is_refuted_with_a_replayed_witness():
    engine_z3 = _plan_cost("zero3").memory.model_state
    ob = relation("memory/wrong", MEMORY, "wrong", "ZeRO-3 = 16Ψ/N for every K", engine_z3, 16 * psi / N, "==",
                  {"psi": POS(), "K": POS(), "N": INT(1)}, "test")
    result, _ = engine.decide(ob, 10)
    assert result.verdict is Verdict.REFUTED and not result.error
    w = dict(result.witness)
    assert Fraction(w["K"]) != 12
    k, p, n = Fraction(w["K"]), Fraction(w["psi"]), Fraction(w["N"])
    assert (4 + k) * p / n != 16 * p / n


def test_solver_disagreement_is_an_error(monkeypatch):
    def contrary(text, timeout):
        return solvers.Run("cvc5", Verdict.REFUTED, 0.0)

    monkeypatch.setattr(engine, "run_cvc5", contrary)
    code, out, err = run_cli("prove", "--only", "memory")
    assert code == 1
    assert "solvers disagree: z3 proved, cvc5 refuted" in err
    assert out.rstrip().endswith("failed")


def test_unknown_is_never_success(monkeypatch):
    def gives_up(*args, **kw):
        return solvers.Run("z3", Verdict.UNKNOWN, 0.0, reason="timeout")

    monkeypatch.setattr(engine, "run_z3", gives_up)
    monkeypatch.setattr(engine, "run_cvc5", lambda text, timeout: solvers.Run("cvc5", Verdict.UNKNOWN, 0.0, "timeout"))
    code, out, _ = run_cli("prove", "--only", "comm", "--format", "json")
    report = json.loads(out)
    assert code == 3 and report["verdict"] == "unknown"
    assert all(o["status"] == "unknown" and not o["ok"] for o in report["obligations"])


def test_false_claim_in_a_spec_fails(tmp_path):
    spec = tmp_path / "bad.place"
    spec.write_text((ROOT / "examples" / "zero_paper.place").read_text().split("assert")[0]
                    + 'claim "ZeRO-1 moves half of DP": volume(zero1) / volume(dp) == 1 / 2\n')
    code, out, _ = run_cli("prove", "--only", "none", str(spec))
    assert code == 1
    assert "holds for no values" in out


def test_cli_json_matches_the_report_shape():
    code, out, err = run_cli("prove", "--only", "claims", "--format", "json")
    report = json.loads(out)
    assert code == 0, err
    assert report["schema_version"] == 2 and report["exit_status"] == code and report["tool"] == "placement-logic" and report["command"] == "prove"
    assert {c["holds"] for c in report["claims"]} == {"conditional", "always"}
    assert all(o["smt2"] == f"proofs/smt2/{o['key']}.smt2" for o in report["obligations"])


def test_markdown_and_text_formats():
    code, out, _ = run_cli("prove", "--only", "correctness", "--format", "markdown")
    assert code == 0
    assert out.startswith("| theorem | obligation | verdict | z3 | cvc5 | time (s) |")
    assert "witness found" in out
    code, out, _ = run_cli("prove", "--only", "correctness")
    assert "GI is necessary" in out and out.rstrip().endswith("proved")


def test_input_error_exit_2(tmp_path):
    bad = tmp_path / "bad.place"
    bad.write_text("plan {")
    code, _, err = run_cli("prove", "--only", "none", str(bad))
    assert code == 2 and "[PL" in err


def test_export_to_an_unwritable_place_is_pl700(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run_cli("prove", "--only", "none", "--export", str(blocker / "sub"),
                           str(ROOT / "examples" / "zero_paper.place"))
    assert code == 2 and "[PL700]" in err
