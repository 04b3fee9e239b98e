"""Figures (``costreport.plot``): rendered to PNG and checked for size and labelled axes with
units; a missing matplotlib is the diagnostic PL312 before any work."""

from __future__ import annotations

import builtins
import io
import struct
from fractions import Fraction

import pytest

from placement_logic.cli import main
from placement_logic.costreport.sweep import build_sweep
from placement_logic.frontend.loader import load_spec

UNITS = ("GiB", "GB per step", "(s)")


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def labelled(fig) -> None:
    for ax in fig.axes:
        x, y = ax.get_xlabel(), ax.get_ylabel()
        assert x and y, ax.get_title()
        assert any(u in y for u in UNITS), y


def test_sweep_over_a_data_axis(tmp_path):
    pytest.importorskip("matplotlib")
    from placement_logic.costreport.plot import sweep_figure, sweep_plot

    spec = load_spec("examples/llama70b_3d.place")
    report = build_sweep(spec, sweeps={"dp": tuple(Fraction(2**k) for k in range(7))})
    fig = sweep_figure(report)
    labelled(fig)
    assert len(fig.axes) == 3  # one per plan and the links
    assert fig.axes[0].get_xscale() == "log"
    assert "dp" in fig.axes[0].get_xlabel()
    # each plan's panel: five states, the total and the two pipeline stages
    assert len(fig.axes[0].lines) == 8
    path = tmp_path / "sweep.png"
    sweep_plot(report, path)
    w, h = png_size(path)
    assert 800 <= w <= 3000 and 250 <= h <= 2000


def test_bars_for_one_configuration(tmp_path):
    pytest.importorskip("matplotlib")
    from placement_logic.costreport.plot import sweep_figure

    spec = load_spec("examples/zero_paper.place")
    fig = sweep_figure(build_sweep(spec))
    labelled(fig)
    mem, comm = fig.axes
    heights = [p.get_height() for p in mem.patches]
    assert len(heights) == 5 * 4  # 5 states stacked for each of the 4 plans
    assert "memory per device (GiB)" == mem.get_ylabel() and "GB per step" in comm.get_ylabel()


def test_frontier_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from placement_logic.costreport.plot import frontier_figure, frontier_plot

    points = [("a", 40e9, 2.0, True), ("b", 60e9, 1.5, True), ("c", 70e9, 1.8, False), ("d", 20e9, 3.0, True)]
    fig = frontier_figure(points)
    labelled(fig)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "memory per device (GiB)" and ax.get_ylabel() == "step time (s)"
    assert [t.get_text() for t in ax.texts] == ["a", "b", "c", "d"]
    front = ax.lines[0]
    assert list(front.get_ydata()) == [3.0, 2.0, 1.5]  # frontier points by memory
    for suffix in ("png", "svg", "pdf"):
        frontier_plot(points, tmp_path / f"f.{suffix}")
        assert (tmp_path / f"f.{suffix}").stat().st_size > 1000
    w, h = png_size(tmp_path / "f.png")
    assert w >= 400 and h >= 300


def test_plot_through_the_cli(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    out = tmp_path / "cmp.png"
    code = main(["compare", "examples/llama70b_3d.place", "--set", "dp=1..64:x2", "--plot", str(out)],
                io.StringIO(), io.StringIO())
    assert code == 0 and png_size(out)[0] > 800
    code = main(["cost", "examples/llama70b_3d.place", "--plot", str(tmp_path / "one.svg")], io.StringIO(), io.StringIO())
    assert code == 0 and (tmp_path / "one.svg").read_text().lstrip().startswith("<?xml")


def test_missing_matplotlib_is_pl312_before_any_work(tmp_path, monkeypatch):
    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.setenv("PLACEMENT_NO_CACHE", "1")
    derived = []
    import placement_logic.costreport.sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "build_sweep", lambda *a, **k: derived.append(1))
    out, err = io.StringIO(), io.StringIO()
    path = tmp_path / "x.png"
    code = main(["cost", "examples/zero_paper.place", "--set", "dp=2,4", "--plot", str(path)], out, err)
    assert code == 2 and "[PL312]" in err.getvalue() and "placement-logic[plot]" in err.getvalue()
    assert out.getvalue() == "" and not path.exists() and not derived
