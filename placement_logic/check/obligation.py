"""One obligation of a plan: a named statement, the z3 encoding of its negation and the
concrete replay of a witness. Plain data shared by every module that states obligations
(``check.obligations`` and the classes it gathers: checkpoints, loss terms)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..diagnostics import Span
from . import encode as en


@dataclass
class Obligation:
    name: str
    condition: str
    span: Span
    checked: str
    encode: Callable[[en.Env], tuple[list, Callable]]
    replay: Callable[[dict], object]
    notes: tuple[str, ...] = ()
    whole: str | None = None  # the group whose whole-plan gradient integrity this is
    aspect_of: str | None = None  # the group whose whole-plan GI this per-aspect finding explains
    unknown: str = ""  # a fact the step model lacks to decide it: the verdict is unknown, saying which
    groups: tuple[str, ...] = ()  # the parameter groups a placement-caused obligation concerns ((): all)
