"""The figure of a search: memory per device against step time (matplotlib, the ``plot`` extra).

Input: the ranked rows as ``(label, memory bytes, step seconds, on the frontier)``, fastest
first; optionally every evaluated candidate as ``(memory bytes, step seconds)`` arrays, and the
memory budget in bytes (the device's memory less the reserve). Output: a ``Figure`` (or a
``.png``, ``.svg`` or ``.pdf`` file, by the path's suffix) that reads in a design document:

- every candidate a faint point (rasterised, so an SVG or PDF of a million candidates stays
  small); the ranked rows a little darker; the Pareto frontier joined in colour;
- the memory budget a dashed vertical line, named in the legend and beside the line;
- labels for the first ``labels`` ranked rows only (``#rank`` and the layout), each placed
  at the first of a few offsets where it overlaps no label already placed and stays inside
  the axes; a label with no such place is left out, so at most ``labels`` are drawn;
- 7 × 4.5 inches, 10-point text, PNG at 150 dots per inch (1050 × 675 pixels); SVG keeps its
  text as text (``svg.fonttype = none``), PDF embeds TrueType fonts.

Memory is in GB (10⁹ bytes), the unit ``placement cost`` and ``search`` print.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .figsave import require_matplotlib, save_as

GB = 10**9
SIZE = (7.0, 4.5)  # inches
DPI = 150
FONT = 10
OFFSETS = ((6, 6), (6, -14), (-6, 6), (-6, -14), (6, 18), (-6, 18), (6, -26), (-6, -26))


def frontier_figure(points: Iterable[tuple], candidates: tuple[Sequence[float], Sequence[float]] | None = None,
                    budget: float | None = None, labels: int = 8):
    """See the module's docstring; ``points`` fastest first (the order labels are given in)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pts = [(str(p[0]), float(p[1]), float(p[2]), bool(p[3])) for p in points]
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if candidates is not None and len(candidates[0]):
        ax.scatter([m / GB for m in candidates[0]], list(candidates[1]), s=4, color="0.6", alpha=0.25,
                   linewidths=0, rasterized=True, label=f"candidates ({len(candidates[0]):,})", zorder=1)
    if pts:
        ax.scatter([p[1] / GB for p in pts], [p[2] for p in pts], s=14, color="0.35", alpha=0.7, linewidths=0,
                   label="ranked rows", zorder=2)
    front = sorted((p for p in pts if p[3]), key=lambda p: p[1])
    if front:
        ax.plot([p[1] / GB for p in front], [p[2] for p in front], color="tab:red", marker="o", markersize=5,
                drawstyle="steps-post", label="Pareto frontier", zorder=3)
    if budget is not None:
        name = f"memory budget {budget / GB:.4g} GB"
        ax.axvline(budget / GB, color="tab:blue", linestyle="--", linewidth=1.2, label=name, zorder=2)
        ax.annotate(name, (budget / GB, 1), xycoords=("data", "axes fraction"), xytext=(-4, -4),
                    textcoords="offset points", ha="right", va="top", rotation=90, fontsize=FONT - 1,
                    color="tab:blue")
    ax.set_title("memory per device and step time", fontsize=FONT + 1)
    ax.set_xlabel("memory per device (GB)", fontsize=FONT)
    ax.set_ylabel("step time (s)", fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    ax.grid(True, alpha=0.3)
    ax.margins(0.08)
    if pts or budget is not None or candidates is not None:
        ax.legend(fontsize=FONT - 1, loc="upper right", framealpha=0.9)
    _label(fig, ax, [(f"#{k + 1} {p[0]}", p[1] / GB, p[2], p[3]) for k, p in enumerate(pts[:max(labels, 0)])])
    return fig


def _label(fig, ax, rows: list[tuple[str, float, float, bool]]) -> None:
    """Each row's label at the first offset where it overlaps none placed and fits the axes."""
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()  # fixes the layout, so the boxes below are where they are drawn
    frame = ax.get_window_extent(renderer)
    placed = [ax.get_legend().get_window_extent(renderer)] if ax.get_legend() is not None else []
    placed += [t.get_window_extent(renderer) for t in ax.texts]  # the budget's name
    for text, x, y, on in rows:
        for dx, dy in OFFSETS:
            t = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=FONT - 2,
                            ha="left" if dx > 0 else "right", color="tab:red" if on else "0.2", zorder=4)
            box = t.get_window_extent(renderer)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1)
            if inside and not any(box.overlaps(b) for b in placed):
                placed.append(box)
                break
            t.remove()


def frontier_plot(points: Iterable[tuple], path, candidates=None, budget: float | None = None,
                  labels: int = 8) -> None:
    """``frontier_figure`` written to ``path`` (.png, .svg or .pdf)."""
    save_as(frontier_figure(points, candidates, budget, labels), path, DPI)


def label_boxes(fig) -> list:
    """The drawn labels' boxes in display coordinates (for tests and callers that check layout)."""
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    return [t.get_window_extent(renderer) for t in ax.texts if t.get_text().startswith("#")]
