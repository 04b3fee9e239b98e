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

UNITS = ("GiB", "GB per step", "(s)", "(GB)")


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
    assert ax.get_xlabel() == "memory per device (GB)" and ax.get_ylabel() == "step time (s)"
    assert [t.get_text() for t in ax.texts] == ["#1 a", "#2 b", "#3 c", "#4 d"]  # rank and layout
    front = ax.lines[0]
    assert list(front.get_ydata()) == [3.0, 2.0, 1.5]  # frontier points by memory
    for suffix in ("png", "svg", "pdf"):
        frontier_plot(points, tmp_path / f"f.{suffix}")
        assert (tmp_path / f"f.{suffix}").stat().st_size > 1000
    w, h = png_size(tmp_path / "f.png")
    assert w >= 1000 and h >= 600  # 7 × 4.5 inches at 150 dpi


def _crowded(n: int = 60):
    """Rows packed into a small region (labels would overprint) and many candidates."""
    rows = [(f"dp{2 ** (k % 6)} tp{1 + k % 8} zero{k % 4} selective mb{1 + k % 4}", 50e9 + (k % 10) * 1e8,
             2.0 + (k // 10) * 0.01, k % 9 == 0) for k in range(n)]
    cand = ([20e9 + (k * 7919 % 1000) * 8e7 for k in range(3000)], [1 + (k * 104729 % 1000) / 200 for k in range(3000)])
    return rows, cand


def test_search_figure_budget_candidates_and_bounded_labels(tmp_path):
    pytest.importorskip("matplotlib")
    from placement_logic.costreport.frontier import label_boxes
    from placement_logic.costreport.plot import frontier_figure, frontier_plot

    rows, cand = _crowded()
    fig = frontier_figure(rows, cand, budget=80e9, labels=10)
    ax = fig.axes[0]
    boxes = label_boxes(fig)
    assert 1 <= len(boxes) <= 10  # the top rows only, fewer where they would overlap
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    frame = ax.get_window_extent(fig.canvas.get_renderer())
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    texts = [t.get_text() for t in ax.texts if t.get_text().startswith("#")]
    assert all(int(t.split()[0][1:]) <= 10 for t in texts)
    assert [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == "--"] == [80.0]  # the budget in GB
    assert ax.collections[0].get_offsets().shape[0] == 3000  # every candidate drawn
    for suffix in ("png", "svg", "pdf"):
        frontier_plot(rows, tmp_path / f"s.{suffix}", cand, 80e9)
        assert (tmp_path / f"s.{suffix}").stat().st_size > 1000
    svg = (tmp_path / "s.svg").read_text()
    assert "memory budget 80 GB" in svg  # text kept as text
    assert "<image" in svg  # the candidates rasterised


def test_search_plot_through_the_cli(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("numpy")
    model = tmp_path / "m.place"
    model.write_text("model {\n  transformer { hidden = 2048  layers = 16  heads = 16  ffn = 5632  vocab = 32000 }\n}\n")
    out = tmp_path / "search.svg"
    code = main(["search", str(model), "--device", "l40s", "--devices", "16", "--global-batch", "64", "--seq", "4096",
                 "--tp", "1,2", "--pp", "1,2", "--no-check", "--plot", str(out)], io.StringIO(), io.StringIO())
    assert code == 0
    svg = out.read_text()
    assert "memory budget" in svg and "Pareto frontier" in svg and "#1 " in svg


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
    assert code == 2 and "[PL312]" in err.getvalue() and "pip install '.[plot]' in a clone" in err.getvalue()
    assert out.getvalue() == "" and not path.exists() and not derived
