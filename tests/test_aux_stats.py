"""The groups the MoE load-balancing loss's routing statistics are taken over (check.auxstats).

A spec with data (dp), expert (ep), context (cp) and sequence-parallel tensor (tp) axes states the
objective's grouping (``aux_stats``) and, per plan, what its path gathers. The checker's ``GI
aux_stats`` (for every mesh size) is compared with the concrete simulator
(tests/simulator_auxstats.py: every token listed, random routings, each axis and the microbatches at
1 and 2, which is enough: a difference needs one dimension of two) and with the verdict derived by
hand; a refutation's replayed values are recomputed by the simulator on the routing it describes."""

from __future__ import annotations

import random
import re
from fractions import Fraction
from itertools import product

import pytest
import simulator_auxstats as sim

from placement_logic.check.run import check_spec
from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.loader import load_string
from placement_logic.outcome import Verdict

NAME = "GI aux_stats"


def spec_text(scope: str | None, plans: dict[str, str], sequences: int = 2, sp: bool = True, experts: int = 8,
              top_k: int = 2, axes: tuple[str, ...] = ("dp", "ep", "cp", "tp")) -> str:
    stats = f"    aux_stats = {scope}\n" if scope else ""
    strategies = {"dp": "ddp", "ep": "expert_parallel", "cp": "context_parallel",
                  "tp": "megatron_sp" if sp else "megatron_tp", "pp": "one_f_one_b"}
    mesh = "".join(f"  {a} = 2\n" for a in axes)
    body = "".join(f"plan {name} {{\n" + "".join(f"  {a}: {strategies[a]}\n" for a in axes) + extra + "}\n\n"
                   for name, extra in plans.items())
    return f"""from std.data import ddp
from std.expert import expert_parallel
from std.context import context_parallel
from std.tensor import megatron_sp, megatron_tp
from std.pipeline import one_f_one_b

model {{
  transformer {{
    hidden = 1024
    layers = 8
    heads = 16
    ffn = 4096
    vocab = 32000
    experts = {experts}
    top_k = {top_k}
  }}
  seq = 4096
  microbatch = {sequences}
  microbatches = 4
  losses {{
    aux = per_microbatch_mean
{stats}  }}
}}

mesh {{
{mesh}}}

{body}"""


def stats(verb: str, axes: str) -> str:
    return f"  override loss[aux]: {verb} over ({axes})\n"


# name -> (objective, statement, whether the path computes the objective, by hand: dp and ep hold
# different sequences; cp and tp (sequence parallel) split each sequence; 2 sequences per microbatch)
CASES = {
    "global_derived": ("global_batch", "", True),
    "global_stated": ("global_batch", stats("stats_per_step", "dp, ep, cp, tp"), True),
    "global_per_microbatch": ("global_batch", stats("stats_per_microbatch", "dp, ep, cp, tp"), False),  # mbs apart
    "global_no_ep": ("global_batch", stats("stats_per_step", "dp, cp, tp"), False),
    "micro_derived": ("per_microbatch", "", True),
    "micro_stated": ("per_microbatch", stats("stats_per_microbatch", "cp, tp"), True),
    "micro_tp_only": ("per_microbatch", stats("stats_per_microbatch", "tp"), False),  # cp parts apart
    "micro_over_dp": ("per_microbatch", stats("stats_per_microbatch", "dp, cp, tp"), False),  # dp gathered
    "micro_per_sequence": ("per_microbatch", stats("stats_per_sequence", "cp, tp"), False),
    "seq_derived": ("per_sequence", "", True),
    "seq_stated": ("per_sequence", stats("stats_per_sequence", "tp, cp"), True),
    "seq_whole_microbatch": ("per_sequence", stats("stats_per_microbatch", "cp, tp"), False),  # packed: one sequence
    "seq_no_tp": ("per_sequence", stats("stats_per_sequence", "cp"), False),
}


def _spec(scope: str, names: list[str]):
    return load_string(spec_text(scope, {n: CASES[n][1] for n in names}), "auxstats.place")


def _simulated(plan, scope: str, sequences: int = 2, experts: int = 8, top_k: int = 2) -> bool:
    """Whether the simulator finds a routing and sizes (each axis 1 or 2) where the path's value differs."""
    rng = random.Random(0)
    axes = plan.mesh.names
    for combo in product((1, 2), repeat=len(axes) + 1):
        sizes = dict(zip(axes, combo[:-1])) | {"microbatches": combo[-1]}
        if sim.differs(plan, scope, sizes, sequences, experts, top_k, rng, tries=2):
            return True
    return False


@pytest.mark.parametrize("name", list(CASES))
def test_the_statistics_scope_agrees_with_the_simulator_and_by_hand(name):
    scope, _, ok = CASES[name]
    spec = _spec(scope, [name])
    assert _simulated(spec.plan(name), scope) is (not ok), name
    report = check_spec(spec, [name], timeout=20).plans[0]
    ob = next(o for o in report.obligations if o.name == NAME)
    assert ob.verdict is (Verdict.PROVED if ok else Verdict.REFUTED), (name, ob.unknown)
    if not ok:
        assert ob.counterexample is not None and ob.counterexample.diagnosis


def _replayed(ob, plan, scope: str, sequences: int, experts: int, top_k: int):
    """The counterexample's two values, and the simulator's on the routing it describes."""
    cx = ob.counterexample
    got, want = (Fraction(x) for x in re.match(r"aux on this path = ([0-9/]+) .* gives ([0-9/]+)$", cx.equation).groups())
    routing = dict(cx.values)["routing"]
    dim, = re.search(r"tokens at (\w+)=0", routing).groups()
    sizes = dict(cx.sizes)
    whole, _ = sim.token_layout(plan)
    verb, axes = sim.stated_path(plan) or sim.default_path(plan, scope)
    c0, c1 = tuple(range(top_k)), tuple(range(1, top_k + 1))
    path, obj = {}, {}
    for t in sim.tokens(plan, sizes, sequences):
        at = {"microbatches": t["mb"], "sequences": t["seq"]}.get(dim, t["rank"].get(dim))
        chosen = c0 if at == 0 else c1
        r = (chosen, tuple(Fraction(1, top_k) if i in chosen else Fraction(0) for i in range(experts)))
        path.setdefault(sim.path_key(verb, axes, t), []).append(r)
        obj.setdefault(sim.objective_key(scope, t, whole), []).append(r)
    return (got, want), (sim.loss(path, experts, top_k), sim.loss(obj, experts, top_k))


@pytest.mark.parametrize("name", [n for n, (_, _, ok) in CASES.items() if not ok])
def test_the_replayed_values_are_the_simulators(name):
    scope = CASES[name][0]
    spec = _spec(scope, [name])
    ob = next(o for o in check_spec(spec, [name], timeout=20).plans[0].obligations if o.name == NAME)
    stated, simulated = _replayed(ob, spec.plan(name), scope, 2, 8, 2)
    assert stated == simulated and stated[0] != stated[1]


def test_a_pinned_size_of_one_leaves_nothing_to_mix():
    """The cp parts kept apart matter only where cp has two ranks: at cp = 1 the plan computes the objective."""
    spec = _spec("per_microbatch", ["micro_tp_only"])
    ob = next(o for o in check_spec(spec, ["micro_tp_only"], pinned={"cp": 1}, timeout=20).plans[0].obligations
              if o.name == NAME)
    assert ob.verdict is Verdict.PROVED
    assert not _simulated_at(spec.plan("micro_tp_only"), "per_microbatch", {"cp": 1})


def _simulated_at(plan, scope: str, pinned: dict[str, int]) -> bool:
    rng = random.Random(1)
    axes = [a for a in plan.mesh.names if a not in pinned]
    for combo in product((1, 2), repeat=len(axes) + 1):
        sizes = dict(zip(axes, combo[:-1])) | pinned | {"microbatches": combo[-1]}
        if sim.differs(plan, scope, sizes, 2, 8, 2, rng, tries=2):
            return True
    return False


def test_top_k_of_every_expert_makes_the_value_constant():
    """With k = E every token routes to every expert: f_i = 1/E and the loss is 1 whatever the grouping."""
    text = spec_text("global_batch", {"p": stats("stats_per_sequence", "cp")}, experts=2, top_k=2)
    spec = load_string(text, "auxstats.place")
    ob = next(o for o in check_spec(spec, ["p"], timeout=20).plans[0].obligations if o.name == NAME)
    assert ob.verdict is Verdict.PROVED
    assert not _simulated(spec.plan("p"), "global_batch", experts=2, top_k=2)


def test_one_sequence_per_microbatch_makes_sequence_and_microbatch_one_group():
    text = spec_text("per_sequence", {"p": stats("stats_per_microbatch", "cp, tp")}, sequences=1)
    spec = load_string(text, "auxstats.place")
    ob = next(o for o in check_spec(spec, ["p"], timeout=20).plans[0].obligations if o.name == NAME)
    assert ob.verdict is Verdict.PROVED
    assert not _simulated(spec.plan("p"), "per_sequence", sequences=1)


@pytest.mark.parametrize("scope,plans,code,words", [
    (None, {"p": stats("stats_per_sequence", "cp")}, "PL214", "states no objective"),
    ("per_sequence", {"p": stats("stats_per_sequence", "cp, cp")}, "PL215", "names cp twice"),
    ("per_sequence", {"p": stats("stats_per_sequence", "pp")}, "PL215", "hold the same tokens"),
])
def test_a_statement_the_statistics_cannot_read_is_refused(scope, plans, code, words):
    """Refused where the plan is resolved: every command (check, cost) sees the same diagnostic."""
    text = spec_text(scope, plans, axes=("dp", "ep", "cp", "pp"))
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxstats.place")
    d = exc.value.diagnostics[0]
    assert d.code == code and words in d.message, d.message
    assert _cost_refused(text) == code


def test_tensor_ranks_without_sequence_parallelism_hold_the_same_tokens():
    text = spec_text("per_sequence", {"p": stats("stats_per_sequence", "tp")}, sp=False)
    with pytest.raises(DiagnosticError) as exc:
        load_string(text, "auxstats.place")
    assert exc.value.diagnostics[0].code == "PL215"
    assert _cost_refused(text) == "PL215"  # a refused statement is not priced


def _cost_refused(text: str) -> str | None:
    """The code `cost` exits 2 with on ``text`` (None where it prices the plan)."""
    import io
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from placement_logic.cli import main

    with TemporaryDirectory() as d:
        path = Path(d) / "auxstats.place"
        path.write_text(text)
        err = io.StringIO()
        rc = main(["cost", str(path), "--plan", "p"], out=io.StringIO(), err=err)
    found = re.search(r"\[(PL\d+)\]", err.getvalue())
    return found.group(1) if rc == 2 and found else None


@pytest.mark.parametrize("text,code", [
    ("  override loss[z]: stats_per_sequence over (cp)\n", "PL213"),
    ("  override loss: stats_per_sequence over (cp)\n", "PL213"),  # the main loss
])
def test_a_scope_for_a_per_token_term_is_refused(text, code):
    src = spec_text("per_sequence", {"p": text}).replace("    aux = per_microbatch_mean\n",
                                                          "    aux = per_microbatch_mean\n    z = global_mean\n")
    with pytest.raises(DiagnosticError) as exc:
        load_string(src, "auxstats.place")
    assert exc.value.diagnostics[0].code == code


def test_a_scope_without_the_aux_term_is_refused():
    src = spec_text("per_sequence", {"p": ""}).replace("    aux = per_microbatch_mean\n", "    z = global_mean\n")
    with pytest.raises(DiagnosticError) as exc:
        load_string(src, "auxstats.place")
    assert exc.value.diagnostics[0].code == "PL213"


def test_the_statistics_scope_round_trips_through_fmt():
    from placement_logic.frontend.canonical import format_source

    text = spec_text("per_sequence", {"p": "  override   loss[aux] :stats_per_sequence over(cp,tp)\n"})
    out = format_source(text, "auxstats.place")
    assert "  override loss[aux]: stats_per_sequence over (cp, tp)\n" in out and "aux_stats = per_sequence" in out
    assert format_source(out, "auxstats.place") == out
    spec = load_string(out, "auxstats.place")
    (o,) = spec.plan("p").overrides
    assert (o.target, o.group, o.verb, o.axes) == ("loss", "aux", "stats_per_sequence", ("cp", "tp"))
    assert spec.plan("p").model.aux_stats[0] == "per_sequence"


SCOPES = ("global_batch", "per_microbatch", "per_sequence")
VERBS = ("stats_per_sequence", "stats_per_microbatch", "stats_per_step")


def _random_case(rng: random.Random):
    axes = tuple(a for a in ("dp", "ep", "cp", "tp") if rng.random() < 0.7) or ("dp",)
    sp = rng.random() < 0.6
    token = [a for a in axes if a != "tp" or sp]
    body = ""
    if rng.random() < 0.85 and token:
        chosen = [a for a in token if rng.random() < 0.5] or [rng.choice(token)]
        body = stats(rng.choice(VERBS), ", ".join(chosen))
    return axes, sp, rng.choice(SCOPES), body, rng.choice((1, 2))


@pytest.mark.parametrize("seed", range(12))
def test_random_statistics_scopes_agree_with_the_simulator(seed):
    rng = random.Random(seed)
    axes, sp, scope, body, sequences = _random_case(rng)
    spec = load_string(spec_text(scope, {"p": body}, sequences=sequences, sp=sp, axes=axes), "auxstats.place")
    ob = next(o for o in check_spec(spec, ["p"], timeout=20).plans[0].obligations if o.name == NAME)
    bad = _simulated(spec.plan("p"), scope, sequences=sequences)
    assert ob.verdict is (Verdict.REFUTED if bad else Verdict.PROVED), (axes, sp, scope, body, sequences)
    if bad:
        stated, simulated = _replayed(ob, spec.plan("p"), scope, sequences, 8, 2)
        assert stated == simulated and stated[0] != stated[1]


def _collectives(text: str, plan: str) -> list[dict]:
    import io
    import json
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from placement_logic.cli import main

    with TemporaryDirectory() as d:
        path = Path(d) / "auxstats.place"
        path.write_text(text)
        out = io.StringIO()
        assert main(["cost", str(path), "--plan", plan, "--format", "json"], out=out, err=io.StringIO()) == 0
    return json.loads(out.getvalue())["plans"][0]["communication"]["collectives"]


@pytest.mark.parametrize("scope,body,axes", [
    ("per_microbatch", "", ["cp", "tp"]),  # derived: over the ranks that split a sequence
    ("global_batch", "", ["dp", "ep", "cp", "tp"]),
    ("per_sequence", stats("stats_per_sequence", "tp"), ["tp"]),
    ("per_sequence", stats("stats_per_microbatch", ""), None),  # each rank's own: nothing moves
    (None, "", None),  # no scope stated: the statistics are not modelled, nothing priced
])
def test_the_statistics_all_reduce_is_priced(scope, body, axes):
    """E = 8 fp32 values per MoE layer (8 layers) and microbatch (4), all-reduced over the summed axes
    (each of size 2): the ring moves 2·(n-1)/n of the 32 bytes per reduction."""
    found = [c for c in _collectives(spec_text(scope, {"p": body}), "p") if "routing statistics" in c["payload"]]
    if axes is None:
        assert found == []
        return
    (c,) = found
    n = 2 ** len(axes)
    assert c["kind"] == "all_reduce" and c["axes"] == axes and c["count"] == 8 * 4
    assert Fraction(c["bytes_per_device"]) == Fraction(2 * (n - 1), n) * 8 * 4 * 32
