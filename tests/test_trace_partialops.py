"""Where a traced row-parallel layer adds its bias (or a residual) relative to its all-reduce over the tensor axis
(placement_logic/trace/recorder_partial.py, lift_partialops.py).

The fast tests give the lift fingerprints computed by hand (the arithmetic in the comments); the torch ones
compute a row-parallel linear over two simulated ranks concretely (the full layer, its slices, both orders; the sum
all-reduced or reduce-scattered) and run examples/traced/tp_rowwise_bias.py: refuted for the bias or the residual
added before the all-reduce or the reduce-scatter (`--sp`, `--sp-caller`), proved in the order Megatron-LM uses,
unknown (PL614) where the output is not the product plus those terms, where the layer sums a buffer twice
(`--twice`) or where the script reduces a summand no product alone wrote or a statistic of an addition
(`--caller-residual`, `--scaled`, `--statistic`). Never proved where the order is not observed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_trace_facts import _layers, _line, run, stored

from placement_logic.trace.lift import lift
from placement_logic.trace.lift_partialops import _orders

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "tp_rowwise_bias.py"
WHAT = "the operations on the partial output of fc2 (RowLinear) over tp"


def _fingerprinted(output: float, bias: float | None = 0.5, residuals: tuple = (), recomputed: bool = True) -> dict:
    """fc2 all-reduced over tp in its forward on both ranks, its bias-free products' fingerprints 3 (rank 0) and 5
    (rank 1), 4 rows, the bias's fingerprint ``bias`` on both ranks, its output's ``output``."""
    trace = _layers(stored(), fc2_output_equal=True, fc2_reduced=True, losses_equal=True)
    for part in trace["ranks"]:
        fc2 = part["steps"][-1]["modules"][1]
        fc2["partial"] = {"recomputed": recomputed}
        if recomputed:
            fc2["partial"].update(rows=4, product=3.0 + 2 * part["rank"], product_abs=10.0, output=output,
                                  output_abs=20.0, residuals=list(residuals))
            if bias is not None:
                fc2["partial"]["bias"] = bias
    return trace


def _lifted(trace: dict):
    lifted = lift(trace)
    return lifted, [u for u in lifted.unliftable if u.what.startswith("the operations on the partial output")]


def test_the_bias_added_once_after_the_reduce_lifts_to_nothing():
    # sum of products 3 + 5 = 8; the bias once: 4 rows * 0.5 = 2; output 10
    lifted, named = _lifted(_fingerprinted(10.0))
    assert not named and "_before_reduce" not in lifted.text, lifted.unliftable


@pytest.mark.slow
def test_the_bias_added_on_every_rank_is_lifted_and_refuted(tmp_path):
    # the bias on both ranks' summands: 8 + 2 * (4 * 0.5) = 12
    lifted, named = _lifted(_fingerprinted(12.0))
    line = "  override activations[mlp]: bias_before_reduce over (tp)"
    assert not named and line in lifted.text, lifted.unliftable
    spec = tmp_path / "lifted.place"
    spec.write_text(lifted.text)
    status, out, _ = run(["check", str(spec)])
    assert status == 1 and "refuted GI activations[mlp]: bias_before_reduce" in out, out


@pytest.mark.parametrize("output,verb", [
    (13.0, "residual_before_reduce"),  # 8 + bias once 2 + the residual 1.5 on both ranks 3 = 13
    (11.5, None),                      # 8 + 2 + 1.5 once = 11.5
    (15.0, "bias_before_reduce, residual_before_reduce"),  # 8 + 4 + 3 = 15
])
def test_a_residual_argument_is_placed_by_its_coefficient(output, verb):
    lifted, named = _lifted(_fingerprinted(output, residuals=(1.5,)))
    assert not named, lifted.unliftable
    found = sorted(v for v in ("bias_before_reduce", "residual_before_reduce")
                   if f"override activations[mlp]: {v} over (tp)" in lifted.text)
    assert found == (verb.split(", ") if verb else []), lifted.text


@pytest.mark.parametrize("partial,why", [
    ({"output": 11.0}, "is not the all-reduced product"),       # 11 - 8 = 3: neither 2 (once) nor 4 (twice)
    ({"output": 8.0, "bias": 0.0}, "too small"),                 # a zero bias: 8 + 0 either way
    ({"output": 10.0, "recomputed": False}, "cannot be recomputed"),
])
def test_an_order_not_observed_is_unknown_never_proved(partial, why):
    """Named at the layer's forward and stated `unobserved` in the plan (whose check is then unknown: the real
    script's run below)."""
    lifted, named = _lifted(_fingerprinted(**partial))
    assert len(named) == 1 and why in named[0].reason, lifted.unliftable
    assert named[0].what == WHAT and named[0].where == "examples/traced/tp_rowwise_unreduced.py:49"
    assert f'unobserved "{WHAT}' in lifted.text and "_before_reduce" not in lifted.text


def _scattered(outputs: tuple[float, float], residuals: tuple = (), slices: tuple = ()) -> dict:
    """fc2 reduce-scattered over tp in its forward on both ranks (its output a slice of 2 of the 4 rows of its
    product), its bias-free products' fingerprints 3 (rank 0) and 5 (rank 1), the bias's fingerprint 0.5, rank r's
    output slice's ``outputs[r]``, a residual argument shaped like the product (``residuals``: the same on both
    ranks) or like the slice (``slices[r]``)."""
    trace = _fingerprinted(0.0, residuals=residuals)
    for part in trace["ranks"]:
        r, fc2 = part["rank"], part["steps"][-1]["modules"][1]
        next(c for c in part["collectives"] if c["seq"] == fc2["collectives"][0])["kind"] = "reduce_scatter"
        fc2["partial"].update(scattered=True, out_rows=2, output=outputs[r], slice_residuals=[slices[r]] if slices
                              else [])
    return trace


@pytest.mark.parametrize("outputs,residuals,slices,want", [
    # the products sum to 3 + 5 = 8; the bias after: on each slice's 2 rows, 2 * 0.5 = 1 per rank, 2 in all;
    # before: in each rank's 4-row summand, 4 * 0.5 = 2 per rank, 4 in all
    ((4.5, 5.5), (), (), ""),                        # 8 + 2 = 10: after
    ((5.0, 7.0), (), (), "bias_before_reduce"),      # 8 + 4 = 12: before
    ((5.0, 6.0), (), (), "unknown"),                 # 11: neither 10 nor 12
    ((6.0, 7.0), (1.5,), (), "residual_before_reduce"),  # 8 + 2 + the residual on both summands 2 * 1.5 = 13
    ((4.5, 5.5), (1.5,), (), ""),                    # 10: the residual argument not added
    ((5.0, 6.5), (1.5,), (), "unknown"),             # 11.5: the residual once is no choice in a summand
    ((5.3, 6.3), (), (0.7, 0.9), ""),                # 8 + 2 + the slices' residuals 0.7 + 0.9 = 11.6: after
])
def test_a_reduce_scatter_in_the_layer_is_read_as_its_all_reduce(outputs, residuals, slices, want):
    lifted, named = _lifted(_scattered(outputs, residuals, slices))
    assert bool(named) == (want == "unknown"), lifted.unliftable
    found = [v for v in ("bias_before_reduce", "residual_before_reduce")
             if f"override activations[mlp]: {v} over (tp)" in lifted.text]
    assert found == ([want] if want not in ("", "unknown") else []), lifted.text
    if named:
        assert "is not the all-reduced product" in named[0].reason and f'unobserved "{WHAT}' in lifted.text


@pytest.mark.parametrize("origins,reported", [
    (("mm", "mm"), False),   # both ranks summed a product alone (through copies): nothing added before
    (("mm", "add"), True),   # rank 1's summand an addition's result
    (("", ""), True),        # no op seen
])
def test_a_layer_not_recomputed_is_read_from_the_op_that_wrote_its_summand(origins, reported):
    trace = _fingerprinted(10.0, recomputed=False)
    for part in trace["ranks"]:
        seq = part["steps"][-1]["modules"][1]["collectives"][0]
        next(c for c in part["collectives"] if c["seq"] == seq)["origin"] = origins[part["rank"]]
    lifted, named = _lifted(trace)
    assert bool(named) == reported and "_before_reduce" not in lifted.text, lifted.unliftable
    if named:
        assert "cannot be recomputed" in named[0].reason


@pytest.mark.parametrize("origin,api,kind,reported", [
    ("add", "c10d.allreduce_", "all_reduce", True),       # a sum all-reduced: the summand an addition's result
    ("addmm", "c10d.allreduce_", "all_reduce", True),     # a linear with its bias fused, reduced by the caller
    ("mul", "c10d.allreduce_", "all_reduce", True),       # reduce(s * (fc2(h) + b)): the last op a scale
    ("", "c10d.allreduce_", "all_reduce", True),          # no op seen writing it
    ("mm", "c10d.allreduce_", "all_reduce", False),       # a product alone
    ("sum", "c10d.allreduce_", "all_reduce", False),      # a reduction (a softmax's denominator): not a term added
    ("add", "_c10d_functional.all_reduce", "all_reduce", False),  # DTensor's own redistribution
    ("addmm", "c10d._reduce_scatter_base_", "reduce_scatter", True),  # reduce_scatter_tensor(out, F.linear(x, W, b))
    ("gelu", "c10d._reduce_scatter_base_", "reduce_scatter", True),
    ("mm", "c10d._reduce_scatter_base_", "reduce_scatter", False),
    ("add", "c10d.allreduce_", "all_gather", False),      # no sum
])
def test_a_summand_not_a_product_reduced_outside_any_layer_is_unknown(origin, api, kind, reported):
    """The script's own all-reduce or reduce-scatter over tp, in no layer's forward, matched to no layer's
    output: unknown unless a product alone (or a reduction to a statistic) wrote its input."""
    trace = _layers(stored(), fc2_output_equal=True, fc2_reduced=True, losses_equal=True)
    for part in trace["ranks"]:
        fc2 = part["steps"][-1]["modules"][1]
        seq = fc2.pop("collectives")[0]
        c = next(c for c in part["collectives"] if c["seq"] == seq)
        c.pop("module", None)
        c.update(origin=origin, api=api, kind=kind)
    lifted = lift(trace)
    what = "the summand of the " + ("reduce-scatter" if kind == "reduce_scatter" else "all-reduce") + " over tp"
    named = [u for u in lifted.unliftable if u.what.startswith(what)]
    assert bool(named) == reported, lifted.unliftable
    if named:
        wrote = (f"an addition ({origin})" if origin in ("add", "addmm") else f"the result of {origin}" if origin
                 else "written by no operation observed")
        assert wrote in named[0].reason and f'unobserved "{what}' in lifted.text, named[0].reason


@pytest.mark.torch
def test_the_op_that_wrote_a_value_is_followed_through_copies():
    """Under a dispatch mode noting every op: a product cloned (ReduceFromTensorRanks' clone), a product viewed,
    a product plus a bias (F.linear with a bias: addmm), a product with a bias added in place."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from placement_logic.trace.recorder_partial import note_origin, origin_of

    origins: dict = {}

    class Noting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            note_origin(origins, func.overloadpacket.__name__, args, out)
            return out

    x, w, b = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2)
    with Noting():
        cloned = torch.nn.functional.linear(x, w).clone()
        viewed = torch.nn.functional.linear(x.view(2, 2, 3), w).reshape(-1)
        fused = torch.nn.functional.linear(x, w, b).clone()
        in_place = torch.nn.functional.linear(x, w)
        in_place += b
    assert origin_of(origins, cloned) in ("mm", "matmul")
    assert origin_of(origins, viewed) in ("mm", "bmm", "matmul")
    assert origin_of(origins, fused) == "addmm"
    assert origin_of(origins, in_place) == "add_"


def _reduced_twice(origins: tuple[tuple[str, str], tuple[str, str]], recomputed: bool = True,
                   statistic_of: str = "") -> dict:
    """fc2 as in ``_fingerprinted(10.0)`` (the bias once after: 8 + 4 * 0.5 = 10) whose forward issues a second sum
    all-reduce over tp: on rank r the first reduction's summand written by ``origins[r][0]``, the second's by
    ``origins[r][1]`` (a statistic's input written by ``statistic_of``)."""
    trace = _fingerprinted(10.0, recomputed=recomputed)
    for part in trace["ranks"]:
        fc2 = part["steps"][-1]["modules"][1]
        first = next(c for c in part["collectives"] if c["seq"] == fc2["collectives"][0])
        seq = max(c["seq"] for c in part["collectives"]) + 1
        part["collectives"].append(dict(first, seq=seq, origin=origins[part["rank"]][1], statistic_of=statistic_of))
        first["origin"] = origins[part["rank"]][0]
        fc2["collectives"].append(seq)
    return trace


@pytest.mark.parametrize("origins,recomputed,statistic_of,why", [
    ((("mm", "mm"), ("mm", "mm")), True, "", None),          # two products summed: the fingerprints decide (10)
    ((("add", "mm"), ("add", "mm")), True, "", None),        # one summand not a product: the output's, decided
    ((("add", "sum"), ("add", "sum")), True, "exp", None),   # a statistic of a value no addition wrote
    ((("add", "sum"), ("add", "sum")), True, "add", "more than one of them"),  # a statistic of an addition
    ((("add", "add"), ("add", "add")), True, "", "more than one of them"),
    ((("mm", "all_reduce"), ("mm", "all_reduce")), True, "", "a buffer it already summed"),
    ((("mm", "mm"), ("mm", "mm")), False, "", None),         # not recomputed: every summand a product alone
    ((("mm", "mm"), ("mm", "add")), False, "", "cannot be recomputed"),  # rank 1's second summand an addition's
    ((("mm", "all_reduce"), ("mm", "all_reduce")), False, "", "cannot be recomputed"),
])
def test_every_reduction_in_the_layer_is_read(origins, recomputed, statistic_of, why):
    lifted, named = _lifted(_reduced_twice(origins, recomputed, statistic_of))
    assert bool(named) == bool(why) and "_before_reduce" not in lifted.text, lifted.unliftable
    if named:
        assert why in named[0].reason and named[0].what == WHAT and f'unobserved "{WHAT}' in lifted.text


@pytest.mark.parametrize("origin,statistic_of,reported", [
    ("sum", "add", True),     # reduce((fc2(h) + b).sum(-1)): the bias in every rank's statistic
    ("mean", "addmm", True),  # reduce(F.linear(h, W, b).mean(-1))
    ("sum", "exp", False),    # the vocabulary-parallel cross entropy's sum of exponentials
    ("sum", "mm", False),     # a statistic of a product alone
    ("amax", "", False),      # a statistic whose input no op seen wrote: not an addition's
])
def test_a_statistic_of_an_addition_is_unknown(origin, statistic_of, reported):
    """The script's own sum all-reduce over tp, outside any layer: its input a statistic whose own input the op
    ``statistic_of`` wrote."""
    trace = _layers(stored(), fc2_output_equal=True, fc2_reduced=True, losses_equal=True)
    for part in trace["ranks"]:
        seq = part["steps"][-1]["modules"][1].pop("collectives")[0]
        c = next(c for c in part["collectives"] if c["seq"] == seq)
        c.pop("module", None)
        c.update(origin=origin, statistic_of=statistic_of, api="c10d.allreduce_")
    lifted = lift(trace)
    what = "the summand of the all-reduce over tp"
    named = [u for u in lifted.unliftable if u.what.startswith(what)]
    assert bool(named) == reported, lifted.unliftable
    if named:
        assert f"a statistic ({origin}) of the result of an addition ({statistic_of})" in named[0].reason


@pytest.mark.torch
def test_a_statistic_keeps_the_op_that_wrote_its_input():
    """Under a dispatch mode noting every op: the row sum of a product plus a bias, of a product alone, of a fused
    linear with a bias (cloned after the sum); a linear with a bias on a non-contiguous input; and a buffer
    all-reduced in place (``note_reduced``), then cloned."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    from placement_logic.trace.recorder_partial import note_origin, note_reduced, origin_of, statistic_of

    origins: dict = {}

    class Noting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            note_origin(origins, func.overloadpacket.__name__, args, out)
            return out

    x, w, b = torch.randn(4, 3), torch.randn(2, 3), torch.randn(2)
    with Noting():
        added = (torch.nn.functional.linear(x, w) + b).sum(-1)
        alone = torch.nn.functional.linear(x, w).sum(-1)
        fused = torch.nn.functional.linear(x, w, b).mean(-1).clone()
        strided = torch.nn.functional.linear(x.view(2, 2, 3).transpose(0, 1), w, b)  # the bias added apart
        reduced = torch.nn.functional.linear(x, w).clone()
        note_reduced(origins, reduced)
        again = reduced.clone()
    assert (origin_of(origins, added), statistic_of(origins, added)) == ("sum", "add")
    assert origin_of(origins, alone) == "sum" and statistic_of(origins, alone) in ("mm", "matmul")
    assert (origin_of(origins, fused), statistic_of(origins, fused)) == ("mean", "addmm")
    assert origin_of(origins, again) == "all_reduce" and statistic_of(origins, again) == ""
    assert origin_of(origins, strided) in ("add", "add_", "addmm")  # a linear with a bias never reads as a product


def _caller_reduced(summands: tuple[float, float], bias: float = 0.5, sums: bool = True,
                    kind: str = "all_reduce") -> dict:
    """fc2 (a bias, no collective of its own) whose output the caller all-reduces (``kind``: or reduce-scatters)
    over tp: on rank r its bias-free product's fingerprint 3 + 2r, its output's ``summands[r]``, 4 rows, the bias's
    fingerprint ``bias``; the collective's input checksums those of fc2's output (``sums``: else another
    tensor's); the op that wrote its input a product (``mm``)."""
    trace = _layers(stored(), fc2_output_equal=False, fc2_reduced=True, losses_equal=True)
    for part in trace["ranks"]:
        r, st = part["rank"], part["steps"][-1]
        fc2 = st["modules"][1]
        seq = fc2.pop("collectives")[0]
        fc2["partial"] = {"recomputed": True, "rows": 4, "product": 3.0 + 2 * r, "product_abs": 10.0,
                          "output": summands[r], "output_abs": 20.0, "bias": bias, "residuals": [],
                          "sums": [summands[r], 1.0, 2.0]}
        c = next(c for c in part["collectives"] if c["seq"] == seq)
        c["sums"] = [summands[r], 1.0, 2.0] if sums else [99.0, 1.0, 2.0]
        api = "c10d._reduce_scatter_base_" if kind == "reduce_scatter" else "c10d.allreduce_"
        c.update(kind=kind, api=api, origin="mm")  # as F.linear(h, W) writes it: a product alone
        c.pop("module", None)
    return trace


@pytest.mark.parametrize("summands,bias,sums,want", [
    ((5.0, 7.0), 0.5, True, "bias_before_reduce"),  # each summand its product plus 4 * 0.5: 3 + 2, 5 + 2
    ((5.0, 5.0), 0.5, True, None),                  # the bias on rank 0 alone: 3 + 2, 5 + 0 (Megatron's one rank)
    ((3.0, 5.0), 0.5, True, None),                  # no bias in the summands (added after the reduction)
    ((5.0, 7.0), 0.5, False, None),                 # the all-reduce's input is not fc2's output: not read
    ((3.0, 6.0), 0.5, True, "unknown"),             # 1 over the products: neither 0, 2 nor 4
    ((3.0, 5.0), 0.0, True, "too small"),           # a zero bias: 0 however many summands carry it
])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_the_bias_in_every_summand_the_caller_reduces(summands, bias, sums, want, kind):
    lifted, named = _lifted(_caller_reduced(summands, bias, sums, kind))
    line = "  override activations[mlp]: bias_before_reduce over (tp)"
    assert (line in lifted.text) == (want == "bias_before_reduce"), lifted.text
    unknown = {"unknown": "not its bias-free product plus its bias", "too small": "too small"}.get(want)
    assert bool(named) == bool(unknown), lifted.unliftable
    if named:
        assert unknown in named[0].reason and f'unobserved "{WHAT}' in lifted.text
    if not sums:  # not matched: its summand a product alone (origin "mm"), trusted
        assert not [u for u in lifted.unliftable if u.what.startswith("the summand of")], lifted.unliftable


@pytest.mark.torch
@pytest.mark.parametrize("order", ["after", "bias", "residual"])
def test_fingerprints_of_a_concrete_row_parallel_linear(order):
    """Two ranks simulated in one process: each holds half of the input features of one 6 -> 3 linear; the
    output is computed concretely in each order and the fingerprints tell them apart."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_partial import partial_ops

    g = torch.Generator().manual_seed(7)
    full_w, b = torch.randn(3, 6, generator=g), torch.randn(3, generator=g)
    x, h = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
    shards = [(x[:, 3 * r:3 * r + 3], full_w[:, 3 * r:3 * r + 3]) for r in range(2)]
    summed = sum(xs @ ws.T for xs, ws in shards)  # x W^T of the whole layer, from its slices
    assert torch.allclose(summed, x @ full_w.T, atol=1e-5)
    out = summed + {"after": b + h, "bias": 2 * b + h, "residual": b + 2 * h}[order]
    recs = []
    for xs, ws in shards:
        layer = torch.nn.Linear(3, 3)
        with torch.no_grad():
            layer.weight.copy_(ws)
            layer.bias.copy_(b)
        recs.append(partial_ops(layer, (xs, h), out))
    fits, _ = _orders(recs[0], recs)
    assert fits == {{"after": (), "bias": ("bias",), "residual": ("residual",)}[order]}


@pytest.mark.torch
@pytest.mark.parametrize("order", ["after", "bias", "residual", "slice_residual", "tanh"])
def test_fingerprints_of_a_concrete_reduce_scattered_linear(order):
    """Two ranks simulated in one process, each holding half of the input features of one 6 -> 3 linear on 4
    rows: the partial sums reduce-scattered (rank r keeps rows 2r, 2r + 1) with the bias in each summand, or the bias
    added to the slice after and besides a residual h of the product's shape added to each summand, one of the
    slice's shape added after, or tanh on each summand."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_partial import partial_ops

    g = torch.Generator().manual_seed(11)
    full_w, b = torch.randn(3, 6, generator=g), torch.randn(3, generator=g)
    x, h = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
    shards = [(x[:, 3 * r:3 * r + 3], full_w[:, 3 * r:3 * r + 3]) for r in range(2)]
    summands = [xs @ ws.T for xs, ws in shards]
    if order == "bias":
        summands = [p + b for p in summands]
    elif order == "residual":
        summands = [p + h for p in summands]
    elif order == "tanh":
        summands = [torch.tanh(p) for p in summands]
    whole = summands[0] + summands[1]  # the reduce-scatter's sum, sliced below
    recs = []
    for r, (xs, ws) in enumerate(shards):
        out = whole[2 * r:2 * r + 2] + (0 if order == "bias" else b)  # the bias after, on the slice
        out = out + (h[2 * r:2 * r + 2] if order == "slice_residual" else 0)
        layer = torch.nn.Linear(3, 3)
        with torch.no_grad():
            layer.weight.copy_(ws)
            layer.bias.copy_(b)
        args = (xs, h if order == "residual" else None, h[2 * r:2 * r + 2] if order == "slice_residual" else None)
        recs.append(partial_ops(layer, args, out, reduced="scatter"))
    assert all(p["scattered"] and p["rows"] == 4 and p["out_rows"] == 2 for p in recs)
    fits, _ = _orders(recs[0], recs)
    assert fits == {"after": {()}, "bias": {("bias",)}, "residual": {("residual",)}, "slice_residual": {()},
                    "tanh": set()}[order]


@pytest.mark.torch
def test_a_layer_reduced_by_its_caller_is_fingerprinted_with_its_output_checksums():
    """A linear with a bias and no all-reduce of its own: its output's linear checksums are those the recorder
    keeps for an all-reduce of that output (recorder_router.linear_sums), and its output minus its bias-free
    product is its bias; a linear without a bias is not recorded."""
    torch = pytest.importorskip("torch")
    from placement_logic.trace.recorder_partial import partial_ops
    from placement_logic.trace.recorder_router import linear_sums

    layer = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(3))
    out = layer(x)
    rec = partial_ops(layer, (x,), out, reduced=False)
    assert rec["sums"] == linear_sums(out.clone())
    assert abs(rec["output"] - rec["product"] - rec["rows"] * rec["bias"]) < 1e-5 * rec["output_abs"]
    assert rec["rows"] == 5
    assert partial_ops(torch.nn.Linear(3, 2, bias=False), (x,), out, reduced=False) is None


def _trace(argv: list[str], tmp_path):
    spec = tmp_path / "lifted.place"
    status, out, err = run(["trace", "--nproc", "2", "--check", "--spec-file", str(spec), "--",
                            "python", f"examples/traced/{SCRIPT}", *argv])
    return status, out, err, spec.read_text()


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,verb", [([], "bias_before_reduce"), (["--residual"], "residual_before_reduce"),
                                       (["--caller"], "bias_before_reduce"), (["--sp"], "bias_before_reduce"),
                                       (["--sp-caller"], "bias_before_reduce")])
def test_an_addition_before_the_all_reduce_is_refuted_at_the_layer(argv, verb, tmp_path, monkeypatch):
    """In fc2's own forward (the bias, the residual passed in; the bias before its reduce-scatter under sequence
    parallelism by hand) or in every summand its caller all-reduces (or reduce-scatters)."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    status, out, err, spec = _trace(argv, tmp_path)
    assert status == 1 and "[PL614]" not in err, out + err
    line = _line(SCRIPT, "def forward(self, x, residual):")
    assert f"1 finding in examples/traced/{SCRIPT}:" in out, out
    assert f"examples/traced/{SCRIPT}:{line}: refuted GI activations[mlp]: {verb}: " in out, out
    assert f"  override activations[mlp]: {verb} over (tp)" in spec


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,tp", [(["--fixed"], "megatron_tp"), (["--caller-fixed"], "megatron_tp"),
                                     (["--scaled-fixed"], "megatron_tp"), (["--sp-fixed"], "megatron_sp"),
                                     (["--two-products"], "megatron_tp"), (["--statistic-fixed"], "megatron_tp"),
                                     (["--sp-caller-fixed"], "megatron_sp")])
def test_the_bias_and_residual_after_the_all_reduce_are_proved(argv, tp, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    status, out, err, spec = _trace(argv, tmp_path)
    assert status == 0 and "[PL614]" not in err and "proved for all mesh sizes" in out, out + err
    assert "_before_reduce" not in spec and f"  tp: {tp}" in spec


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("argv,what,where", [
    (["--tanh"], WHAT, "def forward(self, x, residual):"),
    (["--caller-residual"], "the summand of the all-reduce over tp at examples/traced/tp_rowwise_bias.py:{line}",
     "ReduceFromTensorRanks.apply(self.fc2(F.gelu(self.fc1(x)), None) + x"),
    (["--scaled"], "the summand of the all-reduce over tp at examples/traced/tp_rowwise_bias.py:{line}",
     "ReduceFromTensorRanks.apply(SCALE * (self.fc2("),
    (["--twice"], WHAT, "def forward(self, x, residual):"),
    (["--statistic"], "the summand of the all-reduce over tp at examples/traced/tp_rowwise_bias.py:{line}",
     "centre = ReduceFromTensorRanks.apply((part + self.fc2.bias)"),
])
def test_an_operation_not_decided_is_unknown(argv, what, where, tmp_path, monkeypatch):
    """tanh on each rank's summand (the output is not the product plus the bias or the residual); the residual
    added by the caller to fc2's partial sum before its all-reduce (the summand an addition no layer's output
    accounts for); the bias added and the sum scaled before it (the summand a product's, ``mul``); fc2's partial sum
    all-reduced twice in its forward; a row statistic of fc2's partial sum with the bias added on every rank: named
    at the line, never proved."""
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    status, out, err, spec = _trace(argv, tmp_path)
    line = _line(SCRIPT, where)
    what = what.format(line=line)
    assert status == 3 and f"examples/traced/{SCRIPT}:{line}:1: error: not lifted: {what} " in err, out + err
    assert "proved for all mesh sizes" not in out and f'unobserved "{what}' in spec
    status, out, _ = run(["check", str(tmp_path / "lifted.place")])
    assert status == 3 and out.rstrip().endswith("UNKNOWN"), out
