"""The set-up shared by the tests of kv heads copied over several tensor axes (tests/test_kv_product.py,
tests/test_kv_joint.py): the spec text, the checked plan's report and the simulator's GI probe."""

from __future__ import annotations

import random

import simulator

from placement_logic.check.run import check_spec
from placement_logic.frontend.loader import load_string


def spec_text(tensor: dict[str, int], kv: int, plans: dict[str, str], n_heads: int) -> str:
    """A transformer of ``n_heads`` query heads and ``kv`` kv heads on dp = 2 and the tensor axes
    ``tensor`` (name -> size, each bound to megatron_tp); ``plans``: name -> extra plan lines."""
    axes = "".join(f"  {a}: megatron_tp\n" for a in tensor)
    body = "\n".join(f"plan {name} {{\n  dp: ddp\n{axes}{extra}}}\n" for name, extra in plans.items())
    mesh = "".join(f"  {a} = {s}\n" for a, s in tensor.items())
    return f"""from std.data import ddp
from std.tensor import megatron_tp

model {{
  transformer {{
    hidden = {32 * n_heads}
    layers = 2
    heads = {n_heads}
    kv_heads = {kv}
    ffn = {96 * n_heads}
    vocab = {64 * n_heads}
  }}
  seq = 64
  microbatch = 1
  microbatches = 2
}}

mesh {{
  dp = 2
{mesh}}}

{body}"""


def report(text: str, plan: str, path: str, **kw):
    """The checker's report on plan ``plan`` of the spec ``text`` (read as file ``path``)."""
    return check_spec(load_string(text, path), [plan], timeout=20, **kw).plans[0]


def gi_broken(p, bindings: dict, sizes: dict[str, int], seed: int) -> bool:
    """Whether the simulator finds the kv gradient's GI broken in any of three draws of ``seed``."""
    rng = random.Random(seed)
    return any(not simulator.gi_ok(p, "kv", sizes, rng, bindings) for _ in range(3))
