"""A measurement job: what the host hands to every rank process (plain data, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from .realise import Realisation
from .shape import TinyShape


@dataclass(frozen=True)
class Job:
    key: str
    realisation: Realisation
    shape: TinyShape
    steps: int
    seed: int = 0
