"""``--set NAME=VALUE`` on ``inspect`` and ``measure``: the one parser ``cost`` and ``check`` use
(``commands.options``), one value per name, the re-bound spec shown or realised."""

from __future__ import annotations

import io
import json

import pytest

from placement_logic.cli import main

DDP = "examples/library/ddp.place"
ZERO = "examples/zero_paper.place"
TWO_AXES = "examples/llama70b_3d.place"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def caret_under(err: str, option: str) -> tuple[int, int]:
    """The columns of the caret line under the quoted option (start, width)."""
    lines = err.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith("| " + option))
    marks = lines[at + 1].split("| ", 1)[1]
    start = len(marks) - len(marks.lstrip())
    return start, len(marks.strip())


# --------------------------------------------------------------------------- inspect


def test_inspect_shows_a_re_bound_axis_size_everywhere():
    code, out, err = run("inspect", DDP, "--set", "dp=4", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bindings"]["dp"] == {"value": 4, "exact": "4", "formula": "4", "set": True}
    assert [a["size"] for a in doc["plans"][0]["mesh"]] == ["4"]
    code, text, _ = run("inspect", DDP, "--set", "dp=4")
    assert "symbols: dp = 4 (--set)" in text and "  size         4" in text
    code, md, _ = run("inspect", DDP, "--set", "dp=4", "--format", "markdown")
    assert "`dp = 4` (--set)" in md and "| size | 4 |" in md


def test_inspect_re_binds_a_let_and_what_is_derived_from_it():
    code, out, err = run("inspect", ZERO, "--set", "psi=70e9", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bindings"]["psi"]["value"] == 70 * 10**9 and doc["bindings"]["psi"]["set"]
    assert not doc["bindings"]["dp"]["set"] and doc["bindings"]["dp"]["value"] == 64
    assert doc["model"]["params_count"] == "70,000,000,000"
    plain = json.loads(run("inspect", ZERO, "--format", "json")[1])
    assert plain["model"]["params_count"] == "7,500,000,000" and not plain["bindings"]["psi"]["set"]


def test_inspect_re_binds_lets_that_axis_sizes_and_later_lets_refer_to(tmp_path):
    spec = tmp_path / "s.place"
    spec.write_text("from std.data import ddp\nlet n = 8\nlet m = n * 2\nmodel {\n  params = 1e9\n}\n"
                    "mesh {\n  dp = n\n}\nplan p {\n  dp: ddp\n}\n")
    code, out, err = run("inspect", str(spec), "--set", "n=3", "--format", "json")
    assert code == 0, err
    b = json.loads(out)["bindings"]
    assert (b["n"]["value"], b["m"]["value"], b["dp"]["value"]) == (3, 6, 3)
    assert b["n"]["set"] and not b["m"]["set"] and b["dp"]["formula"] == "n"


@pytest.mark.parametrize("item, phrase, caret", [
    ("dq=4", "not a let or an axis", (0, len("--set dq=4"))),
    ("dp=2.5", "positive integer", (0, len("--set dp=2.5"))),
    ("dp", "NAME=NUMBER", (0, len("--set dp"))),
    ("psi=abc", "not an exact number", (0, len("--set psi=abc"))),
    ("psi=__x__", "'__x__' is not an exact number", (0, len("--set psi=__x__"))),  # quoted as written
    ("dp=4,8", "one value per name", (len("--set dp="), 3)),
    ("dp=1..4", "one value per name", (len("--set dp="), 4)),
])
def test_a_bad_set_on_inspect_is_pl301_under_the_option(item, phrase, caret):
    code, out, err = run("inspect", ZERO, "--set", item)
    assert code == 2 and out == "" and "[PL301]" in err and phrase in err and "Traceback" not in err, err
    assert "<command line>" not in err.splitlines()[0]
    assert caret_under(err, f"--set {item}") == caret, err


# --------------------------------------------------------------------------- measure


@pytest.fixture
def launches(monkeypatch):
    """Measure without launching ranks: each launch is recorded (world size, each job's axis
    sizes and tiny shape) and fails, so the report still names the mesh it would have run."""
    pytest.importorskip("torch")
    from placement_logic.measure import session
    from placement_logic.measure.runner import LaunchError

    seen = []
    real = session.measure_many

    def recorded(items, devices=None, steps=3, launcher=None, with_checker=True, progress=None, pinned=None):
        def launcher(jobs, world):
            seen.append((world, [dict(j.realisation.sizes) for j in jobs]))
            raise LaunchError("not launched in this test")
        return real(items, devices, steps, launcher, with_checker, progress, pinned)

    monkeypatch.setattr(session, "measure_many", recorded)
    return seen


def test_measure_realises_a_re_bound_axis_size(launches):
    code, out, err = run("measure", DDP, "--plan", "ddp", "--set", "dp=4", "--no-check", "--format", "json")
    assert code == 1 and err == "", err  # the launch is refused in this test: failed
    assert json.loads(out)["plans"][0]["mesh"] == {"dp": 4}
    assert launches == [(4, [{"dp": 4}])]


def test_measure_pins_one_axis_of_several_and_keeps_two_on_the_others(launches):
    from placement_logic.frontend.loader import load_spec

    plan = load_spec(TWO_AXES).plans[0]
    first, *rest = plan.mesh.names
    code, out, err = run("measure", TWO_AXES, "--plan", plan.name, "--set", f"{first}=4", "--no-check",
                         "--format", "json")
    assert code in (1, 4), err
    mesh = json.loads(out)["plans"][0]["mesh"]
    assert mesh == {first: 4, **{a: 2 for a in rest}}, mesh


def test_measure_re_binds_a_let_of_the_spec(monkeypatch):
    """The re-bound spec (not the file's) reaches the measurement."""
    from placement_logic.measure import session

    got = []
    monkeypatch.setattr(session, "measure_many", lambda items, *a, **k: got.extend(items) or [])
    code, _, err = run("measure", ZERO, "--plan", "dp", "--set", "psi=1e6", "--set", "dp=4", "--no-check")
    spec, name = got[0]
    assert name == "dp" and dict(spec.bindings)["psi"].value == 10**6 and dict(spec.bindings)["dp"].value == 4
    assert spec.plan("dp").mesh.axis("dp").size.value == 4


def test_mesh_sizes_take_the_pinned_sizes():
    from placement_logic.diagnostics import DiagnosticError
    from placement_logic.frontend.loader import load_spec
    from placement_logic.measure.session import mesh_sizes

    ddp = load_spec(DDP).plan("ddp")
    assert mesh_sizes(ddp, None, {"dp": 4}) == {"dp": 4} and mesh_sizes(ddp, 4, {"dp": 4}) == {"dp": 4}
    assert mesh_sizes(ddp, None) == {"dp": 2}
    with pytest.raises(DiagnosticError) as e:
        mesh_sizes(ddp, 8, {"dp": 4})
    assert e.value.diagnostics[0].code == "PL602" and "disagree" in e.value.diagnostics[0].message
    plan = load_spec(TWO_AXES).plans[0]
    first = plan.mesh.names[0]
    want = 4 * 2 ** (len(plan.mesh.names) - 1)
    assert mesh_sizes(plan, want, {first: 4})[first] == 4
    with pytest.raises(DiagnosticError) as e:
        mesh_sizes(plan, want * 2, {first: 4})
    assert e.value.diagnostics[0].code == "PL602" and f"needs {want}" in e.value.diagnostics[0].message


@pytest.mark.parametrize("items, phrase", [
    (["dp=1"], "2 to 64"),
    (["dp=65"], "2 to 64"),
    (["dp=2,4"], "one value per name"),
    (["dp=2..4"], "one value per name"),
    (["dq=2"], "not a let or an axis"),
])
def test_a_bad_set_on_measure_is_pl301_before_any_process(items, phrase):
    argv = ["measure", DDP, "--plan", "ddp", "--no-check"]
    for item in items:
        argv += ["--set", item]
    code, out, err = run(*argv)
    assert code == 2 and out == "" and "[PL301]" in err and phrase in err, err


def test_measure_refuses_more_processes_than_one_machine_runs():
    from placement_logic.frontend.loader import load_spec

    plan = load_spec(TWO_AXES).plans[0]
    first = plan.mesh.names[0]
    code, out, err = run("measure", TWO_AXES, "--plan", plan.name, "--set", f"{first}=64", "--no-check")
    assert code == 2 and "[PL301]" in err and "at most 64" in err, err


@pytest.mark.slow
@pytest.mark.torch
def test_measure_runs_ddp_at_a_re_bound_size():
    pytest.importorskip("torch")
    code, out, err = run("measure", DDP, "--plan", "ddp", "--set", "dp=3", "--steps", "2", "--no-check",
                         "--format", "json")
    plan = json.loads(out)["plans"][0]
    assert plan["mesh"] == {"dp": 3} and plan["devices"] == 3, plan
    assert code == 0 and plan["outcome"] == "matched", (err, plan)
