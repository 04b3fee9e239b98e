"""Hostile values in the recent constructs: every mutant of a shipped example that uses one (a
zero, a negative, a huge or fractional number, an unbound or fractional ``let``, an axis not in
the mesh or named twice, an empty or a very long list, ranks repeated or past the axis, a group
that does not exist, the statement without the model section it needs, two contradicting
statements) gets a verdict (exit 0, 1 or 3) or a located diagnostic naming a code (exit 2) from
``check``, ``cost``, ``inspect`` and ``fmt``: never an internal error (70), never a traceback,
never a hang.

Each run is a forked child calling the CLI's ``main`` under a wall-clock limit. The quick tier runs
a fixed sample of the grid; the whole grid is slow."""

from __future__ import annotations

import io
import math
import multiprocessing
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
LIMIT_S = 20.0
COMMANDS = ("check", "cost", "inspect", "fmt")
LOCATED = re.compile(r"\.place:\d+:\d+: error: .*\[PL\d{3}\]")


@dataclass(frozen=True)
class Base:
    """A shipped example using a construct, and the text of the construct's statement in it."""

    construct: str
    path: str
    key: str  # a substring of the statement's line (or of the block entry)
    edit: tuple[str, str] = ("", "")  # (old, new): the example's text with every OLD replaced by NEW first


SEQ_MEAN = "bugs/ulysses_seq_mean_over_slice_length.place"
BASES = (
    Base("router", "safe/moe_top2_sampling_tp_ranks.place", "override router: same"),
    Base("router_vary", "bugs/moe_router_jitter_tp_seed.place", "override router:"),
    Base("router_partial", "bugs/moe_router_on_partial_sums.place", "override router:"),
    Base("window", "safe/cp_sliding_window.place", "window = 4096"),
    Base("causal_mask", "bugs/p2p_ring_window_off_diagonal.place", "causal_mask"),
    Base("amax_blocks", "bugs/mxfp8_sp_sequence_shard_not_whole_blocks.place", "override amax[dense]"),
    Base("amax_rows", "bugs/torchao_rowwise_fp8_row_parallel.place", "override amax[dense]"),
    Base("amax_local", "bugs/te_sp_amax_not_reduced_over_tp.place", "override amax"),
    Base("activations", "bugs/tp_loss_global_group.place", "override activations[loss]"),
    Base("activation_partial", "bugs/sp_embedding_grad_own_slice.place", "override activation"),
    Base("heads", "bugs/ulysses_heads_floor.place", "override heads"),
    Base("heads_kv", "bugs/ulysses_kv_heads_split.place", "override heads"),
    Base("heads_backward", "bugs/ulysses_heads_backward.place", "override heads"),
    Base("capacity", "bugs/moe_capacity_counts_padding.place", "override capacity"),
    Base("ptrr", "bugs/torch_cp_ptrr_labels_head_tail.place", "override layout"),
    Base("pad_chunks", "bugs/te_cp_thd_cu_seqlens_unpadded.place", "override layout"),
    Base("cut_unequal", "bugs/mbridge_cp_short_sequence_unpadded_chunks.place", "cut_unequal"),
    Base("reduce_sets", "bugs/grads_reduced_in_shard_groups_of_one.place", "reduce_sets"),
    Base("reduce_sets_2d", "bugs/data_groups_with_the_neighbour_axis_ranks.place", "reduce_sets"),
    Base("reduce_groups", "bugs/grads_reduced_per_node_of_unequal_size.place", "reduce_groups"),
    Base("clip_on_ranks", "bugs/pp_clip_first_and_last_stage.place", "_on_ranks"),
    Base("divide_on_ranks", "bugs/ddp_grad_scaler_one_rank_backed_off.place", "_on_ranks"),
    Base("count_on_ranks", "bugs/replicated_weights_counted_per_tp_rank.place", "_on_ranks"),
    Base("growth_local", "bugs/fairseq2_scaler_state_per_tp_rank.place", "growth_local"),
    Base("tokens_equal", "bugs/pp_grad_accum_rescaled.place", "tokens: equal"),
    Base("losses", "bugs/tp_label_smoothing_local_mean.place", "label_smoothing"),
    Base("losses_aux", "bugs/moe_aux_loss_dynamic_cp_uneven.place", "aux ="),
    Base("checkpoint", "bugs/ckpt_zero1_new_dp_by_rank.place", "override checkpoint"),
    Base("gathered_loss", "bugs/verl_ulysses_gathered_tokens_over_world.place", "loss: on_gathered_sequence"),
    Base("term_seq_mean", SEQ_MEAN, "override loss[policy]"),
    Base("term_seq_sum", SEQ_MEAN, "override loss[policy]", ("per_sequence_mean", "per_sequence_sum")),
    Base("tokens_seq_local", SEQ_MEAN, "per_sequence_local"),
    Base("tokens_seq_gathered", "safe/ulysses_seq_mean_over_slice_length.place", "per_sequence_gathered"),
    Base("tokens_term_equal", "safe/ulysses_seq_mean_over_slice_length.place", "tokens[policy]: equal",
         ("tokens[policy]: reduce over (dp)", "tokens[policy]: equal")),
    Base("losses_section", SEQ_MEAN, "policy = per_sequence_mean"),
    Base("step_every_microbatch", "bugs/zero3_muon_every_microbatch.place", "]: step_every_microbatch"),
    Base("no_zero_grad", "bugs/bf16_zero0_zero_grad_skipped.place", "grads: no_zero_grad"),
    Base("no_zero_grad_group", "bugs/zero3_muon_every_microbatch.place", "no_zero_grad",
         ("override optimizer[matrices]: step_every_microbatch", "override grads[matrices]: no_zero_grad")),
    Base("reduce_accumulated", "bugs/colossalai_zero_accumulation_rereduced.place", "grads: reduce_accumulated"),
    Base("reduce_summed", "bugs/megatron_grads_doubled_every_microbatch.place", "grads: reduce_summed"),
    Base("mtp_stage", "bugs/mtp_standalone_stage_outside_embedding_group.place", "embedding: mtp_stage"),
    Base("group_first_last", "bugs/mtp_standalone_stage_tied_embedding_group.place", "embedding: group_first_last"),
    Base("assert_output", "bugs/tp_to_local_partial_output_grad.place", "assert_output"),
    Base("assert_output_experts", "bugs/gpt_oss_expert_output_grad_partial.place", "assert_output"),
    Base("ckpt_fused", "bugs/ckpt_fused_qkv_flat_reshard.place", "fused over"),
    Base("ckpt_flat_offset", "bugs/ckpt_vpp_layer_offset_flat.place", "flat_offset"),
    Base("rng_not_restored", "bugs/ckpt_rng_not_restored.place", "checkpoint: rng_not_restored"),
    Base("rng_by_coordinates", "bugs/ckpt_rng_by_coordinates_new_tp.place", "checkpoint: rng_by_coordinates"),
    Base("amax_group_local_reduce", "bugs/te_sp_amax_not_reduced_over_tp.place", "amax[dense]: local",
         ("override amax: local over (dp, tp)", "override amax[dense]: local over (dp, tp)\n"
          "  override amax[dense]: reduce over (tp)")),
    Base("nonlinear_embedding", "safe/rmsnorm_on_vocab_parallel_lookup.place", "nonlinear_before_reduce"),
    Base("rmsnorm", "safe/rmsnorm_on_vocab_parallel_lookup.place", "norm = rmsnorm"),
)

NUMBERS = ("0", "-1", "-3", "1" + "0" * 30, "1e300", "1/2", "unbound_w", "w_frac", "w_zero")
HUGE_RANKS = ", ".join(str(i) for i in range(10_000))


def _line(text: str, key: str) -> tuple[int, str]:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if key in line and not line.lstrip().startswith("#"):
            return i, line
    raise AssertionError(f"no line with {key!r}")


def _with_line(text: str, i: int, new: str) -> str:
    lines = text.split("\n")
    lines[i] = new
    return "\n".join(lines)


def _number(line: str, value: str) -> list[tuple[str, str]]:
    """The line with each of its integer literals in turn replaced by ``value`` (and the ``let``
    it needs)."""
    out = []
    let = {"w_frac": "let w = 3/2\n", "w_zero": "let w = 1 - 1\n"}.get(value, "")
    word = {"unbound_w": "w", "w_frac": "w", "w_zero": "w"}.get(value, value)
    for m in re.finditer(r"(?<![\w.])\d+(?![\w.])", line):
        out.append((let, line[:m.start()] + word + line[m.end():]))
    return out


def _axes(line: str) -> list[str]:
    m = re.search(r"over \(([^)]*)\)", line)
    if not m:
        return []
    axes = [a.strip() for a in m.group(1).split(",") if a.strip()]
    first = axes[0] if axes else "dp"
    rep = ["nope", f"{first}, {first}", "", f"{m.group(1)}, nope"]
    return [line[:m.start()] + f"over ({r})" + line[m.end():] for r in rep]


def _ranks(line: str) -> list[str]:
    out = []
    m = re.search(r"ranks \((.*)\)( by .*)?$", line)
    if m:
        body = m.group(1)
        tail = m.group(2) or ""
        pre = line[:m.start()]
        if "[" in body:
            subs = ["[]", "[0], [0]", "[0, 0]", "[999]", "[-1]", f"[{HUGE_RANKS}]", "[0]", "[1/2]"]
            out += [pre + f"ranks ({s})" + tail for s in subs]
        else:
            subs = ["", "0, 0", "999", "-1", HUGE_RANKS, "1/2", "w"]
            out += [pre + f"ranks ({s})" + tail for s in subs]
    m = re.search(r"by \(([^)]*)\)", line)
    if m:
        for s in ("", "0, 4", "-1, 5", "1/2, 4", ", ".join(["1"] * 10_000), "w"):
            out.append(line[:m.start()] + f"by ({s})" + line[m.end():])
    return out


def _group(line: str) -> list[str]:
    if "[" in line.split(":")[0]:
        return [re.sub(r"\[[^\]]*\]", "[no_such_group]", line, count=1),
                re.sub(r"\[[^\]]*\]", "[]", line, count=1)]
    if line.lstrip().startswith("override"):
        head, rest = line.split(":", 1)
        return [f"{head}[no_such_group]:{rest}"]
    return []


def _drop_block(text: str, opener: str) -> str | None:
    """``text`` without the block opened by ``opener`` (matched braces), or None."""
    i = text.find(opener)
    if i < 0:
        return None
    depth, j = 0, text.index("{", i)
    while j < len(text):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            break
        j += 1
    return text[:i] + text[j + 1:]


def _sections(text: str) -> list[tuple[str, str]]:
    out = []
    no_experts = re.sub(r"\n *(experts|top_k|capacity_factor|moe_ffn) = [^\n]*", "", text)
    if no_experts != text:
        out.append(("no_experts", no_experts))
    for opener in ("attention {", "losses {", "transformer {"):
        dropped = _drop_block(text, opener)
        if dropped is not None:
            out.append((f"no_{opener.split()[0]}", dropped))
    if re.search(r"\n *cp = ", text):
        no_cp = re.sub(r"\n *cp = [^\n]*", "", text)
        no_cp = re.sub(r"\n *cp: [^\n]*", "", no_cp)
        out.append(("no_cp", no_cp))
    return out


MINIMAL = """from std.data import ddp
from std.tensor import megatron_tp

model {
  transformer {
    hidden = 1024
    layers = 4
    heads = 8
    ffn = 4096
    vocab = 32000
  }
  seq = 2048
}

mesh {
  dp = 4
  tp = 2
}

plan p {
  dp: ddp
  tp: megatron_tp
STATEMENT
}
"""


def _block_entry(line: str) -> list[str]:
    m = re.match(r"^(\s*)(\w+) = (.*)$", line)
    if not m:
        return []
    ind, key, _ = m.groups()
    return [f"{ind}{key} = nonsense", f"{ind}{key} = 0", f"{ind}{key} = true",
            f"{ind}{key} = 1e300", f"{ind}no_such_entry = 1", f"{line}\n{line}"]


def _base_text(base: Base) -> str:
    text = (EX / base.path).read_text()
    old, new = base.edit
    if old:
        assert old in text, (base.construct, old)
        text = text.replace(old, new)
    return text


TERM_NAMES = ("main", "loss", "tokens", "all", "aux_loss", "mtp_loss", "dense", "router", "embedding", "matrices",
              "aux", "z", "mtp", "aux_stats", "aux_packed", "label_smoothing", "policy_2", "_", "Policy")


def _term_names(text: str, i: int, line: str) -> list[tuple[str, str]]:
    """An entry of the model's ``losses { ... }`` section renamed (a reserved word, a parameter group's or a
    built-in term's name, another section key, an empty name), repeated under 10,000 names, or the section
    emptied."""
    lines = text.split("\n")
    m = re.match(r"^(\s*)(\w+) = (.*)$", line)
    if not m or not any(ln.strip() == "losses {" for ln in lines[:i]):
        return []
    ind, key, value = m.groups()
    out = [(f"term={name}", _with_line(text, i, f"{ind}{name} = {value}")) for name in TERM_NAMES]
    out.append(("term=empty", _with_line(text, i, f"{ind} = {value}")))
    out.append(("term=renamed_everywhere", re.sub(rf"\b{key}\b", "term_of_mine", text)))
    out.append(("term=flag", _with_line(text, i, f"{ind}{key} = true")))
    many = "\n".join(f"{ind}t{k} = {value}" for k in range(1_000))  # the section takes 64 (PL114)
    out.append(("terms=1000", _with_line(text, i, f"{line}\n{many}")))
    out.append(("terms=none", _with_line(text, i, "")))
    return out


def mutants(base: Base) -> list[tuple[str, str]]:
    """(name, text) for each mutant of ``base``."""
    text = _base_text(base)
    i, line = _line(text, base.key)
    out: list[tuple[str, str]] = []
    for value in NUMBERS:
        for k, (let, new) in enumerate(_number(line, value)):
            out.append((f"num{k}={value}", let + _with_line(text, i, new)))
    for k, new in enumerate(_axes(line) + _ranks(line) + _group(line) + _block_entry(line)):
        out.append((f"edit{k}", _with_line(text, i, new)))
    out += _sections(text) + _term_names(text, i, line)
    if line.lstrip().startswith("override"):
        out.append(("twice", _with_line(text, i, f"{line}\n{line}")))
        verb = line.split(":", 1)[1].split()[0]
        other = line.replace(f": {verb}", ": no_such_verb", 1)
        out.append(("bad_verb", _with_line(text, i, other)))
        out.append(("minimal", MINIMAL.replace("STATEMENT", line)))
        out.append(("contradict", _with_line(text, i, f"{line}\n{_contradiction(line)}")))
    return out


CONTRA = {"same": "vary over (tp)", "vary": "same", "input_partial": "same", "window_dropped": "window_local",
          "window_on_diagonal": "window_local",
          "blockwise": "local over (tp)", "rowwise": "reduce over (tp)", "local": "reduce over (tp)",
          "floor": "uneven", "uneven": "floor", "split": "repeat", "repeat": "split",
          "counts_padding": "masks_padding", "masks_padding": "counts_padding", "ptrr": "pad_to_chunks",
          "pad_to_chunks": "truncate_to_chunks", "truncate_to_chunks": "pad_to_chunks",
          "cut_unequal": "pad_to_chunks", "reduce_sets": "reduce over (dp)", "reduce_groups": "reduce over (dp)",
          "growth_local": "local over (tp)", "equal": "count_ignored",
          "on_gathered_sequence": "global_mean", "per_sequence_mean": "per_sequence_sum",
          "per_sequence_sum": "per_sequence_mean", "per_sequence_local": "per_sequence_gathered over (sp)",
          "per_sequence_gathered": "per_sequence_local over (sp)", "step_every_microbatch": "gather over (dp)",
          "no_zero_grad": "reduce_every_microbatch", "reduce_accumulated_every_microbatch": "reduce_summed_every_microbatch",
          "reduce_summed_every_microbatch": "reduce_accumulated_every_microbatch", "mtp_stage": "group_first_last over (pp)",
          "group_first_last": "mtp_stage over (pp)", "assert_output_partial": "assert_output_replicate over (tp)",
          "fused": "flat_offset over (tp)", "flat_offset": "fused over (pp) by 2", "rng_not_restored": "rng_by_coordinates",
          "rng_by_coordinates": "rng_not_restored", "nonlinear_before_reduce": "reduce over (tp)"}


def _contradiction(line: str) -> str:
    head, rest = line.split(":", 1)
    verb = rest.split()[0]
    return f"{head}: {CONTRA.get(verb, 'no_reduce')}"


def _child(argv, conn) -> None:  # pragma: no cover - runs in the forked child
    from placement_logic.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        rc = main(argv, out, err)
    except BaseException:  # noqa: BLE001 - reported to the parent as a failure
        import traceback

        rc, err = -1, io.StringIO(traceback.format_exc())
    text = err.getvalue()
    conn.send((rc, out.getvalue()[-4000:], text if len(text) < 8000 else text[:6000] + text[-2000:]))
    conn.close()
    os._exit(0)


def _preload() -> None:
    """Import what the four commands use once, in the parent, so each forked child starts warm."""
    import importlib
    import pkgutil

    import placement_logic

    if getattr(_preload, "done", False):
        return
    for sub in ("frontend", "resolve", "ir", "check", "costs", "costreport", "commands", "solver"):
        pkg = importlib.import_module(f"placement_logic.{sub}")
        for info in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}."):
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001,S112 - an optional dependency missing: that module stays cold
                continue
    importlib.import_module("placement_logic.cli")
    _preload.done = placement_logic is not None  # type: ignore[attr-defined]


def run_cli(argv: list[str], limit: float = LIMIT_S) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of ``placement ARGV`` in a forked child; status None when it
    ran past ``limit`` seconds (the child is killed)."""
    _preload()
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(argv, child))
    proc.start()
    child.close()
    got = parent.recv() if parent.poll(limit) else None
    proc.join(1 if got else 0)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return got if got else (None, "", "")


def _crash_report(err: str) -> str:
    """The traceback's last lines from the crash report an internal error names (and removes it)."""
    m = re.search(r"crash report: (\S+)", err)
    if not m or not os.path.exists(m.group(1)):
        return err.strip()[-600:]
    text = Path(m.group(1)).read_text()
    os.remove(m.group(1))
    return "\n".join(text.strip().split("\n")[-6:])


def problems(path: Path, seen: dict | None = None) -> list[str]:
    """What is wrong in the four commands' answers on the spec at ``path`` (each command's exit
    status and first code into ``seen``)."""
    found = []
    for command in COMMANDS:
        rc, out, err = run_cli([command, str(path)])
        if seen is not None:
            seen[command] = (rc, re.findall(r"\[PL\d{3}\]", err)[:1])
        what = f"{command}: "
        if rc is None:
            found.append(what + f"ran past {LIMIT_S} s")
        elif rc not in (0, 1, 2, 3):
            found.append(what + f"exit {rc}: {_crash_report(err)}")
        elif "Traceback" in out + err:
            found.append(what + "traceback in the output")
        elif rc == 2 and not LOCATED.search(err):
            found.append(what + f"exit 2 without a located diagnostic: {err.strip()[-300:]}")
    return found


GRID = [(b.construct, name, text) for b in BASES for name, text in mutants(b)]


def size_mutants(base: Base) -> list[tuple[str, str]]:
    """The example with one mesh axis of 4096 ranks, or one model size of 10**9 or 10**30."""
    text = _base_text(base)
    out = []
    mesh = re.search(r"mesh \{(.*?)\}", text, re.S)
    for m in re.finditer(r"\n\s*(\w+) = (\d+)", mesh.group(1) if mesh else ""):
        out.append((f"{m.group(1)}=4096", text.replace(m.group(0), m.group(0).replace(m.group(2), "4096", 1), 1)))
    for key in ("seq", "heads", "hidden", "experts", "vocab", "ffn", "microbatches", "top_k", "kv_heads", "layers"):
        m = re.search(rf"\n\s*{key} = (\d+)", text)
        for v in ("1" + "0" * 30, "1000000000") if m else ():
            out.append((f"{key}={v[:6]}", text.replace(m.group(0), m.group(0).replace(m.group(1), v, 1), 1)))
    return out


SIZES = [(b.construct, name, text) for b in BASES for name, text in size_mutants(b)]


def _sample(grid, every: int = 97):
    return [g for k, g in enumerate(grid) if k % every == 0]


def _check(tmp_path, construct, name, text):
    f = tmp_path / f"{construct}.place"
    f.write_text(text)
    found = problems(f)
    assert not found, (construct, name, found)


@pytest.mark.parametrize("construct,name,text", _sample(GRID), ids=lambda v: v if len(v) < 40 else "spec")
def test_hostile_values_sampled(tmp_path, construct, name, text):
    _check(tmp_path, construct, name, text)


@pytest.mark.slow
@pytest.mark.parametrize("construct,name,text", GRID, ids=lambda v: v if len(v) < 40 else "spec")
def test_hostile_values_whole_grid(tmp_path, construct, name, text):
    _check(tmp_path, construct, name, text)


@pytest.mark.slow
@pytest.mark.parametrize("construct,name,text", SIZES, ids=lambda v: v if len(v) < 40 else "spec")
def test_huge_sizes_whole_grid(tmp_path, construct, name, text):
    _check(tmp_path, construct, name, text)


def test_the_grid_covers_every_construct():
    assert {c for c, _, _ in GRID} == {b.construct for b in BASES}
    assert len(GRID) > 10 * len(BASES)


if __name__ == "__main__":  # survey: python tests/test_hostile_constructs.py [CONSTRUCT...]
    import sys
    import tempfile

    wanted = set(sys.argv[1:])
    with tempfile.TemporaryDirectory() as d:
        for construct, name, text in GRID:
            if wanted and construct not in wanted:
                continue
            f = Path(d) / f"{construct}.place"
            f.write_text(text)
            seen: dict = {}
            for p in problems(f, seen):
                print(f"{construct} {name}: {p}", flush=True)
            print(construct, name, seen, file=sys.stderr, flush=True)


def _mutant(path: str, old: str, new: str, let: str = "") -> str:
    text = (EX / path).read_text()
    assert old in text
    return let + text.replace(old, new, 1)


def _diagnosed(tmp_path, capsys, text: str, command: str = "check") -> str:
    from placement_logic.cli import main

    f = tmp_path / "s.place"
    f.write_text(text)
    assert main([command, str(f)]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("let,shown", [("let w = 3/2\n", "3/2"), ("let w = 1 - 1\n", "0"), ("let w = 0 - 5\n", "-5")])
def test_a_window_through_a_let_is_checked_like_a_literal(tmp_path, capsys, let, shown):
    # the window's check folded the value without the file's lets: a window of 3/2 or 0 tokens was checked
    # (exit 3, unknown) instead of refused
    err = _diagnosed(tmp_path, capsys, _mutant("safe/cp_sliding_window.place", "window = 4096", "window = w", let))
    assert "[PL283]" in err and f"(not {shown})" in err and "s.place:22:5" in err, err


ROUTER = "safe/moe_top2_sampling_tp_ranks.place"


@pytest.mark.parametrize("second,words", [
    ("override router: vary over (tp)", "contradicts override router: same (line 33)"),
    ("override router: same", "repeats override router: same (line 33)"),
])
def test_a_second_router_statement_is_an_error(tmp_path, capsys, second, words):
    # the checker read the last statement only: `same` then `vary` was checked as `vary` alone
    text = _mutant(ROUTER, "override router: same", f"override router: same\n  {second}")
    for command in ("check", "cost"):
        err = _diagnosed(tmp_path, capsys, text, command)
        assert "[PL291]" in err and words in err and "s.place:34:3" in err, err


@pytest.mark.parametrize("path,old,second", [
    ("bugs/p2p_ring_window_off_diagonal.place", "override layout[causal_mask]: window_on_diagonal",
     "override layout[causal_mask]: window_local"),
    ("bugs/mxfp8_sp_sequence_shard_not_whole_blocks.place", "override amax[dense]: blockwise over (tp) by 32",
     "override amax[dense]: rowwise over (tp)"),
    ("bugs/ulysses_heads_floor.place", "override heads: floor", "override heads: uneven"),
    ("bugs/moe_capacity_counts_padding.place", "override capacity: counts_padding", "override capacity: masks_padding"),
    ("bugs/moe_ep_unpermute_empty_buffer.place", "override capacity: dropped_uninitialised",
     "override capacity: drops_zeroed"),
    ("bugs/ring_chunked_attention_off_diagonal.place", "override layout[causal_mask]: chunk_on_diagonal",
     "override layout[causal_mask]: chunk_local"),
])
def test_contradicting_once_only_statements_are_errors(tmp_path, capsys, path, old, second):
    err = _diagnosed(tmp_path, capsys, _mutant(path, old, f"{old}\n  {second}"))
    assert "[PL291]" in err and f"contradicts {old.strip()}" in err, err


def test_statements_that_combine_are_still_accepted(tmp_path, capsys):
    from placement_logic.cli import main

    # the loss's three reductions (one per statistic) and a heads split per all-to-all pair combine
    f = tmp_path / "s.place"
    f.write_text(_mutant("bugs/ulysses_heads_floor.place", "override heads: floor",
                         "override heads[forward]: floor\n  override heads[backward]: uneven"))
    assert main(["cost", str(f)]) == 0
    assert main(["check", str(EX / "bugs/tp_loss_global_group.place")]) == 1
    # the capacity step's three questions each once: padding, what a dropped pair adds, the renormalisation
    f.write_text(_mutant("bugs/moe_deepep_unpermute_empty_rows.place", "override capacity: dropped_uninitialised",
                         "override capacity: masks_padding\n  override capacity: dropped_uninitialised"))
    assert main(["check", str(f)]) == 1
    capsys.readouterr()


def test_an_axis_named_twice_where_it_says_what_each_rank_does(tmp_path, capsys):
    err = _diagnosed(tmp_path, capsys, _mutant(ROUTER, "override router: same", "override router: vary over (tp, tp)"))
    assert "[PL106]" in err and "axis 'tp' is named twice" in err, err


CKPT = "bugs/ckpt_zero1_new_dp_by_rank.place"


def test_a_second_reshard_is_an_error(tmp_path, capsys):
    # check.checkpoint read the last reshard only: a second one replaced the first unseen
    text = _mutant(CKPT, "override checkpoint: reshard over (dp)",
                   "override checkpoint: reshard over (dp)\n  override checkpoint: reshard over (dp)")
    err = _diagnosed(tmp_path, capsys, text)
    assert "[PL291]" in err and "repeats override checkpoint: reshard over (dp) (line 21)" in err, err


def test_a_checkpoint_axis_named_twice(tmp_path, capsys):
    text = _mutant(CKPT, "load_by_rank over (dp)", "load_by_rank over (dp, dp)")
    err = _diagnosed(tmp_path, capsys, text, "cost")
    assert "[PL106]" in err and "s.place:22:3" in err, err


@pytest.mark.parametrize("path,old,new,status,words", [
    # the window's exact decision walked 4c² chunk pairs: a context group of 4096 ranks did not end
    ("safe/cp_sliding_window.place", "cp = 8 @ intra_node", "cp = 4096 @ intra_node", 3, "4096 ranks is more than"),
    # the shape facts' divisors by trial division up to √seq: seq = 10**30 did not end
    ("safe/cp_sliding_window.place", "seq = 32768", "seq = " + "1" + "0" * 30, 0, "proved"),
    # the fp8 blocks' divisors of the sequence by trial division up to √seq: seq = 10**30 did not end
    ("bugs/mxfp8_sp_sequence_shard_not_whole_blocks.place", "seq = 31936", "seq = " + "1" + "0" * 30, 0, "proved"),
    # the heads split walked every group size up to the heads, O(heads²): 10**9 heads did not end (checked and
    # priced for at most 1024 heads: a located PL114 at the statement, in check and in cost alike)
    ("bugs/ulysses_heads_floor.place", "heads = 28", "heads = 1000000000", 2, "at most 1024 heads"),
])
def test_huge_sizes_end_with_a_verdict(tmp_path, path, old, new, status, words):
    f = tmp_path / "s.place"
    f.write_text(_mutant(path, old, new))
    rc, out, err = run_cli(["check", str(f)])
    assert rc == status and words in out + err, (rc, out[-2000:], err[-2000:])
    if status == 2:
        assert "[PL114]" in err and run_cli(["cost", str(f)])[0] == 2, err


def test_divisors_of_large_numbers_agree_with_trial_division():
    from placement_logic.check.divisors import divisors

    for v in list(range(1, 2000)) + [2 ** 40, 3 ** 25 * 7, 999_983 * 1_000_003, 10 ** 13 + 1]:
        small = [d for d in range(1, int(v ** 0.5) + 1) if v % d == 0]
        assert divisors(v) == sorted(set(small + [v // d for d in small])), v
    big = divisors(10 ** 30)
    assert len(big) == 31 * 31 and all(10 ** 30 % d == 0 for d in big)
    assert divisors((2 ** 61 - 1) * (2 ** 31 - 1)) == [1, 2 ** 31 - 1, 2 ** 61 - 1, (2 ** 61 - 1) * (2 ** 31 - 1)]


@pytest.mark.parametrize("path", ["bugs/moe_router_on_partial_sums.place", "bugs/moe_router_jitter_tp_seed.place"])
@pytest.mark.parametrize("experts", ["1000000000", "1" + "0" * 30])
def test_a_router_of_very_many_experts_is_still_refuted(tmp_path, path, experts):
    # the replay listed every expert's score: 10**9 experts did not end, 10**30 was an internal error
    text = (EX / path).read_text()
    f = tmp_path / "s.place"
    f.write_text(re.sub(r"experts = \d+", f"experts = {experts}", text, count=1))
    rc, out, err = run_cli(["check", str(f)])
    assert rc == 1 and "the root cause is the MoE router's choice" in out, (rc, out[-2000:], err[-2000:])


@pytest.mark.parametrize("experts", ["1000000000", "1" + "0" * 30])
def test_a_capacity_step_of_very_many_experts_ends_unknown(tmp_path, experts):
    # the replay's router call listed every expert's probability and about E/(cf·k) padded positions: did not end
    text = (EX / "bugs/moe_capacity_counts_padding.place").read_text()
    f = tmp_path / "s.place"
    f.write_text(re.sub(r"experts = \d+", f"experts = {experts}", text, count=1))
    rc, out, err = run_cli(["check", str(f)])
    assert rc == 3 and "GI capacity" in out, (rc, out[-2000:], err[-2000:])


def test_aux_statistics_of_very_many_experts_end_unknown(tmp_path):
    # the aux term's replay listed every expert's probability per token: 10**9 experts did not end
    text = (EX / "bugs/moe_aux_loss_dynamic_cp_uneven.place").read_text()
    f = tmp_path / "s.place"
    f.write_text(re.sub(r"experts = \d+", "experts = 1000000000", text, count=1))
    rc, out, err = run_cli(["check", str(f)])
    assert rc == 3 and "GI aux_stats" in out, (rc, out[-2000:], err[-2000:])


SEQ_SAFE = "safe/ulysses_seq_mean_over_slice_length.place"
GATHERED = "bugs/verl_ulysses_gathered_tokens_over_world.place"
LENGTH = "override tokens[policy]: per_sequence_gathered over (sp)"


@pytest.mark.parametrize("path,old,new,code,words", [
    # an axis named twice in a length statement was read once: the spec was proved
    (SEQ_SAFE, LENGTH, "override tokens[policy]: per_sequence_gathered over (sp, sp)", "PL106", "named twice"),
    # over () named no context axis and changed nothing: check was unknown, cost silent
    (SEQ_SAFE, LENGTH, "override tokens[policy]: per_sequence_gathered over ()", "PL506", "over () changes nothing"),
    # check.losses read the last length statement per axis: a second one silently replaced the first
    (SEQ_SAFE, LENGTH, f"{LENGTH}\n  {LENGTH}", "PL291", "repeats override tokens[policy]: per_sequence_gathered"),
    (SEQ_SAFE, LENGTH, f"{LENGTH}\n  override tokens[policy]: per_sequence_local over (sp)", "PL291",
     "contradicts override tokens[policy]: per_sequence_gathered over (sp) (line 37)"),
    # ir.lossgather read the last on_gathered_sequence statement only
    (GATHERED, "override loss: on_gathered_sequence over (sp)", "override loss: on_gathered_sequence over (sp)\n"
     "  override loss: on_gathered_sequence over (sp)", "PL291", "repeats override loss: on_gathered_sequence"),
    # check.losses read a term's last path and its last token count reduction only
    (SEQ_MEAN, "override loss[policy]: per_sequence_mean", "override loss[policy]: per_sequence_mean\n"
     "  override loss[policy]: per_sequence_sum", "PL291", "contradicts override loss[policy]: per_sequence_mean"),
    (SEQ_MEAN, "override tokens[policy]: reduce over (dp, sp)", "override tokens[policy]: reduce over (dp, sp)\n"
     "  override tokens[policy]: reduce over (dp)", "PL291", "contradicts override tokens[policy]: reduce over (dp, sp)"),
    # ir.actflow took the last statement of a region's slot: partial then replicate was proved as replicate alone
    ("bugs/tp_to_local_partial_output_grad.place", "override activation_grads[attention]: assert_output_partial over (tp)",
     "override activation_grads[attention]: assert_output_partial over (tp)\n"
     "  override activation_grads[attention]: assert_output_replicate over (tp)", "PL291",
     "contradicts override activation_grads[attention]: assert_output_partial over (tp) (line 37)"),
])
def test_loss_term_statements_made_twice_or_over_nothing(tmp_path, capsys, path, old, new, code, words):
    text = _mutant(path, old, new)
    for command in ("check", "cost"):
        err = _diagnosed(tmp_path, capsys, text, command)
        assert f"[{code}]" in err and words in err and re.search(r"s\.place:\d+:3: error", err), err


def _flat_mismatch_by_listing(c: int, n: int, m: int):
    """The first (rank, local piece, wanted, read) found by listing every piece: rank r of k holds the
    pieces [b·L + r·L/k, b·L + (r+1)·L/k) of every block b, keyed r·(C·L/k) + its local index."""
    big = n * m // math.gcd(n, m)
    saved = {}
    for r in range(n):
        local = [b * big + e for b in range(c) for e in range(r * big // n, (r + 1) * big // n)]
        saved.update({r * (c * big // n) + p: g for p, g in enumerate(local)})
    for r2 in range(m):
        want = [b * big + e for b in range(c) for e in range(r2 * big // m, (r2 + 1) * big // m)]
        for p, g in enumerate(want):
            if saved[r2 * (c * big // m) + p] != g:
                return r2, p, g, saved[r2 * (c * big // m) + p]
    return None


def test_the_flat_offset_mismatch_in_closed_form_agrees_with_listing_every_piece():
    from placement_logic.check.checkpoint_check import _flat_first_mismatch

    for c in range(1, 5):
        for n in range(1, 7):
            for m in range(1, 7):
                big = n * m // math.gcd(n, m)
                assert _flat_first_mismatch(c, big, n, m) == _flat_mismatch_by_listing(c, n, m), (c, n, m)
    # 3 components on 4 -> 2 ranks: L = lcm(4, 2) = 4; rank 0 of 4 saved one piece per component, globals 0, 4, 8
    # at keys 0, 1, 2; rank 0 of 2 wants two per component, globals 0, 1 | 4, 5 | ...: its local piece 1 (global
    # 1) is read at key 1, which holds global 4 (piece 0 of component 1)
    assert _flat_first_mismatch(3, 4, 4, 2) == (0, 1, 1, 4)


@pytest.mark.parametrize("by", ["1" + "0" * 30, "1e300"])
def test_a_flat_offset_over_very_many_fused_components_ends_refuted(tmp_path, by):
    # the replay listed the C·L pieces of every rank: C = 10**30 components did not end
    f = tmp_path / "s.place"
    f.write_text(_mutant("bugs/ckpt_fused_qkv_flat_reshard.place", "fused over (tp) by 3", f"fused over (tp) by {by}"))
    rc, out, err = run_cli(["check", str(f)])
    assert rc == 1 and "the flat offset reads" in out, (rc, out[-2000:], err[-2000:])


@pytest.mark.parametrize("path,old", [("bugs/ckpt_vpp_layer_offset_flat.place", "flat_offset over (pp)"),
                                      ("bugs/ckpt_fused_qkv_flat_reshard.place", "flat_offset over (tp)")])
def test_a_flat_offset_over_no_axis_changes_nothing(tmp_path, capsys, path, old):
    # over () keyed no shard by a flat offset: the bug spec was proved
    err = _diagnosed(tmp_path, capsys, _mutant(path, old, "flat_offset over ()"))
    assert "[PL506]" in err and "flat_offset changes nothing: it names no axis" in err, err


@pytest.mark.parametrize("old,new", [("dp = 8", "dp = 4096"), ("heads = 32", "heads = 1000000000")])
def test_a_flat_offset_witness_shrunk_on_a_large_mesh_is_refuted(tmp_path, old, new):
    # the shrink read a flat-offset witness's block count (an int) as a map of blocks: an internal error
    f = tmp_path / "s.place"
    f.write_text(_mutant("bugs/ckpt_fused_qkv_flat_reshard.place", old, new))
    rc, out, err = run_cli(["check", str(f)])
    assert rc == 1 and "the flat offset reads" in out, (rc, out[-2000:], err[-2000:])
