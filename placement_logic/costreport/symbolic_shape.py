"""``--symbolic``: a spec whose model numbers become the symbols a paper writes.

Input: an ``ir.Spec``. Output: the same spec with each plan's model rewritten: the transformer's
hidden size, layers, heads, MLP width and vocabulary, the sequence length and the microbatch
become the symbols ``h``, ``L``, ``a``, ``f``, ``V``, ``s``, ``b``, and a stated parameter count
the symbol Ψ (``psi``); each symbol is bound to the number it replaces (so every value stays
what it was) and the formulas are derived in the symbols. The kv heads, the experts and the
other fields stay numbers (they decide how heads and experts split, which a symbol would leave
as a case analysis). A name the spec already binds (an axis or a ``let`` called ``h``, ...)
keeps its number. The heads stay a number too where a plan states Ulysses' head split
(``override heads``): the largest rank's share of the heads is exact at numbers (costs.ulysses_share).
"""

from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..ir.overrides import OverrideTarget

SHAPE = (("hidden", "h"), ("layers", "L"), ("heads", "a"), ("ffn", "f"), ("vocab", "V"))
MODEL = (("seq", "s"), ("microbatch", "b"), ("params", "psi"))


def _swap(obj, fields, taken: set[str], bound: dict[str, ir.Value]) -> dict:
    out = {}
    for attr, name in fields:
        v = getattr(obj, attr, None)
        if not isinstance(v, ir.Const) or name in taken or (name in bound and bound[name] != v):
            continue
        bound[name] = v
        out[attr] = ir.Sym(name, v.span)
    return out


def symbolic_spec(spec: ir.Spec) -> ir.Spec:
    """See the module's docstring."""
    taken = {n for n, _ in spec.bindings} | set(spec.mesh.names if spec.mesh else ())
    bound: dict[str, ir.Value] = {}
    cache: dict[int, ir.Model] = {}
    split = any(o.target == OverrideTarget.HEADS for p in spec.plans for o in p.overrides)
    fields = tuple(f for f in SHAPE if not (split and f[0] == "heads"))

    def model(m: ir.Model | None) -> ir.Model | None:
        if m is None:
            return None
        if id(m) not in cache:
            changes = _swap(m, MODEL, taken, bound)
            if m.transformer is not None:
                shape = _swap(m.transformer, fields, taken, bound)
                if shape:
                    changes["transformer"] = replace(m.transformer, **shape)
            cache[id(m)] = replace(m, **changes) if changes else m
        return cache[id(m)]

    plans = tuple(replace(p, model=model(p.model)) for p in spec.plans)
    top = model(spec.model)
    extra = tuple((n, v) for n, v in bound.items())
    dims = tuple((n, ir.Dim.COUNT) for n, _ in extra)
    return replace(spec, plans=plans, model=top, bindings=spec.bindings + extra, dims=spec.dims + dims)
