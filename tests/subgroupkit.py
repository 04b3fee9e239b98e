"""What the tests of reductions in groups over part of an axis share (tests/test_unequal_groups.py: consecutive
groups of unequal sizes, ``reduce_groups ... by (S1, ...)``; tests/test_rank_sets.py: a list of rank sets,
``reduce_sets ... ranks ([R, ...], ...)``): the spec text and the command line, the located error of a
statement whose groups cannot cut the axis, the gradient sync's price, and the checker at pinned sizes
against the independent simulator (tests/simulator_subgroups.py); and what the tests of rank sets over several axes
share (tests/test_rank_sets_axes.py: the gradients, tests/test_norm_sets_axes.py: the grad norm): the plan built
at pinned sizes, random partitions of the flattened ranks."""

from __future__ import annotations

import io
import json
import random
from dataclasses import replace

import pytest
import simulator
from irkit import const, ov, plan

from placement_logic import ir
from placement_logic.check.run import check_plan
from placement_logic.cli import main
from placement_logic.diagnostics import DiagnosticError
from placement_logic.outcome import Verdict
from placement_logic.solver.session import Session

PSI = 10**9
SESSION = Session(timeout=20)
DP = {"dp": ("data", "R,R,R,R")}
ZERO2 = {"dp": ("data", "R,S,S,R")}
DDP_TP = {"dp": ("data", "R,R,R,R"), "tp": ("tensor", "S,S,S,S")}


def spec_text(mesh: str, override: str, plan: str = "dp: ddp") -> str:
    """A spec of Ψ = 10⁹ parameters with the mesh lines ``mesh`` and one plan: ``plan`` and ``override``
    (the override on line 10 when the mesh is one line)."""
    return (f"from std.data import ddp, zero3\nmodel {{\n  params = {PSI}\n}}\nmesh {{\n{mesh}\n}}\n"
            f"plan p {{\n  {plan}\n  {override}\n}}\n")


def run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def check_fmt_round_trip(tmp_path, written: str, canonical: str, mesh: str = "  dp = 5") -> None:
    """`placement fmt` prints the override ``written`` (over the mesh lines ``mesh``) as ``canonical``, and its
    output is a fixed point."""
    f = tmp_path / "g.place"
    f.write_text(spec_text(mesh, written))
    rc, out, _ = run(["fmt", str(f)])
    assert rc == 0 and f"{canonical}\n" in out, out
    f.write_text(out)
    assert run(["fmt", str(f)])[1] == out


def check_located_error(tmp_path, mesh: str, override: str, code: str, phrase: str) -> None:
    """`placement check` refuses the spec with ``code`` at the override's line and column 3, saying ``phrase``."""
    f = tmp_path / "bad.place"
    f.write_text(spec_text(mesh, override))
    rc, _, err = run(["check", str(f)])
    line = 9 + mesh.count("\n") + 1
    assert rc == 2 and f"{f}:{line}:3: error:" in err and f"[{code}]" in err and phrase in err, err


def check_located_error_in(tmp_path, text: str, override: str, code: str, phrase: str) -> None:
    """`placement check` refuses the spec ``text`` with ``code`` at the line of ``override`` (indented by two) and
    column 3, saying ``phrase``."""
    f = tmp_path / "e.place"
    f.write_text(text)
    rc, _, err = run(["check", str(f)])
    line = text.splitlines().index(f"  {override}") + 1
    assert rc == 2 and f"{f}:{line}:3: error:" in err and f"[{code}]" in err and phrase in err, err


def sets_plan(axes: dict, sizes: dict, target: str, sets, names=("a", "t")):
    """(spec, plan) built in memory over ``axes`` (tests/irkit.py) with ``override TARGET: reduce_sets over (names)
    ranks (sets)``, each axis's size the number ``sizes`` gives."""
    spec, p = plan("p", axes, overrides=(ov(target, "reduce_sets", None, names, sets=sets),))
    mesh = ir.Mesh(tuple(ir.Axis(x.name, const(sizes[x.name])) for x in p.mesh.axes))
    p = replace(p, mesh=mesh)
    return replace(spec, mesh=mesh, plans=(p,)), p


def partitions(n: int, rng: random.Random):
    """A random partition of the ranks 0..n-1 into two sets or more."""
    ranks = list(range(n))
    rng.shuffle(ranks)
    cuts = sorted(rng.sample(range(1, n), rng.randint(1, n - 1)))
    return tuple(tuple(ranks[i:j]) for i, j in zip([0] + cuts, cuts + [n]))


def check_pinned_elsewhere(tmp_path, text: str, code: str) -> None:
    """The spec ``text`` (its groups over dp = 5, the override on line 10) pinned at dp = 4 is refused with
    ``code`` at the override; pinned at 5, its blocks are refuted."""
    f = tmp_path / "p.place"
    f.write_text(text)
    rc, _, err = run(["check", str(f), "--set", "dp=4"])
    assert rc == 2 and f"{f}:10:3: error:" in err and f"[{code}]" in err and "pinned at 4" in err, err
    rc, out, err = run(["check", str(f), "--set", "dp=5"])
    assert rc == 1 and "refuted GI grads[dense] blocks" in out, out + err


def grad_sync(tmp_path, text: str) -> list[dict]:
    """The gradient-sync collectives `placement cost --format json` prices for the spec ``text``."""
    f = tmp_path / "c.place"
    f.write_text(text)
    rc, out, err = run(["cost", str(f), "--format", "json"])
    assert rc == 0, err
    comm = json.loads(out)["plans"][0]["communication"]
    return [c for c in comm["collectives"] if c["phase"] == "grad_sync"]


def rank_of(cex, key: str) -> int:
    """The rank a counterexample's device ``key`` ("rank A", "rank B") names, read from its "(dp=R)"."""
    return int(dict(cex.devices)[key].split("=")[1].rstrip(")"))


def obligation(report, name: str):
    return next(o for o in report.obligations if o.name == name)


def sim(p, sizes: dict, key, seeds: int = 4) -> bool:
    """Whether the simulator finds the violation ``key`` with any of ``seeds`` seeds."""
    return any(key in simulator.violations(p, sizes, random.Random(s), trials=2) for s in range(seeds))


def random_axes(rng: random.Random) -> dict:
    """A random axis ``a`` to cut (data, ZeRO-2 data or tensor) and, half the time, a second axis ``b``."""
    axes = {"a": rng.choice([("data", "R,R,R,R"), ("data", "R,S,S,R"), ("tensor", "S,S,S,S")])}
    if rng.random() < 0.5:
        axes["b"] = rng.choice([("data", "R,R,R,R"), ("tensor", "S,S,S,S")])
    return axes


def random_target(rng: random.Random) -> tuple[str, str | None]:
    """A random target (the gradients or the grad norm) and, for the gradients, a random group or none."""
    target = rng.choice(["grads", "clip_norm"])
    return target, rng.choice([None, "dense", "norms"]) if target == "grads" else None


def check_against_the_simulator(spec_, p, sizes: dict, target: str, context) -> None:
    """At pinned ``sizes``: each group's ``GI grads[g] blocks`` (and, for a norm target, ``SC clip_norm``)
    refuted iff the simulator finds it wrong with one of four seeds; none unknown. A statement the step cannot
    read is a located error (tested on its own): skipped."""
    try:
        report = check_plan(SESSION, spec_, p, sizes)
    except DiagnosticError:
        pytest.skip("a statement the step cannot read (a located error, tested above)")
    found: set = set()
    for s in range(4):
        found |= simulator.violations(p, sizes, random.Random(s), trials=2)
    keys = {}
    for o in report.obligations:
        if o.name.startswith("GI grads[") and o.name.endswith("] blocks"):
            keys[("blocks", o.name[len("GI grads["):-len("] blocks")])] = o.verdict
        elif o.name == "SC clip_norm" and target == "clip_norm":
            keys[("clip",)] = o.verdict
    assert keys and Verdict.UNKNOWN not in keys.values(), keys
    wrong = [(k, v.word) for k, v in keys.items() if (v is Verdict.REFUTED) != (k in found)]
    assert not wrong, (wrong, *context)


def check_one_group_leaves_the_others_alone(spec_, p) -> None:
    """``norms`` reduced in groups over dp = 3 (tp = 2): its blocks refuted, ``dense`` proved with no blocks
    obligation, as the simulator finds."""
    sizes = {"dp": 3, "tp": 2, "microbatches": 1}
    report = check_plan(SESSION, spec_, p, sizes)
    assert obligation(report, "GI grads[norms] blocks").verdict is Verdict.REFUTED
    assert obligation(report, "GI grads[dense]").verdict is Verdict.PROVED
    assert not any(o.name == "GI grads[dense] blocks" for o in report.obligations)
    assert sim(p, sizes, ("blocks", "norms")) and not sim(p, sizes, ("gi", "dense"))


def check_norm_against_the_simulator(spec_, p, sizes: dict) -> None:
    """``SC clip_norm`` refuted at ``sizes``, a device's norm 0 in the replay, and the simulator agrees."""
    clip = obligation(check_plan(SESSION, spec_, p, sizes), "SC clip_norm")
    assert clip.verdict is Verdict.REFUTED
    assert any(("clip",) in simulator.norm_violations(p, sizes, random.Random(s)) for s in range(6))
    assert "grad-norm² on" in clip.counterexample.equation and "= 0" in clip.counterexample.equation


def check_grads_refuted_at(spec_, p, sizes: dict) -> tuple:
    """At pinned ``sizes``: ``GI grads[g]`` and its blocks refuted for ``dense`` and ``norms``, as the simulator
    finds, and the dense blocks' replay gives rank A the contribution 1. Returns that counterexample and its
    ranks A and B."""
    report = check_plan(SESSION, spec_, p, sizes)
    for g in ("dense", "norms"):
        assert obligation(report, f"GI grads[{g}] blocks").verdict is Verdict.REFUTED
        assert obligation(report, f"GI grads[{g}]").verdict is Verdict.REFUTED
        assert sim(p, sizes, ("blocks", g)) and sim(p, sizes, ("gi", g))
    cex = obligation(report, "GI grads[dense] blocks").counterexample
    a, b = rank_of(cex, "rank A"), rank_of(cex, "rank B")
    assert f"1 on (dp={a})" in dict(cex.values)["per-rank contribution"]
    return cex, a, b


def check_unpinned_witness(spec_, p, n: int) -> None:
    """Unpinned, the dense blocks are refuted at dp = ``n`` (the ranks the statement holds), and the simulator
    finds them wrong there."""
    ob = obligation(check_plan(SESSION, spec_, p, {}), "GI grads[dense] blocks")
    assert ob.verdict is Verdict.REFUTED and dict(ob.counterexample.sizes)["dp"] == n
    assert sim(p, {"dp": n, "microbatches": 1}, ("blocks", "dense"))
