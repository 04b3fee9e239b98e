"""Every example in README.md and docs/*.md runs as shown.

- A ```place block whose first line is ``# NAME.place`` is written to NAME.place in a
  scratch folder shared by the document's console blocks; it must parse.
- Any other ```place block must parse and resolve, unless its first line is
  ``# fragment`` (then it must parse).
- A ```console block: each ``$ placement ...`` line is run (in the scratch folder, with
  ``$COLUMNS`` unset, so text is as wide as piped output: 120 columns), and the lines after
  it, up to the next ``$`` line, are what it prints (standard output, then standard error),
  compared exactly, whole. ``$`` lines for other programs are not run.

  Elision: a line that is exactly ``...`` stands for any number of lines (none included)
  that the document leaves out. The shown lines before the first ``...`` must be the first
  lines of the output, those after the last ``...`` its last lines, and the shown lines
  between two ``...`` must come, in that order, in between. Without a ``...`` line the
  output is shown in full (a command that prints nothing is followed by no line).

  Exit status: a trailing shell comment on the command line, ``# exit status N``, states
  it; a command without one must exit 0. (The comment is the reader's too: it is what a
  shell would ignore.)
"""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.frontend.loader import load_string
from placement_logic.frontend.parser import parse

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


def blocks(path: Path):
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text())]


def _doc_ids():
    return [str(p.relative_to(ROOT)) for p in DOCS]


@pytest.mark.parametrize("doc", DOCS, ids=_doc_ids())
def test_document_examples(doc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    # Examples may refer to the shipped examples/ folder.
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    ran = 0
    for lang, body in blocks(doc):
        if lang == "place":
            first = body.splitlines()[0] if body.strip() else ""
            m = re.fullmatch(r"#\s*([\w./-]+\.place)\s*", first)
            if m:
                (tmp_path / m.group(1)).write_text(body)
                parse(body, m.group(1))
            elif first.strip() == "# fragment":
                parse(body, "<fragment>")
            else:
                load_string(body, "<doc>", tmp_path)
            ran += 1
        elif lang == "console":
            ran += _run_console(body)
    runnable = [b for b in blocks(doc) if b[0] in ("place", "console")]
    assert ran or not runnable, f"{doc} has examples but none ran"


ELIDED = "..."
EXIT = re.compile(r"#\s*exit status (\d+)\s*$")


def _run_console(body: str) -> int:
    commands = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append([line[2:], []])
        elif commands:
            commands[-1][1].append(line)
    count = 0
    for command, expected in commands:
        stated = EXIT.search(command)
        argv = shlex.split(command, comments=True)
        if not argv or argv[0] != "placement":
            continue
        out, err = io.StringIO(), io.StringIO()
        status = main(argv[1:], out=out, err=err)
        actual = (out.getvalue() + err.getvalue()).splitlines()
        problem = shown_output_differs(expected, actual)
        assert problem is None, f"output of `{command}` differs: {problem}"
        want = int(stated.group(1)) if stated else 0
        assert status == want, f"`{command}` exits {status}, the document says {want}"
        count += 1
    return count


def shown_output_differs(expected: list[str], actual: list[str]) -> str | None:
    """None when ``actual`` is what ``expected`` shows (``...`` lines eliding any lines),
    otherwise a description of the first difference."""
    parts: list[list[str]] = [[]]
    for line in expected:
        if line == ELIDED:
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) == 1:
        if actual == expected:
            return None
        at = next((i for i, (e, a) in enumerate(zip(expected, actual)) if e != a), min(len(expected), len(actual)))
        return (f"line {at + 1}: shown {expected[at]!r}" if at < len(expected) else f"line {at + 1}: nothing shown") \
            + (f", printed {actual[at]!r}" if at < len(actual) else ", nothing printed") \
            + f" ({len(expected)} lines shown, {len(actual)} printed; end a partial output with '...')"
    head, *middle, tail = parts
    if actual[:len(head)] != head:
        return f"the first {len(head)} lines shown are not the first lines printed: {actual[:len(head)]!r}"
    if len(head) + len(tail) > len(actual) or (tail and actual[len(actual) - len(tail):] != tail):
        return f"the last {len(tail)} lines shown are not the last lines printed: {actual[-len(tail):]!r}"
    at, end = len(head), len(actual) - len(tail)
    for part in middle:
        found = next((i for i in range(at, end - len(part) + 1) if actual[i:i + len(part)] == part), None)
        if found is None:
            return f"the lines shown between '...' are not printed there, in order: {part!r}"
        at = found + len(part)
    return None


@pytest.mark.parametrize("expected, actual, ok", [
    (["a", "b"], ["a", "b"], True),
    (["a"], ["a", "b"], False),  # a prefix is not the whole output
    (["a", "b", "c"], ["a", "b"], False),
    ([], [], True),
    ([], ["a"], False),
    (["a", "..."], ["a", "b", "c"], True),
    (["a", "..."], ["a"], True),
    (["...", "c"], ["a", "b", "c"], True),
    (["a", "...", "c"], ["a", "c"], True),
    (["a", "...", "c"], ["a", "b"], False),
    (["a", "...", "b", "...", "d"], ["a", "x", "b", "y", "d"], True),
    (["a", "...", "y", "...", "d"], ["a", "x", "b", "y", "d"], True),
    (["a", "...", "y", "...", "b"], ["a", "x", "b", "y", "d"], False),
    (["a", "...", "a"], ["a"], False),  # the head and the tail do not share a line
])
def test_elision_convention(expected, actual, ok):
    assert (shown_output_differs(expected, actual) is None) == ok


def test_the_exit_status_comment_is_read_and_not_passed_on():
    command = "placement check twice.place --format json  # exit status 1"
    assert EXIT.search(command).group(1) == "1"
    assert shlex.split(command, comments=True) == ["placement", "check", "twice.place", "--format", "json"]
