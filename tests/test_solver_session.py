"""A remembering solver session (``Session(remember=True)``, what ``prove`` checks its library
compositions with): a query identical to one it decided is answered from that answer without
calling the solver; a different query, a different limit, or an answer z3 gave up on, is asked
again; a plain session asks every time."""

from __future__ import annotations

import z3

from placement_logic.solver.session import Session


class Counting(Session):
    calls = 0

    def raw_check(self, solver):
        type(self).calls += 1
        return super().raw_check(solver)


def _queries(s: Session):
    x, y = s.int("x"), s.int("y")
    return [x > 2, x < 2], [x + y == 3, x > 0, y > 0], [x > 2, x < 3]


def test_a_repeated_query_is_answered_from_the_first_answer():
    s = Counting(remember=True)
    Counting.calls = 0
    unsat, sat, other = _queries(s)
    first = s.check("a", unsat)
    again = s.check("b", _queries(s)[0])  # built anew: equal terms, the same query
    assert (first.status, again.status, Counting.calls) == ("unsat", "unsat", 1)
    m = s.check("c", sat)
    m2 = s.check("d", _queries(s)[1])
    assert Counting.calls == 2 and m2.model is m.model
    x, y = s.int("x"), s.int("y")
    assert m2.model.evaluate(x + y).as_long() == 3  # a model of the query asked
    assert s.check("e", other).status == "unsat" and Counting.calls == 3  # another query
    s.check("f", unsat, timeout=1)  # another limit
    assert Counting.calls == 4
    assert [label for label, _, _ in s.timings] == ["a", "b", "c", "d", "e", "f"]


def test_a_plain_session_asks_every_time():
    s = Counting()
    Counting.calls = 0
    for _ in range(3):
        assert s.check("q", _queries(s)[0]).status == "unsat"
    assert Counting.calls == 3


class GivesUpOnce(Session):
    calls = 0

    def raw_check(self, solver):
        type(self).calls += 1
        return z3.unknown if type(self).calls == 1 else super().raw_check(solver)


def test_an_unknown_answer_is_asked_again():
    s = GivesUpOnce(remember=True)
    GivesUpOnce.calls = 0
    assert s.check("q", _queries(s)[0]).status == "unknown"
    assert s.check("q", _queries(s)[0]).status == "unsat"
    assert GivesUpOnce.calls == 2
