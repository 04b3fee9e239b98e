"""A norm reduction the grad norm's rank sets over several axes replace: PL506.

``override clip_norm: reduce_sets over (A, B) ranks (...)`` sums every rank's squared norm over the devices of its
set, in place of each group's norm reduction over A and B (docs/semantics.md, "Global reductions"). A
``clip_norm[g]: reduce over (AXES)`` statement whose axes are all among the sets' then changes nothing the step
computes; it changed only the reference the sets were judged against (the derived group of g over those axes), so a
plan whose sets are right was refuted where that statement counts replicated copies (an HSDP norm's groups summed
over the replicate axis). Refused as a statement that changes nothing, as every such construct is.

Input: the plan and the sets statement. Output: nothing, or a ``DiagnosticError`` at the replaced statement."""

from __future__ import annotations

from ..diagnostics import Code, Diagnostic, DiagnosticError
from ..ir.overrides import OverrideTarget, OverrideVerb
from .subgroups import head


def check(plan, sets) -> None:
    for o in plan.overrides:
        if o.target == OverrideTarget.CLIP_NORM and o.verb == OverrideVerb.REDUCE and o.axes \
                and set(o.axes) <= set(sets.axes):
            who = f"clip_norm[{o.group}]" if o.group is not None else "clip_norm"
            raise DiagnosticError([Diagnostic(
                Code.OVERRIDE_NO_EFFECT, f"override {who}: reduce over ({', '.join(o.axes)}) changes nothing: "
                f"{head(sets)} (line {sets.span.line}) sums every rank's squared norm over its set in place of each "
                "group's norm reduction over those axes; drop it", o.span)])
