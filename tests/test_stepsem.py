"""The step semantics behind `placement prove`'s witnesses (prove/stepsem.py) on token-count normalisers that
name an axis more than once: a brute-force oracle (every rank's count, all-reduced in the statement's order)
against stepsem, and the witness query against the checker's GI verdict on the same plans."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import pytest

from placement_logic.check import run as check_run
from placement_logic.check.plan import PlanChecker
from placement_logic.check.report import Verdict
from placement_logic.check.rules import GRADIENT_INTEGRITY
from placement_logic.frontend.loader import load_string
from placement_logic.prove import correctness, stepsem
from placement_logic.prove.engine import decide
from placement_logic.solver.query import Obligation
from placement_logic.solver.session import Session

DDP = "from std.data import ddp\nmodel {\n  params = 1000\n  microbatches = %d\n}\nmesh {\n  dp = %d\n}\n" \
      "plan p {\n  dp: ddp\n%s}\n"
ULYSSES = ("from std.data import ddp\nfrom std.context import context_parallel\n"
           "model {\n  params = 1000\n  seq = 64\n  microbatch = 1\n  microbatches = %d\n}\n"
           "mesh {\n  dp = %d\n  sp = %d\n}\n"
           "plan p {\n  dp: ddp\n  sp: context_parallel\n  override loss: on_gathered_sequence over (sp)\n%s}\n")

# (name, text, sizes, the oracle's program: the axes the count is summed over by the gather, then all-reduced
# over in order; the axes the gradient is all-reduced over in order; the divisor)
CASES = [
    ("tokens (dp, dp)", DDP % (2, 2, "  override tokens: reduce over (dp, dp)\n"),
     {"dp": 2, "microbatches": 2}, ((), ("dp", "dp"), ("dp",), 1)),
    ("tokens (dp, dp, dp)", DDP % (1, 3, "  override tokens: reduce over (dp, dp, dp)\n"),
     {"dp": 3, "microbatches": 1}, ((), ("dp", "dp", "dp"), ("dp",), 1)),
    ("tokens (dp, dp), grads (dp, dp)",
     DDP % (2, 2, "  override tokens: reduce over (dp, dp)\n  override grads: reduce over (dp, dp)\n"),
     {"dp": 2, "microbatches": 2}, ((), ("dp", "dp"), ("dp", "dp"), 1)),
    ("gathered over sp, tokens (dp, sp)", ULYSSES % (1, 2, 2, "  override tokens: reduce over (dp, sp)\n"),
     {"dp": 2, "sp": 2, "microbatches": 1}, (("sp",), ("dp", "sp"), ("dp", "sp"), 1)),
    ("gathered over sp, tokens (dp)", ULYSSES % (1, 2, 2, "  override tokens: reduce over (dp)\n"),
     {"dp": 2, "sp": 2, "microbatches": 1}, (("sp",), ("dp",), ("dp", "sp"), 1)),
]


def _step(text: str):
    spec = load_string(text, "<stepsem>")
    return spec, PlanChecker(spec, spec.plan("p")).step


def _oracle(sizes, program, counts, contrib):
    """Rank r = its mesh coordinates; counts/contrib: (r, microbatch) -> its own tokens' count and summed
    per-token gradient. The gather sums the count over its axes; the count is accumulated over the
    microbatches; each all-reduce replaces every rank's value by the sum over the ranks that differ from it
    on that axis only (a value already equal there is multiplied by the size); the gradient likewise."""
    gathered, count_axes, grad_axes, divisor = program
    axes = [a for a in sizes if a != "microbatches"]
    ranks = list(product(*[range(sizes[a]) for a in axes]))
    m = sizes["microbatches"]

    def line(r, a):
        i = axes.index(a)
        return [r[:i] + (j,) + r[i + 1:] for j in range(sizes[a])]

    def all_reduce(val, a):
        return {r: sum(val[q] for q in line(r, a)) for r in ranks}

    local = {}
    for r in ranks:
        group = [r]
        for a in gathered:
            group = [q for p in group for q in line(p, a)]
        local[r] = sum(counts[q, t] for q in group for t in range(m))
    for a in count_axes:
        local = all_reduce(local, a)
    grad = {r: sum(Fraction(contrib[r, t]) for t in range(m)) / local[r] for r in ranks}
    for a in grad_axes:
        grad = all_reduce(grad, a)
    return grad[tuple(0 for _ in axes)] / divisor


def _assignments(n_cells: int, limit: int):
    values = (1, 2, 3) if n_cells <= 4 else (1, 2)
    out = list(product(values, repeat=n_cells))
    return out[::max(1, len(out) // limit)]


@pytest.mark.parametrize("name,text,sizes,program", CASES, ids=[c[0] for c in CASES])
def test_stepsem_matches_a_brute_force_all_reduce_of_the_counts(name, text, sizes, program):
    _, step = _step(text)
    g = step.group("dense")
    dims, cells = stepsem.grid(g, sizes)
    names = [d.name for d in dims]
    assert sorted(names) == sorted(sizes)  # the grid is the ranks and their microbatches

    def key(c):  # stepsem's cell -> (rank coordinates in the sizes' order, microbatch)
        at = dict(zip(names, c))
        return tuple(at[a] for a in sizes if a != "microbatches"), at["microbatches"]

    seen_wrong = False
    for i, ns in enumerate(_assignments(len(cells), 40)):
        counts = {key(c): n for c, n in zip(cells, ns)}
        contrib = {key(c): Fraction(3 * j + i % 5 - 4, j + 1) for j, c in enumerate(cells)}
        expected = _oracle(sizes, program, counts, contrib)
        got = stepsem.device_gradient(g, sizes, {c: counts[key(c)] for c in cells},
                                      {c: contrib[key(c)] for c in cells},
                                      stepsem.divisor_of(g, sizes, lambda v: v), Fraction(0))
        assert got == expected, (name, ns)
        ref = stepsem.global_gradient(cells, {c: counts[key(c)] for c in cells},
                                      {c: contrib[key(c)] for c in cells}, Fraction(0))
        seen_wrong |= got != ref
    # (dp, dp): the count is dp·T, the gradient dp times too small; reduced twice over dp it is dp times larger
    # again and right. Gathered over sp and reduced over (dp, sp): sp·T (every token counted sp times).
    assert seen_wrong == (name not in ("tokens (dp, dp), grads (dp, dp)", "gathered over sp, tokens (dp)"))


def test_repeat_factor_by_hand():
    _, step = _step(DDP % (1, 3, "  override tokens: reduce over (dp, dp, dp)\n"))
    # three all-reduces over dp = 3: the first sums the counts, the next two each multiply by 3: 3·3 = 9
    assert stepsem.repeat(step.group("dense"), {"dp": 3, "microbatches": 1}) == 9
    _, step = _step(ULYSSES % (2, 2, 4, "  override tokens: reduce over (dp, sp)\n"))
    # the gather sums over sp once, the all-reduce over sp a second time: × sp = 4
    assert stepsem.repeat(step.group("dense"), {"dp": 2, "sp": 4, "microbatches": 2}) == 4


AGREE = [(n, t, s) for n, t, s, _ in CASES]


@pytest.mark.slow
@pytest.mark.parametrize("name,text,sizes", AGREE, ids=[c[0] for c in AGREE])
def test_prove_witness_and_check_agree(name, text, sizes):
    """The witness query `placement prove` decides (stepsem, z3 and cvc5, the witness replayed in Fractions)
    refutes equivalence exactly where `placement check` refutes the plan's dense GI."""
    spec, step = _step(text)
    report = check_run.check_plan(Session(timeout=10), spec, spec.plan("p"), {})
    gi = [o for o in report.obligations if o.condition == GRADIENT_INTEGRITY and o.name == "GI grads[dense]"]
    assert len(gi) == 1 and gi[0].verdict in (Verdict.PROVED, Verdict.REFUTED)
    ob = Obligation("t/" + name, correctness.THEOREM, name, "", gi[0].verdict,
                    correctness._witness_query(spec, step, None, sizes))
    result, _ = decide(ob, 10)
    assert not result.error
    # a witness (data on which one step differs) exists iff the checker refutes; none iff it proves
    assert result.verdict is gi[0].verdict
