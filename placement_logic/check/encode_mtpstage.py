"""The z3 encoding of an embedding copy left out of the embedding group: an obligation's negation when the
multi-token-prediction block's copy on a middle pipeline stage is not summed with the others (``embedding:
group_first_last`` beside ``mtp_stage``, ``check.mtpstage``)."""

from __future__ import annotations

import zlib

import z3

from ..solver.session import value_of

KIND = "mtp_stage_outside_group"


def outside(orig, axis: str, name: str):
    """An obligation's negation when the MTP stage's copy is left out of the embedding group: either the original
    negation, or the missing copy itself, which loses wherever the axis has a middle stage (3 or more stages)."""
    def encode(env):
        cons, extract = orig(env)
        left = env.sess.bool(f"mtp_outside_{zlib.crc32(name.encode()):08x}")
        out = [z3.Implies(z3.Not(left), z3.And(cons)), z3.Implies(left, env.size(axis) >= 3)]

        def ex(model):
            if value_of(model, left):
                return {"kind": KIND, "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode
