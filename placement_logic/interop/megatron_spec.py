"""Megatron-LM arguments -> specs (see ``interop.frameworks``)."""

from __future__ import annotations

import difflib
import re
import shlex

from ..diagnostics import Code, Diagnostic, DiagnosticError, Span
from ..frontend.configs import MAX_INT_DIGITS
from .framework_common import (
    ImportReport,
    _err,
    _imports,
    _mesh_and_plan,
    _widths,
    fold_axes,
    links_assumption,
    node_links,
    per_node_source,
)

_MEGATRON_INT = {
    "--tensor-model-parallel-size": "t", "--pipeline-model-parallel-size": "p", "--context-parallel-size": "c",
    "--expert-model-parallel-size": "e", "--expert-tensor-parallel-size": "etp",
    "--num-layers-per-virtual-pipeline-stage": "layers_per_chunk",
    "--num-virtual-stages-per-pipeline-rank": "v", "--micro-batch-size": "mb", "--global-batch-size": "gbs",
    "--seq-length": "s", "--num-layers": "L", "--hidden-size": "h", "--num-attention-heads": "a",
    "--num-query-groups": "kv", "--ffn-hidden-size": "f", "--padded-vocab-size": "V", "--vocab-size": "vocab",
    "--make-vocab-size-divisible-by": "vdiv", "--max-position-embeddings": "maxpos",
    "--num-experts": "E", "--moe-router-topk": "k", "--kv-channels": "dh", "--moe-ffn-hidden-size": "ef",
    "--moe-shared-expert-intermediate-size": "sf", "--mtp-num-layers": "mtp", "--q-lora-rank": "qr",
    "--kv-lora-rank": "kvr", "--qk-head-dim": "qkd", "--qk-pos-emb-head-dim": "qkp", "--v-head-dim": "vd",
    "--recompute-num-layers": "rnl", "--muon-num-ns-steps": "ns",
}
_MEGATRON_FLAGS = {"--sequence-parallel": "sp", "--use-distributed-optimizer": "dist_opt", "--swiglu": "swiglu",
                   "--untie-embeddings-and-output-weights": "untie", "--disable-bias-linear": "no_bias",
                   "--group-query-attention": "gqa", "--bf16": "bf16", "--fp16": "fp16", "--add-qkv-bias": "qkv_bias",
                   "--qk-layernorm": "qk_norm", "--multi-latent-attention": "mla",
                   "--moe-router-enable-expert-bias": "router_bias", "--use-flash-attn": "flash",
                   "--accumulate-allreduce-grads-in-fp32": "fp32_grads",
                   "--use-layer-wise-distributed-optimizer": "layer_wise"}
_MEGATRON_CHOICES = {"--recompute-granularity": ("recompute", {"selective": "selective", "full": "full"}),
                     "--recompute-method": ("method", {"uniform": "uniform", "block": "block"}),
                     "--normalization": ("norm", {"RMSNorm": "rmsnorm", "LayerNorm": "layernorm"}),
                     "--position-embedding-type": ("pos", {"rope": "rope", "learned_absolute": "learned",
                                                           "none": "none"}),
                     "--optimizer": ("optimizer", {"adam": "adam", "sgd": "sgd", "muon": "muon"}),
                     "--muon-tp-mode": ("tp_mode", {"blockwise": "blockwise", "duplicated": "duplicated",
                                                    "distributed": "distributed"})}


def _moe_layer_freq(text: str, layers: int, file: str) -> list[bool]:
    """Megatron-LM's --moe-layer-freq: an integer k (MoE on layers i with i mod k = 0) or a
    Python list of 0/1 per layer, written as list literals joined by + and repeated by *
    (``([0]*3+[1]*58)``); parsed here without evaluating anything."""
    t = text.replace(" ", "")
    if t.isdigit():
        k = int(t)
        if k < 1:
            raise _err(file, "--moe-layer-freq needs a positive integer or a list of 0/1 per layer")
        return [i % k == 0 for i in range(layers)]
    if t.startswith("(") and t.endswith(")"):
        t = t[1:-1]
    out: list[bool] = []
    for term in t.split("+"):
        m = re.fullmatch(r"\[([01](?:,[01])*)\](?:\*(\d+))?", term)
        if m is None:
            raise _err(file, f"--moe-layer-freq {text!r} is neither an integer nor a list of 0/1 such as "
                       "([0]*3+[1]*58)")
        out += [x == "1" for x in m.group(1).split(",")] * int(m.group(2) or 1)
    if len(out) != layers:
        raise _err(file, f"--moe-layer-freq lists {len(out)} layers, not --num-layers {layers}")
    return out


def _fit_moe_pattern(moe: list[bool], file: str) -> dict[str, int]:
    """dense_layers, moe_every and moe_offset (as few as needed) for a per-layer MoE pattern."""
    ones = [i for i, m in enumerate(moe) if m]
    if not ones:
        raise _err(file, "--moe-layer-freq makes no layer an MoE layer")
    if ones == list(range(ones[0], len(moe))):
        return {"dense_layers": ones[0]} if ones[0] else {}
    k = ones[1] - ones[0] if len(ones) > 1 else len(moe)  # one MoE layer: a period longer than the model
    d, r = ones[0], ones[0] % k
    if moe != [i >= d and i % k == r for i in range(len(moe))]:
        raise _err(file, "--moe-layer-freq: MoE layers that are not every k-th layer after the first dense ones are "
                   "not modelled")
    out = {"moe_every": k}
    if r:
        out["moe_offset"] = r
    if d >= k:
        out["dense_layers"] = d
    return out


def _arg_error(text: str, file: str, word: str, message: str, notes: tuple[str, ...] = (),
               code: str = Code.BAD_FRAMEWORK_CONFIG) -> DiagnosticError:
    """A PL141 (or ``code``) located at the first occurrence of ``word`` in the arguments' text."""
    at = text.find(word) if word else -1
    if at < 0:
        return DiagnosticError([Diagnostic(code, message, Span.point(file, 1, 1), notes=notes)])
    line = text.count("\n", 0, at) + 1
    col = at - (text.rfind("\n", 0, at) + 1) + 1
    return DiagnosticError([Diagnostic(code, message, Span(file, line, col, line, col + len(word)), notes=notes)],
                           {file: text})


def _first(text: str, *flags: str) -> str:
    """The first of ``flags`` the arguments' text holds ("" when none: the error is unlocated)."""
    return next((f for f in flags if f in text), "")


# a launch line's options (torchrun, python -m torch.distributed.run): the devices per node and the node count
_LAUNCH = {"--nproc_per_node": "nproc", "--nproc-per-node": "nproc", "--nnodes": "nnodes"}
DROPPED_WHY = ("not read: the plan takes from Megatron-LM's arguments the parallel sizes, the batch, the precision, "
               "recompute, the attention kernel and the model's shape")


def _known_options() -> tuple[str, ...]:
    return tuple(_MEGATRON_INT) + tuple(_MEGATRON_CHOICES) + tuple(_MEGATRON_FLAGS) + ("--moe-layer-freq",) \
        + tuple(_LAUNCH)


def _megatron_args(text: str, file: str) -> dict:
    try:
        args = shlex.split(text.replace("\\\n", " "), comments=True)  # a shell line continued by a backslash
    except ValueError as exc:  # an unclosed quote, a lone escape at the end
        raise _err(file, f"not a Megatron-LM argument list: {exc}") from None
    got: dict = {}
    known = _known_options()
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, inline = a.partition("=")
        if key.startswith("--") and key not in known:
            # Megatron-LM has hundreds of options that change no cost; one a letter or two away from an
            # option read here is a typo that would otherwise vanish (and change the plan)
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.9)
            if close:
                raise _arg_error(text, file, key, f"unknown argument {key}", (f"did you mean {close[0]}?",))
        if key.startswith("--"):
            got.setdefault("_read" if key in known else "_dropped", []).append(key)
        if key in _LAUNCH:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            if value.isascii() and value.isdigit() and 0 < len(value) <= MAX_INT_DIGITS and int(value) > 0:
                got[_LAUNCH[key]] = int(value)
            else:  # torchrun's "gpu", "auto" or an elastic range "1:4": no count to read
                got["_read"].remove(key)
                got.setdefault("_dropped", []).append(f"{key} {value}")
            continue
        if key == "--moe-layer-freq":
            got["moe_freq"] = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            continue
        if key in _MEGATRON_INT or key in _MEGATRON_CHOICES:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if eq else 2
            if key in _MEGATRON_INT:
                if not value.isascii() or not value.isdigit() or len(value) > MAX_INT_DIGITS or int(value) < 1:
                    shown = value if len(value) <= 40 else value[:37] + "..."
                    raise _arg_error(text, file, a, f"{key} needs a positive integer of at most {MAX_INT_DIGITS} "
                                     f"digits, not {shown!r}")
                got[_MEGATRON_INT[key]] = int(value)
            else:
                name, table = _MEGATRON_CHOICES[key]
                if value not in table:
                    raise _arg_error(text, file, a, f"{key} {value!r} is not modelled ({', '.join(table)})")
                got[name] = table[value]
            continue
        if a in _MEGATRON_FLAGS:
            got[_MEGATRON_FLAGS[a]] = True
        i += 1
    return got


def _megatron_folding(got: dict, t: int, c: int, dp_all: int, e: int, etp: int, file: str,
                      problems: list[str]) -> tuple[list[tuple[str, int, str, str]], dict[str, str]] | None:
    """Megatron-LM's MoE parallel folding as mesh axes and the expert group's roles, or None
    when the experts are laid out as plain expert parallelism (an expert axis carved out of the
    data-parallel devices, the expert tensor size the dense one) or have no experts.

    Megatron-LM numbers the devices of a pipeline stage tensor-innermost: tensor × context ×
    data for the dense layers, expert tensor × expert × expert data for the experts. The
    axes are the cuts of both groupings (``fold_axes``): e.g. tensor 2, data 32, expert 8,
    expert tensor 1 gives tp (2, expert for the experts), dp_ep (4, expert) and dp_edp (8)."""
    if got.get("E", 1) <= 1 or (etp == t and (c == 1 or e == 1)):
        return None
    inner = t * c * dp_all
    if inner % (etp * e):
        raise _err(file, f"--expert-tensor-parallel-size {etp} × --expert-model-parallel-size {e} does not divide "
                   f"tensor × context × data parallel {inner}")
    axes = fold_axes([("tp", t), ("cp", c), ("dp", dp_all)], [("etp", etp), ("ep", e), ("edp", inner // (etp * e))])
    if axes is None:
        problems.append(f"--expert-model-parallel-size {e} with --expert-tensor-parallel-size {etp}: expert groups that "
                        f"cut across the tensor {t} × context {c} ranks without containing them are not whole mesh "
                        "axes; the plan carves the expert axis out of the data-parallel devices")
        return None
    dense = {"tp": "tensor", "cp": "context", "dp": "data"}
    expert = {"etp": "tensor", "ep": "expert", "edp": "data"}
    return axes, {a: expert[x] for a, _, d, x in axes if expert[x] != dense[d]}


def _folding_without_sp(text: str, file: str, t: int, etp: int) -> DiagnosticError:
    """PL133 at the --expert-tensor-parallel-size argument (else at the tensor size): experts
    folded over tensor ranks that each hold the whole sequence."""
    flag = "--expert-tensor-parallel-size" if "--expert-tensor-parallel-size" in text else "--tensor-model-parallel-size"
    m = re.search(re.escape(flag) + r"(?:=|\s+)\S*", text)
    at, length = (m.start(), len(m.group())) if m else (0, 1)
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    span = Span(file, line, column, line, column + length)
    return DiagnosticError([Diagnostic(
        Code.FOLD_NEEDS_SEQUENCE_PARALLEL, f"--expert-tensor-parallel-size {etp} folds the experts over the tensor ranks of "
        f"--tensor-model-parallel-size {t} without --sequence-parallel: every tensor rank holds the whole sequence, "
        "so each token would reach the experts once per tensor rank", span,
        notes=("Megatron-LM asserts it: \"When using expert parallelism and tensor parallelism, sequence "
               "parallelism must be used\"", "add --sequence-parallel"))], {file: text})


def _shape_lines(got: dict, t: int, text: str, file: str) -> list[str]:
    """The transformer block's lines of the model flags (tensor size ``t`` pads the vocabulary)."""
    for need in ("L", "h", "a"):
        if need not in got:
            flag = next(k for k, v in _MEGATRON_INT.items() if v == need)
            raise _err(file, f"the arguments have no {flag}, which the model needs")
    if "V" not in got and "vocab" not in got:
        raise _err(file, "the arguments have no --padded-vocab-size or --vocab-size, which the model needs")
    tr = [f"hidden = {got['h']}", f"layers = {got['L']}", f"heads = {got['a']}"]
    if "V" in got:
        tr.append(f"vocab = {got['V']}")
    else:  # Megatron-LM pads the vocabulary to a multiple of make-vocab-size-divisible-by (128) × tensor size
        tr += [f"vocab = {got['vocab']}", f"vocab_multiple = {got.get('vdiv', 128) * t}"]
    tr += _layer_lines(got)
    if got.get("pos", "learned") == "learned":  # Megatron-LM's default position embedding
        rows = got.get("maxpos", got.get("s"))
        if rows is None:
            raise _arg_error(text, file, "--position-embedding-type", "learned absolute position embeddings (the "
                             "default --position-embedding-type) need --max-position-embeddings")
        tr.append(f"position_embeddings = {rows}")
    if got.get("mla"):
        tr += _mla_lines(got, text, file)
    if got.get("E", 1) > 1:
        tr += _expert_lines(got, file)
    if got.get("mtp"):
        tr.append(f"mtp_layers = {got['mtp']}")
    return tr


def _layer_lines(got: dict) -> list[str]:
    """Attention groups and head width, the MLP, norm, biases and embeddings of a layer."""
    tr = []
    if got.get("gqa") and "kv" in got:
        tr.append(f"kv_heads = {got['kv']}")
    if "f" in got:
        tr.append(f"ffn = {got['f']}")
    if got.get("dh") and got["dh"] * got["a"] != got["h"]:
        tr.append(f"head_dim = {got['dh']}")
    if got.get("swiglu"):
        tr.append("gated_mlp")
    tr.append(f"norm = {got.get('norm', 'layernorm')}")
    tr.append("bias = false" if got.get("no_bias") else "bias = true")
    if got.get("qkv_bias") and got.get("no_bias"):
        tr.append("qkv_bias")
    if got.get("qk_norm"):
        tr.append("qk_norm")
    tr.append("tied_embeddings = false" if got.get("untie") else "tied_embeddings")
    return tr


def _mla_lines(got: dict, text: str, file: str) -> list[str]:
    """--multi-latent-attention's ranks and head widths (every one but the query rank required)."""
    tr = []
    for key, name in (("qr", "q_lora_rank"), ("kvr", "kv_lora_rank"), ("qkp", "qk_rope_dim"),
                      ("qkd", "qk_nope_dim"), ("vd", "v_head_dim")):
        if key in got:
            tr.append(f"{name} = {got[key]}")
        elif key != "qr":
            flag = next(k for k, v in _MEGATRON_INT.items() if v == key)
            raise _arg_error(text, file, "--multi-latent-attention", f"--multi-latent-attention needs "
                             f"{flag}")
    return tr


def _expert_lines(got: dict, file: str) -> list[str]:
    """The experts, their router, widths and the layers that hold them."""
    tr = [f"experts = {got['E']}", f"top_k = {got.get('k', 2)}"]
    if "ef" in got:
        tr.append(f"expert_ffn = {got['ef']}")
    if "sf" in got:
        tr += ["shared_experts = 1", f"shared_expert_ffn = {got['sf']}"]
    if got.get("router_bias"):
        tr.append("router_bias")
    if "moe_freq" in got:
        tr += [f"{k} = {v}" for k, v in _fit_moe_pattern(_moe_layer_freq(got["moe_freq"], got["L"], file),
                                                          file).items()]
    return tr


def _launch_devices(got: dict, text: str, file: str, devices: int | None) -> int:
    """The device count: ``devices`` (``--devices``), else a launch line's ``--nnodes`` ×
    ``--nproc_per_node``; PL162 where the two disagree."""
    launched = got["nnodes"] * got["nproc"] if "nnodes" in got and "nproc" in got else None
    if devices is not None and launched is not None and devices != launched:
        raise _arg_error(text, file, "--nnodes", f"the launch line starts --nnodes {got['nnodes']} × "
                         f"--nproc_per_node {got['nproc']} = {launched} processes, not --devices {devices}",
                         code=Code.LAUNCH_LINE_DEVICES)
    if devices is None and launched is None:
        from ..diagnostics import COMMAND_LINE

        raise DiagnosticError([Diagnostic(Code.BAD_SET, "placement import megatron needs --devices N (N >= 1), or a "
                                          "launch line with --nnodes and --nproc_per_node",
                                          Span(COMMAND_LINE, 1, 1, 1, 10, "--devices"))])
    return devices if devices is not None else launched


def _optimizer_lines(got: dict, t: int, dp: int, folded: bool, problems: list[str], report: ImportReport) -> list[str]:
    """--optimizer sgd | muon (Megatron-LM's Muon on the linear layers' matrices, Adam on the rest):
    the plan's optimizer section; --muon-tp-mode duplicated or distributed gives each tensor rank the
    whole matrix (a gather over tp), blockwise (the default) orthogonalises each rank's own block;
    --use-layer-wise-distributed-optimizer shards the state by whole layers over dp (owners)."""
    alg = got.get("optimizer")
    if alg == "sgd":
        return ["optimizer {\n    all = sgd\n  }"]
    if alg != "muon":
        return []
    out = [f"optimizer {{\n    matrices = muon(ns_steps = {got.get('ns', 5)})\n  }}"]
    mode = got.get("tp_mode", "blockwise")
    if folded and (t > 1 or got.get("layer_wise")):
        problems.append("Muon's tensor mode and layer-wise sharding under MoE parallel folding are not expressed")
        return out
    if t > 1 and mode in ("duplicated", "distributed"):
        out.append("override optimizer[matrices]: gather over (tp)")
        if mode == "distributed":
            report.assumed.append("--muon-tp-mode distributed: Newton-Schulz computed jointly over tp, the whole "
                                  "matrix's update; costed as every tensor rank gathering each matrix")
    elif t > 1:
        report.assumed.append("--muon-tp-mode blockwise: each tensor rank orthogonalises its own block of every "
                              "matrix (no gather), which placement check refutes against single-device Muon")
    if got.get("layer_wise") and dp > 1:
        out.append("override optimizer[matrices]: round_robin over (dp)")
    return out


def _recompute_lines(got: dict, chunks: int, problems: list[str]) -> list[str]:
    """--recompute-granularity as the plan's recompute (``chunks``: pipeline × virtual stages)."""
    if got.get("recompute") == "selective":
        return ["use selective_recompute"]
    if got.get("recompute") != "full":
        return []
    method, n = got.get("method", "uniform"), got.get("rnl", 1)
    per_chunk = got["L"] // chunks
    if not ((method, n) == ("uniform", 1) or (method == "block" and n >= per_chunk)):
        what = (f"checkpointing groups of {n} layers" if method == "uniform" else
                f"recomputing only {n} of the {per_chunk} layers of each chunk")
        problems.append(f"--recompute-method {method} --recompute-num-layers {n}: {what} is not modelled (full "
                        "recompute keeps each layer's input and recomputes every layer: uniform 1, or block over "
                        "every layer of a chunk); the plan recomputes every layer")
    return ["use full_recompute"]


def megatron_to_spec(text: str, file: str, devices: int | None, problems: list[str] | None = None, *,
                     report: ImportReport | None = None, per_node: int | None = None) -> str:
    """The spec of Megatron-LM arguments; what the DSL cannot express is appended to ``problems``,
    what was assumed (devices per node, the links) and the arguments read and dropped to
    ``report``. ``devices`` None: the launch line's node count × processes per node."""
    problems = [] if problems is None else problems
    report = ImportReport() if report is None else report
    got = _megatron_args(text, file)
    devices = _launch_devices(got, text, file, devices)
    report.read += got.get("_read", [])
    report.dropped += [(a, DROPPED_WHY) for a in got.get("_dropped", [])]
    t, p, c, e = (got.get(k, 1) for k in ("t", "p", "c", "e"))
    if devices % (t * p * c):
        flag = _first(text, "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size")
        raise _arg_error(text, file, flag, f"{devices} devices are not a multiple of tensor {t} × pipeline {p} × "
                         f"context {c}")
    dp_all = devices // (t * p * c)  # Megatron-LM's data-parallel size; the expert size folds into it
    etp = got.get("etp", t)
    folded = _megatron_folding(got, t, c, dp_all, e, etp, file, problems)
    if folded is not None and not got.get("sp") and any(d == "tp" and x != "etp" and n > 1
                                                         for _, n, d, x in folded[0]):
        raise _folding_without_sp(text, file, t, etp)
    if folded is None:
        if dp_all % e:
            raise _arg_error(text, file, "--expert-model-parallel-size", f"--expert-model-parallel-size {e} does not "
                             f"divide the data-parallel size {dp_all}")
        if etp != t and got.get("E", 1) > 1:
            problems.append(f"--expert-tensor-parallel-size {etp}: experts split over a tensor size of their own "
                            f"(not {t}) have no placement; the plan splits them over the tensor axis")
    dp = dp_all // e if folded is None else dp_all
    tr = _shape_lines(got, t, text, file)
    mb = got.get("mb", 1)
    m = 1
    if "gbs" in got:
        if got["gbs"] % (mb * dp_all):
            raise _arg_error(text, file, "--global-batch-size", f"--global-batch-size {got['gbs']} is not a multiple "
                             f"of micro batch {mb} × data parallel {dp_all}")
        m = got["gbs"] // (mb * dp_all)
    half = got.get("bf16") or got.get("fp16")
    # bf16 keeps fp32 main gradients; fp16 too with --accumulate-allreduce-grads-in-fp32, else 16-bit ones
    grads = 4 if got.get("bf16") or got.get("fp32_grads") else 2
    roles = ""
    if folded is not None and folded[1]:
        roles = "  group experts {\n    role = {" + ", ".join(f"{a}: {r}" for a, r in folded[1].items()) + "}\n  }\n"
    model = ("model {\n  transformer {\n" + "".join(f"    {x}\n" for x in tr) + "  }\n"
             + f"  bytes {{\n    {_widths(bool(half), grads)}\n  }}\n" + (f"  seq = {got['s']}\n" if "s" in got else "")
             + f"  microbatch = {mb}\n  microbatches = {m}\n" + roles + "}\n\n")
    v = got.get("v") or (got["L"] // (p * got["layers_per_chunk"]) if got.get("layers_per_chunk") else 1)
    pipe = f"interleaved_1f1b(v = {v})" if v > 1 else "one_f_one_b"
    bind = {"dp": "zero1" if got.get("dist_opt") or got.get("layer_wise") else "ddp", "cp": "context_parallel",
            "tp": "megatron_sp" if got.get("sp") else "megatron_tp"}
    products: tuple[tuple[str, ...], ...] = ()
    if folded is None:
        axes = [("dp", dp, bind["dp"]), ("cp", c, bind["cp"]), ("ep", e, "expert_parallel"), ("tp", t, bind["tp"]),
                ("pp", p, pipe)]
    else:  # the folded axes, outermost first; a dense tensor or context group cut into several is one product
        axes = [(a, s, bind[d]) for a, s, d, _ in reversed(folded[0])] + [("pp", p, pipe)]
        products = tuple(tuple(a for a, _, d, _ in reversed(folded[0]) if d == k) for k in ("tp", "cp"))
    extra = _recompute_lines(got, p * v, problems)
    if got.get("flash"):
        extra.append("flash_attention")
    extra += _optimizer_lines(got, t, dp, folded is not None, problems, report)
    note = (" (the expert axis divides Megatron-LM's data-parallel devices: dense parameters are replicated over "
            "dp × ep, experts over dp)" if e > 1 and folded is None else "")
    if folded is not None:
        note = (f" (MoE parallel folding: dense tensor {t} × context {c} × data {dp_all}, experts on expert {e} × "
                f"expert tensor {etp} × expert data {t * c * dp_all // (e * etp)} of the same devices)")
    per, source = per_node_source(per_node, got.get("nproc"), "the launch line's --nproc_per_node")
    if folded is None:
        inner = [("tp", t), ("cp", c), ("ep", e), ("dp", dp), ("pp", p)]
    else:
        inner = [(a, s) for a, s, _, _ in folded[0]] + [("pp", p)]
    links = node_links(inner, per)
    report.assumed.extend(links_assumption(links, per, source, "in Megatron-LM's order, innermost first: "
                                           "tensor, context, expert, data, pipeline"))
    spec = (f"# from the Megatron-LM arguments in {file} on {devices} devices{note}\n" + report.comments()
            + "".join(f"# not expressed: {q}\n" for q in problems) + model
            + _mesh_and_plan(axes, "megatron", extra, products, links))
    return _imports(spec) + "\n" + spec
