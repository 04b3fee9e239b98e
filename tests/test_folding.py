"""MoE parallel folding: the expert group's own roles, against an enumeration of devices."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from placement_logic import costs, load_string
from placement_logic.ir import State

SPEC = """from std.data import zero1
from std.tensor import megatron_sp
model {{
  transformer {{ hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = {E}  top_k = 2
                 bias = false }}
  seq = 16
  group experts {{ role = {{{roles}}} }}
}}
mesh {{ d = {d}  e = {e}  t = {t} }}
plan p {{ d: zero1  e: zero1  t: megatron_sp }}
"""


def expert_bytes(E, d, e, t, etp_axes, ep_axes):
    """Enumerate devices (d, e, t); each expert's weights (2 matrices h × f) go to the
    ranks of its expert group, split over the expert tensor axes; the optimizer state (12
    bytes per parameter) is sharded over the expert-data axes. Returns the bytes of the most
    loaded device (params, optimizer)."""
    sizes = {"d": d, "e": e, "t": t}
    per_expert = 2 * 64 * 128 * 2  # MLP in and out, two layers
    edp_axes = [a for a in "det" if a not in ep_axes and a not in etp_axes]
    out = set()
    for coord in itertools.product(range(d), range(e), range(t)):
        c = dict(zip("det", coord))
        ep_rank, ep = 0, 1
        for a in ep_axes:
            ep_rank, ep = ep_rank * sizes[a] + c[a], ep * sizes[a]
        etp = 1
        for a in etp_axes:
            etp *= sizes[a]
        edp = 1
        for a in edp_axes:
            edp *= sizes[a]
        mine = [j for j in range(E) if j * ep // E == ep_rank]
        params = Fraction(len(mine) * per_expert, etp)
        out.add((params * 2, params * 12 / edp))
    assert len(out) == 1
    return out.pop()


GRID = [(E, d, e, t, roles) for E in (4, 8) for d in (1, 2) for e in (1, 2) for t in (1, 2)
        for roles in ({"t": "expert", "e": "expert"}, {"e": "expert"}, {"t": "data", "e": "expert"},
                      {"e": "expert", "d": "tensor"})]


@pytest.mark.parametrize("E,d,e,t,roles", GRID)
def test_expert_memory_equals_the_enumerated_devices(E, d, e, t, roles):
    ep_axes = [a for a in "det" if roles.get(a) == "expert"]
    etp_axes = [a for a in "det" if roles.get(a, "tensor" if a == "t" else "data") == "tensor"]
    ep = 1
    for a in ep_axes:
        ep *= {"d": d, "e": e, "t": t}[a]
    if E % ep:
        return
    spec = SPEC.format(E=E, d=d, e=e, t=t, roles=", ".join(f"{a}: {r}" for a, r in roles.items()))
    pc = costs.derive(load_string(spec).plan("p"), sized=True)
    subs = {costs.symbol(a): n for a, n in (("d", d), ("e", e), ("t", t))}
    groups = pc.memory.groups["experts"]
    got = (groups[State.PARAMS].subs(subs), groups[State.OPTIMIZER].subs(subs))
    want = expert_bytes(E, d, e, t, etp_axes, ep_axes)
    assert (Fraction(int(got[0].p), int(got[0].q)), Fraction(int(got[1].p), int(got[1].q))) == want
