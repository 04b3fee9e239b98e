"""Outcomes shared by every command: verdicts and their order, exit statuses, and the
JSON envelope with its schema version. Imports nothing heavy.

- ``Verdict``: three-valued and ordered, refuted < unknown < proved; a collection's verdict
  is its weakest member's. Unknown is never a pass.
- ``Exit``: the process exit statuses (mypy's convention, with unknown and unrealised
  given their own codes).
- ``envelope(command, **fields)``: the top-level JSON object every command emits.
"""

from __future__ import annotations

from enum import IntEnum

SCHEMA_VERSION = 1
TOOL = "placement-logic"


class Verdict(IntEnum):
    REFUTED = 0
    UNKNOWN = 1
    PROVED = 2

    @property
    def word(self) -> str:
        return self.name.lower()


class Exit(IntEnum):
    OK = 0  # proved, formatted, every assertion holds
    FAILED = 1  # refuted, not formatted, an assertion fails
    INPUT = 2  # usage or input error (a diagnostic was printed)
    UNKNOWN = 3  # nothing refuted, something unknown
    UNREALISED = 4  # measure: a plan could not be realised on PyTorch


def exit_for(verdict: Verdict) -> Exit:
    """The exit status of a verdict."""
    return {Verdict.PROVED: Exit.OK, Verdict.REFUTED: Exit.FAILED, Verdict.UNKNOWN: Exit.UNKNOWN}[verdict]


def envelope(command: str | None, **fields) -> dict:
    """The JSON envelope: schema version and tool first, then the command and its fields."""
    out: dict = {"schema_version": SCHEMA_VERSION, "tool": TOOL}
    if command is not None:
        out["command"] = command
    out.update(fields)
    return out
