"""Machine-checked theorems of the framework, and the claims of specs, as obligations.

Input: optional ``ir.Spec`` objects (their ``claim`` statements) and a time limit.
Output: a ``ProveReport`` — every built-in obligation (memory and communication
derivations from the cost engine, the correctness theorem on the checker's step model,
the composition theorem over the library, the published claims) and every claim of the
given specs, each decided by z3 and re-decided by cvc5 from its SMT-LIB 2 text — and,
on request, those texts (``smt2_files``) for ``proofs/smt2/``.
"""

from __future__ import annotations

from typing import Callable

from .. import ir
from ..solver.query import Obligation
from ..solver.session import Session
from . import render  # noqa: F401 - gives ProveReport its Markdown view in a notebook
from .claims import claim_analyses
from .composition_theorem import breaker_obligations, family_obligations
from .correctness import necessity, sufficiency
from .derivations import comm_obligations, memory_obligations
from .engine import decide, export_texts
from .library_compositions import compositions
from .published import SPECS, published_spec
from .report import ClaimResult, ProveReport

__all__ = ["builtin", "prove", "smt2_files", "ProveReport", "GROUPS"]


GROUPS = ("memory", "comm", "correctness", "composition", "claims")


Progress = Callable[[int, "int | None", str], None]  # (done, total or None while unknown, what runs now)


def builtin(timeout: float = 10.0, only: tuple[str, ...] = GROUPS, progress: Progress | None = None
            ) -> tuple[list[Obligation], list[ClaimResult]]:
    """The built-in obligations of the selected groups, in report order, and the published claims."""
    sess = Session(timeout=timeout)
    obs: list[Obligation] = []

    def preparing(group: str) -> None:
        if progress is not None:
            progress(0, None, f"preparing the {group} obligations")

    if "memory" in only:
        preparing("memory")
        obs += memory_obligations()
    if "comm" in only:
        preparing("comm")
        obs += comm_obligations()
    if "correctness" in only:
        preparing("correctness")
        obs += [sufficiency()] + necessity(sess)
    if "composition" in only:
        preparing("composition")
        # the compositions are read for their verdicts only: their own session answers a query
        # repeated across plans from its first answer
        obs += family_obligations(compositions(Session(timeout=timeout, remember=True))) + breaker_obligations(sess)
    claims: list[ClaimResult] = []
    if "claims" in only:
        preparing("claims")
        for name in SPECS:
            for ca in claim_analyses(published_spec(name)):
                claims.append(ca.result)
                obs += list(ca.obligations)
    return obs, claims


def spec_claims(specs: list[ir.Spec]) -> tuple[list[Obligation], list[ClaimResult]]:
    obs: list[Obligation] = []
    claims: list[ClaimResult] = []
    for spec in specs:
        for ca in claim_analyses(spec):
            claims.append(ca.result)
            obs += list(ca.obligations)
    return obs, claims


def prove(specs: list[ir.Spec] = (), timeout: float = 10.0, only: tuple[str, ...] = GROUPS,
          second_solver: bool = True, progress: Progress | None = None) -> tuple[ProveReport, dict[str, str]]:
    """Decide every obligation; returns the report and the SMT-LIB text of each query.
    ``progress(done, total, key)`` is called before each obligation is decided."""
    obs, claims = builtin(timeout, only, progress)
    more, more_claims = spec_claims(list(specs))
    results, texts = [], {}
    every = obs + more
    for i, ob in enumerate(every):
        if progress is not None:
            progress(i, len(every), ob.key)
        result, text = decide(ob, timeout, second_solver)
        results.append(result)
        texts[ob.key] = text
    return ProveReport(tuple(results), tuple(claims + more_claims), timeout), texts


def smt2_files(timeout: float = 10.0) -> dict[str, str]:
    """relative path -> SMT-LIB 2 text of every built-in obligation (for proofs/smt2/)."""
    obs, _ = builtin(timeout)
    return {f"{key}.smt2": text for key, text in export_texts(obs).items()}
