"""The engines' vocabularies are types: each is a StrEnum defined once, and no module of the package
writes one of its words as a bare string literal where a member is meant (compared with, assigned
to, passed as or returned as the field that holds the vocabulary). A member compares, hashes,
formats and serialises as its word, so text and JSON output are those of the strings it replaced.

The scan is syntactic (``bare_literals``): a site is "where a member is meant" when the expression
beside the literal names the field (a regular expression over its source text), when the literal
is an argument of the vocabulary's record, or when it is a key of a dict literal read by the field.
"""

from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from pathlib import Path

import pkgsource

from placement_logic.ir.buffers import DENSE_BUFFERS, EXPERT_BUFFERS, PayloadTensor, grads_group, group_grads
from placement_logic.ir.groups import CLASSES, LIKE, GradClass, Holding, LayerKind, LayerRange, Stage
from placement_logic.measure.report import Outcome, RowStatus
from placement_logic.outcome import QuestionVerdict, Verdict
from placement_logic.prove.report import ClaimHolds, ProveStatus
from placement_logic.trace.lift_step import AXIS_NAMES, LiftRole

PKG = Path(__file__).resolve().parent.parent / "placement_logic"


@lru_cache(maxsize=None)
def _modules() -> tuple[tuple[str, ast.Module], ...]:
    return tuple((str(p.relative_to(PKG)), pkgsource.tree(p)) for p in sorted(PKG.rglob("*.py")))


def _strings(node: ast.AST | None):
    """The string literals an expression may evaluate to (through tuples, lists, sets, x if c else y, a or b)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            yield from _strings(e)
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            yield from _strings(v)


def _is_enum(node: ast.ClassDef) -> bool:
    return any("Enum" in ast.unparse(b) for b in node.bases)


def _call_sites(node: ast.Call, keep) -> None:
    """A call's sites, each handed to ``keep``: each literal argument beside its callee (a record built, or a
    list appended to), each keyword's value beside its name, each key of a dict literal read by ``.get``."""
    literal = [a for a in node.args if any(True for _ in _strings(a))]
    callee = ast.unparse(node.func) if literal else ""
    for a in literal:
        keep(node.lineno, ["new " + callee.split(".")[-1], "call " + callee], a)
    for k in node.keywords:
        if k.arg is not None:
            keep(node.lineno, [k.arg], k.value)
    if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Dict) \
            and node.func.attr == "get" and node.args:
        for key in node.func.value.keys:
            keep(node.lineno, [node.args[0]], key)


def _sites(tree: ast.AST):
    """(line, the source texts that say which field the literal stands for, the literal expression) for each
    place a string literal stands beside a field: a comparison's other sides, an assignment's targets, a
    keyword's name, a call's callee (a record built, or a list appended to), a dict literal's reader, each
    function around it returning it. Only expressions with a string literal are kept (the scan is quick), and
    none inside an enum's own class body (where the words are defined). One walk of the tree."""
    out = []

    def keep(line, texts, expr):
        if any(True for _ in _strings(expr)):
            out.append((line, tuple(ast.unparse(t) if isinstance(t, ast.AST) else t for t in texts), expr))

    def visit(node: ast.AST, functions: tuple[str, ...]):
        if isinstance(node, ast.ClassDef) and _is_enum(node):
            return
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                if any(True for _ in _strings(side)):
                    keep(node.lineno, [o for j, o in enumerate(sides) if j != i], side)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            if node.value is not None:
                keep(node.lineno, node.targets if isinstance(node, ast.Assign) else [node.target], node.value)
        elif isinstance(node, ast.Call):
            _call_sites(node, keep)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
            for key in node.value.keys:
                keep(node.lineno, [node.slice], key)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions += (node.name,)
        elif isinstance(node, ast.Return) and node.value is not None:
            for name in functions:  # a nested function's return is also its enclosing functions'
                keep(node.lineno, ["def " + name], node.value)
        for child in ast.iter_child_nodes(node):
            visit(child, functions)

    visit(tree, ())
    return out


@lru_cache(maxsize=None)
def _module_sites() -> tuple[tuple[str, list], ...]:
    return tuple((rel, _sites(tree)) for rel, tree in _modules())


_COLLECTING = (".append", ".add", ".startswith", ".endswith")


def _names_field(texts: tuple[str, ...], names: re.Pattern, constructors: tuple[str, ...]) -> bool:
    """Whether a site's texts say the literal stands for the field: a record of ``constructors`` built with it, a
    collection of the field's values taking it, a function named for the field returning it, or an expression
    naming the field beside it. (No expression's source begins "new ", "call " or "def ".)"""
    for t in texts:
        if t.startswith("new "):
            hit = t[4:] in constructors
        elif t.startswith("call "):
            hit = t.endswith(_COLLECTING) and names.search(t[5:]) is not None
        elif t.startswith("def "):
            hit = names.search(t[4:]) is not None
        else:
            hit = names.search(t) is not None
        if hit:
            return True
    return False


def bare_literals(words, names: str, constructors: tuple[str, ...] = (), under: str = "",
                  modules=None) -> list[str]:
    """Where a module writes one of ``words`` as a string literal for the field ``names`` names."""
    words, pattern = {str(w) for w in words}, re.compile(names)
    found = []
    sites = _module_sites() if modules is None else tuple((rel, _sites(tree)) for rel, tree in modules)
    for rel, module_sites in sites:
        if not rel.startswith(under):
            continue
        for line, texts, expr in module_sites:
            if _names_field(texts, pattern, constructors):
                found += [f"{rel}:{line}: {s!r}" for s in _strings(expr) if s in words]
    return sorted(set(found))


# --------------------------------------------------------------------------- the scan itself


def test_the_scan_finds_each_kind_of_site():
    src = '''
if c.payload.tensor == "grads": pass
if tensor in ("kv", "other"): pass
x = Payload("boundary", ())
what = {"params": 1}[tensor]
roles[a] = "data" if y else "tensor"
g = ParamGroup("kv", checks_as="norms")
n = {"data": "dp"}.get(roles[a], "tp")
def status(self):
    return "unknown"
'''
    mods = (("x.py", ast.parse(src)),)
    assert bare_literals(PayloadTensor, r"\btensor\b", ("Payload",), modules=mods) == [
        "x.py:2: 'grads'", "x.py:3: 'kv'", "x.py:4: 'boundary'", "x.py:5: 'params'"]
    assert bare_literals(LiftRole, r"\broles\b", modules=mods) == ["x.py:6: 'data'", "x.py:6: 'tensor'",
                                                                  "x.py:8: 'data'"]
    # a group's name is a free word, its checker class is not
    assert bare_literals(GradClass, r"\bchecks_as\b", modules=mods) == ["x.py:7: 'norms'"]
    assert bare_literals(ProveStatus, r"\bstatus\b", modules=mods) == ["x.py:10: 'unknown'"]


def test_a_member_is_its_word_in_text_and_json():
    for vocabulary in (PayloadTensor, Stage, Holding, GradClass, LayerKind, LiftRole, QuestionVerdict, ProveStatus,
                       ClaimHolds, RowStatus, Outcome):
        for m in vocabulary:
            assert m == m.value and str(m) == m.value and f"{m}" == m.value and f"{m:>3}" == f"{m.value:>3}"
            assert json.dumps({m: [m]}) == json.dumps({m.value: [m.value]})
            assert {m.value: 1}[m] == 1


# --------------------------------------------------------------------------- collective payloads


def test_payload_tensors():
    assert set(PayloadTensor) == {*DENSE_BUFFERS, *EXPERT_BUFFERS, PayloadTensor.PARAMS, PayloadTensor.GRADS,
                                  PayloadTensor.PARAMS_SHARD, PayloadTensor.GRADS_SHARD, PayloadTensor.ACTIVATION,
                                  PayloadTensor.BOUNDARY, PayloadTensor.BOUNDARY_CHUNK, PayloadTensor.TOKENS,
                                  PayloadTensor.EXPERT_TOKENS, PayloadTensor.TOKEN_SCALARS, PayloadTensor.KV,
                                  PayloadTensor.ULYSSES, PayloadTensor.ROUTER_STATS,
                                  PayloadTensor.GATHERED_TOKEN_SCALARS}
    assert group_grads("qk_norms") == "grads:qk_norms" and grads_group("grads:qk_norms") == "qk_norms"
    assert grads_group(PayloadTensor.GRADS) is None
    from placement_logic.ir.ulysses_split import payload, rules_of

    assert rules_of(payload("chunk", "split")) == ("chunk", "split") and rules_of(PayloadTensor.ULYSSES) is None
    assert bare_literals(PayloadTensor, r"\btensor\b|\bpayload\b", ("Payload",)) == []


# --------------------------------------------------------------------------- parameter-group fields


def test_group_fields():
    assert CLASSES == tuple(GradClass) and set(LIKE) < set(GradClass)
    assert LayerRange(LayerKind.AFTER).moe and LayerRange(LayerKind.MOE_OF).moe
    assert not LayerRange(LayerKind.FIRST).moe and not LayerRange(LayerKind.DENSE_OF).moe
    assert bare_literals(Stage, r"\bwhere\b") == []
    assert bare_literals(Holding, r"\b(tensor|sees)\b", under="ir") == []
    assert bare_literals(Holding, r"\b(g|group|cls|d)\.(tensor|sees)\b") == []
    assert bare_literals(GradClass, r"\b(checks_as|like)\b") == []
    assert bare_literals(LayerKind, r"\blayers\b|\bwhich\b|\brng\b", ("LayerRange",)) == []


# --------------------------------------------------------------------------- the lift's axis roles


def test_lift_roles():
    assert set(AXIS_NAMES) == set(LiftRole)
    assert bare_literals(LiftRole, r"\broles?\b", under="trace") == []


# --------------------------------------------------------------------------- verdicts


def test_verdicts():
    # an assert's or a claim's verdict, the checker's verdict words, a measured plan's outcome
    words = {*QuestionVerdict, *(v.word for v in Verdict)}
    assert bare_literals(words, r"verdict|\bexpect(ed)?\b|\bthere\b") == []
    assert bare_literals(Outcome, r"\boutcome\b") == []
    # the solver's answers, a proof obligation's status and where a claim holds
    assert bare_literals({"sat", "unsat", "unknown"}, r"\bstatus\b|\bexpected\b", ("Outcome",), under="solver") == []
    assert bare_literals({"sat", "unsat", "unknown"}, r"\bstatus\b", under="check") == []
    assert bare_literals({*ProveStatus, *ClaimHolds}, r"\bstatus\b|\bholds\b", under="prove") == []
    # a measured row's status
    assert bare_literals(RowStatus, r"\bstatus\b", ("Row",), under="measure") == []


# --------------------------------------------------------------------------- override targets and verbs


def test_override_words_are_members():
    from placement_logic.ir.overrides import OverrideTarget, OverrideVerb

    assert bare_literals(OverrideVerb, r"\bverbs?\b") == []
    assert bare_literals(OverrideTarget, r"\btargets?\b") == []
