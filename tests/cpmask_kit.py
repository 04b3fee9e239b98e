"""What the tests of the attention masks under context parallelism (tests/test_check_cpwindow.py: the sliding
window; tests/test_check_cpchunk.py: the chunks) share: the plan they vary, the obligation they read, the sweep
of the exact decision against the ring simulator (tests/simulator_cpwindow.py) and the format round trip."""

from __future__ import annotations

from itertools import product

import pytest

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

SESSION = Session(timeout=20)


def source(stmts: str, attention: str, seq: int, cp: int, extra: str = "") -> str:
    """Llama-3-8B's shape over dp = 2 and cp context ranks; ``attention``: the lines of its attention block,
    ``extra``: more lines of the mesh."""
    return (f"from std.context import context_parallel\nfrom std.data import ddp\n\nmodel {{\n  transformer {{\n"
            f"    hidden = 4096\n    layers = 32\n    heads = 32\n    ffn = 14336\n    vocab = 128256\n  }}\n"
            f"  seq = {seq}\n  microbatch = 1\n  attention {{\n{attention}  }}\n}}\n\n"
            f"mesh {{\n  dp = 2 @ inter_node\n  cp = {cp} @ intra_node\n{extra}}}\n\n"
            f"plan p {{\n  dp: ddp\n  cp: context_parallel\n{stmts}}}\n")


def without_context(src: str) -> str:
    """The plan of ``source`` with no context axis."""
    return src.replace("  cp = 8 @ intra_node\n", "").replace("  cp: context_parallel\n", "").replace(
        "from std.context import context_parallel\n", "")


def report(src: str, pinned=None):
    spec = load_string(src, "x.place")
    return check_plan(SESSION, spec, spec.plans[0], pinned or {})


def obligation(src: str, name: str, pinned=None):
    return next(o for o in report(src, pinned).obligations if o.name == name)


def code(src: str) -> str:
    """The code of the first diagnostic that loading and checking ``src`` raises."""
    with pytest.raises(DiagnosticError) as err:
        report(src)
    return err.value.diagnostics[0].code


def sweep(difference, differing, pair_differs, query_ok, behaviours, layout: str, c: int) -> None:
    """At every block size h ≤ 3 and length 1 ≤ L ≤ n + 1 (the window W or the chunk C): a pair found exactly where
    the simulator's ``differing`` finds a query whose output differs, the pair one the ring lets in otherwise than
    one device (``pair_differs``), its query as ``query_ok(query, differing queries)`` wants."""
    for h, verb in product((1, 2, 3), behaviours):
        n = 2 * c * h
        for length in range(1, n + 2):
            found = difference(verb, layout, c, n, length)
            wrong = differing(verb, layout, c, n, length)
            assert (found is None) == (not wrong), (verb, layout, c, h, length)
            if found is not None:
                assert pair_differs(verb, layout, c, n, length, found["query"], found["key"])
                assert query_ok(found["query"], wrong)


def agrees(ob, wrong: list, verb: str | None) -> None:
    """The obligation of a plan with cp = 3 against the simulator's differing queries ``wrong``."""
    assert ob.verdict is (Verdict.REFUTED if wrong else Verdict.PROVED)
    if wrong:
        assert "root cause" in ob.counterexample.diagnosis[0] and verb in ob.counterexample.diagnosis[0]
        assert dict(ob.counterexample.sizes)["cp"] == 3


def round_trip(src: str, stmt: str, length: str, messy_length: str) -> None:
    """``src`` formats to itself, and so does it with ``stmt`` and ``length`` spaced otherwise."""
    from placement_logic.frontend.canonical import format_source

    assert format_source(src, "x.place") == src
    messy = src.replace(f"  {stmt}", "  " + stmt.replace(": ", " :   ").replace("[", "[ ").replace("]", " ]"))
    messy = messy.replace(length, messy_length)
    assert format_source(messy, "x.place") == src
