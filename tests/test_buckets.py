"""DeepSpeed's buckets priced as transient memory (costs.buckets, docs/costs.md "DeepSpeed's
buckets"): the ZeRO-3 gathered window against a replay of DeepSpeed's parameter coordinator
(fetch, prefetch and release rules of runtime/zero/partitioned_param_coordinator.py, written
here from its source at layer granularity), the reduction bucket and the persisted parameters
against hand-derived counts, and the import carrying the settings."""

import json
import subprocess
import sys

import pytest
import sympy

from placement_logic import costs, load_string

H, F, L, V = 1024, 4096, 8, 32000
# one layer: attention 4h², MLP 2hf, biases 3h + h (attention) + f + h (MLP), two layernorms 2·2h
U = 4 * H * H + 2 * H * F + 5 * H + F + 4 * H
PSI = L * U + 2 * V * H + 2 * H  # untied embedding and head, final layernorm


def _spec(buckets: str, plan: str = "dp: zero3", dp: int = 8) -> str:
    return (f"from std.data import zero2, zero3\nmodel {{\n  transformer {{ hidden = {H}  layers = {L}  heads = 16  "
            f"ffn = {F}  vocab = {V} }}\n  seq = 1024\n  microbatch = 1\n  buckets {{ {buckets} }}\n}}\n"
            f"mesh {{ dp = {dp} @ intra_node }}\nplan p {{ {plan} }}\n")


def _transient(text: str) -> dict:
    spec = load_string(text, "t.place")
    mem = costs.derive(spec.plans[0]).memory
    return {k: int(v.subs({s: 8 for s in v.free_symbols if s.name == "dp"})) for k, v in
            ((k, sympy.sympify(v)) for k, v in mem.transient.items())}


def _coordinator_peak(layers: int, unit: int, prefetch: int, live: int, reuse: int) -> int:
    """Peak gathered elements of DeepSpeed's coordinator over a forward and backward trace of
    ``layers`` modules of ``unit`` elements each."""
    trace = list(range(layers)) + list(range(layers - 1, -1, -1))
    available: set[int] = set()
    fetched_for = {m: -1 for m in range(layers)}  # __most_recent_step_id_param_fetched_for
    queue, n, peak = 0, 0, 0
    for step, m in enumerate(trace):
        if m not in available:  # the module being run is fetched whatever the limits
            available.add(m)
            n += unit
        if queue <= step:  # its own entries leave the queue
            fetched_for[m] = max(fetched_for[m], step)
            queue = step + 1
        limit, numel = min(live - n, prefetch), 0
        while queue < len(trace) and numel < limit:
            nxt = trace[queue]
            fetched_for[nxt] = max(fetched_for[nxt], queue)
            if nxt not in available:
                available.add(nxt)
                n += unit
                numel += unit
            queue += 1
        peak = max(peak, n)
        # __params_to_release at step_id = step + 1
        keep = fetched_for[m] > step + 1
        traversed = 0
        for later in trace[step + 1:]:
            if traversed >= reuse:
                break
            keep = keep or later == m
            traversed += unit
        if not keep:
            available.discard(m)
            n -= unit
    return peak


GRID = [(p * U, live * U, reuse) for p in (0, 1, 2, 3) for live in (1, 2, 4, 20) for reuse in (0, U, 3 * U, 10 * U)]


@pytest.mark.parametrize("prefetch,live,reuse", GRID)
def test_gathered_window_bounds_the_coordinator(prefetch, live, reuse):
    got = _transient(_spec(f"prefetch_bucket_size = {prefetch}  max_live_parameters = {live}  "
                           f"max_reuse_distance = {reuse}"))
    window = got["gathered params (DeepSpeed's window: unit, reused and prefetched)"] // 2  # bf16 elements
    simulated = _coordinator_peak(L, U, prefetch, live, reuse)
    assert window >= simulated
    if prefetch == 0 and reuse == 0:  # no prefetch, nothing kept: the module run alone
        assert window == simulated
    if prefetch == 2 * U and live == 20 * U:  # a bucket larger than a module: the window runs to the live limit
        assert simulated == min(live, L * U)  # (here every layer of the model)


def test_reduce_bucket_and_persisted_parameters():
    got = _transient(_spec("reduce_bucket_size = 3000000  param_persistence_threshold = 2048"))
    assert got["gradient reduction bucket (reduce_bucket_size)"] == 3_000_000 * 2  # one flat bf16 buffer
    # tensors of h = 1024 elements kept whole: two layernorms (2 · 2h) and two row biases (2h) per
    # layer and the final layernorm (2h), less the 1/8 shard ZeRO-3 would have kept
    small = L * (4 * H + 2 * H) + 2 * H
    name = next(k for k in got if k.startswith("persisted params"))
    assert got[name] == 2 * (small - small // 8)
    none = _transient(_spec("param_persistence_threshold = 1000"))  # h = 1024 > 1000: nothing persisted
    assert not any(k.startswith("persisted params") for k in none)


def test_overlap_comm_doubles_the_stage_two_bucket():
    two = _transient(_spec("reduce_bucket_size = 1000  overlap_comm = true", plan="dp: zero2"))
    one = _transient(_spec("reduce_bucket_size = 1000", plan="dp: zero2"))  # DeepSpeed's default: false below 3
    assert two["gradient reduction bucket (reduce_bucket_size × 2, overlap_comm)"] == 2 * 1000 * 2
    assert one["gradient reduction bucket (reduce_bucket_size)"] == 1000 * 2
    assert not any(k.startswith("gathered") for k in one)


def test_defaults_are_deepspeeds():
    got = _transient(_spec(""))
    assert got["gradient reduction bucket (reduce_bucket_size)"] == 500_000_000 * 2
    # max_live_parameters 1e9 exceeds the whole model (1.7e8 elements): the window is the model
    assert got["gathered params (DeepSpeed's window: unit, reused and prefetched)"] == 2 * PSI


def test_bad_bucket_values_are_located(tmp_path):
    f = tmp_path / "b.place"
    f.write_text(_spec("reduce_bucket_size = -1  overlap = true"))
    r = subprocess.run([sys.executable, "-m", "placement_logic", "check", str(f)], capture_output=True, text=True)
    assert r.returncode == 2
    assert "[PL107]" in r.stderr and "reduce_bucket_size" in r.stderr
    assert "'buckets' has no property 'overlap'" in r.stderr


def test_import_carries_the_buckets_and_fills_trainer_auto(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "vocab_size": 1000}))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {
        "stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
        "overlap_comm": True}, "train_micro_batch_size_per_gpu": 1}))
    r = subprocess.run([sys.executable, "-m", "placement_logic", "import", "deepspeed", str(ds), "--devices", "8",
                        "--model", str(tmp_path / "config.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # the Trainer's rules: hidden², 0.9 hidden², 10 hidden
    for line in ("reduce_bucket_size = 262144", "prefetch_bucket_size = 235929", "param_persistence_threshold = 5120",
                 "max_live_parameters = 1000000000", "overlap_comm = true"):
        assert line in r.stdout
    assert 'reduce_bucket_size "auto" = 262144 (hidden², hidden 512' in r.stderr
