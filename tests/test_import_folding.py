"""MoE parallel folding read from Megatron-LM arguments and torchtitan job configs.

Oracles: a spec written by hand for a folded Megatron-LM configuration and a folded
torchtitan one; Megatron-LM's own rank numbering (tensor innermost, then context, then data
for the dense layers; expert tensor, then expert, then expert data for the experts; torchtitan's
mesh pp × replicate × shard_mod_ep × shard_in_ep × context × tensor) against the groups the
imported mesh and roles form; and the expert parameter and optimizer bytes per device counted
by enumerating the devices, each expert's weights given to the ranks that hold them."""

from __future__ import annotations

import io
import json
from fractions import Fraction
from pathlib import Path

import pytest

from placement_logic import ir
from placement_logic.cli import main
from placement_logic.frontend.loader import load_string
from placement_logic.ir import views

HF = Path(__file__).resolve().parent / "data" / "hf"

MODEL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --padded-vocab-size 128 --position-embedding-type "
         "rope --num-experts 8 --ffn-hidden-size 128 --seq-length 64 --bf16 --use-distributed-optimizer "
         "--sequence-parallel --disable-bias-linear --swiglu")


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _import(tmp_path, source, text, devices, *extra):
    f = tmp_path / ("job.toml" if source == "torchtitan" else "a.args")
    f.write_text(text)
    status, spec, err = _run(["import", source, str(f), "--devices", str(devices), *extra])
    assert status == 0, err
    return f, spec


def _expert_bytes(tmp_path, spec_text):
    """params and optimizer bytes per device of the expert group, from ``placement cost``."""
    (tmp_path / "s.place").write_text(spec_text)
    status, out, err = _run(["cost", str(tmp_path / "s.place"), "--groups", "--format", "json", "--no-cache"])
    assert status == 0, err
    groups = {g["name"]: g for g in json.loads(out)["plans"][0]["memory"]["param_groups"]}
    dev = groups["experts"]["per_device"]
    return Fraction(dev["params"]["exact"]), Fraction(dev["optimizer"]["exact"])


def test_megatron_folded_import_is_the_spec_written_by_hand(tmp_path):
    """Tensor 2 × data 8 for the dense layers; expert 4 × expert tensor 1 × expert data 4 for the
    experts. Megatron-LM numbers the ranks tensor-innermost: the dense boundaries are 2 and 16,
    the expert ones 1, 4 and 16, so the axes are tp (2), dp_ep (2) and dp_edp (4); tp and dp_ep
    are the experts' expert axes. On 8-device nodes (the default) tp × dp_ep = 4 devices lie
    inside a node, dp_edp's groups (stride 4, 16 devices) across nodes."""
    f, spec = _import(tmp_path, "megatron", "--tensor-model-parallel-size 2 --expert-model-parallel-size 4 "
                      "--expert-tensor-parallel-size 1 " + MODEL, 16)
    want = f"""from std.data import zero1
from std.tensor import megatron_sp

# from the Megatron-LM arguments in {f} on 16 devices (MoE parallel folding: dense tensor 2 × context 1 × data 8, \
experts on expert 4 × expert tensor 1 × expert data 4 of the same devices)
# assumed: 8 devices per node (the default: neither --gpus-per-node nor the launch line's --nproc_per_node says)
# assumed: links: tp, dp_ep inside a node (intra_node); dp_edp across nodes (inter_node) (ranks in Megatron-LM's \
order, innermost first: tensor, context, expert, data, pipeline)
model {{
  transformer {{
    hidden = 64
    layers = 2
    heads = 4
    vocab = 128
    ffn = 128
    gated_mlp
    norm = layernorm
    bias = false
    tied_embeddings
    experts = 8
    top_k = 2
  }}
  bytes {{
    params = 2
    grads = 4
    optimizer = 12
    activations = 2
  }}
  seq = 64
  microbatch = 1
  microbatches = 1
  group experts {{
    role = {{tp: expert, dp_ep: expert}}
  }}
}}

mesh {{
  dp_edp = 4 @ inter_node
  dp_ep = 2 @ intra_node
  tp = 2 @ intra_node
}}

plan megatron {{
  dp_edp: zero1
  dp_ep: zero1
  tp: megatron_sp
}}
"""
    assert spec == want


def _coords(plan, rank):
    """The mesh coordinates of a rank, the last mesh axis innermost."""
    sizes = [(a.name, int(a.size.value)) for a in plan.mesh.axes]
    out = {}
    for name, n in reversed(sizes):
        out[name], rank = rank % n, rank // n
    return out


def _groups(plan, n, axes):
    """The device groups that vary exactly ``axes`` (ranks 0..n-1)."""
    keys = {}
    for r in range(n):
        c = _coords(plan, r)
        keys.setdefault(tuple(v for a, v in sorted(c.items()) if a not in axes), set()).add(r)
    return sorted(map(sorted, keys.values()))


def _megatron_groups(n, sizes, which):
    """Megatron-LM's groups of ``which`` over ranks numbered with ``sizes`` innermost first."""
    names = [k for k, _ in sizes]
    keys = {}
    for r in range(n):
        c, x = {}, r
        for k, s in sizes:
            c[k], x = x % s, x // s
        keys.setdefault(tuple(c[k] for k in names if k != which), set()).add(r)
    return sorted(map(sorted, keys.values()))


FOLDED = [  # devices, tensor, context, expert, expert tensor
    (16, 2, 1, 4, 1),
    (16, 2, 2, 4, 2),
    (16, 1, 2, 2, 4),
    (16, 4, 1, 2, 2),
    (32, 2, 2, 8, 1),
    (16, 4, 1, 2, 1),  # the tensor group cut into expert and expert-data axes: one product
    (16, 1, 4, 2, 1),  # the context group so cut
]


@pytest.mark.parametrize("n,t,c,e,etp", FOLDED)
def test_megatron_folding_forms_megatron_groups_and_its_expert_bytes(tmp_path, n, t, c, e, etp):
    args = (f"--tensor-model-parallel-size {t} --context-parallel-size {c} --expert-model-parallel-size {e} "
            f"--expert-tensor-parallel-size {etp} " + MODEL)
    _, text = _import(tmp_path, "megatron", args, n)
    spec = load_string(text)
    plan = spec.plan("megatron")
    group = views.expert_group(plan)
    assert group is not None
    dp, edp = n // (t * c), n // (etp * e)

    def axes(role_of, *roles):
        return {a for a in plan.mesh.names if role_of(a) in roles}

    dense = [("tp", t), ("cp", c), ("dp", dp)]
    expert = [("etp", etp), ("ep", e), ("edp", edp)]
    expert_role = (lambda a: views.role_of(plan, group, a))
    for which, roles in (("tp", (ir.Role.TENSOR, ir.Role.SEQUENCE)), ("cp", (ir.Role.CONTEXT,)),
                         ("dp", (ir.Role.DATA,))):
        assert _groups(plan, n, axes(plan.role, *roles)) == _megatron_groups(n, dense, which), which
    for which, roles in (("etp", (ir.Role.TENSOR, ir.Role.SEQUENCE)), ("ep", (ir.Role.EXPERT,)),
                         ("edp", (ir.Role.DATA,))):
        assert _groups(plan, n, axes(expert_role, *roles)) == _megatron_groups(n, expert, which), which

    # every rank: its expert rank (Megatron-LM's numbering) holds experts [ep_rank·E/e, (ep_rank+1)·E/e),
    # each a gated MLP (3 matrices h × f per layer) split over the expert tensor ranks; bf16 weights, a
    # 12-byte optimizer state sharded over the expert-data ranks by the distributed optimizer
    E, h, f, L = 8, 64, 128, 2
    per_expert = 3 * h * f * L
    seen = set()
    for r in range(n):
        ep_rank = (r // etp) % e
        mine = [j for j in range(E) if ep_rank * E // e <= j < (ep_rank + 1) * E // e]
        params = sum(Fraction(per_expert, etp) for _ in mine)
        seen.add((2 * params, 12 * params / edp))
    assert len(seen) == 1
    assert _expert_bytes(tmp_path, text) == seen.pop()


def test_megatron_tensor_group_cut_by_the_folding_is_one_ring(tmp_path):
    """Tensor 4, expert 2, expert tensor 2 on 16 devices: the expert ranks cut each tensor group of 4
    into tp_ep × tp_etp, bound as one product. Megatron-LM gathers and scatters over its 4-rank
    tensor group (sequence parallelism, which it requires with MoE and tensor parallelism): a ring
    all-gather or reduce-scatter of a B-byte tensor over n ranks sends (n−1)/n·B per rank, 0.75·B
    for n = 4 (two over 2 ranks would send 2 × 0.5·B). With s = 64, b = 1, h = 64 and bf16,
    B = 64·64·2 = 8192: 2 layers × 1 microbatch × (2 all-gathers + 2 reduce-scatters) in each of
    forward and backward, the embedding's reduce-scatter and its gradient's all-gather, the head's
    all-gather and its gradient's reduce-scatter, and in backward the two column-parallel inputs
    of each layer and the head's gathered again for the weight gradients, each of B; the cross
    entropy's 3 all-reduces of s·b·4 = 256 bytes (2·(n−1)/n each), every one over the 4 ranks:
    0.75 × (16·8192 + 4·8192 + 5·8192) + 1.5 × 3·256 = 154752 bytes."""
    f, text = _import(tmp_path, "megatron", "--tensor-model-parallel-size 4 --expert-model-parallel-size 2 "
                      "--expert-tensor-parallel-size 2 " + MODEL, 16)
    assert "  [tp_ep, tp_etp]: megatron_sp\n" in text and "role = {tp_ep: expert}" in text
    (tmp_path / "s.place").write_text(text)
    status, out, err = _run(["cost", str(tmp_path / "s.place"), "--format", "json", "--no-cache"])
    assert status == 0, err
    tensor = [c for c in json.loads(out)["plans"][0]["communication"]["collectives"]
              if c["kind"] != "all_to_all" and c["state"] == "activations"]
    assert {tuple(c["axes"]) for c in tensor} == {("tp_ep", "tp_etp")}
    B = 64 * 64 * 2
    layers = [c for c in tensor if c["rule"].startswith("Megatron SP: 2 all-gather")]
    assert sorted((c["kind"], c["phase"], c["count"], c["bytes_per_device"]) for c in layers) == \
        sorted((k, p, 4, 4 * B * 3 // 4) for k in ("all_gather", "reduce_scatter") for p in ("forward", "backward"))
    assert sum(c["bytes_per_device"] for c in tensor) == Fraction(3, 4) * 25 * B + Fraction(3, 2) * 3 * 64 * 4 == 154752
    plan = load_string(text).plan("megatron")
    assert plan.groups_with_role(ir.Role.TENSOR) == (("tp_ep", "tp_etp"),)


def test_megatron_folding_of_tensor_ranks_without_sequence_parallelism_is_refused(tmp_path):
    """The same arguments without --sequence-parallel: Megatron-LM asserts against them, and the
    experts on tensor ranks that each hold the whole sequence would see every token 2 times."""
    f = tmp_path / "a.args"
    f.write_text("--tensor-model-parallel-size 4 --expert-model-parallel-size 2 --expert-tensor-parallel-size 2 "
                 + MODEL.replace("--sequence-parallel ", ""))
    status, out, err = _run(["import", "megatron", str(f), "--devices", "16"])
    assert status == 2 and out == "" and "[PL133]" in err and f"{f}:1:63: error:" in err, err


def test_megatron_folding_that_is_not_whole_axes_is_stated(tmp_path):
    """Expert groups of 3 ranks over tensor pairs cut a tensor group without containing it: no
    mesh of whole axes forms both; the plan carves the expert axis out of the data devices."""
    f = tmp_path / "a.args"
    f.write_text("--tensor-model-parallel-size 2 --expert-model-parallel-size 3 --expert-tensor-parallel-size 1 "
                 + MODEL.replace("--num-experts 8", "--num-experts 6"))
    status, spec, err = _run(["import", "megatron", str(f), "--devices", "12"])
    assert status == 1 and "not expressed in the plan: --expert-model-parallel-size 3 with " \
        "--expert-tensor-parallel-size 1" in err
    plan = load_string(spec).plan("megatron")
    assert [(a.name, a.size.value) for a in plan.mesh.axes] == [("dp", 2), ("ep", 3), ("tp", 2)]


def test_megatron_plain_expert_parallel_is_unchanged(tmp_path):
    """The expert tensor size the dense one and no context: the expert axis of plain expert parallelism."""
    _, text = _import(tmp_path, "megatron", "--tensor-model-parallel-size 2 --expert-model-parallel-size 2 " + MODEL, 8)
    plan = load_string(text).plan("megatron")
    assert views.expert_group(plan) is None
    assert [(a.name, a.size.value, plan.role(a.name)) for a in plan.mesh.axes] == [
        ("dp", 2, ir.Role.DATA), ("ep", 2, ir.Role.EXPERT), ("tp", 2, ir.Role.TENSOR)]


TITAN = """[training]
local_batch_size = 1
seq_len = 4096

[parallelism]
data_parallel_shard_degree = -1
tensor_parallel_degree = {t}
context_parallel_degree = {c}
expert_parallel_degree = {e}
expert_tensor_parallel_degree = {etp}
"""


def test_torchtitan_folded_import_is_the_spec_written_by_hand(tmp_path):
    """Mixtral-8x7B on 64 devices, FSDP over the rest, tensor 2, expert 8 with expert tensor 1:
    torchtitan's mesh is dp_shard_mod_ep 8 × dp_shard_in_ep 4 × tensor 2, the expert degree the
    shard_in_ep devices and the tensor pair. On 8-device nodes tp × dp_ep = 8 devices fill a
    node; dp's groups (stride 8) cross nodes."""
    model = str(HF / "mixtral_8x7b.json")
    f, spec = _import(tmp_path, "torchtitan", TITAN.format(t=2, c=1, e=8, etp=1), 64, "--model", model)
    want = f"""from std.data import fsdp_full_shard
from std.recompute import selective_recompute
from std.tensor import megatron_sp

# from the torchtitan job {f} on 64 devices (MoE parallel folding: experts on expert 8 = data shard 4 × context 1 × \
tensor 2, expert tensor 1)
# assumed: 8 devices per node (the default: neither --gpus-per-node nor a torchtitan job says)
# assumed: links: tp, dp_ep inside a node (intra_node); dp across nodes (inter_node) (ranks in torchtitan's device \
mesh order, innermost first: tensor, context, data shard, data replicate, pipeline)
model from "{model}" {{
  bytes {{
    params = 2
    grads = 2
    optimizer = 12
    activations = 2
  }}
  seq = 4096
  microbatch = 1
  microbatches = 1
  group experts {{
    role = {{dp_ep: expert, tp: expert}}
  }}
}}

mesh {{
  dp = 8 @ inter_node
  dp_ep = 4 @ intra_node
  tp = 2 @ intra_node
}}

plan torchtitan {{
  dp: fsdp_full_shard
  dp_ep: fsdp_full_shard
  tp: megatron_sp
  use selective_recompute
  flash_attention
}}
"""
    assert spec == want


@pytest.mark.parametrize("n,t,c,e,etp", [(64, 2, 1, 8, 1), (32, 2, 2, 4, 2), (32, 1, 2, 8, 1), (16, 2, 1, 2, 2)])
def test_torchtitan_folding_forms_its_groups_and_expert_bytes(tmp_path, n, t, c, e, etp):
    """torchtitan's mesh (dp_shard_mod_ep, dp_shard_in_ep, cp, tp), the last innermost: the experts'
    expert group varies dp_shard_in_ep, cp (and tp when etp = 1); each device keeps an FSDP shard
    (over dp_shard_mod_ep, and over tp when etp = tp splits each expert) of its expert rank's experts."""
    _, text = _import(tmp_path, "torchtitan", TITAN.format(t=t, c=c, e=e, etp=etp), n, "--model",
                      str(HF / "mixtral_8x7b.json"))
    plan = load_string(text).plan("torchtitan")
    group = views.expert_group(plan)
    in_ep = e // (c * (t if etp == 1 else 1))
    mod_ep = n // (t * c * in_ep)
    sizes = [("dp_shard_mod_ep", mod_ep), ("dp_shard_in_ep", in_ep), ("cp", c), ("tp", t)]
    ep_dims = ["dp_shard_in_ep", "cp"] + (["tp"] if etp == 1 else [])
    keys = {}
    for r in range(n):
        coord, x = {}, r
        for k, s in reversed(sizes):
            coord[k], x = x % s, x // s
        keys.setdefault(tuple(v for k, v in coord.items() if k not in ep_dims), set()).add(r)
    want_ep = sorted(map(sorted, keys.values()))
    got_ep = _groups(plan, n, {a for a in plan.mesh.names if views.role_of(plan, group, a) is ir.Role.EXPERT})
    assert got_ep == want_ep

    h, f, L, E = 4096, 14336, 32, 8
    per_expert = 3 * h * f * L
    seen = set()
    for r in range(n):
        coord, x = {}, r
        for k, s in reversed(sizes):
            coord[k], x = x % s, x // s
        ep_rank = 0
        for k in ep_dims:
            ep_rank = ep_rank * dict(sizes)[k] + coord[k]
        mine = [j for j in range(E) if j * e // E == ep_rank]  # whole experts per expert rank
        shard = Fraction(len(mine) * per_expert, mod_ep * (t if etp == t else 1))  # FSDP (and tensor) shards
        seen.add((2 * shard, 12 * shard))
    assert len(seen) == 1
    assert _expert_bytes(tmp_path, text) == seen.pop()


def test_torchtitan_expert_tensor_degree_other_than_1_or_tensor_is_an_error(tmp_path):
    f = tmp_path / "job.toml"
    f.write_text(TITAN.format(t=2, c=1, e=2, etp=4))
    status, _, err = _run(["import", "torchtitan", str(f), "--devices", "8", "--model", str(HF / "mixtral_8x7b.json")])
    # at the key: line 10 of TITAN (three [training] lines, a blank, [parallelism] and its five keys)
    assert status == 2 and f"{f}:10:1: error: parallelism.expert_tensor_parallel_degree 4 is 1 or the tensor degree 2 " \
        "[PL141]" in err


@pytest.mark.parametrize("n,t,c,e,etp", FOLDED)
def test_megatron_folding_round_trips(tmp_path, n, t, c, e, etp):
    """Exported again, a folded import gives Megatron-LM's sizes back, and importing those gives
    the same spec (the first line names the file read)."""
    args = (f"--tensor-model-parallel-size {t} --context-parallel-size {c} --expert-model-parallel-size {e} "
            f"--expert-tensor-parallel-size {etp} " + MODEL)
    _, text = _import(tmp_path, "megatron", args, n)
    (tmp_path / "s.place").write_text(text)
    status, exported, err = _run(["export", "megatron", str(tmp_path / "s.place"), "--plan", "megatron"])
    assert status == 0, err
    got = exported.split()
    flags = {f: int(got[got.index(f) + 1]) if f in got else 1 for f in (
        "--tensor-model-parallel-size", "--context-parallel-size", "--expert-model-parallel-size",
        "--expert-tensor-parallel-size")}
    assert list(flags.values()) == [t, c, e, etp]
    (tmp_path / "b.args").write_text(exported)
    status, back, err = _run(["import", "megatron", str(tmp_path / "b.args"), "--devices", str(n)])
    assert status == 0, err
    strip = [line for line in text.splitlines() if not line.startswith("# from")]
    assert [line for line in back.splitlines() if not line.startswith("# from")] == strip


def test_folding_examples_export_their_megatron_sizes():
    """examples/mixtral_folding.place (tensor 2, experts on t × e = 8, expert tensor 1) and
    examples/deepseek_v3_folding.place (tensor 2, expert 64 = e × t)."""
    root = HF.parent.parent.parent / "examples"
    for name, want in (("mixtral_folding", "--tensor-model-parallel-size 2 --expert-model-parallel-size 8 "
                        "--expert-tensor-parallel-size 1"),
                       ("deepseek_v3_folding", "--tensor-model-parallel-size 2 --expert-model-parallel-size 64 "
                        "--expert-tensor-parallel-size 1")):
        status, out, err = _run(["export", "megatron", str(root / f"{name}.place"), "--plan", "folded"])
        assert status == 0 and want in out, (name, err)


def test_folding_out_of_megatron_rank_order_is_stated(tmp_path):
    """Experts on the outer data axis d while the inner e stays their data axis: Megatron-LM's
    expert ranks are the inner ones after the expert tensor ranks."""
    (tmp_path / "s.place").write_text("""from std.data import zero1
from std.tensor import megatron_sp
model {
  transformer { hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = 8  top_k = 2  bias = false }
  seq = 16
  group experts { role = {d: expert} }
}
mesh { d = 2  e = 2  t = 2 }
plan p { d: zero1  e: zero1  t: megatron_sp }
""")
    status, _, err = _run(["export", "megatron", str(tmp_path / "s.place"), "--plan", "p"])
    assert status == 1 and "the expert roles of the axes, innermost first (t (tensor), e (data), d (expert))" in err


def test_plain_expert_axis_beside_a_context_axis_is_not_megatron_layout(tmp_path):
    (tmp_path / "s.place").write_text("""from std.context import context_parallel
from std.expert import expert_parallel
model {
  transformer { hidden = 64  layers = 2  heads = 4  ffn = 128  vocab = 128  experts = 8  top_k = 2  bias = false }
  seq = 16
}
mesh { c = 2  x = 2 }
plan p { c: context_parallel  x: expert_parallel }
""")
    status, _, err = _run(["export", "megatron", str(tmp_path / "s.place"), "--plan", "p"])
    assert status == 1 and "an expert axis beside a context axis: Megatron-LM forms its expert groups from the " \
        "context ranks first" in err


@pytest.mark.parametrize("n,t,c,e,etp", [(64, 2, 1, 8, 1), (32, 2, 2, 4, 2), (32, 1, 2, 8, 1), (16, 2, 1, 2, 2)])
def test_torchtitan_folding_round_trips(tmp_path, n, t, c, e, etp):
    """Exported again, a folded torchtitan import gives its degrees back (the data-shard degree
    over both data-shard axes), and importing those gives the same spec."""
    model = str(HF / "mixtral_8x7b.json")
    _, text = _import(tmp_path, "torchtitan", TITAN.format(t=t, c=c, e=e, etp=etp), n, "--model", model)
    (tmp_path / "s.place").write_text(text)
    status, exported, err = _run(["export", "torchtitan", str(tmp_path / "s.place"), "--plan", "torchtitan"])
    assert status == 0, err
    import tomllib

    par = tomllib.loads(exported)["parallelism"]
    assert (par["data_parallel_shard_degree"], par.get("context_parallel_degree", 1), par["expert_parallel_degree"],
            par["expert_tensor_parallel_degree"]) == (n // (t * c), c, e, etp)
    (tmp_path / "b.toml").write_text(exported)
    status, back, err = _run(["import", "torchtitan", str(tmp_path / "b.toml"), "--devices", str(n), "--model", model])
    assert status == 0, err
    assert [x for x in back.splitlines() if not x.startswith("# from")] == \
        [x for x in text.splitlines() if not x.startswith("# from")]


def test_folding_outside_torchtitan_mesh_is_stated(tmp_path):
    """Experts on the outer data-shard axis while the inner one stays their data axis."""
    (tmp_path / "s.place").write_text(f"""from std.data import fsdp_full_shard
from std.tensor import megatron_sp
model from "{HF / 'mixtral_8x7b.json'}" {{
  seq = 4096
  group experts {{ role = {{d: expert}} }}
}}
mesh {{ d = 4  s = 2  t = 2 }}
plan p {{ d: fsdp_full_shard  s: fsdp_full_shard  t: megatron_sp  flash_attention }}
""")
    status, _, err = _run(["export", "torchtitan", str(tmp_path / "s.place"), "--plan", "p"])
    assert status == 1 and "the expert group's roles, innermost first (t (tensor; experts: tensor), s (data; " \
        "experts: data), d (data; experts: expert))" in err
