"""Figures of cost reports (matplotlib, the optional ``plot`` extra).

Input: a ``SweepReport`` (``sweep_figure``, ``sweep_plot``) or plain points of a search
(``frontier_figure``, ``frontier_plot``). Output: a matplotlib ``Figure``, or the figure
written to a ``.png``, ``.svg`` or ``.pdf`` file.

- A sweep over one name: per plan, the device memory per state, the transient terms and
  the total against the swept value (with a pipeline also each stage's total, dashed),
  and the ring bytes sent per device per step on each link. The x-axis is log₂ when the
  swept name is a mesh axis or its values grow geometrically.
- One configuration (no sweep): per plan a bar of the device memory stacked by state (two
  bars, the first and the last stage, for a pipeline plan), and the bytes per link.
- A search's points: memory per device against step time (``costreport.frontier``: every
  candidate faint, the Pareto frontier highlighted, the memory budget, labels for the top rows).

matplotlib is imported only here, lazily, and drawn with its Agg canvas (no window and no
change to the user's pyplot state). Without it a command that was asked for a plot stops
with PL312 before any work (``require_matplotlib``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterable, Sequence

from . import frontier
from .figsave import require_matplotlib, save_as  # noqa: F401 (require_matplotlib: callers import it from here)

GIB = 2**30
GB = 10**9
STATES = ("params", "optimizer", "grads", "activations", "transient")
PANEL = (5.0, 3.6)  # inches per panel
DPI = 100


def _figure(panels: int, cols: int = 3):
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = max(1, min(cols, panels))
    rows = (panels + cols - 1) // cols
    fig = Figure(figsize=(PANEL[0] * cols, PANEL[1] * rows), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, cols, k + 1) for k in range(panels)]
    return fig, axes


def save(fig, path) -> None:
    """The figure written to ``path`` atomically, in the format its suffix names; a failure
    to write is a located PL700 and leaves ``path`` as it was."""
    save_as(fig, path, DPI)


def _num(v) -> float:
    return float(v)


def _geometric(values: Sequence[Fraction]) -> bool:
    if len(values) < 3 or any(v <= 0 for v in values):
        return False
    ratios = {values[k + 1] / values[k] for k in range(len(values) - 1)}
    return len(ratios) == 1 and next(iter(ratios)) >= 2


def sweep_figure(r):
    """The figure of a ``SweepReport`` (one swept name, or none)."""
    if len(r.swept) > 1:
        raise ValueError("a sweep figure draws one swept name")
    if r.swept:
        return _sweep_lines(r)
    return _bars(r)


def sweep_plot(r, path) -> None:
    save(sweep_figure(r), path)


def _sweep_lines(r):
    name = r.swept[0]
    fig, axes = _figure(len(r.plans) + 1)
    xs_all = sorted({row.values[0] for row in r.rows})
    log2 = name in r.axes or _geometric(xs_all)
    xlabel = f"{name} (devices on the axis)" if name in r.axes else name
    for ax, plan in zip(axes, r.plans):
        rows = sorted((row for row in r.rows if row.plan == plan), key=lambda row: row.values[0])
        xs = [_num(row.values[0]) for row in rows]
        for s in STATES:
            ax.plot(xs, [_num(row.get(f"memory.{s}")) / GIB for row in rows], marker=".", label=s)
        ax.plot(xs, [_num(row.get("memory.total")) / GIB for row in rows], color="black", linewidth=2,
                label="total (peak)")
        if plan in r.staged:
            for st, style in (("first", "--"), ("last", ":")):
                ax.plot(xs, [_num(row.get(f"stage.{st}.total")) / GIB for row in rows], color="gray",
                        linestyle=style, label=f"{st} stage total")
        ax.set_title(f"{plan}: memory per device")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("memory per device (GiB)")
        if log2:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax = axes[-1]
    for plan in r.plans:
        rows = sorted((row for row in r.rows if row.plan == plan), key=lambda row: row.values[0])
        xs = [_num(row.values[0]) for row in rows]
        for link in r.links:
            ax.plot(xs, [_num(row.get(f"comm.link.{link}")) / GB for row in rows], marker=".",
                    label=f"{plan} on {link}")
    ax.set_title("communication per device per step, by link")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("sent per device (GB per step)")
    if log2:
        ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    if r.links:
        ax.legend(fontsize="small")
    return fig


def _bars(r):
    fig, (mem, comm) = _figure(2, cols=2)
    labels, stacks = [], {s: [] for s in STATES}
    for row in r.rows:
        prefixes = [(f"{row.plan}\n{st} stage", f"stage.{st}.") for st in ("first", "last")] \
            if row.plan in r.staged else [(row.plan, "memory.")]
        for label, prefix in prefixes:
            labels.append(label)
            for s in STATES:
                stacks[s].append(_num(row.get(prefix + s)) / GIB)
    bottom = [0.0] * len(labels)
    for s in STATES:
        mem.bar(labels, stacks[s], bottom=bottom, label=s)
        bottom = [b + v for b, v in zip(bottom, stacks[s])]
    mem.set_title("memory per device, by state")
    mem.set_xlabel("plan (pipeline plans: per stage)")
    mem.set_ylabel("memory per device (GiB)")
    mem.legend(fontsize="small")
    width = 0.8 / max(1, len(r.links))
    for k, link in enumerate(r.links):
        comm.bar([i + k * width for i in range(len(r.rows))],
                 [_num(row.get(f"comm.link.{link}")) / GB for row in r.rows], width=width, label=link)
    comm.set_xticks([i + width * (len(r.links) - 1) / 2 for i in range(len(r.rows))], [row.plan for row in r.rows])
    comm.set_title("communication per device per step, by link")
    comm.set_xlabel("plan")
    comm.set_ylabel("sent per device (GB per step)")
    if r.links:
        comm.legend(fontsize="small")
    return fig


def frontier_figure(points: Iterable[tuple[str, float, float, bool]], candidates=None, budget=None, labels: int = 8):
    """A search's figure (``costreport.frontier``)."""
    return frontier.frontier_figure(points, candidates, budget, labels)


def frontier_plot(points: Iterable[tuple[str, float, float, bool]], path, candidates=None, budget=None,
                  labels: int = 8) -> None:
    """``frontier_figure`` written to ``path`` (.png, .svg or .pdf)."""
    frontier.frontier_plot(points, path, candidates, budget, labels)
