"""The z3 encoding of time within a step: an obligation's negation when the gradient sync may
be armed before the last accumulated micro-step (``grads: sync_before_last``, ``check.timing``).
One of the two modules (with ``encode``) that build z3 terms."""

from __future__ import annotations

import zlib

import z3

from ..solver.session import value_of
from . import steps


def early_sync(orig, axes, name: str):
    """An obligation's negation when the gradient sync may be armed before the last micro-step
    (``grads: sync_before_last``): either the original negation, or the early sync itself where
    it loses something (at least 2 microbatches and an axis of 2 or more devices)."""
    def encode(env):
        cons, extract = orig(env)
        early = env.sess.bool(f"early_sync_{zlib.crc32(name.encode()):08x}")
        cond = z3.And(env.size(steps.MICROBATCHES) >= 2, z3.Or([env.size(a) >= 2 for a in axes]))
        out = [z3.Implies(z3.Not(early), z3.And(cons)), z3.Implies(early, cond)]

        def ex(model):
            if value_of(model, early):
                return {"kind": "early_sync", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode
