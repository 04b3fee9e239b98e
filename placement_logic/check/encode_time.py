"""The z3 encoding of time within and across steps: an obligation's negation when the gradient sync
may be armed before the last accumulated micro-step (``grads: sync_before_last``, ``check.timing``),
when the gradient buffer is not cleared between optimizer steps (``grads: no_zero_grad``,
``check.carryover``), or when the optimizer update runs after every micro-step (``optimizer[g]:
step_every_microbatch``, ``check.microupdate``), or when the accumulated buffer is reduced again after every
micro-step (``grads: reduce_accumulated_every_microbatch``, ``check.rereduce``), or summed in place after every
micro-step (``grads: reduce_summed_every_microbatch``, ``check.resummed``). One of the two modules (with ``encode``) that build z3 terms."""

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


def stale_buffer(orig, name: str):
    """An obligation's negation when the gradient buffer is not cleared between optimizer steps
    (``grads: no_zero_grad``): either the original negation, or the previous step's gradient still
    in the buffer, which loses at every size (the earlier step's gradient is arbitrary, so nonzero
    for some data)."""
    def encode(env):
        cons, extract = orig(env)
        stale = env.sess.bool(f"stale_buffer_{zlib.crc32(name.encode()):08x}")
        out = [z3.Implies(z3.Not(stale), z3.And(cons))]

        def ex(model):
            if value_of(model, stale):
                return {"kind": "stale_buffer", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode


def update_per_microstep(orig, name: str):
    """An obligation's negation when the optimizer update runs after every micro-step (``optimizer[g]:
    step_every_microbatch``): either the original negation, or the m updates of the micro-steps'
    gradients, which lose wherever there are two or more micro-steps (``check.microupdate``)."""
    def encode(env):
        cons, extract = orig(env)
        each = env.sess.bool(f"update_per_microstep_{zlib.crc32(name.encode()):08x}")
        out = [z3.Implies(z3.Not(each), z3.And(cons)), z3.Implies(each, env.size(steps.MICROBATCHES) >= 2)]

        def ex(model):
            if value_of(model, each):
                return {"kind": "update_per_microstep", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode


def rereduced(orig, name: str):
    """An obligation's negation when the accumulated gradient buffer is reduced again after every micro-step
    into a separate accumulator (``grads: reduce_accumulated_every_microbatch``): either the original negation,
    or the earlier micro-steps' gradients counted again, which loses wherever there are two or more micro-steps
    (``check.rereduce``)."""
    def encode(env):
        cons, extract = orig(env)
        again = env.sess.bool(f"rereduced_{zlib.crc32(name.encode()):08x}")
        out = [z3.Implies(z3.Not(again), z3.And(cons)), z3.Implies(again, env.size(steps.MICROBATCHES) >= 2)]

        def ex(model):
            if value_of(model, again):
                return {"kind": "rereduced", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode


def summed_in_place(orig, axes, name: str):
    """An obligation's negation when the accumulating buffer is all-reduced with a sum in place after every
    micro-step (``grads: reduce_summed_every_microbatch``): either the original negation, or micro-step k's
    gradient multiplied by n^(m - k), which loses wherever m >= 2 and one of the reduced axes has 2 or more
    devices (``check.resummed``)."""
    def encode(env):
        cons, extract = orig(env)
        summed = env.sess.bool(f"summed_in_place_{zlib.crc32(name.encode()):08x}")
        cond = z3.And(env.size(steps.MICROBATCHES) >= 2, z3.Or([env.size(a) >= 2 for a in axes]))
        out = [z3.Implies(z3.Not(summed), z3.And(cons)), z3.Implies(summed, cond)]

        def ex(model):
            if value_of(model, summed):
                return {"kind": "summed_in_place", "sizes": env.size_values(model)}
            return extract(model)

        return out, ex
    return encode
