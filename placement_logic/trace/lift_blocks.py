"""Reductions run over process groups that cut a mesh axis into blocks of consecutive ranks (no torch).

- ``find_blocks``: every collective's group (the recorder's global ranks of its process group) that is no set of
  mesh axes but a run of consecutive ranks along one axis (the other coordinates the caller's). Where every such
  group along an axis starts at a multiple of one size B (the largest seen) and holds B ranks (the last block may
  hold fewer), the groups are that axis's blocks: ``_Layout.blocks`` maps each to (axis index, B), and the layout reads
  a call over one as a call over the axis (the gradient programs see the axis reduced). Strided groups, groups of
  unequal sizes, or a partition that is not of consecutive ranks are left as they are: named, never lifted.
- ``block_lines``: the plan lines of the calls over blocks in the step: a gradient reduction is
  ``override grads[g]: reduce_blocks over (AXIS) by B`` (``grads`` where every parameter's is), the grad norm's
  all-reduce after backward (a float all-reduce no gradient program holds, the gradients clipped, a gradient
  sharded over the axis) ``override clip_norm: reduce_blocks over (AXIS) by B`` (over an axis no gradient is
  sharded on, the ranks' norms are alike and the blocks count them: the norm's ``reduce over`` as lifted, noted), a broadcast in forward (DDP's buffers over the same
  group) a note; any other call over blocks is named.
"""

from __future__ import annotations

from .lift_layout import Unliftable, _frames, _Layout, _placement_axes

P2P = ("send", "recv", "recv_any_source")


def _run(layout: _Layout, ranks, r: int) -> tuple[str, int, int] | None:
    """(axis, first coordinate, length) where ``ranks`` are consecutive along one axis through ``r``."""
    if r not in layout.coords or any(x not in layout.coords for x in ranks):
        return None
    me = layout.coords[r]
    for i, a in enumerate(layout.names):
        if any(any(layout.coords[x][j] != me[j] for j in range(len(me)) if j != i) for x in ranks):
            continue
        idx = sorted(layout.coords[x][i] for x in ranks)
        if idx == list(range(idx[0], idx[0] + len(idx))):
            return a, idx[0], len(idx)
    return None


def find_blocks(trace: dict, layout: _Layout) -> None:
    """Record in ``layout.blocks`` every group that is a block of B consecutive ranks of an axis (see above)."""
    runs: dict[str, dict[frozenset, tuple[int, int]]] = {}
    alone: set[int] = set()  # ranks seen in a group of their own (the last block, of one rank)
    for part in trace["ranks"]:
        for c in part["collectives"]:
            ranks = c.get("ranks") or []
            if len(ranks) == 1 and c["kind"] not in P2P:
                alone.add(ranks[0])
            if len(ranks) < 2 or c["kind"] in P2P or layout.axes_of(ranks, part["rank"]) is not None:
                continue
            run = _run(layout, ranks, part["rank"])
            if run is not None:
                runs.setdefault(run[0], {})[frozenset(ranks)] = run[1:]
    for a, groups in runs.items():
        n = layout.sizes[layout.names.index(a)]
        b = max(k for _, k in groups.values())
        if 2 <= b < n and all(lo % b == 0 and (k == b or lo + k == n) for lo, k in groups.values()):
            i = layout.names.index(a)
            layout.blocks.update({g: (i, b) for g in groups})
            # a last block of one rank: its group holds that rank alone
            layout.blocks.update({frozenset([r]): (i, b) for r in alone
                                  if r in layout.coords and layout.coords[r][i] == n - 1 and (n - 1) % b == 0})


def block_lines(st, params: list[dict], named: list, clipped: bool) -> list[tuple[str, list]]:
    """The plan lines of the step's calls over blocks (see above); what has no statement is added to
    ``st.items``."""
    blocks = st.layout.blocks
    if not blocks:
        return []
    lines: list[tuple[str, list]] = []
    in_programs = {(p["rank"], s) for p in params for s in ((p.get("grad") or {}).get("collectives") or [])}
    # parameter name -> (axis, B, stack) of a gradient reduction over blocks
    held: dict[str, tuple[str, int, list]] = {}
    for p in params:
        for s in (p.get("grad") or {}).get("collectives") or []:
            c = st.by_seq[p["rank"]].get(s)
            if c is not None and frozenset(c["ranks"]) in blocks:
                i, b = blocks[frozenset(c["ranks"])]
                a = st.layout.names[i]
                held.setdefault(p["name"], (a, b, c["stack"]))
    if held:
        lines.extend(_grad_lines(st, held, named))
    norm = None
    for r, part in sorted(st.ranks.items()):
        for c in part["collectives"]:
            if c["step"] != st.step_no or frozenset(c["ranks"]) not in blocks:
                continue
            i, b = blocks[frozenset(c["ranks"])]
            a = st.layout.names[i]
            if (r, c["seq"]) in in_programs:
                continue
            if c["phase"] == "forward" and c["kind"] == "broadcast" and held:
                note = (f"{a}: a broadcast in forward over blocks of {b} consecutive ranks (DDP's buffers over the "
                        "same process group as its gradients): the buffers are not part of the plan")
                if note not in st.notes:
                    st.notes.append(note)
                continue
            if c["phase"] == "backward" and c["kind"] in ("all_reduce", "reduce_scatter") and held:
                continue  # a gradient bucket read on another rank: its parameters' programs hold it on the observer
            if c["phase"] == "after_backward" and c["kind"] == "all_reduce" and clipped \
                    and str(c.get("dtype", "")).startswith(("float", "bfloat")):
                if not any(a in _placement_axes(q, st.layout) for q in params):
                    # the ranks of a replicated axis hold the same squared norms: the sum over a block counts
                    # them B times, stated as the norm's reduction over the axis (``clip_norm: reduce over``)
                    note = (f"{a}: the grad norm all-reduced within blocks of {b} consecutive ranks, an axis no "
                            f"gradient is sharded on: lifted as its reduction over {a} (a count, not a sum)")
                    if note not in st.notes:
                        st.notes.append(note)
                    continue
                norm = norm or (f"  override clip_norm: reduce_blocks over ({a}) by {b}  # observed: the grad norm "
                                f"all-reduced within groups of {b} consecutive {a} ranks",
                                _frames([c["stack"]], st.script))
                continue
            st.items.append(Unliftable((r,), c["seq"], f"{c['kind']} ({c['api']}) over the group {sorted(c['ranks'])}",
                                       f"its group is a block of {b} consecutive ranks of {a}: only gradient and "
                                       "grad-norm reductions over blocks are lifted", tuple(c["stack"])))
    if norm is not None:
        lines.append(norm)
    return lines


def _grad_lines(st, held: dict[str, tuple[str, int, list]], named: list) -> list[tuple[str, list]]:
    """``grads: reduce_blocks`` where every parameter is reduced over the same blocks, else per group."""
    kinds = {(a, b) for a, b, _ in held.values()}
    every = {e[0]["name"] for _, _, members in named for e in members}
    first = next(iter(held.values()))
    frames = _frames([first[2]], st.script)

    def text(target: str, a: str, b: int) -> str:
        return (f"  override {target}: reduce_blocks over ({a}) by {b}  # observed: the gradient all-reduced within "
                f"groups of {b} consecutive {a} ranks")

    if len(kinds) == 1 and set(held) >= every:
        a, b = next(iter(kinds))
        return [(text("grads", a, b), frames)]
    lines = []
    for g, _, members in named:
        mine = [e[0]["name"] for e in members]
        got = {held[n][:2] for n in mine if n in held}
        if not got:
            continue
        if len(got) == 1 and all(n in held for n in mine):
            a, b = next(iter(got))
            lines.append((text(f"grads[{g}]", a, b), _frames([held[mine[0]][2]], st.script)))
        else:
            st.items.append(Unliftable((st.observer,), -1, f"the reductions over blocks of group {g}",
                                       f"some of its parameters' gradients are reduced over blocks of an axis "
                                       f"({', '.join(f'{a} by {b}' for a, b in sorted(got))}), the others not: one "
                                       "statement per group, not lifted", tuple(held[next(n for n in mine
                                                                                     if n in held)][2])))
    return lines
