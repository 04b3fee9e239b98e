"""The ``pytorch_eager`` activation convention against what eager PyTorch's autograd saves.

Oracle: a pre-norm transformer written the plain way (``nn.LayerNorm`` / ``nn.RMSNorm``, q, k and
v projections of their own, ``F.scaled_dot_product_attention`` with a causal mask and grouped
key/value heads, a GELU MLP or a SwiGLU MLP with separate gate and up projections, a head and
``F.cross_entropy`` on fp32 logits) — not the measure harness's model — run forward once under
``torch.autograd.graph.saved_tensors_hooks``; every distinct floating-point storage autograd
saves, parameters left out, is counted once, in the block and outside it. The cost engine's
per-layer and outside bytes under ``conventions { activations = pytorch_eager }`` (one device)
must equal the counts exactly, for LayerNorm and RMSNorm, gated and ungated MLPs, MHA and GQA,
fp32 and bf16.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import pytest

from placement_logic import costs
from placement_logic.frontend.loader import load_string

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

pytestmark = pytest.mark.torch


class Block(nn.Module):
    def __init__(self, h, a, kv, f, norm, gated):
        super().__init__()
        Norm = nn.RMSNorm if norm == "rmsnorm" else nn.LayerNorm
        self.a, self.kv, self.d, self.gated = a, kv, h // a, gated
        self.n1, self.n2 = Norm(h), Norm(h)
        self.q, self.k, self.v = nn.Linear(h, h), nn.Linear(h, kv * self.d), nn.Linear(h, kv * self.d)
        self.o = nn.Linear(h, h)
        if gated:
            self.gate, self.up, self.down = nn.Linear(h, f), nn.Linear(h, f), nn.Linear(f, h)
        else:
            self.fc1, self.fc2 = nn.Linear(h, f), nn.Linear(f, h)

    def attn(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.a, self.d).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv, self.d).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv, self.d).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.a)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))

    def mlp(self, x):
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.fc2(F.gelu(self.fc1(x)))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


def saved_bytes(sh: dict, dtype) -> tuple[int, int]:
    """(one block's, outside the blocks') bytes of the distinct storages autograd saves."""
    torch.manual_seed(0)
    h, V = sh["h"], 64
    emb = nn.Embedding(V, h).to(dtype)
    block = Block(h, sh["a"], sh["kv"], sh["f"], sh["norm"], sh["gated"]).to(dtype)
    final = (nn.RMSNorm(h) if sh["norm"] == "rmsnorm" else nn.LayerNorm(h)).to(dtype)
    head = nn.Linear(h, V, bias=False).to(dtype)
    params = {p.untyped_storage().data_ptr() for m in (emb, block, final, head) for p in m.parameters()}
    tokens = torch.randint(0, V, (sh["b"], sh["s"]))
    where = {"block": {}, "outside": {}}
    current = ["outside"]

    def pack(t):
        st = t.untyped_storage()
        if t.is_floating_point() and st.data_ptr() not in params:
            where[current[0]][st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        x = emb(tokens)
        current[0] = "block"
        x = block(x)
        current[0] = "outside"
        logits = head(final(x)).float()
        F.cross_entropy(logits.view(-1, V), tokens.view(-1))
    return sum(where["block"].values()), sum(where["outside"].values())


def engine_bytes(sh: dict, width: int) -> tuple[Fraction, Fraction]:
    norm = "rmsnorm" if sh["norm"] == "rmsnorm" else "layernorm"
    text = ("from std.data import ddp\nmodel {\n  transformer {\n"
            f"    hidden = {sh['h']}\n    layers = 2\n    heads = {sh['a']}\n    kv_heads = {sh['kv']}\n"
            f"    ffn = {sh['f']}\n    vocab = 64\n    gated_mlp = {'true' if sh['gated'] else 'false'}\n"
            f"    norm = {norm}\n  }}\n  seq = {sh['s']}\n  microbatch = {sh['b']}\n"
            f"  bytes {{ params = {width}  grads = {width}  activations = {width} }}\n"
            "  conventions { activations = pytorch_eager }\n}\nmesh { dp = 2 }\nplan p { dp: ddp }\n")
    act = costs.derive(load_string(text).plan("p")).activations
    return Fraction(str(act.per_layer)), Fraction(str(act.embedding + act.output))


SHAPES = [dict(s=16, b=2, h=64, a=8, kv=8, f=256), dict(s=8, b=3, h=96, a=12, kv=4, f=160),
          dict(s=32, b=1, h=32, a=4, kv=1, f=96)]


@pytest.mark.parametrize("shape,norm,gated,dtype", list(product(SHAPES, ["layernorm", "rmsnorm"], [False, True],
                                                                ["float32", "bfloat16"])))
def test_the_eager_count_is_what_autograd_saves(shape, norm, gated, dtype):
    sh = dict(shape, norm=norm, gated=gated)
    block, outside = saved_bytes(sh, getattr(torch, dtype))
    per_layer, out = engine_bytes(sh, 4 if dtype == "float32" else 2)
    assert (per_layer, out) == (block, outside)


def test_the_eager_terms_add_up_and_name_no_dropout():
    from placement_logic.costs.activations import named_terms

    text = ("from std.data import ddp\nfrom std.tensor import megatron_sp\nmodel {\n  transformer { hidden = 64  "
            "layers = 2  heads = 8  kv_heads = 2  ffn = 256  vocab = 64  gated_mlp  norm = rmsnorm }\n  seq = 16\n"
            "  microbatch = 2\n  conventions { activations = pytorch_eager }\n}\nmesh { dp = 2  tp = 2 }\n"
            "plan p { dp: ddp\n tp: megatron_sp }\n")
    pc = costs.derive(load_string(text).plan("p"))
    layer, outside = named_terms(pc.shape, pc.layout)
    assert {n for n, _ in layer} == {"norm inputs", "norm statistics", "normalised norm inputs", "norm outputs",
                                     "query", "keys and values", "projection input", "attention log-sum-exp", "mlp",
                                     "gathered inputs"}
    assert {n for n, _ in outside} == {"output-layer inputs", "final norm statistics", "logits", "loss total weight",
                                       "gathered head input"}
    assert sum(x for _, x in layer) - pc.activations.per_layer == 0
