"""The plain text tables (costreport.tables) against rich, the oracle: every report and a
seeded sample of tables and lines (long words, wide characters, emoji codes, markup, narrow
widths) come out byte for byte as rich's console prints them."""

from __future__ import annotations

import random
from functools import lru_cache

import pytest

from placement_logic.costreport import tables, text
from placement_logic.costreport.build import build
from placement_logic.frontend.loader import load_spec

WORDS = ["a", "bb", "= 16384*(1", "+", "32000/tp", "Max(4194304*(157", "[dim]= 2*dp[/dim]", "[bold]total on dp[/bold]",
         "Ψ", "×", "  └ transient", "averyveryverylongwordwithoutanyspacethatmustbecutshort", "", " ", "  leading",
         "trailing  ", "4.34 GB (4.05 GiB)", "\n", "😀", "日本語", "x:100:y", "[dp]", "—", "a\\[b]", "[/]", "[@click]x[/]"]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 8))).replace(" \n ", "\n")


def _items(rng: random.Random) -> list:
    items: list = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.3:
            items.append(_text(rng))
            continue
        t = tables.Table(_text(rng) or "title", show_lines=rng.random() < 0.7)
        n = rng.randint(1, 5)
        for _ in range(n):
            t.add_column(_text(rng))
        for _ in range(rng.randint(0, 5)):
            t.add_row(*(_text(rng) for _ in range(n)))
        items.append(t)
    return items


def _outcome(render, *args) -> str:
    try:
        return render(*args)
    except Exception as exc:  # rich rejects some markup: both ways must
        return f"{type(exc).__name__}"


@pytest.mark.parametrize("seed", range(4))
def test_random_tables_print_as_rich_prints_them(seed):
    rng = random.Random(seed)
    for _ in range(150):
        items, width = _items(rng), rng.choice([30, 40, 60, 80, 120, 200])
        assert _outcome(tables.render, items, width, False) == _outcome(tables._rich, items, width, False)


@lru_cache(maxsize=None)
def _report(spec: str, kwargs: tuple):
    """One report per spec and options, printed at every width (rendering does not change it)."""
    return build(load_spec(spec), latex=False, **dict(kwargs))


@pytest.mark.parametrize("spec, kwargs", [
    ("examples/llama70b_3d.place", {}),
    ("examples/mixtral_4d.place", {"device": "h100_sxm"}),
    ("examples/zero_paper.place", {"command": "compare"}),
    ("examples/library/zero3.place", {"show_groups": True}),
])
@pytest.mark.parametrize("width", [60, 120, 200])
def test_reports_print_as_rich_prints_them(spec, kwargs, width, monkeypatch):
    report = _report(spec, tuple(sorted(kwargs.items())))
    plain = text.render(report, width=width)
    monkeypatch.setattr(tables, "_plain_item", lambda item, width: (_ for _ in ()).throw(tables._NotPlain()))
    assert plain == text.render(report, width=width)
