"""``parser.parse_pieces``: a text's top-level pieces parsed once each and joined give the module
the whole text's parse gives (the oracle: ``parse``), spans included, for the specs a search
writes and for every example; a split that falls inside a block, or a text that does not parse,
gives ``parse``'s module or diagnostic."""

from __future__ import annotations

from pathlib import Path

import pytest

from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.parser import parse, parse_pieces

ROOT = Path(__file__).resolve().parent.parent


def _spans(module) -> list:
    """Every span in the module's items (dataclass equality leaves none out, but say so)."""
    out = []

    def walk(x):
        if hasattr(x, "line") and hasattr(x, "end_column"):
            out.append((x.line, x.column, x.end_line, x.end_column))
        elif hasattr(x, "__dataclass_fields__"):
            for f in x.__dataclass_fields__:
                walk(getattr(x, f))
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
    walk(module.items)
    return out


@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.place")), ids=lambda p: p.name)
def test_every_example_parses_alike_whole_and_in_pieces(path):
    text = path.read_text(encoding="utf-8")
    try:
        whole = parse(text, str(path))
    except DiagnosticError:
        pytest.skip("an example that does not parse (a diagnostics example)")
    pieces = parse_pieces(text, str(path))
    assert pieces == whole
    assert _spans(pieces) == _spans(whole)


def test_the_specs_a_search_writes_parse_alike_whole_and_in_pieces():
    search = pytest.importorskip("placement_logic.search")
    from placement_logic.search.space import Structure

    block, _, _ = search.model_text(str(ROOT / "examples" / "models" / "llama3_8b.place"), 4096)
    texts = set()
    for strategy, recompute, optimizer in (("ddp", "none", "adamw"), ("zero1", "selective", "muon"),
                                           ("hsdp", "full", "adamw"), ("offload", "none", "adamw")):
        for axes in ((), ("tp",), ("pp",), ("tp", "pp"), ("tp", "pp", "cp")):
            for schedule in (("1f1b", "interleaved") if "pp" in axes else (None,)):
                s = Structure(strategy=strategy, recompute=recompute, schedule=schedule, axes=("dp", *axes),
                              optimizer=optimizer)
                texts.add(search.spec_text(block, s, {}, "h100_sxm", None))
    assert len(texts) > 20
    for text in sorted(texts):
        whole = parse(text, "<search>")
        first, again = parse_pieces(text, "<search>"), parse_pieces(text, "<search>")  # parsed, then from the table
        assert first == whole == again
        assert _spans(first) == _spans(whole) and len(_spans(whole)) > 30


def test_a_split_inside_a_block_gives_the_whole_parse():
    # "model" at the first column of a line inside an expression: the first piece does not parse alone
    text = "let a = max(1,\nmodel)\nmesh {\n  dp = 2\n}\n"
    assert parse_pieces(text) == parse(text)


def test_a_text_that_does_not_parse_gives_parses_diagnostic():
    text = "from std.data import ddp\n\nmesh {\n  dp = 2 @\n}\nplan p {\n  dp: ddp\n}\n"
    with pytest.raises(DiagnosticError) as whole:
        parse(text, "x.place")
    with pytest.raises(DiagnosticError) as pieces:
        parse_pieces(text, "x.place")
    assert [str(d) for d in pieces.value.diagnostics] == [str(d) for d in whole.value.diagnostics]
