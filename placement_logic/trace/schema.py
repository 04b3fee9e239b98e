"""The trace file: its schema name and version, and reading one back (no torch).

A trace is JSON (docs/json.md, "Trace files"): ``schema`` = ``TRACE_SCHEMA``,
``version`` = ``VERSION``, the world size, the script and its arguments, and one object
per rank. ``load_trace`` returns the dict or raises a located ``PL612`` diagnostic:
unreadable file (not a regular file, over 256 MiB), not JSON (or nested too deep, an
integer too long), another schema, another version, a rank missing, an entry of the wrong
type (its path named: ``ranks[0].collectives[3].kind: expected a string``).
"""

from __future__ import annotations

import json

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span

TRACE_SCHEMA = "placement-trace"
VERSION = 1

RANK_KEYS = ("rank", "world", "meshes", "collectives", "unrecognised", "steps")


def _bad(path: str, message: str, line: int = 1) -> DiagnosticError:
    return DiagnosticError([Diagnostic(Code.BAD_TRACE, f"{message}", Span.point(path, line, 1))])


# The types of a trace's entries (docs/json.md, "Trace files"): a key -> (type, required). A type
# is a Python type or tuple of types, ``[T]`` a list of T, a dict a nested object, ``None`` anything.
_NUM = (int, float)
_FRAME = {"file": (str, True), "line": (int, True), "function": (str, False), "code": (str, False)}
_COLLECTIVE = {"seq": (int, True), "step": (int, True), "phase": (str, True), "kind": (str, True),
               "ranks": ([int], True), "stack": ([_FRAME], True), "dtype": (str, False), "bytes": (int, False),
               "numel": (int, False), "op": (str, False), "api": (str, False), "carried": ([str], False),
               "inputs_reduced": ([int], False), "value_in": (_NUM + (type(None),), False),
               "value_out": (_NUM + (type(None),), False), "micro": (int, False), "vector_in": ([_NUM], False),
               "module": (str, False), "custom_backward": (str, False), "sums": ([_NUM], False),
               "origin": (str, False), "grads_read": ([int], False), "statistic_of": (str, False),
               "offset": ({"value": (_NUM, True), "at": (_FRAME, True)}, False)}
_UNRECOGNISED = {"seq": (int, True), "op": (str, True), "phase": (str, False), "stack": ([_FRAME], True)}
_GRAD = {"checksum": ((str, type(None)), False), "placements": ([str], False), "collectives": ([int], False),
         "scales": (list, False), "dynamic_scales": ([str], False), "dynamic_at": (list, False),
         "dynamic_values": ([float], False)}
_PARAM = {"name": (str, True), "shape": ([int], True), "local_shape": ([int], False), "dtype": (str, False),
          "checksum": (str, False), "mesh_dims": ([str], False), "placements": ([str], False),
          "grad": ((_GRAD, type(None)), False)}
_OPTIMIZER = {"class": (str, False), "stack": ([_FRAME], False), "state_bytes": (int, False),
              "param_elements": (int, False), "inner": (list, False), "params": ([_PARAM], False)}
_DRAW = {"op": (str, True), "sha": (str, True), "samples": (int, False), "stack": ([_FRAME], True)}
_STEP = {"step": (int, True), "seed": (int, False),
         "inputs": ([{"module": (str, False), "shape": (list, False), "checksum": (str, False),
                      "values": ([int], False), "position_ids": ([int], False), "stack": ([_FRAME], False)}], False),
         "nll": ([{"reduction": (str, False), "tokens": (int, False), "positions": (int, False),
                   "value": (_NUM, False), "stack": ([_FRAME], False), "target": ([int], False),
                   "label_smoothing": (_NUM, False), "classes": (int, False), "width": (int, False),
                   "input_collectives": ([int], False),
                   "stats": ({k: (_NUM, True) for k in ("zsq_true", "zsq_local", "smooth_true", "smooth_local")},
                             False),
                   "mask": ({"sum": (int, True), "labelled": (int, False), "value": (_NUM, True), "stack": ([_FRAME], False)}, False)}],
                 False),
         "terms": ([{"ce": (_NUM, True), "other": (_NUM, True), "micro": (int, False), "stack": ([_FRAME], False)}],
                   False),
         "losses": ([{"value": (_NUM, False), "stack": ([_FRAME], False)}], False),
         "grads_before": ({"carried": ((bool, type(None)), True), "names": ([str], False)}, False),
         "grads_between": ([(bool, type(None))], False),
         "router": ([{"width": (int, True), "rows": (int, True), "colsum": ([_NUM], True), "counts": ([int], False),
                      "top_k": (int, False), "micro": (int, False), "stack": ([_FRAME], False),
                      "capacity": (int, False), "kept": ([int], False), "entered": ([int], False), "masked": ([int], False),
                      "capacity_stack": ([_FRAME], False),
                      "input": ({"sha": (str, True), "lin": ([_NUM], True), "abs": (_NUM, True), "numel": (int, True),
                                 "stack": ([_FRAME], False)},
                                False),
                      "noise_stack": ([_FRAME], False), "chosen": (str, False), "gates": (str, False),
                      "choice_stack": ([_FRAME], False), "sampled": ([_DRAW], False)}], False),
         "draws": ([{**_DRAW, "micro": (int, False)}], False),
         "recomputed": ([{"module": (str, False), "stack": ([_FRAME], False)}], False),
         "attention_masks": ([{"micro": (int, False), "shape": ([int], True), "values": ([int], True),
                               "keyword": (bool, False), "stack": ([_FRAME], False)}], False),
         "optimizer": ((_OPTIMIZER, type(None)), False),
         "modules": ([{"name": (str, False), "class": (str, False), "input": ((str, type(None)), False),
                       "output": ((str, type(None)), False), "collectives": ([int], False),
                       "stack": ([_FRAME], False), "at": (_FRAME, False),
                       "partial": ({"recomputed": (bool, True), "dtensor": (bool, False), "rows": (int, False),
                                    "product": (_NUM, False), "product_abs": (_NUM, False), "output": (_NUM, False),
                                    "output_abs": (_NUM, False), "bias": (_NUM, False), "residuals": ([_NUM], False),
                                    "sums": ([_NUM], False)},
                                   False)}], False)}
_MESH = {"shape": ([int], True), "dim_names": ([str], False), "ranks": (list, True)}
_RANK = {"rank": (int, True), "world": (int, True), "meshes": ([_MESH], True), "collectives": ([_COLLECTIVE], True),
         "unrecognised": ([_UNRECOGNISED], True), "steps": ([_STEP], True), "exit_status": (int, False),
         "error": ({"message": (str, False), "file": (str, False), "line": (int, False)}, False),
         "unmodelled": ([{"what": (str, True), "detail": (str, False), "phase": (str, False), "step": (int, False),
                          "stack": ([_FRAME], True)}], False),
         "seeds": ([{"seed": (str, True), "step": (int, False), "stack": ([_FRAME], True)}], False),
         "asserted": ([{"placements": ([str], True), "groups": ([[int]], True), "checksum": ((str, type(None)), False),
                        "phase": (str, False), "step": (int, False), "module": (str, False),
                        "stack": ([_FRAME], True)}], False),
         "dropouts": ([{"p": (_NUM, False), "input": (str, True), "output": (str, True), "step": (int, False),
                        "module": (str, False), "stack": ([_FRAME], True)}], False),
         "checkpoints": ([{"op": (str, True), "api": (str, True), "file": (str, True), "states": ([str], True),
                           "sharded": ([str], False), "rng": ([(str, type(None))], False), "unread": (bool, False),
                           "elements": (dict, False), "held": (dict, False),
                           "rng_before": (str, False), "rng_after": (str, False),
                           "step": (int, False), "stack": ([_FRAME], True)}], False),
         "registration": ([{"params": ([list], True)}], False)}


def _type_name(t) -> str:
    if isinstance(t, list):
        return f"a list of {_type_name(t[0])}"
    if isinstance(t, dict):
        return "an object"
    if isinstance(t, tuple):
        return " or ".join(_type_name(x) for x in t)
    return {int: "an integer", float: "a number", str: "a string", list: "a list", type(None): "null",
            bool: "true or false"}.get(t, t.__name__)


def _conforms(value, t) -> bool:
    if isinstance(t, tuple):
        return any(_conforms(value, x) for x in t)
    if isinstance(t, list):
        return isinstance(value, list)
    if isinstance(t, dict):
        return isinstance(value, dict)
    if t is int or t is float:
        return isinstance(value, (int, float) if t is float else int) and not isinstance(value, bool)
    return isinstance(value, t)


def _check(value, t, where: str, path: str) -> None:
    """``value`` of type ``t`` (iteratively: a hand-edited trace cannot exhaust the stack)."""
    stack = [(value, t, where)]
    while stack:
        v, ty, at = stack.pop()
        if not _conforms(v, ty):
            shown = json.dumps(v)[:40] if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__
            raise _bad(path, f"a record of the trace does not fit the schema: {at}: expected {_type_name(ty)}, "
                       f"found {shown}")
        if isinstance(ty, tuple):
            ty = next(x for x in ty if _conforms(v, x))
        if isinstance(ty, list):
            stack.extend((x, ty[0], f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(ty, dict):
            for key, (kt, required) in ty.items():
                if key in v:
                    stack.append((v[key], kt, f"{at}.{key}"))
                elif required:
                    raise _bad(path, f"a record of the trace does not fit the schema: {at}: missing {key}")


def validate(trace: object, path: str = "<trace>") -> dict:
    if not isinstance(trace, dict) or trace.get("schema") != TRACE_SCHEMA:
        raise _bad(path, f"not a placement trace (expected \"schema\": \"{TRACE_SCHEMA}\")")
    if trace.get("version") != VERSION:
        raise _bad(path, f"trace schema version {trace.get('version')!r}; this placement reads version {VERSION}")
    world = trace.get("world")
    ranks = trace.get("ranks")
    if not isinstance(world, int) or isinstance(world, bool) or not isinstance(ranks, list) or sorted(
            r.get("rank") if isinstance(r.get("rank"), int) else -1 for r in ranks if isinstance(r, dict)) \
            != list(range(world)):
        raise _bad(path, "the trace does not hold one entry per rank 0..world-1")
    for r in ranks:
        missing = [k for k in RANK_KEYS if k not in r]
        if missing:
            raise _bad(path, f"rank {r.get('rank')}: missing {', '.join(missing)}")
    for i, r in enumerate(ranks):
        _check(r, _RANK, f"ranks[{i}]", path)
    return trace


MAX_TRACE_BYTES = 256 * 1024 * 1024  # a trace larger than this is not one placement trace wrote


def load_trace(path: str) -> dict:
    """The validated trace in ``path``: a regular file of at most ``MAX_TRACE_BYTES`` (a FIFO or a
    device is refused before it is opened, so reading cannot block), bounded JSON, every entry
    of the documented type."""
    import os
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file")
        if st.st_size > MAX_TRACE_BYTES:
            raise OSError(0, f"larger than {MAX_TRACE_BYTES // (1024 * 1024)} MiB")
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_TRACE_BYTES + 1)
        if len(text) > MAX_TRACE_BYTES:
            raise OSError(0, f"larger than {MAX_TRACE_BYTES // (1024 * 1024)} MiB")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DiagnosticError([Diagnostic(Code.UNREADABLE_FILE, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                                          Span.point(path, 1, 1))]) from None
    from ..frontend.configs import load_json

    trace = load_json(text, path, Code.BAD_TRACE, "JSON")
    return validate(trace, path)
