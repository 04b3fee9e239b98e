"""Outcomes shared by every command: verdicts and their order, exit statuses, and the
JSON envelope with its schema version. Imports nothing heavy.

- ``Verdict``: three-valued and ordered, refuted < unknown < proved; a collection's verdict
  is its weakest member's. Unknown is never a pass.
- ``QuestionVerdict``: an assert's or claim's verdict at a report's values (holds, fails,
  unknown), as text and JSON show it.
- ``Exit``: the process exit statuses (mypy's convention, with unknown and unrealised
  given their own codes).
- ``envelope(command, **fields)``: the top-level JSON object every command emits.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

SCHEMA_VERSION = 2  # 2: plans a list everywhere, command and exit_status in every envelope
TOOL = "placement-logic"


class Verdict(IntEnum):
    REFUTED = 0
    UNKNOWN = 1
    PROVED = 2

    @property
    def word(self) -> str:
        return self.name.lower()


class QuestionVerdict(StrEnum):
    """An assert's or a claim's verdict at a report's values (``cost``, ``compare``, ``sweep``)."""

    HOLDS = "holds"
    FAILS = "fails"
    UNKNOWN = "unknown"  # a side has no exact value


class Exit(IntEnum):
    OK = 0  # proved, formatted, every assertion holds
    FAILED = 1  # refuted, not formatted, an assertion fails
    INPUT = 2  # usage or input error (a diagnostic was printed)
    UNKNOWN = 3  # nothing refuted, something unknown
    UNREALISED = 4  # measure: a plan could not be realised on PyTorch
    INTERNAL = 70  # an internal error (a bug, with a crash report), never a verdict (sysexits' EX_SOFTWARE)


def exit_for(verdict: Verdict) -> Exit:
    """The exit status of a verdict."""
    return {Verdict.PROVED: Exit.OK, Verdict.REFUTED: Exit.FAILED, Verdict.UNKNOWN: Exit.UNKNOWN}[verdict]


def envelope(command: str, exit_status: int | None = None, **fields) -> dict:
    """The JSON envelope every command prints (docs/json.md, docs/schema/): schema version, tool,
    command and exit status first, then the command's fields; ``plans``, where a command has
    plans, is a list of objects each naming its ``plan``. (``exit_status`` None: left to the
    caller, which adds it before printing.)"""
    out: dict = {"schema_version": SCHEMA_VERSION, "tool": TOOL, "command": command}
    if exit_status is not None:
        out["exit_status"] = int(exit_status)
    out.update(fields)
    return out
