"""`placement trace` lifting a collective whose process group's global ranks are sets over the flattened ranks of
two mesh axes (``trace/lift_sets_axes.py``): the groups read off the scripts' placement of ranks by hand, not from
the lifter. A unit test on a hand-built layout (no torch), and the traced examples (torch tier): gradients
all-reduced within per-node groups {0, 3}, {1, 2} of a 2 x 2 (replicate, shard) mesh, refuted; an HSDP grad norm
all-reduced within the same diagonal groups (one rank of each shard: right), proved; within {0, 1, 2}, {3}
(a shard counted twice), refuted."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from placement_logic.cli import main
from placement_logic.trace import lift_sets_axes
from placement_logic.trace.lift_layout import _Layout

ROOT = Path(__file__).resolve().parent.parent


def _trace(groups: list[list[int]], alone: list[int] = ()) -> dict:
    calls = {r: [] for r in range(4)}
    for g in groups:
        for r in g:
            calls[r].append({"kind": "all_reduce", "ranks": g})
    for r in alone:
        calls[r].append({"kind": "all_reduce", "ranks": [r]})
    return {"ranks": [{"rank": r, "collectives": cs} for r, cs in calls.items()]}


@pytest.mark.parametrize("groups,alone,want", [
    ([[0, 3], [1, 2]], [], ((0, 3), (1, 2))),
    ([[0, 1, 2]], [3], ((0, 1, 2), (3,))),
    ([[0, 3]], [], None),  # ranks 1 and 2 in no group: not a partition, never lifted
])
def test_two_axis_groups_are_read_as_rank_sets_over_the_flattened_ranks(groups, alone, want):
    """A 2 x 2 mesh whose grid lists ranks 3, 2 / 1, 0 (so global rank r is not the flattened rank): the sets name
    flattened ranks, (a, b) -> 2a + b, read off the grid by hand."""
    layout = _Layout(["a", "b"], [2, 2], [[3, 2], [1, 0]])  # global 3 at (0, 0), 2 at (0, 1), 1 at (1, 0), 0 at (1, 1)
    flat_of = {3: 0, 2: 1, 1: 2, 0: 3}
    lift_sets_axes.find(_trace(groups, alone), layout, set(alone), lambda ranks, r: False)
    if want is None:
        assert not layout.blocks
        return
    want_flat = tuple(sorted(tuple(sorted(flat_of[r] for r in s)) for s in want))
    got = {v for v in layout.blocks.values()}
    assert got == {((0, 1), want_flat, "sets")}, got
    assert layout.axes_of(groups[0], groups[0][0]) == ("a", "b")


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(args, out, err), out.getvalue(), err.getvalue()


def _line(script: str, text: str) -> int:
    lines = (ROOT / "examples" / "traced" / script).read_text().splitlines()
    return next(i for i, x in enumerate(lines, 1) if text in x)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("script,argv,lifted,where,verdict", [
    ("manual_grads_sets_axes.py", [], "override grads: reduce_sets over (replicate, shard) ranks ([0, 3], [1, 2])",
     "dist.all_reduce(p.grad", "refuted GI grads[dense] blocks"),
    ("manual_grads_sets_axes.py", ["--whole"], None, None, None),
    ("fsdp_clip_sets_axes.py", [], "override clip_norm: reduce_sets over (replicate, shard) ranks ([0, 3], [1, 2])",
     "dist.all_reduce(sq", None),
    ("fsdp_clip_sets_axes.py", ["--uneven"], "override clip_norm: reduce_sets over (replicate, shard) ranks "
     "([0, 1, 2], [3])", "dist.all_reduce(sq", "refuted SC clip_norm"),
])
def test_two_axis_rank_sets_are_lifted_and_checked(script, argv, lifted, where, verdict, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    spec = tmp_path / "lifted.place"
    got, out, err = _run(["trace", "--nproc", "4", "--check", "--spec-file", str(spec), "--",
                          "python", f"examples/traced/{script}", *argv])
    text = spec.read_text()
    assert got == (1 if verdict else 0), out + err
    assert ("reduce_sets" in text) == bool(lifted), text
    assert "unobserved" not in text and "clip_norm: reduce over" not in text, text
    if lifted:
        assert f"  {lifted}  # observed:" in text, text
        assert f"examples/traced/{script}:{_line(script, where)}" in text, text
    if verdict:
        assert f"examples/traced/{script}:{_line(script, where)}: {verdict}: " in out, out
    else:
        assert "proved for all mesh sizes" in out, out
