"""Every example in README.md and docs/*.md runs as shown.

- A ```place block whose first line is ``# NAME.place`` is written to NAME.place in a
  scratch folder shared by the document's console blocks; it must parse.
- Any other ```place block must parse and resolve, unless its first line is
  ``# fragment`` (then it must parse).
- A ```console block: each ``$ placement ...`` line is run, and the lines after it
  must equal the first lines of what it prints (stdout then stderr). A block may show
  a prefix of long output. ``$`` lines for other programs are not run.
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


def _run_console(body: str) -> int:
    commands = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append([line[2:], []])
        elif commands:
            commands[-1][1].append(line)
    count = 0
    for command, expected in commands:
        argv = shlex.split(command)
        if argv[0] != "placement":
            continue
        out, err = io.StringIO(), io.StringIO()
        main(argv[1:], out=out, err=err)
        actual = (out.getvalue() + err.getvalue()).splitlines()
        assert actual[: len(expected)] == expected, f"output of `{command}` differs"
        count += 1
    return count
