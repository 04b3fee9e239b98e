"""The head split of Ulysses' all-to-alls (``override heads[PAIR]: RULE``) and what it must keep.

Ulysses (``activations[context]: all_to_all over (G)``) gives each of the g ranks of its group G whole
heads of the tensor rank's h = heads / t over the whole sequence, and the inverse all-to-all after the
attention sends every head's output back to the ranks that own its positions; in backward a second
pair does the same with the output gradients. When g does not divide h the heads are split unevenly,
by a rule that gives rank r a contiguous run of heads (``split``), the next rank's run starting where
its own ends:

* ``uneven``: floor(h/g) heads each, one more on the first h mod g ranks (DeepSpeed's uneven
  all-to-all, ``get_shard_size_list``); for g | h the even split;
* ``chunk``: ceil(h/g) heads each until the heads run out, the last ranks fewer or none (torch.chunk);
* ``floor``: floor(h/g) heads each, the h mod g heads after the last run held by no rank.

``heads[forward]`` and ``heads[backward]`` state a pair's rule (``heads`` with no group: both); not
stated, a pair splits ``uneven``. ``heads[kv]`` states how the kv heads (k = kv_heads / t of them,
k | h, query head j reads kv head j / (h/k)) follow: ``repeat`` (derived: each rank receives the kv
head of each of its query heads, repeated where several ranks read it, as verl and DeepSpeed's GQA
path do) or ``split`` (the k kv heads cut over the g ranks by the forward rule, as if they were
query heads).

Obligations (each ``GI heads[PAIR]``, only where the plan states a split): ``forward``: every head is
attended exactly once, so the forward rule's runs cover the h heads (the runs are contiguous and
consecutive, so they do exactly when the last run ends at h); ``backward``: the backward rule covers
them too and gives every rank the heads it held in forward (the attention backward of rank r reads
the queries, keys and values it saved for its own heads); ``kv``: every rank holds the kv head of
each query head it holds. The z3 negation: sizes of the tensor axes (t) and of the Ulysses axes (g ≥
2) for which the concrete rules fail; the failing pairs (t, g) are enumerated exactly, t over the
divisors of the heads and g from 2 to h + 1: for every g > h each rule gives rank r < h head r and
the rest none (``floor``: none at all), so g = h + 1 stands for all of them. The replay runs the
all-to-alls on concrete heads (one position per rank, every head of it) and names the head, the
rank and the value that differ from the single device.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import z3

from ..diagnostics import NO_SPAN, Code, Diagnostic, DiagnosticError, Span
from ..ir.overrides import OverrideTarget, OverrideVerb
from ..ir.ulysses_split import MAX_SPLIT_HEADS, local, split
from . import encode_shapefacts as shapefacts
from .encode_shapefacts import _int
from .report import Counterexample

RULES = (OverrideVerb.UNEVEN, OverrideVerb.CHUNK, OverrideVerb.FLOOR)
KV_RULES = (OverrideVerb.REPEAT, OverrideVerb.SPLIT)
PAIRS = ("forward", "backward", "kv")


@dataclass(frozen=True)
class HeadsModel:
    ulysses: tuple[str, ...]  # the Ulysses group's axes (mesh order)
    tensor: tuple[str, ...]  # the tensor axes (each tensor rank's heads are split)
    heads: int
    kv: int
    rules: tuple[tuple[str, str], ...]  # pair -> rule
    spans: tuple[tuple[str, Span], ...]  # pair -> the statement that gives it (NO_SPAN: derived)
    first: Span  # the first head statement
    facts: tuple = ()  # the sizes the model's shapes take (check.encode_shapefacts), for the replay's search

    def where(self, pair: str) -> Span:
        return self.span(pair) if self.span(pair) != NO_SPAN else self.first

    def of(self, pair: str) -> str:
        return dict(self.rules)[pair]

    def span(self, pair: str) -> Span:
        return dict(self.spans)[pair]

    def local(self, t: int) -> tuple[int, int]:
        """The heads and kv heads of one tensor rank of t."""
        return local(self.heads, self.kv, t)


def model(plan, bindings: dict, tensor: tuple[str, ...]) -> HeadsModel | None:
    """The head split the plan states; None when it states none. PL276: a rule for the wrong group;
    PL277: no Ulysses all-to-all to split, or head counts that are not numbers."""
    stated = [o for o in plan.overrides if o.target == OverrideTarget.HEADS]
    if not stated:
        return None
    for o in stated:
        kv = o.group == "kv"
        if (o.verb in KV_RULES) != kv:
            accepted = ", ".join(KV_RULES if kv else RULES)
            raise DiagnosticError([Diagnostic(
                Code.HEADS_RULE_GROUP, f"override heads{f'[{o.group}]' if o.group else ''}: {o.verb}: "
                f"{'the kv heads follow the query heads by' if kv else 'a pair of all-to-alls splits the heads by'} "
                f"one of: {accepted}", o.span)])
    a2a = [o for o in plan.overrides if o.target == OverrideTarget.ACTIVATIONS and o.group == "context"
           and o.verb == OverrideVerb.ALL_TO_ALL and o.axes]
    t = plan.model.transformer
    heads = _int(t.heads, bindings) if t is not None else None
    kv = _int(t.kv_heads, bindings) if t is not None and t.kv_heads is not None else heads
    if not a2a or heads is None or kv is None:
        o = stated[0]
        why = ("the plan states no Ulysses all-to-all (override activations[context]: all_to_all over (...)) whose "
               "heads it would split" if not a2a else "the model's head counts are not numbers")
        if not a2a and any(x.target == OverrideTarget.ACTIVATION_GRADS and x.group == "context"
                           and x.verb == OverrideVerb.ALL_TO_ALL and x.axes for x in plan.overrides):
            why = ("its only Ulysses all-to-all is in backward (activation_grads[context]), and a head split is typed for "
                   "a forward pair only: a system's backward all-to-alls are the autograd of its forward ones "
                   "(DeepSpeed's _SeqAllToAll), they split the heads the forward pair gave each rank, and a forward "
                   "exchange over the sequence (ring or all-gather) gives none; state the forward all-to-all "
                   "(override activations[context]: all_to_all over (...))")
        raise DiagnosticError([Diagnostic(Code.HEADS_NO_ULYSSES, f"override heads{f'[{o.group}]' if o.group else ''}: "
                                          f"{o.verb}: {why}", o.span)])
    ulysses = tuple(a for a in plan.mesh.names if a in a2a[-1].axes and a not in tensor)
    own: dict[str, tuple[str, Span]] = {}
    for o in stated:
        for pair in ((o.group,) if o.group else ("forward", "backward")):
            own[pair] = (str(o.verb), o.span)
    rules = {"forward": own.get("forward", (OverrideVerb.UNEVEN.value, NO_SPAN))}
    rules["backward"] = own.get("backward", rules["forward"] if "forward" in own else (OverrideVerb.UNEVEN.value, NO_SPAN))
    rules["kv"] = own.get("kv", (OverrideVerb.REPEAT.value, NO_SPAN))
    return HeadsModel(ulysses, tensor, heads, kv, tuple((p, r[0]) for p, r in rules.items()),
                      tuple((p, r[1]) for p, r in rules.items()), stated[0].span, shapefacts.facts(plan, bindings))


def failure(hm: HeadsModel, pair: str, t: int, g: int) -> tuple | None:
    """The first (rank, head, what) where ``pair`` fails with t tensor ranks and g Ulysses ranks; None if it holds.
    what: 'none' (the head held by no rank), 'moved' (backward: another head than in forward), 'kv' (the query
    head's kv head not on the rank)."""
    h, k = hm.local(t)
    fwd = split(hm.of("forward"), h, g)
    if pair == "forward" or pair == "backward":
        runs = split(hm.of(pair), h, g)
        end = runs[-1][0] + runs[-1][1]
        if end < h:
            return (None, end, "none")
        if pair == "backward":
            for r, (a, b) in enumerate(zip(fwd, runs)):
                if a != b:
                    return (r, next(j for j in range(h) if (a[0] <= j < a[0] + a[1]) != (b[0] <= j < b[0] + b[1])),
                            "moved")
        return None
    if hm.of("kv") == OverrideVerb.REPEAT or h % k:
        return None
    kvs = split(hm.of("forward"), k, g)
    for r, ((s, n), (ks, kn)) in enumerate(zip(fwd, kvs)):
        for j in range(s, s + n):
            if not ks <= j // (h // k) < ks + kn:
                return (r, j, "kv")
    return None


def _cases(hm: HeadsModel, pair: str) -> list[tuple[int, int, bool]]:
    """(t, g, beyond): the sizes where ``pair`` fails; beyond: g = h + 1 standing for every g > h."""
    out = []
    for t in [d for d in range(1, hm.heads + 1) if hm.heads % d == 0] if hm.tensor else [1]:
        h = hm.heads // t
        for g in range(2, h + 2):
            if failure(hm, pair, t, g) is not None:
                out.append((t, g, g == h + 1))
    return out


def negation(env, hm: HeadsModel, pair: str):
    ctx = env.sess.ctx
    one = z3.IntVal(1, ctx)
    t, g = one, one
    for a in hm.tensor:
        t = t * env.size(a)
    for a in hm.ulysses:
        g = g * env.size(a)
    found = _cases(hm, pair)  # the exact sizes first: z3 tends to take them, so a witness is small
    cases = [z3.And(t == tt, g == gg) for tt, gg, _ in found] + [z3.And(t == tt, g > gg) for tt, gg, b in found if b]
    cons = [z3.Or(*cases) if cases else z3.BoolVal(False, ctx)]

    def extract(model) -> dict:
        return {"kind": "heads", "pair": pair, "sizes": env.size_values(model)}

    return cons, extract


WHAT = {"forward": "every head attended exactly once: the forward all-to-all's split ({rule}) gives each of the h "
                   "heads of a tensor rank to one rank of the Ulysses group ({axes})",
        "backward": "the backward all-to-all's split ({rule}) gives every rank of the Ulysses group ({axes}) the "
                    "heads it attended in forward, each head once",
        "kv": "every rank of the Ulysses group ({axes}) holds the kv head each of its query heads reads (kv heads: "
              "{rule})"}


def obligations(hm: HeadsModel | None, ctx, plan_span: Span, obligation) -> list:
    if hm is None:
        return []
    from .rules import GRADIENT_INTEGRITY

    out = []
    for pair in PAIRS:
        span = hm.where(pair)
        text = WHAT[pair].format(rule=hm.of(pair), axes=", ".join(hm.ulysses))
        if hm.heads > MAX_SPLIT_HEADS:  # ``_cases`` walks every tensor and Ulysses size up to the heads: O(heads²);
            # a literal head count above the limit is refused in resolution (PL114), one that a ``let`` or an
            # expression gives is not, and is left unknown here
            out.append(obligation(f"GI heads[{pair}]", GRADIENT_INTEGRITY, span if span != NO_SPAN else plan_span, text,
                                  lambda env: ([], lambda m: {}), lambda w: None,
                                  unknown=f"not decided: the model's {hm.heads} heads are more than the {MAX_SPLIT_HEADS} "
                                  "the split is decided on (every group size up to the heads)"))
            continue
        out.append(obligation(f"GI heads[{pair}]", GRADIENT_INTEGRITY, span if span != NO_SPAN else plan_span, text,
                              lambda env, pair=pair: negation(env, hm, pair),
                              lambda w, pair=pair: replay(ctx, hm, pair, w)))
    return out


# --------------------------------------------------------------------------- concrete replay


def _numbers(i: int, j: int) -> tuple[Fraction, Fraction, Fraction, Fraction]:
    """q, k, v and the output gradient dy of position i (on rank i) and head j."""
    return Fraction(i + 2 + 10 * j), Fraction(2 * i + 1 + 10 * j), Fraction(3 * i + 2 + 10 * j), Fraction(i + 1, 2) + 10 * j


def _y(g: int, i: int, j: int, kvh: int) -> Fraction:
    """Linear attention: y_ij = q_ij · Σ_p k_p,kv v_p,kv over the whole sequence (g positions)."""
    return _numbers(i, j)[0] * sum((_numbers(p, kvh)[1] * _numbers(p, kvh)[2] for p in range(g)), Fraction(0))


def _dv(g: int, p: int, j: int, saved: int) -> Fraction:
    """dv_pj = k_p,s · Σ_i dy_ij q_i,s, s the head whose saved queries and keys the rank pairs with head j."""
    return _numbers(p, saved)[1] * sum((_numbers(i, j)[3] * _numbers(i, saved)[0] for i in range(g)), Fraction(0))


def _coords(axes: tuple[str, ...], sizes: dict, r: int) -> str:
    out = []
    for a in reversed(axes):
        out.append(f"{a}={r % sizes[a]}")
        r //= sizes[a]
    return ", ".join(reversed(out))


def _runs(runs: list[tuple[int, int]]) -> str:
    if len(runs) > 12:  # the first ranks and the last
        return _runs(runs[:8])[:-1] + f", ... ({len(runs) - 10} more), " + _runs(runs[-2:])[1:]
    return "[" + ", ".join(f"{s}..{s + n - 1}" if n > 1 else (f"{s}" if n else "none") for s, n in runs) + "]"


def _tg(hm: HeadsModel, sizes: dict) -> tuple[int, int]:
    t, g = 1, 1
    for a in hm.tensor:
        t *= sizes[a]
    for a in hm.ulysses:
        g *= sizes[a]
    return t, g


def _fails(hm: HeadsModel, pair: str, sizes: dict) -> bool:
    t, g = _tg(hm, sizes)
    return g >= 2 and hm.heads % t == 0 and failure(hm, pair, t, g) is not None


def _sizes(ctx, hm: HeadsModel, pair: str, sizes: dict) -> dict | None:
    """The witness's sizes if the pair fails there; else (a witness cut small, or one past the replay's device
    bound) the same sizes with one free Ulysses axis set to the smallest size where it fails that the model's
    shapes take (every failure has one of at most 4(h + 1), g = h + 1 standing for every larger g)."""
    if _fails(hm, pair, sizes):
        return sizes
    for a in (a for a in hm.ulysses if a not in ctx.pinned):
        for n in range(2, 4 * (hm.heads + 1) + 1):
            other = {**sizes, a: n}
            if _fails(hm, pair, other) and shapefacts.holds(hm.facts, other):
                return other
    return None


def replay(ctx, hm: HeadsModel, pair: str, w: dict) -> Counterexample | None:
    sizes = _sizes(ctx, hm, pair, w["sizes"])
    if sizes is None:
        return None
    t, g = _tg(hm, sizes)
    found = failure(hm, pair, t, g)
    if found is None:
        return None
    r, j, kind = found
    h, k = hm.local(t)
    fwd = split(hm.of("forward"), h, g)
    ratio = h // k if h % k == 0 else 1
    stmt = f"override heads[{pair}]: {hm.of(pair)} at line {hm.where(pair).line}"
    if kind == "none":
        got, want = Fraction(0), _y(g, 0, j, j // ratio)
        eq = (f"attention output y of position 0 (rank 0), head {j} = {got} (no rank attends head {j}: its slot of the "
              f"output is never written), single-device = {want}")
        diag = (f"the {pair} all-to-all's {hm.of(pair)} split of the {h} heads over the {g} ranks of the Ulysses group "
                f"gives them the heads {_runs(split(hm.of(pair), h, g))}, so heads {j}..{h - 1} are attended by no rank; "
                f"the root cause is the split dropping the remainder h mod g = {h % g} ({stmt})",)
        r = 0
    elif kind == "moved":
        back = split(hm.of("backward"), h, g)
        local = j - back[r][0] if back[r][0] <= j < back[r][0] + back[r][1] else None
        saved = fwd[r][0] + local if local is not None and local < fwd[r][1] else None
        got = _dv(g, 0, j, saved) if saved is not None else Fraction(0)
        want = _dv(g, 0, j, j)
        held = f"head {saved}'s" if saved is not None else "no"
        eq = (f"value gradient dv of position 0, head {j} on rank {r} = {got} (computed with {held} saved queries and "
              f"keys), single-device = {want}")
        diag = (f"the forward all-to-all ({hm.of('forward')}) gives the {g} ranks the heads {_runs(fwd)}, the backward one "
                f"({hm.of('backward')}) {_runs(back)}: rank {r} receives the output gradient of head {j} but saved the "
                f"activations of other heads in forward; the root cause is the backward all-to-all's split disagreeing "
                f"with the forward one's ({stmt})",)
    else:
        kvs = split(hm.of("forward"), k, g)
        ks, kn = kvs[r]
        local = j - fwd[r][0]
        used = ks + local * kn // fwd[r][1] if kn else None
        got = _y(g, 0, j, used) if used is not None else Fraction(0)
        want = _y(g, 0, j, j // ratio)
        eq = (f"attention output y of position 0, head {j} on rank {r} = {got} (read with "
              f"{f'kv head {used}' if used is not None else 'no kv head'}), single-device = {want} (kv head {j // ratio})")
        diag = (f"rank {r} of the Ulysses group holds the query heads {_runs([fwd[r]])} but the kv heads "
                f"{_runs([kvs[r]])} (the {k} kv heads cut over {g} ranks as if they were query heads); query head {j} "
                f"reads kv head {j // ratio}, which rank {r} does not hold; the root cause is the kv heads split, not "
                f"repeated for the query heads that read them ({stmt})",)
    diag += ("every layer after the attention, the loss and so every gradient of the step, are computed from it"
             if kind != "moved" else "every layer before the attention, and the weight gradients computed from it, "
             "receive the wrong gradient",)
    values = (("sequence", f"one sample of {g} positions, position i on rank i of the Ulysses group, every one of the "
                           f"{h} heads{f' of each of the {t} tensor ranks' if t > 1 else ''}"),
              ("q, k, v", "i + 2 + 10j, 2i + 1 + 10j, 3i + 2 + 10j (position i, head j)"), ("dy", "(i + 1)/2 + 10j"),
              ("attention", "y_ij = q_ij · Σ_p k_p,kv(j) v_p,kv(j), kv(j) = j / (h/k)"))
    devices = ((f"rank {r}", _coords(hm.ulysses, sizes, r)),)
    return Counterexample(ctx.sizes_tuple(sizes), devices, values, eq, diag, ctx.command(sizes))
