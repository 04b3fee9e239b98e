"""Ties across pipeline stages and replicas seeded apart, lifted as what they are (``tied_embeddings`` with
``override embedding: tie_reduce``; ``override params: no_init_broadcast``) so the checker decides, and
``DTensor.from_local``'s asserted placements and dropout masks compared between the ranks (a false
Replicate: the region's ``assert_replicate``; masks that differ in a replicated region: ``dropout_seed: vary``).

The fast tests edit the stored DDP trace by hand (each edit an independent statement of what a script did); the
slow ones run the scripts of examples/traced/ on gloo and require each verdict at its script line.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from golden import check_golden

from placement_logic.cli import main
from placement_logic.trace.lift import lift

ROOT = Path(__file__).resolve().parent.parent
STORED = ROOT / "tests" / "data" / "traces" / "ddp_summed.json"
GOLDEN = ROOT / "tests" / "golden" / "traced"
FRAME = {"file": "examples/traced/ddp_summed.py", "line": 7, "function": "<module>", "code": "x"}


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


def _check(text: str, tmp_path) -> tuple[int, str]:
    spec = tmp_path / "lifted.place"
    spec.write_text(text)
    status, out, _ = run(["check", str(spec)])
    return status, out


def _seeded(seeds: list[str] | None, apart: bool) -> dict:
    """The stored DDP trace with each rank's torch.manual_seed call (``seeds``) and, where ``apart``, rank 1's
    weights different from rank 0's before the first update (nothing broadcast them)."""
    trace = json.loads(STORED.read_text())
    for part, seed in zip(trace["ranks"], seeds or [None, None]):
        part["seeds"] = [{"seed": seed, "step": -1, "stack": [FRAME]}] if seed is not None else []
    if apart:
        first = min(st["step"] for st in trace["ranks"][1]["steps"])
        for st in trace["ranks"][1]["steps"]:
            if st["step"] == first:
                for p in st["optimizer"]["params"]:
                    p["checksum"] = "apart-" + p["checksum"]
    return trace


def test_replicas_seeded_apart_are_lifted_as_no_init_broadcast_and_refuted(tmp_path):
    lifted = lift(_seeded(["0", "1"], apart=True))
    assert not [u for u in lifted.unliftable if u.what == "per-rank RNG seeding"], lifted.unliftable
    line = next(x for x in lifted.text.splitlines() if "no_init_broadcast" in x)
    assert line.startswith("  override params: no_init_broadcast over (dp)  # observed: ")
    assert line.endswith("examples/traced/ddp_summed.py:7")  # the seed line
    status, out = _check(lifted.text, tmp_path)
    assert status == 1 and "refuted SC params initial" in out, out


def test_replicas_apart_without_a_seed_are_lifted_at_the_first_update():
    lifted = lift(_seeded(None, apart=True))
    line = next(x for x in lifted.text.splitlines() if "no_init_broadcast" in x)
    assert "no broadcast observed" in line and "ddp_summed.py:7" not in line


@pytest.mark.parametrize("seeds,named", [(["0", "1"], True), (["3", "3"], False)])
def test_replicas_that_start_equal_lift_no_init_override(seeds, named):
    """Seeds apart but the weights equal before the first update (broadcast): what else each rank drew from its
    seed is not read, so the seeding stays named; one seed on every rank is nothing to lift."""
    lifted = lift(_seeded(seeds, apart=False))
    assert "no_init_broadcast" not in lifted.text
    assert any(u.what == "per-rank RNG seeding" for u in lifted.unliftable) == named


MODEL = "from std.pipeline import gpipe\n\nmodel {{\n  params = 1000\n{extra}}}\nmesh {{\n  pp = 2\n}}\nplan p {{\n  pp: gpipe\n{override}}}\n"


@pytest.mark.parametrize("extra,override,status,expect", [
    ("  tied_embeddings = true\n", "", 0, "proved CR08"),
    ("  tied_embeddings = true\n", "  override embedding: tie_reduce over ()\n", 1, "refuted CR08"),
    ("", "  override embedding: tie_reduce over ()\n", 2, "[PL506]"),  # nothing tied
    ("  tied_embeddings = 3\n", "", 2, "[PL114]"),
    ("  tied_embeddings = true\n  transformer {\n    hidden = 8\n    layers = 2\n    heads = 2\n    vocab = 16\n  }\n",
     "", 2, "[PL119]"),  # with a shape: in its transformer section
])
def test_a_model_without_a_shape_states_its_tie(extra, override, status, expect, tmp_path):
    """`tied_embeddings` beside `params`: the embedding class has the tied pair of the first and last stage."""
    spec = tmp_path / "t.place"
    spec.write_text(MODEL.format(extra=extra, override=override))
    got, out, err = run(["check", str(spec)])
    assert got == status and expect in out + err, out + err


def _from_local(placement: str, values_differ: bool, module: str = "fc2") -> dict:
    """The stored trace as hand-written tensor parallelism (test_trace_facts: equal inputs, weights sliced) with
    one DTensor.from_local call per rank asserting ``placement`` over both ranks, its local values different on
    the two ranks or not."""
    from test_trace_facts import _tensor_parallel

    trace = _tensor_parallel(json.loads(STORED.read_text()))
    step = max(st["step"] for st in trace["ranks"][0]["steps"])
    for part in trace["ranks"]:
        part["asserted"] = [{"placements": [placement], "groups": [[0, 1]], "phase": "forward", "step": step,
                             "module": module, "stack": [FRAME],
                             "checksum": f"local-{part['rank'] if values_differ else 0}"}]
    return trace


def test_replicate_asserted_for_values_that_differ_is_the_regions_assertion(tmp_path):
    """A row-parallel layer's partial sums declared Replicate: `assert_replicate over (tp)` at the call, refuted."""
    lifted = lift(_from_local("R", values_differ=True))
    line = next(x for x in lifted.text.splitlines() if "assert_replicate" in x)
    assert line.startswith("  override activations[mlp]: assert_replicate over (tp)  # observed: ")
    assert line.endswith("examples/traced/ddp_summed.py:7")
    assert not [u for u in lifted.unliftable if u.what.startswith("DTensor")]
    status, out = _check(lifted.text, tmp_path)
    assert status == 1 and "refuted GI activations[mlp]" in out, out


@pytest.mark.parametrize("placement,differ,module,what", [
    ("R", False, "fc2", "DTensor.from_local"),  # not contradicted: still asserted, not derived
    ("P(sum)", True, "fc2", "DTensor.from_local"),  # checksums cannot confirm a Partial
    ("P(sum)", False, "fc2", "DTensor.from_local"),  # equal values asserted Partial: summed again
    ("R", True, "proj", "DTensor.from_local asserting Replicate"),  # in no region
])
def test_other_assertions_are_named_never_proved(placement, differ, module, what):
    lifted = lift(_from_local(placement, differ, module))
    named = [u for u in lifted.unliftable if u.what.startswith("DTensor")]
    assert [u.what for u in named] == [what] and named[0].where == "examples/traced/ddp_summed.py:7", named
    assert "assert_replicate" not in lifted.text and f'unobserved "{what}' in lifted.text


def _dropout(inputs_equal: bool, masks_equal: bool, seeds=("0", "0")) -> dict:
    """The hand-written tensor-parallel trace with one dropout per rank in the first step: its input checksum equal
    on the two tensor ranks or not (a replicated or a split region), its output equal or not (the same mask or
    not); each rank's torch.manual_seed call ``seeds``."""
    from test_trace_facts import _tensor_parallel

    trace = _tensor_parallel(json.loads(STORED.read_text()))
    first = min(st["step"] for st in trace["ranks"][0]["steps"])
    for part, seed in zip(trace["ranks"], seeds):
        r = part["rank"]
        part["seeds"] = [{"seed": seed, "step": -1, "stack": [FRAME]}]
        part["dropouts"] = [{"p": 0.5, "step": first, "module": "drop", "stack": [FRAME],
                             "input": "in-0" if inputs_equal else f"in-{r}",
                             "output": "out-0" if masks_equal else f"out-{r}"}]
    return trace


@pytest.mark.parametrize("inputs_equal,masks_equal,seeds,line,named", [
    (True, True, ("0", "0"), None, None),  # the same mask on a replicated input: the derivation
    (True, False, ("0", "1"), "  override dropout_seed: vary over (tp)", None),  # seeded apart
    (False, False, ("0", "0"), None, "a dropout in a region split over tp"),  # masks there not read
])
def test_dropout_masks_are_compared_between_the_tensor_ranks(inputs_equal, masks_equal, seeds, line, named, tmp_path):
    lifted = lift(_dropout(inputs_equal, masks_equal, seeds))
    got = [x.split("  #")[0] for x in lifted.text.splitlines() if "dropout_seed" in x]
    assert got == ([line] if line else [])
    assert [u.what for u in lifted.unliftable if "dropout" in u.what or "seed" in u.what] == \
        ([named] if named else [])
    if line:
        assert lifted.text.split(line)[1].splitlines()[0].endswith("examples/traced/ddp_summed.py:7")
        status, out = _check(lifted.text, tmp_path)
        assert status == 1 and "refuted SC dropout_seed" in out, out


# --------------------------------------------------------------------------- slow: the examples

LIFTED = [
    # script, exit status, the lifted line, (the refuted obligation, the text of its script line)
    ("pipeline_tied.py", 0, "  tied_embeddings = true  # observed: ", None),
    ("pipeline_tied_unsummed.py", 1, "  override embedding: tie_reduce over ()",
     ("GI grads[embedding] over pp", "    opt.step()")),
    ("manual_seed_per_rank.py", 1, "  override params: no_init_broadcast over (dp)",
     ("SC params initial", "torch.manual_seed(rank)")),
    ("tp_dropout.py", 0, "  tp: megatron_tp", None),
    ("tp_dropout.py --seed-per-rank", 1, "  override dropout_seed: vary over (tp)",
     ("SC dropout_seed", "return self.drop(")),
    ("tp_from_local.py --replicate", 1, "  override activations[mlp]: assert_replicate over (tp)",
     ("GI activations[mlp]", "out = DTensor.from_local(")),
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,status,lifted,refuted", LIFTED, ids=[x[0] for x in LIFTED])
def test_ties_and_seeds_are_lifted_and_decided(script, status, lifted, refuted, tmp_path, monkeypatch):
    """The tie summed across the stages proved; never summed refuted at the step that updates the copies; the
    replicas seeded apart refuted at the seed line. Nothing named unlifted (no PL614)."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    script, *argv = script.split()
    got, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                         "python", f"examples/traced/{script}", *argv])
    assert got == status and "[PL614]" not in err, out + err
    assert lifted in spec.read_text()
    if refuted is None:
        assert "proved for all mesh sizes" in out
        assert "tie_reduce" not in spec.read_text() and "dropout_seed" not in spec.read_text()
        check_golden(GOLDEN / script.replace(".py", ".place"), spec.read_text())
    else:
        obligation, text = refuted
        line = _line(script, text)
        assert f"1 finding in examples/traced/{script}:" in out, out
        assert f"examples/traced/{script}:{line}: refuted {obligation}: " in out, out
