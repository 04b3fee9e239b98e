"""The MoE dispatch's capacity step: which real tokens each expert keeps (docs/semantics.md, "Loss terms";
the same capacity map counted in the aux term's f: check.encode_auxcells).

A router call is one device's microbatch. The objective's capacity step runs on the call's real tokens:
with N of them, an expert keeps C = ⌈capacity_factor · k · N / E⌉ slots, and it keeps the C tokens that chose
it with the highest router scores (the probability of that expert), ties to the earlier token (Megatron-LM's
``moe_token_drop_policy = probs``, DeepSpeed's ``drop_policy='probs'``). A plan states what its code does:

* ``override capacity: masks_padding``: as derived (the router's padding mask applied before the capacity
  step; NVIDIA/Megatron-LM#5542's fix);
* ``override capacity: counts_padding``: the padded positions of the call are routed too (after its real
  tokens, right padding), take slots by their scores, and N counts them (NVIDIA/Megatron-LM#5542,
  marin-community/marin#8953). A padded position that scores higher than a real token takes the real
  token's slot; and C, computed from the padded count, may keep real tokens the objective drops.

``GI capacity`` holds when every call keeps the objective's real (token, expert) pairs. ``counts_padding``
departs exactly where a capacity step drops at all, capacity_factor · k < E (E ≥ 1, 1 ≤ k ≤ E): the negation
asks z3 for that over the model's numbers (free where it leaves them free). The replay builds one router
call: for E ≥ 2 one real token choosing experts 0..k-1 with probability 1/E on each expert, then the fewest
padded positions P with ⌈cf·k·(1+P)/E⌉ ≤ P, each choosing 0..k-1 with probability 2/(E+1) on expert 0 and
1/(E+1) on the others: the padded positions outscore the real token on expert 0 and fill its C slots, so
the real token is dropped there (kept under a first-tokens order: the witness depends on the order by
score); for E = 1, tied scores, the fewest real tokens N with ⌈cf·N⌉ < N and padded positions until the
padded count's capacity keeps more of them than the objective's.

Input: the plan. Output: the obligation where the plan states a capacity step (none otherwise).
"""

from __future__ import annotations

from fractions import Fraction
from math import ceil

import z3

from .. import ir
from ..ir.overrides import OverrideTarget, OverrideVerb
from ..solver.session import value_of
from . import encode as en
from . import encode_auxcells as auxcells
from . import replay as rp
from .obligation import Obligation
from .report import Counterexample
from .rules import GRADIENT_INTEGRITY


def stated(plan: ir.Plan):
    """The plan's last ``capacity`` statement about the padding, or None (the dropped pairs' statements:
    check.encode_capdrop)."""
    said = [o for o in plan.overrides if o.target == OverrideTarget.CAPACITY
            and o.verb in (OverrideVerb.MASKS_PADDING, OverrideVerb.COUNTS_PADDING)]
    return said[-1] if said else None


def kept(call: list[tuple[tuple[int, ...], tuple[Fraction, ...], bool]], experts: int, top_k: int, cf: Fraction,
         counts_padding: bool) -> frozenset[tuple[int, int]]:
    """The (real token's index in the call, expert) pairs the capacity step keeps. ``call``: each position's
    (chosen experts, probabilities, padded?) in order; the padded positions enter the step where
    ``counts_padding``, else they are masked out before it."""
    entered = [(j, tok) for j, tok in enumerate(call) if counts_padding or not tok[2]]
    marks = auxcells.marked({0: [(j, tok[0], tok[1]) for j, tok in entered]}, experts, top_k, (auxcells.DROP, cf))
    return frozenset((j, i) for j, tok in entered if not tok[2] for i in marks[j])


def witness_call(experts: int, top_k: int, cf: Fraction) -> list | None:
    """The replay's router call (module docstring), or None where no capacity step drops (cf·k >= E)."""
    x = Fraction(cf) * top_k / experts
    if not (0 < x < 1 and 1 <= top_k <= experts):
        return None
    chosen = tuple(range(top_k))
    if experts >= 2:
        pads = 1
        while ceil(x * (1 + pads)) > pads:
            pads += 1
        real = (chosen, tuple(Fraction(1, experts) for _ in range(experts)), False)
        high = tuple(Fraction(2 if i == 0 else 1, experts + 1) for i in range(experts))
        return [real] + [(chosen, high, True)] * pads
    n = 1
    while ceil(x * n) >= n:
        n += 1
    pads = 1
    while ceil(x * (n + pads)) <= ceil(x * n):
        pads += 1
    tok = (chosen, (Fraction(1),))
    return [tok + (False,)] * n + [tok + (True,)] * pads


def _numbers(plan: ir.Plan, env: en.Env):
    """(E, k, capacity_factor) as z3 terms, with side conditions for those the model leaves free."""
    tf, side = plan.model.transformer, []

    def term(value, name):
        if value is not None:
            return env.value(value)
        t = env.sess.int(f"capacity_{name}")
        side.append(t >= 1)
        return env.real(t)

    e = term(tf.experts if tf is not None else None, "experts")
    k = term(tf.top_k if tf is not None else None, "top_k")
    cf = env.value(tf.capacity_factor) if tf is not None else z3.RealVal(1, env.sess.ctx)
    return e, k, cf, side


def negation(env: en.Env, plan: ir.Plan):
    """The padded positions enter a capacity step that drops: capacity_factor · k < E, 1 <= k <= E."""
    e, k, cf, side = _numbers(plan, env)
    drops = z3.And(cf > 0, cf * k < e, k >= 1, k <= e, e >= 1)
    cons = side + [drops]

    def extract(model) -> dict:
        nums = [Fraction(value_of(model, t)) if not isinstance(t, (int, Fraction)) else Fraction(t) for t in (e, k, cf)]
        return {"kind": "capacity", "sizes": env.size_values(model), "experts": int(nums[0]), "top_k": int(nums[1]),
                "capacity_factor": nums[2]}

    return cons, extract


MAX_EXPERTS = 4096  # the replay lists every expert's probability, and pads a call of about E/(cf·k) positions


def replay(ctx: rp.Context, w: dict) -> Counterexample | None:
    e, k, cf = w["experts"], w["top_k"], w["capacity_factor"]
    if e > MAX_EXPERTS:  # not replayed: the obligation stays unknown (never a hang, never refuted unreplayed)
        return None
    call = witness_call(e, k, cf)
    if call is None:
        return None
    want, got = kept(call, e, k, cf, False), kept(call, e, k, cf, True)
    if want == got:
        return None
    real = sum(1 for t in call if not t[2])
    pads = len(call) - real
    shown = lambda pairs: ", ".join(f"token {j} on expert {i}" for j, i in sorted(pairs)) or "none"  # noqa: E731
    probs = lambda t: "(" + ", ".join(rp._frac(p) for p in t[1]) + ")"  # noqa: E731
    values = (
        ("objective", f"capacity step on the call's {real} real token(s): each expert keeps ⌈{cf}·{k}·{real}/{e}⌉ = "
                      f"{ceil(Fraction(cf) * k * real / e)} slot(s), highest router score first"),
        ("path", f"capacity: counts_padding: the {pads} padded position(s) routed too, ⌈{cf}·{k}·{real + pads}/{e}⌉ = "
                 f"{ceil(Fraction(cf) * k * (real + pads) / e)} slot(s)"),
        ("routing", f"E = {e} experts, top-{k}; one router call: {real} real token(s) choosing experts "
                    f"{', '.join(map(str, range(k)))} with probabilities {probs(call[0])}, then {pads} padded "
                    f"position(s) choosing the same with probabilities {probs(call[-1])}"),
        ("kept by the objective", shown(want)),
        ("kept by the path", shown(got)),
    )
    lost, extra = want - got, got - want
    eq = ("the real tokens the experts process differ: " + "; ".join(
        s for s in (f"dropped by the path only: {shown(lost)}" if lost else "",
                    f"kept by the path only: {shown(extra)}" if extra else "") if s))
    return Counterexample(ctx.sizes_tuple(w["sizes"]), (("observer", "one device's router call"),), values, eq,
                          tuple(diagnose()), ctx.command(w["sizes"]))


def diagnose() -> list[str]:
    return ["the MoE capacity step counts the padded positions (capacity: counts_padding): the router runs "
            "without the padding mask before dispatch, so padded positions take expert slots by their router "
            "scores and the capacity C = ⌈capacity_factor·k·N/E⌉ is computed from the padded count N: real tokens "
            "are dropped (or kept) that the capacity step over the real tokens keeps (or drops)"]


def obligations(plan: ir.Plan | None, ctx: rp.Context) -> list[Obligation]:
    """``GI capacity`` where the plan states the capacity step (``override capacity: ...``)."""
    o = stated(plan) if plan is not None else None
    if o is None:
        return []
    if o.verb == OverrideVerb.MASKS_PADDING:
        neg = lambda env: ([z3.BoolVal(False, env.sess.ctx)], lambda model: {})  # noqa: E731
    else:
        neg = lambda env: negation(env, plan)  # noqa: E731
    return [Obligation(
        "GI capacity", GRADIENT_INTEGRITY, o.span,
        "each expert keeps, in every router call, the real tokens of the highest router scores up to its capacity "
        "⌈capacity_factor·k·N/E⌉ of the call's N real tokens (padded positions masked before the capacity step)",
        neg, lambda w: replay(ctx, w))]
