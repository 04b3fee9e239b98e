"""The z3 side of ignored tokens counted in the normaliser (``tokens: count_ignored``, check.ignored):
an obligation's negation extended by the statement's own violation."""

from __future__ import annotations

import zlib

import z3

from ..solver.session import value_of


def pending_ignored(orig, name: str):
    """Either the original negation, or a run whose first piece holds an ignored token (q ≥ 1): the
    normaliser Σ (n + q) = T + Q then exceeds T. Such a run exists for every mesh size and microbatch
    count (a piece holds at least one labelled token; its label mask may ignore any other)."""
    def encode(env):
        cons, extract = orig(env)
        flag = env.sess.bool(f"count_ignored_{zlib.crc32(name.encode()):08x}")
        q = env.sess.int(f"ignored_{zlib.crc32(name.encode()):08x}")
        out = [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, q >= 1)]

        def ex(model):
            if value_of(model, flag):
                return {"kind": "ignored", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode
