"""The aux load-balancing loss's statistics over packed rows (check.auxpacked): ``losses { aux_packed = true }``
makes a sequence of the objective one document of a packed row, and ``loss[aux]: stats_per_row over (AXES)``
takes each row's statistics.

Each case's verdict is derived by hand (per-row statistics pool a row's documents, which the per-sequence
objective keeps apart; a document's rank-local piece is not the document) and compared with the checker's ``GI
aux_stats`` and with the concrete simulator (tests/simulator_auxpacked.py: rows of documents of unequal lengths,
cut into contiguous blocks over the split ranks, random routings, the groups taken per document, row or
microbatch); a refutation's replayed values are recomputed by the simulator on the routing it describes."""

from __future__ import annotations

import random
import re
from fractions import Fraction
from itertools import product

import pytest
import simulator_auxpacked as sim
from test_aux_stats import _cost_refused, spec_text, stats

from placement_logic.check.run import check_spec
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI aux_stats"
SPLIT = "cp, tp"  # the axes that split a row (context, and tensor under sequence parallelism)

# name -> (objective, statement, whether the path computes the objective over packed rows, by hand)
CASES = {
    "doc_derived": ("per_sequence", "", True),
    "doc_stated": ("per_sequence", stats("stats_per_sequence", SPLIT), True),
    # NVIDIA/Megatron-LM#6108: a variable pack scored as one sequence
    "row_over_split": ("per_sequence", stats("stats_per_row", SPLIT), False),
    "row_local": ("per_sequence", stats("stats_per_row", ""), False),
    # a document cut over the context ranks, each rank's piece taken as a sequence
    "doc_piece": ("per_sequence", stats("stats_per_sequence", "tp"), False),
    "doc_microbatch": ("per_sequence", stats("stats_per_microbatch", SPLIT), False),
    "micro_derived": ("per_microbatch", "", True),
    "micro_row": ("per_microbatch", stats("stats_per_row", SPLIT), False),
    "micro_doc": ("per_microbatch", stats("stats_per_sequence", SPLIT), False),
    "global_derived": ("global_batch", "", True),
    "global_row": ("global_batch", stats("stats_per_row", "dp, ep, cp, tp"), False),
    # a row's documents weighted by their lengths (a per-token mean of each token's document's value)
    "doc_length_weighted": ("per_sequence", "  override loss[aux]: stats_length_weighted\n", False),
    "doc_length_weighted_probs": ("per_sequence", stats("stats_per_row", SPLIT) + stats("probs_per_sequence", SPLIT)
                                  + "  override loss[aux]: stats_length_weighted\n", False),
}
PACKS = ([[1, 3], [2, 2]], [[4], [4]], [[1, 1, 2], [3, 1]])  # the rows of a microbatch: documents' real lengths


def packed_text(scope: str, plans: dict[str, str], sequences: int = 2) -> str:
    return spec_text(scope, plans, sequences=sequences).replace(
        f"    aux_stats = {scope}\n", f"    aux_stats = {scope}\n    aux_packed = true\n")


def _spec(name: str):
    scope, body, _ = CASES[name]
    return scope, load_string(packed_text(scope, {name: body}), "auxpacked.place")


def _ob(spec, name: str):
    return next(o for o in check_spec(spec, [name], timeout=20).plans[0].obligations if o.name == NAME)


def _simulated(plan, scope: str, packs_list=PACKS, experts: int = 8, top_k: int = 2) -> bool:
    """Whether the simulator finds packs, sizes (each axis 1 or 2) and a routing where the path's value differs."""
    rng = random.Random(0)
    axes = plan.mesh.names
    for packs in packs_list:
        for combo in product((1, 2), repeat=len(axes) + 1):
            sizes = dict(zip(axes, combo[:-1])) | {"microbatches": combo[-1]}
            if sim.differs(plan, scope, sizes, packs, experts, top_k, rng, tries=2):
                return True
    return False


@pytest.mark.parametrize("name", list(CASES))
def test_the_verdict_agrees_with_the_simulator_and_by_hand(name):
    scope, spec = _spec(name)
    ok = CASES[name][2]
    assert _simulated(spec.plan(name), scope) is (not ok), name
    ob = _ob(spec, name)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (name, ob.unknown)
    if not ok:
        assert ob.counterexample is not None and ob.counterexample.diagnosis


def test_rows_of_one_document_leave_nothing_to_mix():
    """Per-row statistics are per-document ones where every row holds one document: the simulator finds no
    difference on such packs; the checker's witness packs two documents into a row."""
    scope, spec = _spec("row_over_split")
    assert not _simulated(spec.plan("row_over_split"), scope, packs_list=([[4], [4]], [[8]]))
    cx = _ob(spec, "row_over_split").counterexample
    assert re.search(r"^([2-9]|\d\d+) document", dict(cx.values)["packed rows"])
    assert any("per packed row, not per document" in d for d in cx.diagnosis)


@pytest.mark.parametrize("name", [n for n, (_, _, ok) in CASES.items() if not ok])
def test_the_replayed_values_are_the_simulators(name):
    """The counterexample's two values recomputed by the simulator on its sizes, documents (their real lengths, dealt
    to the ranks that split the row in turn) and routing."""
    scope, spec = _spec(name)
    plan = spec.plan(name)
    cx = _ob(spec, name).counterexample
    got, want = (Fraction(x) for x in re.match(r"aux on this path = ([0-9/]+) .* gives ([0-9/]+)$", cx.equation).groups())
    assert got != want
    values = dict(cx.values)
    lengths = [int(x) for x in re.search(r"real lengths ([0-9, ]+) tokens", values["packed rows"]).group(1).split(", ")]
    packs = [lengths for _ in range(int(values["sequences per microbatch"]))]  # dealt to the split ranks in turn
    starts = [sum(lengths[:d]) for d in range(len(lengths))]
    sizes = dict(cx.sizes)
    _, parts = sim.base.token_layout(plan)
    ranks = 1
    for a in parts:
        ranks *= sizes[a]
    c0, c1 = (0, 1), (1, 2)
    found = re.search(r"tokens at (\w+)=0", values["routing"])

    def routing(t):
        if found:  # a grouping's witness: the tokens at 0 of its dimension one way, the others the other
            dim = found.group(1)
            at = {"microbatches": t["mb"], "sequences": t["row"], "documents": t["doc"]}.get(dim, t["rank"].get(dim))
            chosen = c0 if at == 0 else c1
        else:  # lengths: document 0 unmixed, the others' first token per shard one way, the second the other
            chosen = c0 if t["doc"] == 0 or t["pos"] - starts[t["doc"]] < ranks else c1
        return chosen, tuple(Fraction(1, 2) if i in chosen else Fraction(0) for i in range(8))

    assert sim.values(plan, scope, sizes, packs, 8, 2, random.Random(0), routing, cyclic=True) == (got, want)


def test_stats_per_row_without_packing_changes_nothing():
    text = spec_text("per_sequence", {"p": stats("stats_per_row", SPLIT)})
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxpacked.place")
    d = exc.value.diagnostics[0]
    assert d.code == "PL506" and "stats_per_row" in d.message and "no packed rows" in d.message
    assert _cost_refused(text) == "PL506"


def test_packing_without_a_statistics_scope_is_refused():
    text = spec_text(None, {"p": ""}).replace("    aux = per_microbatch_mean\n",
                                               "    aux = per_microbatch_mean\n    aux_packed = true\n")
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxpacked.place")
    assert exc.value.diagnostics[0].code == "PL297"


def test_packing_round_trips_through_fmt():
    from placement_logic.frontend.canonical import format_source

    text = packed_text("per_sequence", {"p": "  override   loss[aux] :stats_per_row over(cp,tp)\n"})
    out = format_source(text, "auxpacked.place")
    assert "  override loss[aux]: stats_per_row over (cp, tp)\n" in out and "    aux_packed = true\n" in out
    assert format_source(out, "auxpacked.place") == out
    spec = load_string(out, "auxpacked.place")
    (o,) = spec.plan("p").overrides
    assert (o.target, o.group, o.verb, o.axes) == ("loss", "aux", "stats_per_row", ("cp", "tp"))
    assert spec.plan("p").model.aux_packed is not None


def test_documents_of_unequal_lengths_weigh_one_each():
    """By hand: a row of documents of lengths 1 and 3, each routed to experts of its own (E = 4, k = 1, probability
    1 on the chosen expert): per document each is fully imbalanced, E·1·1 = 4, mean 4; per row f = P = (1/4, 3/4, 0,
    0), 4·(1/16 + 9/16) = 5/2."""
    scope, spec = _spec("row_local")
    plan = spec.plan("row_local")
    sizes = {a: 1 for a in plan.mesh.names} | {"microbatches": 1}

    def routing(t):
        e = t["doc"]
        return (e,), tuple(Fraction(1) if i == e else Fraction(0) for i in range(4))

    assert sim.values(plan, scope, sizes, [[1, 3]], 4, 1, random.Random(0), routing) == (Fraction(5, 2), Fraction(4))


def test_documents_of_equal_lengths_weigh_alike_either_way():
    """By the simulator: the documents weighted by length give the objective where every document has one length;
    unequal lengths depart."""
    scope, spec = _spec("doc_length_weighted")
    plan = spec.plan("doc_length_weighted")
    assert not _simulated(plan, scope, packs_list=([[2, 2], [2, 2]], [[1, 1, 1, 1], [1, 1, 1, 1]]))
    assert _simulated(plan, scope, packs_list=([[1, 3], [4]],))


def test_the_length_weighted_value_by_hand():
    """Documents of lengths 1 and 3 (E = 4, k = 1): document 0 routed to expert 0 (value 4·1·1 = 4), document 1 one
    token to expert 0 and two to expert 1 (f = P = (1/3, 2/3, 0, 0): 4·5/9 = 20/9); equal weights 1/2·(4 + 20/9) = 28/9,
    by length (1·4 + 3·20/9)/4 = 8/3."""
    scope, spec = _spec("doc_length_weighted")
    plan = spec.plan("doc_length_weighted")
    sizes = {a: 1 for a in plan.mesh.names} | {"microbatches": 1}

    def routing(t):
        e = 0 if t["doc"] == 0 or t["pos"] == 1 else 1
        return (e,), tuple(Fraction(1) if i == e else Fraction(0) for i in range(4))

    assert sim.values(plan, scope, sizes, [[1, 3]], 4, 1, random.Random(0), routing) == (Fraction(8, 3), Fraction(28, 9))


@pytest.mark.parametrize("model_line,body,words", [
    ("", "  override loss[aux]: stats_length_weighted\n", "no packed rows"),
    ("    aux_packed = true\n", stats("stats_per_row", SPLIT) + "  override loss[aux]: stats_length_weighted\n",
     "no documents to weight"),
])
def test_length_weighting_with_no_documents_apart_changes_nothing(model_line, body, words):
    text = spec_text("per_sequence", {"p": body}).replace("    aux_stats = per_sequence\n",
                                                          "    aux_stats = per_sequence\n" + model_line)
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxpacked.place")
    d = exc.value.diagnostics[0]
    assert d.code == "PL506" and words in d.message, d.message
