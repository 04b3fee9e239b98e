"""Property tests: formatting round-trips, and no input makes the front end crash."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from hypothesis.extra.lark import from_lark
from strategies import modules
from tiers import examples

from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_module
from placement_logic.frontend.loader import load_string
from placement_logic.frontend.parser import build_parser, parse


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(modules)
def test_parse_of_format_is_identity(module):
    text = format_module(module)
    assert parse(text, "<generated>") == module


@settings(max_examples=examples(200), deadline=None)
@given(modules)
def test_formatting_is_idempotent(module):
    once = format_module(module)
    assert format_module(parse(once), once) == once


def _front_end(text: str) -> None:
    try:
        load_string(text, "<fuzz>")
    except DiagnosticError as exc:
        assert exc.diagnostics, "a DiagnosticError always carries a diagnostic"
        for d in exc.diagnostics:
            assert d.code.startswith("PL") and d.span.line >= 1 and d.span.column >= 1


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(from_lark(build_parser(cache=False), start="start"))
def test_grammar_driven_fuzzing_never_crashes(text):
    _front_end(text)


@settings(max_examples=examples(300), deadline=None)
@given(hs.binary(max_size=200))
def test_random_bytes_never_crash(data):
    _front_end(data.decode("utf-8", errors="replace"))


@settings(max_examples=examples(300), deadline=None)
@given(hs.text(alphabet=hs.sampled_from(list("{}()[]:=,.*@#\"-+/^<> \n\tabSRMO0123456789eGiB")), max_size=120))
def test_token_soup_never_crashes(text):
    _front_end(text)


@settings(max_examples=examples(100), deadline=None)
@given(modules)
def test_generated_trees_resolve_or_diagnose(module):
    _front_end(format_module(module))
