"""The model a search prices, and a structure written as a spec (sizes as symbols or literals)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from .. import hardware as hw
from .. import ir
from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..frontend import surface
from ..frontend.loader import load_string
from ..frontend.parser import parse
from .space import _LIBRARY, _RECOMPUTE_USE, INTER_NODE, KV_COPIES, ONE_CHUNK, SIZE_SYMBOLS, Structure, inter_node

# --------------------------------------------------------------------------- the model


def model_text(path: str, seq: int) -> tuple[str, ir.TransformerShape, str]:
    """The model block of a spec or a config.json, with the batch written as symbols
    (``seq = S  microbatch = mb  microbatches = nmb``), the lets it may need, and its shape."""
    p = Path(path)
    if p.suffix == ".json":
        block = f'model from "{p.resolve()}" {{\n  seq = {seq}\n  microbatch = mb\n  microbatches = nmb\n}}\n'
        shown = f'model from "{path}" {{\n  seq = {seq}\n  microbatch = mb\n  microbatches = nmb\n}}\n'
        spec = load_string(_lets(1, 1) + block, "<search>", p.resolve().parent)
        return block, spec.model.transformer, shown
    from ..frontend.files import read_source

    text = read_source(str(p))
    module = parse(text, str(p))
    lines = text.splitlines(keepends=True)
    blocks = [i for i in module.items if isinstance(i, surface.ModelBlock)]
    if not blocks:
        raise DiagnosticError([Diagnostic(Code.SEARCH_INPUT, f"{path} has no model block to search for",
                                          Span.point(str(p), 1, 1))])
    mb = blocks[0]
    lets = "".join(_slice(lines, i.span) + "\n" for i in module.items if isinstance(i, surface.LetStmt)
                   and i.name not in SIZE_SYMBOLS)
    kept = []
    for item in mb.items:
        if isinstance(item, surface.Prop) and item.key in ("seq", "microbatch", "microbatches"):
            continue
        kept.append("  " + _slice(lines, item.span))
    head = "model" + (f' from "{(p.parent / mb.source).resolve()}"' if mb.source else "")
    body = "\n".join(kept + [f"  seq = {seq}", "  microbatch = mb", "  microbatches = nmb"])
    block = f"{lets}{head} {{\n{body}\n}}\n"
    spec = load_string(_lets(1, 1) + block, str(p), p.resolve().parent)
    if spec.model is None or spec.model.transformer is None:
        raise DiagnosticError([Diagnostic(Code.SEARCH_INPUT, "the search needs a transformer shape (FLOPs and divisibility "
                                          "come from it)", mb.span)])
    return block, spec.model.transformer, block


def _slice(lines: list[str], s: Span) -> str:
    if s.line == s.end_line:
        return lines[s.line - 1][s.column - 1:s.end_column - 1]
    out = [lines[s.line - 1][s.column - 1:]] + lines[s.line:s.end_line - 1] + [lines[s.end_line - 1][:s.end_column - 1]]
    return "".join(out).rstrip()


def _lets(mb: int, nmb: int) -> str:
    return f"let mb = {mb}\nlet nmb = {nmb}\n"


# --------------------------------------------------------------------------- specs


def spec_text(block: str, structure: Structure, sizes: dict, device: str, mfu: Fraction | None,
              literal: bool = False) -> str:
    """A spec for one structure: sizes as symbols (``literal``: as numbers)."""
    s = structure
    per_node = hw.device(device).per_node
    imports = [("from std.offload import " if s.strategy == "offload" else "from std.data import ")
               + _LIBRARY.get(s.strategy, s.strategy)]
    if "tp" in s.axes:
        imports.append("from std.tensor import megatron_sp")
    if "pp" in s.axes:
        imports.append("from std.pipeline import " + ("interleaved_1f1b" if s.schedule == "interleaved"
                                                         else "one_f_one_b"))
    if "cp" in s.axes:
        imports.append("from std.context import context_parallel")
    if "ep" in s.axes and not s.folded:
        imports.append("from std.expert import expert_parallel")
    if s.recompute != "none":
        imports.append("from std.recompute import " + ("selective_recompute" if s.recompute == "selective"
                                                       else "full_recompute"))
    mesh = [f"  device = {device}"]
    if mfu is not None:
        mesh.append(f"  mfu = {mfu.numerator}/{mfu.denominator}" if mfu.denominator != 1 else f"  mfu = {mfu}")
    if literal:  # the links of these sizes: the facts the structure's rows share (enumeration)
        crossing = {a: bool(x) for a, x in inter_node(per_node, sizes.get("tp", 1), sizes.get("cp", 1),
                                                      sizes.get("ds", 1)).items()}
    else:
        crossing = {a: INTER_NODE[a] in s.facts for a in INTER_NODE}
    # a placeholder size where a derivation reads the declared number (K/V heads copied over tp)
    held = dict(("tp", int(f[len(KV_COPIES):])) for f in s.facts if f.startswith(KV_COPIES))
    for a in ("dp", "tp", "pp", "cp", "ep"):
        if a != "dp" and a not in s.axes:
            continue
        link = "inter_node" if crossing.get(a, True) else "intra_node"
        mesh.append(f"  {a} = {sizes[a] if literal else held.get(a, 2)} @ {link}")
        if a == "dp" and s.strategy == "hsdp":  # the shard group inside a node when it fits there
            link = "inter_node" if crossing["ds"] else "intra_node"
            mesh.append(f"  ds = {sizes['ds'] if literal else 2} @ {link}")
    plan = ["  [dp, ds]: hybrid_shard" if s.strategy == "hsdp" else f"  dp: {_LIBRARY.get(s.strategy, s.strategy)}"]
    if "tp" in s.axes:
        plan.append("  tp: megatron_sp")
    if "pp" in s.axes:
        chunks = sizes["nv"] if literal else 1 if ONE_CHUNK in s.facts else "nv"
        plan.append("  pp: " + (f"interleaved_1f1b(v = {chunks})"
                                 if s.schedule == "interleaved" else "one_f_one_b"))
    if "cp" in s.axes:
        plan.append("  cp: context_parallel")
    if "ep" in s.axes:  # folded: a data axis of the dense layers, under the same strategy
        plan.append("  ep: " + ("expert_parallel" if not s.folded else _LIBRARY.get(s.strategy, s.strategy)))
    if s.folded:  # the experts' expert axes: ep × tp × cp, expert tensor size 1
        roles = ", ".join(f"{a}: expert" for a in ("ep", "tp", "cp") if a in s.axes)
        cut = block.rstrip().rfind("}")
        block = block[:cut] + f"  group experts {{ role = {{{roles}}} }}\n" + block[cut:]
    plan += _optimizer_lines(s)
    lets = f"let mb = {sizes['mb'] if literal else 1}\nlet nmb = {sizes['nmb'] if literal else 1}\n"
    if not literal and s.schedule == "interleaved" and ONE_CHUNK not in s.facts:
        lets += "let nv = 2\n"
    return ("\n".join(imports) + "\n\n" + lets + "\n" + block + "\nmesh {\n" + "\n".join(mesh) + "\n}\n\n"
            + "plan searched {\n" + "\n".join(plan) + "\n" + _RECOMPUTE_USE[s.recompute] + "  flash_attention\n}\n")


def _optimizer_lines(s: Structure) -> list[str]:
    """Muon on the matrices: each matrix owned whole by one rank of the data axes (the state
    partitioned by whole matrices; replicated under ddp, the owners' updates all-gathered), the
    tensor axis's pieces gathered on every tensor rank (Megatron-LM's duplicated mode)."""
    if s.optimizer == "adamw":
        return []
    data = ["dp"] + (["ds"] if s.strategy == "hsdp" else []) + [a for a in ("cp", "ep") if a in s.axes]
    out = ["  optimizer {", "    matrices = muon(ns_steps = 5)", "  }",
           f"  override optimizer[matrices]: round_robin over ({', '.join(data)})"]
    if "tp" in s.axes:
        out.append("  override optimizer[matrices]: gather over (tp)")
    return out
