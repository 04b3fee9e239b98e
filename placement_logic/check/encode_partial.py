"""z3 encodings of an obligation's negation for two statements about how a sum is formed: the token
count clamped before its reduction (``tokens: clamp_before_reduce``, ``check.partial``), and the
step's microbatches accumulated in rounds of a pipeline schedule (``accumulation: ... by M``,
``check.nested``)."""

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


def pending_eps(orig, axes, mb: bool, eps, name: str):
    """Either the original negation, or the epsilon added per piece where the normaliser sums two or
    more pieces and ε ≠ 0: Σ (n + ε) = T + P·ε, not T + ε."""
    def encode(env):
        cons, extract = orig(env)
        flag = env.sess.bool(f"eps_before_reduce_{zlib.crc32(name.encode()):08x}")
        two = ([env.size(MICROBATCHES) >= 2] if mb else []) + [env.size(a) >= 2 for a in axes]
        cond = z3.And(z3.Or(two), env.value(eps) != 0) if two else z3.BoolVal(False, env.sess.ctx)
        out = [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, cond)]

        def ex(model):
            if value_of(model, flag):
                return {"kind": "eps", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode


def nested_rounds(orig, by, rescaled: bool, name: str):
    """The original negation where the step's microbatches are A ≥ 1 whole rounds of M; with a
    rescaled buffer (``accumulation: rescaled_every_round``) also the rescale itself where it
    weights rounds apart (A ≥ 2 rounds of M ≥ 2)."""
    def encode(env):
        cons, extract = orig(env)
        key = f"{zlib.crc32(name.encode()):08x}"
        rounds, per = env.sess.int(f"rounds_{key}"), env.value(by)
        side = [rounds >= 1, env.real(env.size(MICROBATCHES)) == z3.ToReal(rounds) * per]
        if not rescaled:
            return cons + side, extract
        flag = env.sess.bool(f"rescaled_{key}")
        out = side + [z3.Implies(z3.Not(flag), z3.And(cons)), z3.Implies(flag, z3.And(rounds >= 2, per >= 2))]

        def ex(model):
            if value_of(model, flag):
                return {"kind": "nested", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode
