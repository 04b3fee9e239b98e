"""The memory and communication derivation theorems, built from the cost engine.

Input: the library plans of ``library`` (symbolic Ψ = psi, N, K). Output: obligations
stating that the cost engine's closed forms equal the published accounting (ZeRO,
Rajbhandari et al. 2020, §5 and §7; PyTorch FSDP) for all Ψ > 0, K > 0 and integer
N ≥ 1, that the ZeRO stages are ordered by memory, and that ZeRO-1/2 move as much as
DP and ZeRO-3 (and FSDP FULL_SHARD) 1.5× DP in both traffic conventions.

The published formulas are written here by hand, from the papers; the engine's are
taken from ``costs.derive`` on the plans. The obligations compare the two.
"""

from __future__ import annotations

import sympy

from .. import costs
from ..costs.symbolic import symbol
from ..solver.query import Obligation
from .library import data_spec, hybrid_spec
from .symbolic_ob import INT, POS, relation

MEMORY = "Memory derivation"
COMM = "Communication derivation"

psi, K, N, R = symbol("psi"), symbol("K"), symbol("N"), symbol("R")
DOMAIN = {"psi": POS(), "K": POS(), "N": INT(1)}
NAMES = {
    "dp": "DP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
    "fsdp_full_shard": "FSDP FULL_SHARD", "fsdp_shard_grad_op": "FSDP SHARD_GRAD_OP",
    "hybrid_shard": "FSDP HYBRID_SHARD",
}

# Model-state bytes per device (params 2Ψ, grads 2Ψ, optimizer KΨ), as published.
PUBLISHED_MODEL_STATE = {
    "dp": (4 + K) * psi,
    "zero1": 4 * psi + K * psi / N,
    "zero2": 2 * psi + (2 + K) * psi / N,
    "zero3": (2 + 2 + K) * psi / N,
    "fsdp_full_shard": (2 + 2 + K) * psi / N,
    "fsdp_shard_grad_op": (2 + 2 + K) * psi / N,
}
PUBLISHED_TEXT = {
    "dp": "(4 + K)Ψ", "zero1": "4Ψ + KΨ/N", "zero2": "2Ψ + (2 + K)Ψ/N", "zero3": "(2 + 2 + K)Ψ/N",
    "fsdp_full_shard": "(2 + 2 + K)Ψ/N", "fsdp_shard_grad_op": "(2 + 2 + K)Ψ/N",
}
ORDER = ("dp", "zero1", "zero2", "zero3")


def _plan_cost(name: str) -> costs.PlanCost:
    spec = hybrid_spec() if name == "hybrid_shard" else data_spec()
    return costs.derive(spec.plan(name))


def _src(name: str, what: str) -> str:
    return f"cost engine: {what} of the library plan N: {name}"


def memory_obligations() -> list[Obligation]:
    obs = []
    dom_text = "∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 1"
    for name, published in PUBLISHED_MODEL_STATE.items():
        engine = _plan_cost(name).memory.model_state
        obs.append(relation(
            f"memory/{name}-model-state", MEMORY, f"{NAMES[name]} model state = {PUBLISHED_TEXT[name]}",
            f"{dom_text}: model_state({NAMES[name]}) = {PUBLISHED_TEXT[name]}",
            engine, published, "==", DOMAIN, _src(name, "model_state"),
            detail=(("engine", str(engine)),)))
    z3 = _plan_cost("zero3").memory.model_state.xreplace({K: 12})
    obs.append(relation(
        "memory/zero3-k12", MEMORY, "ZeRO-3 model state = 16Ψ/N with K = 12",
        "∀ Ψ > 0, N ∈ ℤ, N ≥ 1: model_state(ZeRO-3)|K=12 = 16Ψ/N",
        z3, 16 * psi / N, "==", {"psi": POS(), "N": INT(1)}, _src("zero3", "model_state, K = 12"),
        detail=(("engine", str(z3)),)))
    sgo = _plan_cost("fsdp_shard_grad_op").memory.device_total
    obs.append(relation(
        "memory/fsdp_shard_grad_op-peak", MEMORY, "FSDP SHARD_GRAD_OP peak = (4 + K)Ψ/N + 2Ψ (params kept gathered)",
        f"{dom_text}: memory(FSDP SHARD_GRAD_OP) = (2 + 2 + K)Ψ/N + 2Ψ",
        sgo, (4 + K) * psi / N + 2 * psi, "==", DOMAIN, _src("fsdp_shard_grad_op", "device peak"),
        detail=(("engine", str(sgo)),)))
    hyb = _plan_cost("hybrid_shard").memory.model_state
    obs.append(relation(
        "memory/hybrid_shard-model-state", MEMORY, "FSDP HYBRID_SHARD model state = (4 + K)Ψ/N_shard",
        "∀ Ψ > 0, K > 0, N, R ∈ ℤ, N, R ≥ 1: model_state(HYBRID_SHARD over (R, N)) = (2 + 2 + K)Ψ/N",
        hyb, (4 + K) * psi / N, "==", {**DOMAIN, "R": INT(1)}, _src("hybrid_shard", "model_state"),
        detail=(("engine", str(hyb)),)))
    for hi, lo in zip(ORDER, ORDER[1:]):
        a, b = _plan_cost(hi).memory.model_state, _plan_cost(lo).memory.model_state
        obs.append(relation(
            f"memory/order-{hi}-{lo}", MEMORY, f"{NAMES[hi]} ≥ {NAMES[lo]} for all sizes",
            f"{dom_text}: model_state({NAMES[hi]}) ≥ model_state({NAMES[lo]})",
            a, b, ">=", DOMAIN, _src(f"{hi}, {lo}", "model_state")))
        obs.append(relation(
            f"memory/order-{hi}-{lo}-strict", MEMORY, f"{NAMES[hi]} > {NAMES[lo]} when N ≥ 2",
            f"∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: model_state({NAMES[hi]}) > model_state({NAMES[lo]})",
            a, b, ">", {**DOMAIN, "N": INT(2)}, _src(f"{hi}, {lo}", "model_state")))
    return obs


def comm_obligations() -> list[Obligation]:
    obs = []
    dom = {"psi": POS(), "K": POS(), "N": INT(2)}
    dp = _plan_cost("dp").communication
    # DP alone, as published: an all-reduce of the 2Ψ-byte gradient.
    obs.append(relation(
        "comm/dp-ring", COMM, "DP ring bytes = 2(N − 1)/N · 2Ψ",
        "∀ Ψ > 0, N ∈ ℤ, N ≥ 1: comm(DP) = 2(N − 1)/N · 2Ψ  (ring all-reduce of the fp16 gradient)",
        dp.total_bytes, 2 * (N - 1) / N * 2 * psi, "==", {"psi": POS(), "N": INT(1)}, _src("dp", "ring bytes")))
    obs.append(relation(
        "comm/dp-volume", COMM, "DP volume = 2 · 2Ψ (ZeRO convention)",
        "∀ Ψ > 0, N ∈ ℤ, N ≥ 1: volume(DP) = 2 · 2Ψ  (2Ψ elements of 2 bytes)",
        dp.total_volume, 2 * 2 * psi, "==", {"psi": POS(), "N": INT(1)}, _src("dp", "volume")))
    ratios = (("zero1", 1), ("zero2", 1), ("zero3", sympy.Rational(3, 2)),
              ("fsdp_full_shard", sympy.Rational(3, 2)), ("fsdp_shard_grad_op", 1))
    for name, ratio in ratios:
        c = _plan_cost(name).communication
        rtext = "1.5" if ratio != 1 else "1"
        for conv, mine, base in (("ring", c.total_bytes, dp.total_bytes), ("volume", c.total_volume, dp.total_volume)):
            what = "comm" if conv == "ring" else "volume"
            obs.append(relation(
                f"comm/{name}-{conv}", COMM, f"{NAMES[name]} {conv} = {rtext} × DP",
                f"∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 2: {what}({NAMES[name]}) / {what}(DP) = {rtext}",
                mine / base, ratio, "==", dom, _src(f"{name}, dp", f"{conv} traffic"),
                detail=(("engine", f"{sympy.factor(mine)}  vs DP {sympy.factor(base)}"),)))
    hyb = _plan_cost("hybrid_shard").communication.total_bytes
    published = 3 * (N - 1) / N * 2 * psi + 2 * (R - 1) / R * 2 * psi / N
    obs.append(relation(
        "comm/hybrid_shard-ring", COMM, "HYBRID_SHARD ring = 3(N−1)/N·2Ψ + 2(R−1)/R·2Ψ/N",
        "∀ Ψ > 0, N, R ∈ ℤ, N, R ≥ 1: comm(HYBRID_SHARD) = 3(N − 1)/N · 2Ψ + 2(R − 1)/R · 2Ψ/N "
        "(gather in forward and backward and reduce-scatter in the shard group, all-reduce of the shard across replicas)",
        hyb, published, "==", {"psi": POS(), "N": INT(1), "R": INT(1)}, _src("hybrid_shard", "ring bytes")))
    return obs
