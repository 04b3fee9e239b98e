"""``placement search`` against a brute force: every configuration of a small space written as
a spec with literal sizes and derived on its own (no compilation, no vectorisation)."""

from __future__ import annotations

import io
import itertools
import json
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("numpy")

from placement_logic import hardware as hw  # noqa: E402
from placement_logic import search  # noqa: E402
from placement_logic.cli import main  # noqa: E402
from placement_logic.costs import derive, steptime, with_sizes  # noqa: E402
from placement_logic.costs.symbolic import symbol  # noqa: E402
from placement_logic.frontend.loader import load_string  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL = """model {
  transformer {
    hidden = 2048
    layers = 16
    heads = 16
    kv_heads = 4
    ffn = 5632
    vocab = 32000
    norm = rmsnorm
    gated_mlp
    bias = false
  }
}
"""


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out, err), out.getvalue(), err.getvalue()


def _space(**kw) -> search.Space:
    base = dict(devices=16, global_batch=64, seq=4096, device="l40s", tp=(1, 2, 4), pp=(1, 2, 4),
                microbatch=(1, 2), chunks=(2,), strategies=("ddp", "zero1", "zero3", "hsdp"), recompute=("none", "full"))
    base.update(kw)
    return search.Space(**base)


def _brute_force(model_path: Path, space: search.Space):
    """Every configuration, each one its own spec with literal sizes, derived exactly."""
    block, shape, _ = search.model_text(str(model_path), space.seq)
    cap = hw.device(space.device).memory
    heads, kv, layers = 16, 4, 16
    experts = int(shape.experts.value)
    found = {}
    for tp, pp, ep, mb, strat, rec, sched, fold in itertools.product(
            space.tp, space.pp, space.ep if experts > 1 else (1,), space.microbatch, space.strategies,
            space.recompute, space.schedules, space.folding if experts > 1 else (False,)):
        # folded: the experts on ep × tp (× cp; expert tensor 1), ep a data axis of the dense layers
        if fold and (strat in ("hsdp", "offload") or ep == 1):
            continue
        if space.devices % (tp * pp * ep) or heads % tp or (kv % tp and tp % kv) or experts % (ep * tp if fold else ep):
            continue
        if space.devices == tp * pp * ep and strat != "ddp":
            continue  # one data replica: the search writes it as ddp
        if pp == 1 and sched != space.schedules[0]:
            continue
        dp = space.devices // (tp * pp * ep)
        if space.global_batch % (dp * ep * mb):
            continue
        nmb = space.global_batch // (dp * ep * mb)
        ds = 1
        if strat == "hsdp":  # sharded inside a node of 8 (beside tp), replicated across
            ds = max(k for k in (1, 2, 4, 8) if dp % k == 0 and k * tp <= 8)
            if ds == 1 or dp // ds == 1:
                continue
        for nv in (space.chunks if (pp > 1 and sched == "interleaved") else (1,)):
            if layers % (pp * nv) or (pp > 1 and sched == "interleaved" and nmb % pp):
                continue
            s = search.Structure(strat, rec, sched if pp > 1 else None,
                                 tuple(a for a, n in (("tp", tp), ("pp", pp), ("ep", ep)) if n > 1), fold)
            z = {"dp": dp // ds, "tp": tp, "pp": pp, "cp": 1, "ep": ep, "ds": ds, "mb": mb, "nmb": nmb, "nv": nv}
            spec = load_string(search.spec_text(block, s, z, space.device, space.mfu, literal=True), "<bf>")
            plan = spec.plans[0]
            subs = {symbol(k): v for k, v in z.items()}
            pc = derive(with_sizes(plan, subs), sized=True)
            st = steptime.step_time(pc, plan.mesh.hardware)
            mem = pc.memory.device_total.xreplace(subs)
            step = st.step.xreplace(subs)
            found[(s.strategy, s.recompute, s.schedule, s.folded, tuple(sorted(z.items())))] = (Fraction(int(mem.p), int(mem.q)), Fraction(int(step.p), int(step.q)),
                                                    mem <= cap)
    return found


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("search") / "model.place"
    p.write_text(MODEL)
    return p


MOE = MODEL.replace("    bias = false\n", "    bias = false\n    experts = 4\n    top_k = 2\n")


@pytest.fixture(scope="module")
def moe_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("search") / "moe.place"
    p.write_text(MOE)
    return p


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_vectorised_search_agrees_with_the_brute_force(which, model_file, moe_file):
    model_file = model_file if which == "dense" else moe_file
    space = _space() if which == "dense" else _space(ep=(1, 2, 4), pp=(1, 2), strategies=("ddp", "zero1"),
                                                     recompute=("none",))
    result = search.run(str(model_file), space, top=5, check=False)
    truth = _brute_force(model_file, space)
    assert result.valid == len(truth)
    fitting = sorted(((v[1], v[0]), str(k)) for k, v in truth.items() if v[2])
    assert result.fitting == len(fitting)
    # every evaluated row equals its exact derivation: memory to the byte, time to 1e-9
    for s, sizes, vals in result.parts:
        for row, v in zip(sizes.tolist(), vals.tolist()):
            z = dict(zip(search.SIZE_SYMBOLS, row))
            mem, step, _ = truth[(s.strategy, s.recompute, s.schedule, s.folded, tuple(sorted(z.items())))]
            # every strategy on one replica: the brute force derives it too (an expert axis holds data
            # replicas of the non-expert parameters, which a ZeRO stage shards there)
            if z["dp"] == 1 and z["ep"] == 1:
                one = search.Structure("zero3", s.recompute, s.schedule, s.axes)
                spec = load_string(search.spec_text(search.model_text(str(model_file), 4096)[0], one, z, "l40s",
                                                    None, literal=True), "<bf>")
                pc = derive(with_sizes(spec.plans[0], {symbol(k): n for k, n in z.items()}), sized=True)
                assert pc.memory.device_total.xreplace({symbol(k): n for k, n in z.items()}) == mem
            assert abs(v[0] - mem) < 0.5 and abs(v[1] - float(step)) <= 1e-9 * float(step), (s, z)
    # the fastest is the brute force's fastest, and the top rows carry the exact figures
    best_step = fitting[0][0][0]
    assert min(c.exact_step for c in result.ranked) == best_step and all(c.agrees for c in result.ranked)
    # the rows within the model's error band of the fastest first, the more robust before (less exposed
    # communication, then less memory), then the others by step time
    band = Fraction(7, 100)  # docs/validation_time.md: the largest error, 6.9 %, rounded up
    tied = [c for c in result.ranked if c.exact_step <= best_step * (1 + band)]
    assert result.ranked[:len(tied)] == sorted(tied, key=lambda c: (c.exposed, c.exact_memory, c.exact_step))
    rest = result.ranked[len(tied):]
    assert [c.exact_step for c in rest] == sorted(c.exact_step for c in rest)
    assert all(c.exact_step > best_step * (1 + band) for c in rest)


def test_frontier_is_pareto_optimal(model_file):
    result = search.run(str(model_file), _space(), top=3, check=False)
    pts = [(v[0], v[1]) for _, _, vals in result.parts for v in vals.tolist()
           if v[0] <= hw.device("l40s").memory]
    for c in result.frontier:
        assert not any(m < c.memory and t < c.step for m, t in pts)
    mems = [c.memory for c in result.frontier]
    assert mems == sorted(mems, reverse=True)


def test_cli_table_emit_and_check(model_file, tmp_path):
    args = ["search", str(model_file), "--device", "l40s", "--devices", "16", "--global-batch", "64", "--seq",
            "4096", "--tp", "1,2,4", "--pp", "1..4", "--top", "3"]
    status, out, err = run_cli(*args)
    assert status == 0, err
    assert "fastest configurations that fit" in out and "proved" in out
    assert "every row agrees with the vectorised figures" in out
    status, emitted, _ = run_cli(*args, "--emit", "2")
    assert status == 0 and emitted.startswith("# dp")
    spec_file = tmp_path / "row2.place"
    spec_file.write_text(emitted)
    status, cost_out, err = run_cli("cost", str(spec_file), "--no-cache")
    assert status == 0 and "fit: fits" in cost_out, err
    status, js, _ = run_cli(*args, "--format", "json", "--no-check")
    doc = json.loads(js)
    assert doc["command"] == "search" and len(doc["ranked"]) == 3
    # the first row is the fastest or a tie of it (within the error band, ranked first as the more robust)
    fastest = min(r["step_s"] for r in doc["ranked"])
    assert doc["ranked"][0]["step_s"] <= fastest * (1 + float(Fraction(doc["error_band"])))
    status, csv_text, _ = run_cli(*args, "--format", "csv", "--no-check")
    assert csv_text.splitlines()[0].startswith("rank,dp,tp,pp") and len(csv_text.splitlines()) == 4


def test_rows_within_the_models_error_of_the_fastest_are_ties(model_file):
    """A row is a tie when its exact step time is within the model's largest error on the
    published runs (7 %, docs/validation_time.md; 45 % under --mfu) of the fastest row's."""
    import csv
    import io

    args = ["search", str(model_file), "--device", "l40s", "--devices", "16", "--global-batch", "64", "--seq",
            "4096", "--tp", "1,2,4", "--pp", "1..4", "--top", "6", "--no-check"]
    for extra, band in (((), Fraction(7, 100)), (("--mfu", "1/2"), Fraction(45, 100))):
        status, js, err = run_cli(*args, *extra, "--format", "json")
        assert status == 0, err
        doc = json.loads(js)
        assert Fraction(doc["error_band"]) == band
        ranked = doc["ranked"]
        best = min(Fraction(r["step_exact"]) for r in ranked)
        assert not ranked[0]["tie"] and Fraction(ranked[0]["step_exact"]) <= best * (1 + band)
        # the first row and its ties: the more robust first (less exposed communication, then less memory)
        group = [r for r in ranked if r is ranked[0] or r["tie"]]
        assert ranked[:len(group)] == group
        assert group == sorted(group, key=lambda r: (r["exposed_comm_s"], r["memory_bytes"]))
        for r in ranked[1:]:
            assert r["tie"] == (Fraction(r["step_exact"]) <= best * (1 + band))
        status, text, _ = run_cli(*args, *extra)
        ties = [str(r["rank"]) for r in ranked if r["tie"]]
        assert (f"ties (~): rows {', '.join(ties)} within" in text) if ties else "no row within" in text
        status, csv_text, _ = run_cli(*args, *extra, "--format", "csv")
        assert [int(r["tie"]) for r in csv.DictReader(io.StringIO(csv_text))] == [int(r["tie"]) for r in ranked]


def test_rows_carry_memory_per_stage_and_bytes_per_link_as_cost_does(model_file, tmp_path):
    """Each ranked row's memory per pipeline stage and bytes per link class equal what ``placement
    cost`` reports for the emitted spec of that row (its CSV columns, derived on their own)."""
    import csv
    import io

    args = ["search", str(model_file), "--device", "l40s", "--devices", "16", "--global-batch", "64", "--seq",
            "4096", "--tp", "1,2,4", "--pp", "2..4", "--top", "3", "--no-check"]
    status, js, err = run_cli(*args, "--format", "json")
    assert status == 0, err
    for row in json.loads(js)["ranked"]:
        status, emitted, _ = run_cli(*args, "--emit", str(row["rank"]))
        spec_file = tmp_path / f"row{row['rank']}.place"
        spec_file.write_text(emitted)
        status, text, err = run_cli("cost", str(spec_file), "--format", "csv", "--no-cache")
        cost = next(csv.DictReader(io.StringIO(text)))
        stages = {k[len("stage_"):-len("_total_bytes")]: int(v) for k, v in cost.items()
                  if k.startswith("stage_") and k.endswith("_total_bytes")}
        links = {k[len("comm_link_"):-len("_bytes")]: int(v) for k, v in cost.items() if k.startswith("comm_link_")}
        assert stages and row["stage_memory_bytes"] == stages, (row["rank"], row["stage_memory_bytes"], stages)
        assert max(stages.values()) == row["memory_bytes"]
        assert row["link_bytes"] == links and sum(links.values()) == int(cost["comm_total_bytes"])
        # the communication on the critical path the ties are ranked by: cost's step less its compute and optimizer
        status, js, _ = run_cli("cost", str(spec_file), "--format", "json", "--no-cache")
        tm = json.loads(js)["plans"][0]["time"]
        fig = {k: Fraction(tm[k]["value"]) if tm[k] is not None else Fraction(0) for k in ("step", "compute", "optimizer")}
        assert row["exposed_comm_s"] == pytest.approx(float(fig["step"] - fig["compute"] - fig["optimizer"]), rel=1e-12)
        assert row["exposed_comm_s"] >= 0


def test_hugging_face_config_is_a_model(tmp_path):
    cfg = ROOT / "tests" / "data" / "hf" / "llama3_8b.json"
    if not cfg.exists():
        cfg = next((ROOT / "tests" / "data" / "hf").glob("*llama*.json"))
    status, out, err = run_cli("search", str(cfg), "--device", "h100_sxm", "--devices", "64", "--global-batch", "512",
                               "--seq", "4096", "--top", "2", "--no-check")
    assert status == 0, err
    assert "fastest configurations that fit" in out


def test_nothing_fits_exits_one(model_file):
    status, out, _ = run_cli("search", str(model_file), "--device", "l40s", "--devices", "1", "--global-batch", "64",
                             "--seq", "65536", "--tp", "1", "--pp", "1", "--recompute", "none")
    assert status == 1 and "no configuration fits" in out


@pytest.mark.parametrize("extra,words", [
    (["--tp", "0"], "--tp 0: a positive integer"),
    (["--tp", "8..1"], "runs backwards"),
    (["--strategies", "zero4"], "'zero4' is not one of"),
    (["--mfu", "2"], "must lie in (0, 1]"),
    (["--devices", "abc"], "--devices abc: a positive integer"),
])
def test_bad_options_are_diagnostics(model_file, extra, words):
    args = ["search", str(model_file), "--device", "l40s", "--devices", "16", "--global-batch", "64", "--seq", "4096"]
    if "--devices" in extra:
        args[args.index("--devices") + 1] = extra[1]
        extra = []
    status, _, err = run_cli(*args, *extra)
    assert status == 2 and "[PL301]" in err and words in err and "Traceback" not in err


def test_unknown_device_and_model_without_shape(tmp_path):
    status, _, err = run_cli("search", str(ROOT / "examples" / "models" / "llama3_8b.place"), "--device", "h100x",
                             "--devices", "8", "--global-batch", "8", "--seq", "1024")
    assert status == 2 and "[PL150]" in err
    f = tmp_path / "m.place"
    f.write_text("model { params = 7e9 }\n")
    status, _, err = run_cli("search", str(f), "--device", "h100_sxm", "--devices", "8", "--global-batch", "8",
                             "--seq", "1024")
    assert status == 2 and "[PL151]" in err and "transformer shape" in err


def test_plot_of_the_frontier(model_file, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "frontier.png"
    status, _, err = run_cli("search", str(model_file), "--device", "l40s", "--devices", "16", "--global-batch", "64",
                             "--seq", "4096", "--top", "3", "--no-check", "--plot", str(png))
    assert status == 0, err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_the_command_names_the_search_vocabulary():
    from placement_logic.commands import search as command

    assert (command.STRATEGIES, command.DEFAULT_STRATEGIES, command.RECOMPUTE, command.SCHEDULES) == \
        (search.STRATEGIES, search.DEFAULT_STRATEGIES, search.RECOMPUTE, search.SCHEDULES)


def test_offload_is_searched_when_asked(model_file):
    space = _space(strategies=("zero2", "offload"), recompute=("none",), tp=(1, 2), pp=(1,))
    result = search.run(str(model_file), space, top=50, check=False)
    kinds = {c.structure.strategy for c in result.ranked}
    assert "offload" in kinds
    best = {s: min((c for c in result.ranked if c.structure.strategy == s and c.sizes["tp"] == 1
                    and c.sizes["mb"] == 1), key=lambda c: c.memory) for s in ("zero2", "offload")}
    assert best["offload"].memory < best["zero2"].memory  # the optimizer state left the device


FOLD_MOE = MODEL.replace("    bias = false\n", "    bias = false\n    experts = 40\n    top_k = 2\n")
FOLD_ARGS = ("--device", "l40s", "--devices", "16", "--global-batch", "16", "--seq", "8192", "--tp", "1,2",
             "--pp", "1", "--cp", "2", "--ep", "1,2", "--microbatch", "1", "--strategies", "ddp,zero1",
             "--recompute", "full", "--top", "3")


def test_only_a_folded_layout_fits_and_search_finds_it(tmp_path):
    """40 experts of 3·2048·5632 per layer (16 layers) on 16 L40S with context parallelism 2:
    plain expert parallelism divides the experts over ep × tp ≤ 4 and needs more than 48 GiB
    whatever the data strategy; folded over ep × tp × cp (expert tensor 1, the context pair in
    the expert group) they fit. Without folding nothing fits; with it the fastest row is folded
    with the context pair among its expert ranks (the kernel model ranks tp = 1 first: its
    products are larger; under the single-MFU convention tp = 2, 8 expert ranks, came first),
    and ``placement cost`` on its emitted spec gives the search's exact memory and step time,
    and ``placement check`` proves it."""
    model = tmp_path / "moe.place"
    model.write_text(FOLD_MOE)
    status, out, _ = run_cli("search", str(model), *FOLD_ARGS, "--no-folding", "--no-check")
    assert status == 1 and "no configuration fits" in out
    status, js, err = run_cli("search", str(model), *FOLD_ARGS, "--format", "json", "--no-check")
    assert status == 0, err
    ranked = json.loads(js)["ranked"]
    fastest = min(ranked, key=lambda r: Fraction(r["step_exact"]))
    assert fastest["folded"] and (fastest["tp"], fastest["cp"], fastest["ep"]) == (1, 2, 2)
    best = ranked[0]  # the fastest, or a tie of it ranked first as the more robust
    assert best["folded"] and best["cp"] == 2 and (best is fastest or fastest["tie"])
    status, emitted, err = run_cli("search", str(model), *FOLD_ARGS, "--emit", "1")
    assert status == 0, err
    assert "group experts { role = {ep: expert, tp: expert, cp: expert} }" in emitted
    assert f"  ep: {best['strategy']}\n" in emitted and "expert_parallel" not in emitted
    spec_file = tmp_path / "row1.place"
    spec_file.write_text(emitted)
    status, cost_js, err = run_cli("cost", str(spec_file), "--format", "json", "--no-cache")
    assert status == 0, err
    plan = json.loads(cost_js)["plans"][0]
    assert Fraction(plan["memory"]["device"]["total"]["exact"]) == Fraction(best["memory_bytes"])
    assert Fraction(plan["time"]["step"]["exact"]) == Fraction(best["step_exact"])
    status, out, err = run_cli("check", str(spec_file))
    assert status == 0, out + err
