"""Row names of the cost report and LaTeX-safe text: shared by the report model and its renderers."""

from __future__ import annotations

DEVICE_ROWS = ("params", "optimizer", "grads", "activations", "transient", "total")
HOST_ROWS = ("params", "optimizer", "grads", "total")


_TEX_SPECIAL = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
                "{": r"\{", "}": r"\}", "^": r"\^{}", "~": r"\~{}", "×": r"$\times$", "Ψ": r"$\Psi$", "·": r"$\cdot$"}


def stage_title(peak: str | None) -> str:
    """Which pipeline stage decides the peak, in words."""
    if peak == "both":
        return "peak on the first and the last stage alike"
    if peak is None:
        return "peak stage depends on unbound symbols"
    return f"peak on the {peak} pipeline stage"


def tex_text(text: str) -> str:
    """Plain text made safe inside LaTeX text mode (control characters, a newline among them, as spaces)."""
    return "".join(_TEX_SPECIAL.get(ch, " " if ch < " " or ch == "\x7f" else ch) for ch in text)
