"""``--objective KEY=VALUE`` of ``placement trace`` and ``placement lift``: the intended objective of a lifted term.

A trace shows what the script computes, not what it means to compute: the lift writes single-device training's
objective (the balancing loss's statistics over every token of the step, ``aux_stats = global_batch``). A script
meant to compute another one (Megatron-LM's per-microbatch balancing loss, DeepSeek's sequence-wise one) states
it: ``--objective aux_stats=per_microbatch`` writes that objective in the lifted model's ``losses`` section, and
the checker compares the script's path with it. Keys and values are the model's (``ir.losses``); anything else
is PL611 at the option.
"""

from __future__ import annotations

from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.losses import STATS_KEY, STATS_OBJECTIVES
from .options import command_line_span

OBJECTIVES: dict[str, tuple[str, ...]] = {STATS_KEY: STATS_OBJECTIVES}  # key -> its allowed values


def add_objective(p) -> None:
    p.add_argument("--objective", action="append", default=[], metavar="KEY=VALUE",
                   help="the intended objective of a lifted term, as the model's losses section states it: "
                        f"{STATS_KEY}={'|'.join(STATS_OBJECTIVES)} (default: single-device training's, "
                        f"{STATS_KEY}={STATS_OBJECTIVES[0]})")


def parse_objective(items: list[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict; a key or value the model does not have is PL611."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = (x.strip() for x in item.partition("="))
        if not sep or key not in OBJECTIVES:
            why = (f"expected KEY=VALUE with KEY one of {', '.join(OBJECTIVES)}" if not sep or not key
                   else f"no objective {key!r}: expected one of {', '.join(OBJECTIVES)}")
        elif value not in OBJECTIVES[key]:
            why = f"{key} = {value!r}: expected one of {', '.join(OBJECTIVES[key])}"
        elif key in out and out[key] != value:
            why = f"{key} stated twice ({out[key]}, {value})"
        else:
            out[key] = value
            continue
        raise DiagnosticError([Diagnostic(Code.BAD_TRACE_COMMAND, f"--objective {item}: {why}",
                                          command_line_span(f"--objective {item}"))])
    return out
