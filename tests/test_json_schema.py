"""Every command's JSON output against its schema in docs/schema/, and the envelope they share.

The schemas are validated with ``tests/jsonschema_lite.py`` (the subset of JSON Schema they
use) and, when the ``jsonschema`` package is installed (the ``test`` extra), with it too."""

import importlib.util
import io
import json
from pathlib import Path

import pytest

from placement_logic.cli import main
from tests.jsonschema_lite import check_schema, errors

SCHEMAS = Path("docs/schema")
EXAMPLES = sorted(str(p) for p in Path("examples").rglob("*.place"))
HEAD = ["schema_version", "tool", "command", "exit_status"]
PLAN_COMMANDS = ("inspect", "cost", "compare", "check", "measure")


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def validate(doc: dict, name: str) -> None:
    s = schema(name)
    found = errors(doc, s)
    assert not found, "\n".join(found[:20])
    if importlib.util.find_spec("jsonschema") is not None:
        import jsonschema

        jsonschema.Draft202012Validator(s).validate(doc)


def json_of(name: str, *argv) -> dict:
    code, out, err = run(*argv, "--format", "json")
    doc = json.loads(out)
    assert list(doc)[:4] == HEAD, list(doc)[:4]
    assert doc["exit_status"] == code and doc["command"] == argv[0], err
    validate(doc, "diagnostics" if code == 2 else name)
    if "plans" in doc:
        assert isinstance(doc["plans"], list) and all(isinstance(p["plan"], str) for p in doc["plans"])
    return doc


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.schema.json")), ids=lambda p: p.stem)
def test_schemas_are_well_formed(path):
    s = json.loads(path.read_text())
    check_schema(s)
    assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema" and s["title"] and s["description"]
    if importlib.util.find_spec("jsonschema") is not None:
        import jsonschema

        jsonschema.Draft202012Validator.check_schema(s)


def test_every_schema_is_documented():
    text = Path("docs/json.md").read_text()
    for path in SCHEMAS.glob("*.schema.json"):
        assert f"docs/schema/{path.name}" in text


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).stem)
def test_inspect_cost_and_compare_of_every_example(path):
    json_of("inspect", "inspect", path)
    for command in ("cost", "compare"):
        doc = json_of("cost", command, path)
        assert [p["plan"] for p in doc["plans"]] == [p["plan"] for p in json_of("inspect", "inspect", path)["plans"]]
        assert ("baseline" in doc) == (command == "compare")
        assert all(("ratios" in p) == (command == "compare") for p in doc["plans"])


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "/bugs/" in p][:6] + ["examples/zero_paper.place",
                                                                              "examples/library/hybrid_shard.place"])
def test_check(path):
    doc = json_of("check", "check", path)
    assert doc["verdict"] in ("proved", "refuted", "unknown")


def test_check_with_pinned_sizes_and_a_counterexample():
    doc = json_of("check", "check", "examples/bugs/zero1_no_regather.place", "--set", "dp=2")
    assert doc["pinned"] == {"dp": 2}
    assert any(o["counterexample"] for p in doc["plans"] for o in p["obligations"])


def test_prove_claims():
    doc = json_of("prove", "prove", "--only", "none", "examples/zero_paper.place", "--timeout", "20")
    assert {c["holds"] for c in doc["claims"]} == {"conditional", "always"}


def test_measure():
    pytest.importorskip("torch")
    doc = json_of("measure", "measure", "examples/library/zero3.place", "--plan", "zero3", "--devices", "2",
                  "--steps", "1", "--no-check")
    assert doc["file"] == "examples/library/zero3.place" and doc["plans"][0]["plan"] == "zero3"


@pytest.mark.parametrize("command", ["inspect", "cost", "compare", "check", "prove", "measure"])
def test_input_errors_in_every_command(command, tmp_path):
    bad = tmp_path / "bad.place"
    bad.write_text("plan p {\n")
    argv = [command, str(bad)] + (["--plan", "p"] if command == "measure" else [])
    doc = json_of("diagnostics", *argv)
    assert doc["exit_status"] == 2 and doc["diagnostics"][0]["code"].startswith("PL")


def test_sweeps_of_cost_and_compare():
    for command in ("cost", "compare"):
        doc = json_of("sweep", command, "examples/zero_paper.place", "--set", "dp=8,16")
        # one row per configuration and plan, each with every question's verdict
        assert doc["summary"]["rows"] == len(doc["rows"]) == 2 * len(doc["plans"])
        assert all(len(r["verdicts"]) == len(doc["questions"]) for r in doc["rows"])
        assert doc["exit_status"] == (1 if doc["summary"]["asserts_failed"] else 0)


def test_search():
    pytest.importorskip("numpy")
    doc = json_of("search", "search", "examples/models/llama3_8b.place", "--device", "h100_sxm", "--devices", "8",
                  "--global-batch", "64", "--seq", "2048", "--top", "3", "--no-check")
    assert doc["file"] == "examples/models/llama3_8b.place" and doc["exit_status"] == 0
    assert 0 < len(doc["ranked"]) <= 3 and doc["fitting"] <= doc["valid"] <= doc["candidates"]

