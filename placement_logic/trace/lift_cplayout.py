"""The layout of context parallelism's chunks of every sequence, read from the values the ranks hold (no torch).

On a context axis of c ranks every sequence is cut into 2c chunks and each rank holds two: chunks 2i and 2i + 1
(contiguous) or chunks i and 2c − 1 − i (zigzag, load-balanced). The recorder keeps, on every rank, the token ids
the model is called with (``inputs[0].values``), a second integer argument of that call (``position_ids``) and
the cross-entropy's labels (``nll[0].target``), each at most 4096 elements. ``layout_lines`` reads, along the
observer's line of the context axis:

- the global order of the input chunks, from the labels (each token's next token, the causal language model's
  shift): a label chunk holds the inputs' chunk it labels shifted by one (``L[:h-1] == A[1:]``, h the chunk
  length) and its last label is the first token of the chunk after it. The chunks chained so, first to last,
  give each input chunk its index, and each label chunk the index of the input chunk it labels;
- the position ids' chunk index from their values (a chunk of consecutive positions starting at a multiple of h).

Each tensor's layout is then contiguous, zigzag, or another (named). Lifted: ``override layout[inputs]:
zigzag`` where the tokens are zigzag (contiguous is the derivation), ``override layout[labels]`` /
``layout[position_ids]`` where they are laid out otherwise than the tokens (the labels cut in contiguous blocks
beside zigzag tokens: NVIDIA-BioNeMo/bionemo-recipes#1449; rotary positions of a contiguous block:
NVIDIA/Megatron-LM#5243). Named (PL614): an input chunk whose next tokens no label chunk holds (the shift
forgotten), and a layout other than contiguous and zigzag. Noted, the layouts left to the derivation: an order
the values do not fix (ignored labels, negative, match any token: padding at the chunks' ends, or labels
shifted after the split and ignored at each rank's block end; repeated tokens), and a second integer argument
that is no chunks of consecutive positions (token types, a mask). Not observed: the loss mask and
the attention's causal mask (they follow the inputs, the derivation).
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames

CONTIGUOUS, ZIGZAG = "contiguous", "zigzag"


def _ranks_along(layout, observer: int, axis: str) -> list[int]:
    """The ranks of the observer's line along ``axis``, by coordinate."""
    i = layout.names.index(axis)
    me = layout.coords[observer]
    line = [r for r, c in layout.coords.items() if all(c[j] == me[j] for j in range(len(me)) if j != i)]
    return sorted(line, key=lambda r: layout.coords[r][i])


def _chunks(flat: list[int], rows: int, h: int) -> list[tuple]:
    """A rank's two chunks of every row (rows × 2h values, row-major): each a tuple of rows."""
    width = 2 * h
    return [tuple(tuple(flat[r * width + j * h: r * width + (j + 1) * h]) for r in range(rows)) for j in (0, 1)]


def _labels(lab: tuple, inp: tuple) -> bool | None:
    """Whether ``lab`` holds the next tokens of ``inp`` within the chunk, an ignored label (negative: padding)
    matching any token; None where every label there is ignored (no evidence either way)."""
    pairs = [(x, y) for lr, ir in zip(lab, inp) for x, y in zip(lr[:-1], ir[1:]) if x >= 0]
    return all(x == y for x, y in pairs) if pairs else None


def _next(lab: tuple, chunk: tuple) -> bool:
    """``lab``'s last label of every row (those not ignored, one at least) is ``chunk``'s first token."""
    pairs = [(lr[-1], r[0]) for lr, r in zip(lab, chunk) if lr[-1] >= 0]
    return bool(pairs) and all(x == y for x, y in pairs)


def _layout(slots: list[tuple[int, int]], c: int) -> str | None:
    if all(s == (2 * k, 2 * k + 1) for k, s in enumerate(slots)):
        return CONTIGUOUS
    if all(s == (k, 2 * c - 1 - k) for k, s in enumerate(slots)):
        return ZIGZAG
    return None


def _order(inputs: list[list[tuple]], labels: list[list[tuple]]) -> tuple[dict | None, str, bool]:
    """Each input chunk's (rank, slot) -> its index in the sequence, and each label chunk's ("label", rank, slot)
    -> the index of the chunk it labels, from the labels; else (None, why, contradicted): contradicted where an
    input chunk's next tokens are in no label chunk (labels shifted after the split), not where ignored labels
    (padding) or repeated tokens leave more than one reading."""
    ins = {(k, j): ch for k, pair in enumerate(inputs) for j, ch in enumerate(pair)}
    labs = {(k, j): ch for k, pair in enumerate(labels) for j, ch in enumerate(pair)}
    of = {}  # input chunk -> the label chunk that labels it
    for lk, lab in labs.items():
        if all(_labels(lab, ch) is False for ch in ins.values()):
            return None, (f"the labels in slot {lk[1]} of context rank {lk[0]} are the next tokens of no input "
                          "chunk: the labels are not the inputs' chunks shifted by one token"), True
    for a, ch in ins.items():
        found = [lk for lk, lab in labs.items() if _labels(lab, ch) is not False]
        if not found:
            return None, (f"no label chunk holds the next tokens of the input chunk in slot {a[1]} of context rank "
                          f"{a[0]}: the labels are not the inputs' chunks shifted by one token (labels shifted "
                          "after the split)"), True
        if len(found) > 1 or _labels(labs[found[0]], ch) is None:
            return None, "ignored labels or repeated tokens match an input chunk to several label chunks", False
        of[a] = found[0]
    after = {}
    for a in ins:
        nxt = [b for b, ch in ins.items() if b != a and _next(labs[of[a]], ch)]
        if len(nxt) > 1:
            return None, "the tokens repeat at a chunk's boundary", False
        if nxt:
            after[a] = nxt[0]
    first = [a for a in ins if a not in after.values()]
    index, a = {}, first[0] if len(first) == 1 else None
    while a is not None and a not in index:
        index[a] = len(index)
        a = after.get(a)
    if len(index) != len(ins):
        return None, ("the labels at the chunks' ends chain the input chunks into no single sequence (ignored labels "
                      "there, or labels shifted after the split)"), False
    return {**index, **{("label", *of[a]): i for a, i in index.items()}}, "", False


def _positions(flat: list[int], rows: int, h: int) -> list[int] | None:
    """The chunk index of each of a rank's two position-id chunks (every row alike), else None."""
    width = 2 * h
    if len(flat) == width:
        flat, rows = flat, 1
    out = []
    for j in (0, 1):
        chunk = {tuple(flat[r * width + j * h: r * width + (j + 1) * h]) for r in range(rows)}
        if len(chunk) != 1:
            return None
        (ch,) = chunk
        if ch[0] % h or list(ch) != list(range(ch[0], ch[0] + h)):
            return None
        out.append(ch[0] // h)
    return out


def layout_lines(st, ax) -> list[tuple[str, list]]:
    """``override layout[...]`` lines for the context axis (the first), what they cannot express in ``st.items``."""
    axis = getattr(ax, "cp", None)
    if axis is None or axis not in st.layout.names:
        return []
    line = _ranks_along(st.layout, st.observer, axis)
    c = len(line)
    recs = [((st.step.get(r) or {}).get("inputs") or [{}])[0] for r in line]
    nll = [((st.step.get(r) or {}).get("nll") or [{}])[0] for r in line]
    if c < 2 or not all(x.get("values") and x.get("shape") for x in recs):
        return []
    width = recs[0]["shape"][-1]
    rows = len(recs[0]["values"]) // max(width, 1)
    at = _frames([recs[0].get("stack") or []], st.script)
    loss_at = _frames([nll[0].get("stack") or []], st.script)
    if width % 2 or width < 4 or any(len(x["values"]) != rows * width for x in recs):
        st.notes.append(f"context axis {axis}: each rank's {width} tokens per sequence are not two chunks of two or "
                        "more: the layout of its chunks is not read (contiguous assumed)")
        return []
    h = width // 2
    inputs = [_chunks(x["values"], rows, h) for x in recs]
    out = []
    if not all(len(n.get("target") or []) == rows * width for n in nll):
        st.notes.append(f"context axis {axis}: no labels of the inputs' shape were recorded: the layout of the "
                        "chunks is not read (contiguous assumed)")
        return []
    labels = [_chunks(n["target"], rows, h) for n in nll]
    index, why, contradicted = _order(inputs, labels)
    if index is None and contradicted:
        st.items.append(Unliftable(tuple(line), -1, f"the layout of the chunks over {axis}", why, tuple(loss_at[:1])))
        return []
    if index is None:
        st.notes.append(f"context axis {axis}: the order of every sequence's chunks is not read from the labels "
                        f"({why}): the layouts are left to the derivation (the labels and position ids follow the "
                        "tokens)")
        return []
    found = {"inputs": _layout([(index[(k, 0)], index[(k, 1)]) for k in range(c)], c),
             "labels": _layout([(index[("label", k, 0)], index[("label", k, 1)]) for k in range(c)], c)}
    pos = [x.get("position_ids") for x in recs]
    if all(pos):
        slots = [_positions(p, rows, h) for p in pos]
        if all(slots):
            found["position_ids"] = _layout([tuple(s) for s in slots], c)
        else:  # a second integer argument that is no chunks of consecutive positions (token types, a mask)
            st.notes.append(f"context axis {axis}: the model's second integer argument is not read as position ids "
                            "(no chunks of consecutive positions): their layout is left to the derivation")
    where = {"inputs": at, "labels": loss_at, "position_ids": at}
    for item, lay in found.items():
        if lay is None:
            st.items.append(Unliftable(tuple(line), -1, f"the layout of the {item.replace('_', ' ')} over {axis}",
                                       f"the chunks the context ranks hold are neither contiguous (rank i: 2i, "
                                       f"2i + 1) nor zigzag (rank i: i, {2 * c - 1} - i) of the {2 * c} chunks",
                                       tuple(where[item][:1])))
    mine = found["inputs"]
    if mine is None:
        return []
    if mine == ZIGZAG:
        out.append((f"  override layout[inputs]: {ZIGZAG}  # observed: context rank i holds chunks i and "
                    f"{2 * c - 1} - i of every sequence's {2 * c}", at))
    for item in ("labels", "position_ids"):
        lay = found.get(item)
        if lay is not None and lay != mine:
            out.append((f"  override layout[{item}]: {lay}  # observed: the {item.replace('_', ' ')} in {lay} "
                        f"chunks beside {mine} tokens", where[item]))
    return out
