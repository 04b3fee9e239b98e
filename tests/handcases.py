"""The scaffold shared by the hand-case tests of one override obligation: the checker's verdict on the
named obligation, and whether an independent simulator finds a violation at any mesh size of 1 to 3
per axis (sizes pinned where the case pins them) and any of the given seeds; and the union of a
simulator's violations over every mesh size (the activation-flow tests)."""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import product

import pytest

from placement_logic.check.run import check_plan
from placement_logic.diagnostics import Code, DiagnosticError


def obligation(session, spec, p, pinned: dict, name: str):
    """The obligation ``name`` of the checked plan."""
    return next(o for o in check_plan(session, spec, p, pinned).obligations if o.name == name)


def obligation_or_skip(session, spec, p, name: str):
    """The obligation ``name``; a random plan whose statement changes nothing (PL506) is skipped."""
    try:
        report = check_plan(session, spec, p, {})
    except DiagnosticError as e:
        assert all(d.code == Code.OVERRIDE_NO_EFFECT for d in e.diagnostics)
        pytest.skip("PL506: the statement changes nothing")
    return next(o for o in report.obligations if o.name == name)


def simulator_finds(p, pinned: dict, seeds: int, hit: Callable[[object, dict, random.Random], object]) -> bool:
    """Whether ``hit(p, sizes, rng)`` is truthy at some sizes of 1 to 3 per axis that agree with
    ``pinned``, for some seed below ``seeds``."""
    names = p.mesh.names
    for sizes in product((1, 2, 3), repeat=len(names)):
        at = dict(zip(names, sizes))
        if any(at[k] != v for k, v in pinned.items()):
            continue
        if any(hit(p, at, random.Random(seed)) for seed in range(seeds)):
            return True
    return False


def violations_at_every_size(violations: Callable[[object, dict], set], p, values=(1, 2, 3)) -> set:
    """The union of ``violations(p, sizes)`` over every mesh size in ``values`` per axis."""
    found: set = set()
    for sizes in product(values, repeat=len(p.mesh.names)):
        found |= violations(p, dict(zip(p.mesh.names, sizes)))
    return found
