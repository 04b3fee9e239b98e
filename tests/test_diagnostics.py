"""The catalogue of bad specs: each gives its named diagnostic, never a traceback."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest
from bad_snippets import CATALOGUE

from placement_logic.cli import main
from placement_logic.diagnostics import CODES, Code, Diagnostic, DiagnosticError, Span
from placement_logic.frontend.loader import load_string
from placement_logic.snippets import render

DOCS = Path(__file__).resolve().parent.parent / "docs" / "diagnostics.md"


@pytest.mark.parametrize("name,code,line,column,phrase,source", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_catalogue_entry(name, code, line, column, phrase, source):
    with pytest.raises(DiagnosticError) as info:
        load_string(source, "bad.place")
    first = info.value.diagnostics[0]
    assert (first.code, first.span.line, first.span.column) == (code, line, column), first.one_line()
    assert phrase in first.message


@pytest.mark.parametrize("name,code,line,column,phrase,source", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_catalogue_entry_through_the_cli(tmp_path, name, code, line, column, phrase, source):
    path = tmp_path / "bad.place"
    path.write_text(source)
    out, err = io.StringIO(), io.StringIO()
    status = main(["inspect", str(path)], out=out, err=err)
    assert status == 2
    text = err.getvalue()
    assert "Traceback" not in text
    first = text.splitlines()[0]
    assert re.fullmatch(rf"{re.escape(str(path))}:{line}:{column}: error: .+ \[{code}\]", first), first
    # the offending line is shown with a caret under the span
    assert re.search(r"^\s+\d+ \| ", text, re.M)
    assert re.search(r"^\s+\| +\^", text, re.M)


def test_catalogue_covers_at_least_25_codes():
    assert len({c[1] for c in CATALOGUE}) >= 25


def test_every_code_is_documented():
    doc = DOCS.read_text()
    for code, (name, _description) in CODES.items():
        assert f"`{code}`" in doc, f"{code} missing from docs/diagnostics.md"
        assert name in doc


def test_every_documented_code_is_catalogued():
    documented = re.findall(r"^## `(PL\d{3})`", DOCS.read_text(), re.M)
    assert sorted(set(documented) - set(CODES)) == []


def test_code_names_agree_with_the_catalogue_one_to_one():
    # every catalogued code has exactly one member, named from its short name, and no other member exists
    assert [member.value for member in Code] == list(CODES)
    for member in Code:
        assert member.name == CODES[member.value][0].upper().replace("-", "_")


def test_a_code_member_reads_as_its_string():
    code = Code.BAD_PROPERTY_VALUE
    assert code == "PL114" and str(code) == "PL114" and f"[{code}]" == "[PL114]"
    assert json.dumps({code: code}) == '{"PL114": "PL114"}'
    assert {"PL114": 1}[code] == 1
    diag = Diagnostic(code, "a message", Span.point("x.place", 1, 1))
    assert diag.one_line() == "x.place:1:1: error: a message [PL114]"
    assert diag.to_json()["name"] == "bad-property-value"


def test_the_package_names_its_codes():
    # a code is written Code.NAME, never as a "PLnnn" literal (CODES itself, in codes.py, and Code aside)
    package = DOCS.parent.parent / "placement_logic"
    literal = re.compile(r"""^(['"])PL\d{3}\1$""")
    found = []
    for path in sorted(package.rglob("*.py")):
        if path in (package / "diagnostics.py", package / "codes.py"):
            continue
        with tokenize.open(path) as f:
            for tok in tokenize.generate_tokens(f.readline):
                if tok.type == tokenize.STRING and literal.match(tok.string):
                    found.append(f"{path.relative_to(package)}:{tok.start[0]}: {tok.string}")
    assert found == []


def test_did_you_mean_suggestion():
    source = "from std.data import zero3\nmodel { params = 1e9 }\nmesh { dp = 8 }\nplan p { dp: zero2 }\n"
    with pytest.raises(DiagnosticError) as info:
        load_string(source, "x.place")
    assert info.value.diagnostics[0].notes == ("did you mean 'zero3'?",)


def test_library_hint_for_a_strategy_not_imported():
    source = "model { params = 1e9 }\nmesh { dp = 8 }\nplan p { dp: fsdp_full_shard }\n"
    with pytest.raises(DiagnosticError) as info:
        load_string(source, "x.place")
    assert "from std.data import fsdp_full_shard" in info.value.diagnostics[0].notes[0]


def test_snippet_points_at_the_span():
    source = "let x = 80 GiB + 3\n"
    d = Diagnostic("PL201", "cannot add bytes and a plain count", Span("f", 1, 9, 1, 19))
    lines = render(d, source).splitlines()
    assert lines[0] == "f:1:9: error: cannot add bytes and a plain count [PL201]"
    assert lines[1] == "   1 | let x = 80 GiB + 3"
    assert lines[2] == "     |         ^~~~~~~~~~"


@pytest.mark.parametrize("column, width", [(1, 3), (60, 5), (3000, 7), (4995, 6), (4990, 400)])
def test_a_long_line_is_shown_as_a_window_with_the_caret_under_the_span(column, width):
    # random letters: a caret one or more places off stands under a different run of text
    import random
    import string
    rng = random.Random(0)
    line = "".join(rng.choice(string.ascii_letters) for _ in range(5000))
    d = Diagnostic("PL201", "m", Span("f", 1, column, 1, min(column + width, 5001)))
    _, text, caret = render(d, line + "\n").splitlines()
    assert len(text) <= 7 + 120 + 2 and text.startswith("   1 | ")
    shown, marks = text[7:], caret[7:]
    at = marks.index("^")
    assert shown[at] == line[column - 1]  # the caret stands under the span's first character
    run = len(marks.rstrip()) - at
    assert 1 <= run <= min(width, 5001 - column) and shown[at:at + run].strip("…") == line[column - 1:column - 1 + run]
    assert shown.startswith("…") == (column > 41) and shown.endswith("…") == (column - 1 - 40 + 120 < 5000)


def test_all_errors_of_a_file_are_reported_together():
    source = ("from std.data import ddp\nmodel { params = 1e9 }\nmesh { dp = 8 }\n"
              "let a = 1 GB + 1\nlet b = sqrt(2)\n")
    with pytest.raises(DiagnosticError) as info:
        load_string(source, "x.place")
    assert [d.code for d in info.value.diagnostics] == ["PL201", "PL205"]


def test_unreadable_file(tmp_path):
    path = tmp_path / "binary.place"
    path.write_bytes(b"\xff\xfe\x00")
    err = io.StringIO()
    assert main(["inspect", str(path)], out=io.StringIO(), err=err) == 2
    assert "[PL006]" in err.getvalue()


def test_missing_file(tmp_path):
    err = io.StringIO()
    assert main(["inspect", str(tmp_path / "nope.place")], out=io.StringIO(), err=err) == 2
    assert "[PL006]" in err.getvalue()


@pytest.mark.parametrize("expression", [
    "-" * 3000 + "1",
    "1" + " + 1" * 5000,
    "2 ^ " * 500 + "1",
    "f(" * 400 + "1" + ")" * 400,
], ids=["negations", "long-sum", "power-tower", "nested-calls"])
def test_deep_nesting_is_a_diagnostic(expression):
    with pytest.raises(DiagnosticError) as info:
        load_string(f"let x = {expression}\n", "deep.place")
    assert info.value.diagnostics[0].code == "PL007"


def test_redundant_parentheses_are_not_nesting():
    spec = load_string("let x = " + "(" * 3000 + "1" + ")" * 3000 + "\n", "parens.place")
    assert spec.binding_map["x"].value == 1


def test_json_diagnostics(tmp_path):
    import json

    path = tmp_path / "bad.place"
    path.write_text("let x = 1 GB + 2\n")
    out = io.StringIO()
    assert main(["inspect", str(path), "--format", "json"], out=out, err=io.StringIO()) == 2
    data = json.loads(out.getvalue())
    d = data["diagnostics"][0]
    assert (d["code"], d["line"], d["column"], d["name"]) == ("PL201", 1, 9, "unit-mismatch")
