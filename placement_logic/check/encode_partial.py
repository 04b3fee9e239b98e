"""The z3 encoding of an operation on a partial value: an obligation's negation when the token
count is clamped before its reduction (``tokens: clamp_before_reduce``, ``check.partial``)."""

from __future__ import annotations

import zlib

import z3

from ..solver.session import value_of
from .dims import MICROBATCHES


def pending_clamp(orig, axes, mb: bool, name: str):
    """Either the original negation (every count at least 1: the clamp is a no-op), or the clamp
    itself where the normaliser sums two or more pieces (the microbatches, when summed, times the
    sizes of the reduced axes): one piece with no token then adds 1 to the normaliser."""
    def encode(env):
        cons, extract = orig(env)
        clamp = env.sess.bool(f"clamp_before_reduce_{zlib.crc32(name.encode()):08x}")
        two = ([env.size(MICROBATCHES) >= 2] if mb else []) + [env.size(a) >= 2 for a in axes]
        cond = z3.Or(two) if two else z3.BoolVal(False, env.sess.ctx)
        out = [z3.Implies(z3.Not(clamp), z3.And(cons)), z3.Implies(clamp, cond)]

        def ex(model):
            if value_of(model, clamp):
                return {"kind": "clamp", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode
