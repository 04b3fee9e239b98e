"""Design-space search: which parallel configuration fits a device, and which is fastest.

Input: a model (a spec's model block or a Hugging Face ``config.json``), a catalogue device,
a device count, a global batch (sequences) and a sequence length, and the space a user
allows (``Space``). Output: every candidate evaluated (``Result``), the fitting ones ranked by
step time, the Pareto frontier of memory against time, and the winners re-derived exactly
and checked.

How: candidates share a few *structures* (data strategy × recompute × schedule × which axes
have more than one device × what a derivation decides from a size's value rather than its
symbol: one interleaved chunk per stage, which axes' groups cross a node, K/V heads copied over
the tensor ranks; ``space.Structure.facts``), so a structure's closed forms are those of each of
its rows written with literal sizes. Each structure is written as a spec with its sizes as symbols,
derived once (exact closed forms: peak memory per device, step time, MFU), written as a
straight-line program over numpy arrays (``search.program``; cached by the structure's spec
text, in the process and on disk, so a repeated structure is neither derived nor compiled
again) and evaluated over every size assignment the divisibility mask keeps, the programs of
the structures over the same rows merged and evaluated together (``search.evaluation``). Every size assignment honours divisibility: heads, kv heads and the
vocabulary over tp, layers over pp × chunks, experts over ep, the sequence over cp, the global
batch over dp × ep × microbatch; a row is ranked or put on the frontier only after the check
every re-bound value meets (``resolve.validate``) accepts its sizes. Winners then get their
figures in exact arithmetic (bytes to the byte, seconds as rationals): the structure's exact
figures, compiled once from the same derivation and cached beside its program
(``search.exactforms``), evaluated in rationals at the winner's sizes (a winner whose sizes
the structure's facts do not hold is written as a spec with literal sizes and derived on its
own), and are checked with ``check``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import time
from fractions import Fraction
from typing import Callable

import sympy

from .. import cache as store
from .. import hardware as hw
from .. import ir
from ..costs import derive, steptime, with_sizes
from ..costs.compiled import cost_exprs
from ..costs.extrema import exact_at, rational_values
from ..costs.symbolic import symbol
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span, did_you_mean
from ..frontend.loader import load_string
from ..resolve.validate import rebinding_diagnostics
from . import evaluation, exactforms, parallel, program
from .enumeration import enumerate_space
from .ranking import by_robustness, error_band, same_row
from .space import (
    AXES,
    COLLAPSED,
    DEFAULT_STRATEGIES,
    RECOMPUTE,
    SCHEDULES,
    SIZE_SYMBOLS,
    STRATEGIES,
    Candidate,
    Result,
    Space,
    Structure,
    row_facts,
)
from .specs import model_text, spec_text

__all__ = ["AXES", "COLLAPSED", "DEFAULT_STRATEGIES", "RECOMPUTE", "SCHEDULES", "SIZE_SYMBOLS", "STRATEGIES",
           "Candidate", "Result", "Space", "Structure", "concrete_spec", "emitted_spec", "enumerate_space", "exact",
           "model_text", "needs_numpy", "run", "spec_text", "by_robustness", "error_band"]


# --------------------------------------------------------------------------- evaluation


def _derived(text: str):
    """The structure's spec (sizes as placeholders), its derivation and its step time."""
    spec = _structure_spec(text)  # loaded once: its rows are validated with it too
    plan = spec.plans[0]
    pc = derive(plan)
    return spec, pc, steptime.step_time(pc, plan.mesh.hardware)


def _forms(text: str):
    """The structure's spec (sizes as placeholders) and its closed forms: peak memory per
    device, step time, MFU and bytes sent."""
    spec, pc, st = _derived(text)
    return spec, (pc.memory.device_total, st.step, st.mfu, pc.communication.total_bytes)


_COMPILED: dict = {}  # structure key -> its evaluator, for this process
_PROGRAMS: dict = {}  # structure key -> its program (or its lambdified forms), for this process
_EXACT_FORMS: dict = {}  # structure key -> its exact figures' record (``exactforms``), or None, for this process
_DERIVED: dict = {}  # structure key -> its derivation and step time, kept for its exact record (the latest 1,024)
_EXACT_FNS: dict = {}  # structure key -> (its spec, its compiled exact figures), or None, for this process


def _key(text: str) -> str:
    """A structure's content address: the tool's source, sympy's release, the size columns and its spec text."""
    return hashlib.sha256("\0".join((store.source_hash(), sympy.__version__, ",".join(SIZE_SYMBOLS), text)).encode()
                          ).hexdigest()


def _keep_exact(k: str, pc, st) -> None:
    """The exact figures' record of a structure's derivation, kept in the process and on disk."""
    record = exactforms.build(pc, st, SIZE_SYMBOLS)
    _EXACT_FORMS[k] = record
    if record is not None and store.enabled():
        store.write("exact-structures", k, record)


def _program(text: str):
    """The structure's forms as a program over size columns in ``SIZE_SYMBOLS`` order
    (``search.program``): read from this process's table or the on-disk cache when the same
    spec text was compiled by the same tool (its source) with the same sympy before
    (content-addressed), else derived, built and stored; a structure whose forms the program
    does not cover gives its forms compiled with ``lambdify`` instead (a function; not stored)."""
    k = _key(text)
    if k in _PROGRAMS:
        return _PROGRAMS[k]
    prog = program.load(store.read("structures", k)) if store.enabled() else None
    if prog is None or tuple(prog["names"]) != SIZE_SYMBOLS or len(prog["outputs"]) != 4:
        _, pc, st = _derived(text)
        # kept for the structure's exact record, built if one of its rows is ranked (most are not)
        _DERIVED[k] = (pc, st)
        while len(_DERIVED) > 1024:
            _DERIVED.pop(next(iter(_DERIVED)))
        forms = (pc.memory.device_total, st.step, st.mfu, pc.communication.total_bytes)
        prog = program.build(forms, SIZE_SYMBOLS)
        if prog is None:
            prog = program.lambdified(list(forms), SIZE_SYMBOLS)
        elif store.enabled():
            store.write("structures", k, prog)
    _PROGRAMS[k] = prog
    return prog


def _built(text: str):
    """A structure's program derived in a worker process (``parallel``): ``None`` where its spec
    refuses it or its forms are lambdified (the parent derives those itself)."""
    try:
        prog = _program(text)
    except DiagnosticError:
        return None
    return None if callable(prog) else prog


def _prefetch(jobs: int, tick: Callable[[int, str], None]) -> Callable[[list[str]], None]:
    """The structures not met before (in this process or the structure cache) derived on ``jobs``
    processes, their programs kept as ``_program`` keeps its own."""
    def prefetch(texts: list[str]) -> None:
        new = [t for t in dict.fromkeys(texts) if _key(t) not in _PROGRAMS
               and not (store.enabled() and store.read("structures", _key(t)) is not None)]
        for text, prog in parallel.derive_all(new, _built, jobs, tick).items():
            if prog is not None:
                _PROGRAMS[_key(text)] = prog
    return prefetch


def _evaluator(text: str) -> Callable:
    """The structure's forms compiled (``_program``), a function of the size columns."""
    k = _key(text)
    if k not in _COMPILED:
        prog = _program(text)
        _COMPILED[k] = prog if callable(prog) else _columns(program.compile(prog))
    return _COMPILED[k]


def _columns(run: Callable) -> Callable:
    return lambda *columns: run(list(columns))


@functools.lru_cache(maxsize=512)
def _structure_spec(text: str):
    """A structure's spec, loaded when a row of it is validated (once per process)."""
    return load_string(text, "<search>", None, shared=True)


def _valid(spec, sizes: dict) -> bool:
    """Whether a size assignment of a structure's spec passes the checks its sizes written in a
    file pass (``resolve.validate``: PL107, PL130, PL131, PL133): the one check every re-bound
    value meets, applied to each row before it is ranked or put on the frontier."""
    bound = {n for n, _ in spec.bindings}
    return not rebinding_diagnostics(spec, {n: Fraction(v) for n, v in sizes.items() if n in bound})


def needs_numpy() -> None:
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise DiagnosticError([Diagnostic(
            Code.SEARCH_INPUT, "placement search evaluates its candidates with numpy, which is not installed",
            Span("<command line>", 1, 1, 1, 2),
            notes=("install it with: pip install 'placement-logic[search]'",))]) from None


def run(model: str, space: Space, top: int = 10, check: bool = True,
        progress: Callable[[int, int, str], None] | None = None, jobs: int | None = None) -> Result:
    """The search. ``progress(done, total, label)`` is called before each structure is derived
    and compiled and before each ranked row is re-derived exactly (and checked): ``total`` is
    the structures plus the rows to re-derive (at most ``top`` until the ranking is known).
    ``jobs``: the processes that derive the structures not met before (``search.parallel``;
    default: one per core this process may use; 1: in this process alone)."""
    needs_numpy()
    import numpy as np

    if hw.device(space.device) is None:
        raise DiagnosticError([Diagnostic(Code.FILTER_ON_SHARDS, f"--device {space.device}: not a device of the catalogue",
                                          Span("<command line>", 1, 1, 1, 2),
                                          notes=did_you_mean(space.device, tuple(hw.DEVICES)))])
    t0 = time.perf_counter()
    block, shape, shown = model_text(model, space.seq)
    every = enumerate_space(space, shape)
    groups = {k: v for k, v in every.items() if v[1].any()}
    # the grid points of every structure with a valid row, whatever part of it (its facts) they fall in
    live = {dataclasses.replace(k, facts=()) for k in groups}
    candidates = sum(len(v[0]) for k, v in every.items() if dataclasses.replace(k, facts=()) in live)
    result = Result(space, shown, candidates, structures=len(groups))
    result.block = block
    t1 = time.perf_counter()
    capacity = hw.device(space.device).memory - space.reserve
    total = len(groups) + max(top, 0)
    texts: dict = {}  # structure -> its spec text, sizes as placeholders

    def tick(done: int, label: str) -> None:
        if progress is not None:
            progress(done, total, label)

    with evaluation.fewer_collections():
        parts, derive_s, evaluate_s = evaluation.evaluate(
            groups, block, space, texts, tick, _program, time.perf_counter,
            _prefetch(parallel.default_jobs() if jobs is None else jobs, tick))
    t2 = time.perf_counter()
    result.valid = sum(len(p[1]) for p in parts)
    result.parts = parts
    # rank the fitting rows of every structure by step time, then memory
    if parts:
        allv = np.concatenate([v for _, _, v in parts])
        where = np.concatenate([np.stack([np.full(len(v), i), np.arange(len(v))], axis=1) for i, (_, _, v) in
                                enumerate(parts)])
        fit = np.nonzero(allv[:, 0] <= capacity)[0]
        order = fit[np.lexsort((allv[fit, 0], allv[fit, 1]))]
        ranked = [tuple(where[o]) for o in order]
    else:
        ranked = []
    result.fitting = len(ranked)

    def candidate(i, j) -> Candidate:
        s, sizes, v = parts[i]
        z = {n: int(sizes[j, c]) for c, n in enumerate(SIZE_SYMBOLS)}
        return Candidate(s, z, float(v[j, 0]), float(v[j, 1]), float(v[j, 2]), float(v[j, 3]), True)

    judged: dict = {}

    def valid(i, j) -> bool:  # the numpy mask is the fast filter; no row is ranked that this refuses
        if (i, j) not in judged:
            s, sizes, _ = parts[i]
            judged[i, j] = _valid(_structure_spec(texts[s]), {n: int(sizes[j, c]) for c, n in enumerate(SIZE_SYMBOLS)})
        return judged[i, j]

    best = math.inf
    for i, j in ranked:  # fastest first: on the frontier when it needs less memory than every faster one
        m = parts[i][2][j, 0]
        if m < best and valid(i, j):
            c = candidate(i, j)
            c.frontier = True
            result.frontier.append(c)
            best = m
    kept: list = []
    twins: dict = {}  # a kept row -> rows of other strategies with the same sizes and figures (merged if exact)
    for i, j in ranked:
        full = len(kept) >= max(top, 0)
        if full and not (kept and (parts[i][2][j, :2] == parts[kept[-1][0]][2][kept[-1][1], :2]).all()):
            break  # past the top rows and past the ties of the last (where its twins are)
        if valid(i, j):
            twin = next((k for k in kept if same_row(parts, k, (i, j))), None)
            if twin is not None:
                twins.setdefault(twin, []).append((i, j))
            elif not full:
                kept.append((i, j))
    result.ranked = [candidate(i, j) for i, j in kept]
    for c in result.ranked:
        c.frontier = any(f.sizes == c.sizes and f.structure == c.structure for f in result.frontier)
    t3 = time.perf_counter()
    total = len(groups) + len(result.ranked) + sum(map(len, twins.values()))
    rows, n = [], 0
    for key, c in zip(kept, result.ranked):
        rows.append(c)
        for t in [c] + [candidate(i, j) for i, j in twins.get(key, [])]:
            tick(len(groups) + n, ("checking " if check else "re-deriving ") + t.label())
            n += 1
            exact(t, block, space, check)
            if t is c:
                continue
            same = (t.exact_memory, t.exact_step, t.stage_memory, t.link_bytes, t.verdict) == \
                (c.exact_memory, c.exact_step, c.stage_memory, c.link_bytes, c.verdict)
            if same:
                c.same.append(t.structure.strategy)
            else:  # the vectorised figures agreed, the exact ones do not: a row of its own
                t.frontier = c.frontier
                rows.append(t)
    result.ranked = by_robustness(rows, error_band(space))
    tick(total, "done")
    result.timings = {"setup": t1 - t0, "derive_and_compile": derive_s, "evaluate": evaluate_s,
                      "filter": t2 - t1 - derive_s - evaluate_s,
                      "rank": t3 - t2, "exact_and_check": time.perf_counter() - t3}
    return result


def concrete_spec(c: Candidate, block: str, space: Space) -> str:
    text = spec_text(block, c.structure, c.sizes, space.device, space.mfu, literal=True)
    return text


_EXACT: dict = {}  # (concrete spec text, sizes) -> the exact figures, for this process


def exact(c: Candidate, block: str, space: Space, check: bool = True) -> None:
    """A candidate's figures in exact arithmetic (and its check): the figures the report prints.
    Its structure's exact figures compiled once (``exactforms``: derived with the search's
    structure, kept in the process and in the structure cache) are evaluated at its sizes when
    the sizes belong to the structure (the facts it decides by value) and pass the checks a
    written value passes; otherwise the candidate is written as a spec with literal sizes and
    derived on its own (``derive_exact``), as every figure was before: the same numbers. The
    figures of a concrete spec already computed in this process are read back (a row ranked
    again by another search of the same space, or another output format of it)."""
    text = concrete_spec(c, block, space)
    key = (text, tuple(sorted(c.sizes.items())))
    if key not in _EXACT:
        _EXACT[key] = _structure_figures(c, block, space) or derive_exact(c, block, space)
    c.exact_memory, c.exact_step, stage, link, c.exposed = _EXACT[key]
    c.stage_memory, c.link_bytes = dict(stage), dict(link)
    c.agrees = abs(float(c.exact_memory) - c.memory) < 0.5 and \
        abs(float(c.exact_step) - c.step) <= 1e-9 * max(1.0, float(c.exact_step))
    if check:
        from ..check.run import check_plan
        from ..solver.session import Session

        spec = load_string(text, "<search>", None)
        plan = spec.plans[0]
        pinned = {a: c.sizes[a] for a in plan.mesh.names}
        report = check_plan(Session(timeout=20), spec, plan, pinned)
        c.verdict = report.verdict.word


def derive_exact(c: Candidate, block: str, space: Space) -> tuple:
    """The candidate written as a spec with literal sizes and derived on its own, then each
    figure's exact value: (memory, step, {stage: bytes}, {link: bytes}, exposed seconds)."""
    plan = load_string(concrete_spec(c, block, space), "<search>", None).plans[0]
    subs = {symbol(n): sympy.Integer(v) for n, v in c.sizes.items()}
    values = rational_values(subs)
    pc = derive(with_sizes(plan, subs), sized=True)
    st = steptime.step_time(pc, plan.mesh.hardware)

    def exact(form) -> Fraction:  # the value xreplace gives, computed over the tree (exact_at) where it can be
        v = exact_at(form, values)
        return v if v is not None else _fraction(form.xreplace(subs))

    exprs = cost_exprs(pc)
    stage = {k.split(".")[1]: exact(v) for k, v in exprs.items() if k.startswith("stage.") and k.endswith(".total")}
    link = {k[len("comm.link."):]: exact(v) for k, v in exprs.items() if k.startswith("comm.link.")}
    step = exact(st.step)
    return exact(pc.memory.device_total), step, stage, link, step - exact(st.compute + st.optimizer)


def _structure_figures(c: Candidate, block: str, space: Space) -> tuple | None:
    """The candidate's exact figures from its structure's compiled ones, or ``None`` where
    they do not apply or are not at hand (then ``derive_exact``)."""
    if set(c.sizes) != set(SIZE_SYMBOLS) or not all(isinstance(v, int) for v in c.sizes.values()):
        return None
    text = spec_text(block, c.structure, {}, space.device, space.mfu)
    k = _key(text)
    if k not in _EXACT_FNS:
        _EXACT_FNS[k] = _exact_fn(k, text)
    if _EXACT_FNS[k] is None:
        return None
    spec, fn = _EXACT_FNS[k]
    t = spec.model.transformer
    kv = t.kv_heads.value if isinstance(t.kv_heads, ir.Const) and t.kv_heads.value.denominator == 1 else None
    facts = row_facts(c.structure, c.sizes, hw.device(space.device).per_node, kv and int(kv), t.mla)
    if facts != set(c.structure.facts) or not _valid(spec, c.sizes):
        return None  # not a row of this structure, or one a file refuses: derived on its own
    return fn([c.sizes[n] for n in SIZE_SYMBOLS])


def _exact_fn(k: str, text: str):
    """A structure's spec and compiled exact figures: its record from this process, else from
    the structure cache, else built from the derivation this process's search made, else
    derived now (once; as the search derives it); ``None`` where the
    structure's spec is refused or a figure has a node exact arithmetic does not take."""
    try:
        spec = _structure_spec(text)
    except DiagnosticError:
        return None
    if k not in _EXACT_FORMS:
        record = exactforms.load(store.read("exact-structures", k)) if store.enabled() else None
        if record is not None:
            _EXACT_FORMS[k] = record
        elif k in _DERIVED:  # derived by this process's search
            _keep_exact(k, *_DERIVED[k])
        else:
            try:
                _, pc, st = _derived(text)
            except DiagnosticError:
                return None
            _keep_exact(k, pc, st)
    record = _EXACT_FORMS[k]
    if record is None or spec.model is None or spec.model.transformer is None:
        return None
    return spec, exactforms.compile(record)


def _fraction(v) -> Fraction:
    if not v.is_Rational:  # every size is bound: a number, or a bug
        raise AssertionError(f"an exact figure is not a number: {v}")
    return Fraction(int(v.p), int(v.q))


def emitted_spec(c: Candidate, result: Result) -> str:
    """The spec of a ranked configuration, to save and run ``cost`` and ``check`` on: its sizes
    literal, the model as the user named it."""
    sp = result.space
    head = (f"# {c.label()} on {sp.devices} x {sp.device}: global batch {sp.global_batch} x {sp.seq} tokens\n"
            "# written by placement search\n")
    return head + spec_text(result.model_text, c.structure, c.sizes, sp.device, sp.mfu, literal=True)
