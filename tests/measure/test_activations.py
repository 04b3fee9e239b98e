"""Saved activations counted by saved_tensors_hooks against a walk of the autograd graph.

The harness counts, per block, the distinct storages autograd packs for backward
(``measure.ranks.activations``). The oracle here is independent of the hooks: after the
forward, it walks the autograd graph from the loss and reads every node's saved tensors
(the ``_saved_*`` attributes PyTorch exposes), keeping distinct floating-point storages
that are not parameters. Both must give the same total, for plain, gated/RMSNorm/GQA and recomputed
models.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from placement_logic.frontend.loader import load_spec
from placement_logic.measure.session import prepare

pytestmark = pytest.mark.torch


def _graph_saved(loss, params) -> int:
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}
    stack, visited = [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            value = getattr(node, name)
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor) and t.is_floating_point():  # token ids and targets are no activations
                    st = t.untyped_storage()
                    if st.data_ptr() not in skip and st.nbytes():
                        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        stack.extend(fn for fn, _ in node.next_functions)
    return sum(seen.values())


@pytest.mark.parametrize("path,plan", [("examples/library/ddp.place", "ddp"),
                                       ("examples/models/qwen25_7b.place", "zero2_tp4")])
def test_hook_count_equals_the_autograd_graph(path, plan):
    from placement_logic.measure.ranks import model as tiny
    from placement_logic.measure.ranks.activations import SavedActivations
    from placement_logic.measure.ranks.training import _batch, _loss_sum

    p = prepare(load_spec(path), plan)
    m = tiny.build(p.shape, 0)
    x, y = _batch(p.shape, p.shape.microbatch, 0, 0)
    saved = SavedActivations()
    with saved.recording(m):
        loss = _loss_sum(m(x), y)
    counted = saved.bytes()
    assert set(counted) == {"outside", *map(str, range(p.shape.layers))}
    assert len({counted[str(i)] for i in range(p.shape.layers)}) == 1  # every layer saves alike
    assert sum(counted.values()) == _graph_saved(loss, list(m.parameters()))


def test_full_recompute_keeps_only_the_layer_input():
    from placement_logic.measure.ranks import model as tiny
    from placement_logic.measure.ranks.activations import SavedActivations
    from placement_logic.measure.ranks.training import _batch, _loss_sum

    p = prepare(load_spec("examples/library/ddp.place"), "ddp")
    sh = p.shape
    m = tiny.build(sh, 0, "full")
    x, y = _batch(sh, sh.microbatch, 0, 0)
    saved = SavedActivations()
    with saved.recording(m):
        _loss_sum(m(x), y)
    # the block's fp32 input s·b·h, nothing else, per layer
    assert all(saved.bytes()[str(i)] == sh.seq * sh.microbatch * sh.hidden * 4 for i in range(sh.layers))
