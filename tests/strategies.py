"""Hypothesis strategies for syntax trees and source text, shared by the property tests."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import strategies as hs

from placement_logic.frontend import surface

KEYWORDS = {"import", "from", "as", "let", "model", "mesh", "strategy", "over", "extends", "plan",
            "use", "override", "by", "ranks", "assert", "claim", "true", "false"}
UNITS = ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")

names = hs.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True).filter(lambda s: s not in KEYWORDS)
mode_names = hs.sampled_from(["R", "S", "M", "O", "Q", "data", "tensor"])
labels = hs.from_regex(r'[A-Za-z0-9 .,:=<>()*-]{0,20}', fullmatch=True)


def _decimal(draw_int: int, places: int) -> Fraction:
    return Fraction(draw_int, 10**places)


numbers = hs.builds(
    lambda n, places, unit: surface.Num(_decimal(n, places), unit),
    hs.integers(min_value=0, max_value=10**12),
    hs.integers(min_value=0, max_value=3),
    hs.one_of(hs.none(), hs.sampled_from(UNITS)),
)

leaves = hs.one_of(numbers, hs.builds(surface.Name, names), hs.builds(surface.Bool, hs.booleans()))


def _extend(children):
    return hs.one_of(
        hs.builds(surface.BinOp, hs.sampled_from(["+", "-", "*", "/", "^"]), children, children),
        hs.builds(surface.Neg, children),
        hs.builds(surface.Call, names, hs.lists(children, max_size=2).map(tuple),
                  hs.lists(hs.builds(surface.Kwarg, names, children), max_size=2).map(tuple)),
    )


exprs = hs.recursive(leaves, _extend, max_leaves=8)
mode_refs = hs.builds(surface.ModeRef, mode_names, hs.booleans())
mode_maps = hs.builds(surface.ModeMap, hs.lists(hs.builds(surface.MapEntry, names, mode_refs), min_size=1, max_size=3)
                      .map(tuple))
kwargs = hs.lists(hs.builds(surface.Kwarg, names, exprs), max_size=2).map(tuple)
dotted = hs.lists(names, min_size=1, max_size=2).map(tuple)
strategy_refs = hs.builds(surface.StrategyRef, dotted, kwargs)

props = hs.builds(surface.Prop, names, hs.one_of(hs.none(), exprs, mode_maps))
sub_blocks = hs.builds(surface.SubBlock, names, hs.lists(props, max_size=3).map(tuple))
entries = hs.builds(
    surface.Entry,
    hs.lists(names, min_size=1, max_size=3).map(tuple),
    hs.one_of(hs.builds(surface.ModeRef, mode_names, hs.just(True)), hs.builds(surface.StrategyRef, dotted), mode_maps),
    kwargs,
)
overrides = hs.builds(
    surface.OverrideStmt, names, hs.one_of(hs.none(), names), names,
    hs.one_of(hs.none(), hs.lists(names, max_size=3).map(tuple)), hs.one_of(hs.none(), exprs),
    ranks=hs.one_of(hs.none(), hs.lists(exprs, min_size=1, max_size=3).map(tuple)),
)
block_items = hs.one_of(props, sub_blocks, entries, hs.builds(surface.Use, strategy_refs), overrides)

strategy_defs = hs.one_of(
    hs.builds(lambda n, p, a, sh: surface.StrategyDef(n, p, a, shorthand=sh),
              names, hs.lists(hs.builds(surface.Param, names, hs.one_of(hs.none(), exprs)), max_size=2).map(tuple),
              hs.lists(names, max_size=2).map(tuple),
              hs.builds(surface.Shorthand, hs.one_of(hs.none(), names),
                        hs.lists(mode_refs, min_size=1, max_size=4).map(tuple))),
    hs.builds(lambda n, ref: surface.StrategyDef(n, extends=ref), names, strategy_refs),
    hs.builds(lambda n, ext, body: surface.StrategyDef(n, extends=ext, body=body),
              names, hs.one_of(hs.none(), strategy_refs), hs.lists(block_items, max_size=4).map(tuple)),
)
compares = hs.builds(surface.Compare, hs.sampled_from(["==", "!=", "<", "<=", ">", ">="]), exprs, exprs)
items = hs.one_of(
    hs.builds(surface.ImportStmt, dotted, hs.one_of(hs.none(), names)),
    hs.builds(lambda m, ns: surface.ImportStmt(m, None, ns), dotted,
              hs.lists(hs.tuples(names, hs.one_of(hs.none(), names)), min_size=1, max_size=3).map(tuple)),
    hs.builds(surface.LetStmt, names, exprs),
    hs.builds(surface.ModelBlock, hs.lists(hs.one_of(props, sub_blocks), max_size=4).map(tuple)),
    hs.builds(surface.MeshBlock, hs.lists(hs.builds(surface.AxisDecl, names, exprs, hs.one_of(hs.none(), names)),
                                     max_size=3).map(tuple)),
    strategy_defs,
    hs.builds(surface.PlanDef, names, hs.one_of(hs.none(), strategy_refs), hs.lists(block_items, max_size=5).map(tuple)),
    hs.builds(surface.AssertStmt, compares, hs.one_of(hs.none(), labels)),
    hs.builds(surface.ClaimStmt, compares, hs.one_of(hs.none(), labels)),
    hs.builds(lambda c, lab, pins: surface.ClaimStmt(c, lab, expect=surface.Expect(pins)), compares,
              hs.one_of(hs.none(), labels), hs.lists(hs.tuples(names, exprs), max_size=2).map(tuple)),
)
modules = hs.builds(surface.Module, hs.lists(items, max_size=6).map(tuple))

# Sizes of a transformer and its mesh (tests/test_rebinding_checks.py): each as a let or an
# axis size, some of them sizes a plan cannot split evenly (PL130), fractions of ``n`` making
# an axis size that is no positive integer (PL107, through ``dp = n * 2``).
shape_values = hs.fixed_dictionaries({
    "H": hs.sampled_from([8, 12, 16, 30, 32, 64]),
    "KV": hs.sampled_from([1, 2, 3, 4, 8]),
    "F": hs.sampled_from([1024, 1536, 3000, 11008]),
    "L": hs.sampled_from([12, 16, 30, 32, 80]),
    "S": hs.sampled_from([2048, 2050, 4096]),
    "n": hs.sampled_from([Fraction(1), Fraction(2), Fraction(3, 2), Fraction(1, 4)]),
    "tp": hs.integers(min_value=1, max_value=8),
    "pp": hs.integers(min_value=1, max_value=6),
})
