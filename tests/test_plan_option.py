"""``--plan`` is one option on every command that reports plans: cost, compare, check, inspect."""

from __future__ import annotations

import io
import json

from placement_logic.cli import main

SPEC = "examples/zero_paper.place"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def plans_of(*argv) -> list[str]:
    code, out, err = run(*argv, "--format", "json")
    assert code in (0, 1), err
    return [p["plan"] for p in json.loads(out)["plans"]]


def test_every_plan_reporting_command_takes_repeated_plans():
    for command in ("cost", "compare", "inspect"):
        assert plans_of(command, SPEC, "--plan", "zero1", "--plan", "zero3") == ["zero1", "zero3"], command
        assert plans_of(command, SPEC) == ["dp", "zero1", "zero2", "zero3"], command


def test_compare_takes_ratios_to_a_baseline_it_does_not_show():
    code, out, err = run("compare", SPEC, "--plan", "zero3", "--baseline", "dp", "--format", "json")
    doc = json.loads(out)
    assert [p["plan"] for p in doc["plans"]] == ["zero3"] and doc["baseline"] == "dp"
    # ZeRO-3 holds 1/dp of every state: 1/64 of dp's memory at dp = 64
    ratio = doc["plans"][0]["ratios"]["memory.total"]
    assert ratio["exact"] == "1/64" and ratio["formula"] == "1/dp", ratio


def test_an_unknown_plan_is_pl302_with_a_suggestion():
    for command in ("cost", "compare", "inspect"):
        code, out, err = run(command, SPEC, "--plan", "zer3")
        assert code == 2 and "PL302" in err and "did you mean 'zero3'" in err, (command, err)


def test_inspect_text_shows_only_the_named_plan():
    code, out, err = run("inspect", SPEC, "--plan", "zero2")
    assert code == 0 and "plan zero2" in out and "plan zero1" not in out and "plan dp " not in out


def test_inspect_markdown_holds_every_mode_json_holds():
    """Each state's row of the Markdown table reads as the JSON's modes, axis by axis."""
    for spec in (SPEC, "examples/llama70b_3d.place", "examples/safe/hybrid_shard.place"):
        code, md, err = run("inspect", spec, "--format", "markdown")
        assert code == 0, err
        doc = json.loads(run("inspect", spec, "--format", "json")[1])
        for p in doc["plans"]:
            section = md.split(f"## Plan `{p['plan']}`", 1)[1].split("\n## ", 1)[0]
            axes = [a["axis"] for a in p["mesh"]]
            assert "| | " + " | ".join(f"`{a}`" for a in axes) + " | |" in section
            for pl in p["placements"]:
                row = next(line for line in section.splitlines() if line.startswith(f"| {pl['state']} |"))
                cells = [c.strip() for c in row.strip("|").split("|")]
                assert cells[1:1 + len(axes)] == [pl["modes"][a] for a in axes], (spec, p["plan"], row)
