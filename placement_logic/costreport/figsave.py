"""What every figure shares: matplotlib required (PL312 before any work) and a figure written
atomically in the format its path's suffix names (PL700 when it cannot be)."""

from __future__ import annotations

from pathlib import Path

from ..atomic import write_atomic
from ..diagnostics import Code, Diagnostic, DiagnosticError


def require_matplotlib() -> None:
    """PL312 unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DiagnosticError([Diagnostic(
            Code.PLOT_UNAVAILABLE, "--plot needs matplotlib, an optional dependency: pip install '.[plot]' in a clone of placement-logic")]) \
            from None


def save_as(fig, path, dpi: int) -> None:
    """``save`` at ``dpi``; an SVG keeps its text as text, a PDF embeds TrueType fonts."""
    import io

    from matplotlib import rc_context

    buf = io.BytesIO()
    with rc_context({"svg.fonttype": "none", "pdf.fonttype": 42}):
        fig.savefig(buf, dpi=dpi, format=Path(path).suffix.lstrip(".").lower() or "png")
    try:
        write_atomic(path, buf.getvalue())
    except OSError as exc:
        raise DiagnosticError([Diagnostic(Code.EXPORT_FAILED, f"--plot {path}: cannot write: {exc.strerror or exc}")]) \
            from None
