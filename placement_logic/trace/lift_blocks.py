"""Reductions run over process groups over part of a mesh axis: blocks, strided groups, the first K ranks (no torch).

- ``find_blocks``: every collective's group (the recorder's global ranks of its process group) that is no set of
  mesh axes but part of one axis (the other coordinates the caller's). Per line of ranks along an axis the groups
  are read as one partition (``_kind``): blocks, where every group is a run of consecutive ranks starting at a
  multiple of one size B (the largest seen) and holding B ranks (the last block may hold fewer, a last block of
  one rank seen in a group of its own); strided groups, where every group is {r, r+S, r+2S ...} for one S ≥ 2 and
  every r < S is present (a group of one rank where r + S is past the axis); the first K ranks, one group
  {0 ... K-1} (2 ≤ K < n) that no other rank of the line calls (a call over a group a rank is no member of records
  nothing); consecutive groups of unequal sizes, runs of consecutive ranks that together hold every rank of the
  line once (a group of one rank seen in a group of its own), two runs or more: ("groups", (S1, S2, ...)), a
  per-node group on nodes of unequal GPU counts, a hand-written ``new_group`` list. ``_Layout.blocks`` maps each
  group to (axis index, size, kind) (the size a tuple of sizes for "groups"), and the layout reads a call over one
  as a call over the axis (the gradient programs see the axis reduced); groups neither consecutive nor strided
  that, with the ranks seen alone, hold every rank of the line once in two groups or more: ("sets", ((r, ...),
  ...)), the process groups of a list of rank sets (``reduce_sets ... ranks ([...], ...)``). One strided group
  alone, K ranks not from rank 0, runs or sets that leave a rank out are left as they are: named, never lifted.
- ``block_lines``: the plan lines of the calls over such groups in the step: a gradient reduction is
  ``override grads[g]: reduce_blocks over (AXIS) by B`` (``reduce_strided ... by S``, ``reduce_first ... by K``,
  ``reduce_groups ... by (S1, S2, ...)``, ``reduce_sets ... ranks ([...], ...)``;
  ``grads`` where every parameter's is), the same call on another rank (its site) part of it; the grad norm's
  all-reduce after backward (a float all-reduce no gradient program holds, the gradients clipped, a gradient
  sharded over the axis) ``override clip_norm: reduce_blocks over (AXIS) by B`` (or the other two; over an axis
  no gradient is sharded on, the ranks' norms are alike and the groups count them: the norm's ``reduce over`` as
  lifted, noted), a broadcast in forward (DDP's buffers over the same group) a note; any other call over such
  groups is named.
- ``outside_first``: the gradient program of a rank outside a group of the first K ranks (the observer's less
  that reduction: it keeps its own value), which ``gradients_pass`` takes as agreeing with the observer's."""

from __future__ import annotations

from . import lift_sets_axes
from .lift_layout import Unliftable, _frames, _Layout, _placement_axes

P2P = ("send", "recv", "recv_any_source")


def _along(layout: _Layout, ranks, r: int) -> tuple[str, list[int]] | None:
    """(axis, sorted coordinates along it) where ``ranks`` differ from ``r`` along that one axis only."""
    if r not in layout.coords or any(x not in layout.coords for x in ranks):
        return None
    me = layout.coords[r]
    for i, a in enumerate(layout.names):
        if any(any(layout.coords[x][j] != me[j] for j in range(len(me)) if j != i) for x in ranks):
            continue
        return a, sorted(layout.coords[x][i] for x in ranks)
    return None


def _kind(groups: list[list[int]], n: int, alone: set[int]) -> tuple[str, int] | None:
    """The partition of an axis of ``n`` ranks the groups (coordinates; ``alone``: coordinates seen in a group of
    their own) are: ("blocks", B), ("strided", S), ("first", K), else None."""
    runs = [g for g in groups if g == list(range(g[0], g[0] + len(g)))]
    if len(runs) == len(groups):
        b = max(len(g) for g in groups)
        covered = {x for g in groups for x in g}
        if 2 <= b < n and all(g[0] % b == 0 and (len(g) == b or g[-1] == n - 1) for g in groups):
            # a last block of one rank holds it alone
            if len(covered) == n or (covered == set(range(n - 1)) and n - 1 in alone and (n - 1) % b == 0):
                return "blocks", b
        if len(groups) == 1 and groups[0][0] == 0 and 2 <= len(groups[0]) < n and not (alone - covered):
            return "first", len(groups[0])  # one group of the first K ranks; the others issued no such call
        parts = sorted(groups + [[x] for x in alone if x not in covered and 0 <= x < n])
        if len(parts) >= 2 and [x for g in parts for x in g] == list(range(n)):
            return "groups", tuple(len(g) for g in parts)  # runs of unequal sizes holding every rank once
        return None
    steps = {g[1] - g[0] for g in groups}
    s = steps.pop() if len(steps) == 1 else 0
    if s >= 2 and not any(g != list(range(g[0], n, s)) or g[0] >= s for g in groups):
        starts = {g[0] for g in groups} | {x for x in alone if x < s and x + s >= n}
        if starts == set(range(min(s, n))):
            return "strided", s
    return _sets(groups, n, alone)


def _sets(groups: list[list[int]], n: int, alone: set[int]):
    """("sets", ((r, ...), ...)) where the groups, with the ranks seen alone, hold every rank of the line once in
    two groups or more: the process groups of a list of rank sets (``reduce_sets``); else None."""
    covered = [x for g in groups for x in g]
    parts = sorted([sorted(g) for g in groups] + [[x] for x in sorted(alone) if x not in covered and 0 <= x < n])
    if len(parts) >= 2 and sorted(x for g in parts for x in g) == list(range(n)):
        return "sets", tuple(tuple(g) for g in parts)
    return None


def find_blocks(trace: dict, layout: _Layout) -> None:
    """Record in ``layout.blocks`` every group that is a block, a strided group or the first K ranks of an axis
    (see above)."""
    runs: dict[tuple[str, tuple], dict[frozenset, list[int]]] = {}
    alone: set[int] = set()  # ranks seen in a group of their own (the last block, a strided group of one rank)
    for part in trace["ranks"]:
        for c in part["collectives"]:
            ranks = c.get("ranks") or []
            if len(ranks) == 1 and c["kind"] not in P2P:
                alone.add(ranks[0])
            if len(ranks) < 2 or c["kind"] in P2P or layout.axes_of(ranks, part["rank"]) is not None:
                continue
            run = _along(layout, ranks, part["rank"])
            if run is not None:
                i = layout.names.index(run[0])
                # the line of ranks along the axis: the other coordinates
                rest = tuple(x for j, x in enumerate(layout.coords[part["rank"]]) if j != i)
                runs.setdefault((run[0], rest), {})[frozenset(ranks)] = run[1]
    for (a, rest), groups in runs.items():
        i = layout.names.index(a)
        line = {c[i]: r for r, c in layout.coords.items() if tuple(x for j, x in enumerate(c) if j != i) == rest}
        n = layout.sizes[i]
        mine = {line[k] for k in line if line[k] in alone}
        kind = _kind(sorted(groups.values()), n, {layout.coords[r][i] for r in mine})
        if kind is None:
            continue
        what, size = kind
        layout.blocks.update({g: (i, size, what) for g in groups})
        # a group of one rank (the last block, a strided group of one): its group holds that rank alone
        layout.blocks.update({frozenset([r]): (i, size, what) for r in mine if not any(r in g for g in groups)})
    # rank sets over the flattened ranks of several axes (lift_sets_axes)
    lift_sets_axes.find(trace, layout, alone, lambda ranks, r: _along(layout, ranks, r) is not None)


def axis_name(layout: _Layout, i) -> str:
    """The axis a group cuts, or the axes (``A, B``) whose flattened ranks rank sets over several axes list."""
    return ", ".join(layout.names[k] for k in i) if isinstance(i, tuple) else layout.names[i]


VERB = {"blocks": "reduce_blocks", "strided": "reduce_strided", "first": "reduce_first", "groups": "reduce_groups",
        "sets": "reduce_sets"}


def _by(b) -> str:
    """The ``by`` clause of a statement: a number, the list of sizes of consecutive groups, or the rank sets."""
    if isinstance(b, tuple) and b and isinstance(b[0], tuple):
        return "ranks (" + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in b) + ")"
    return "by " + (f"({', '.join(map(str, b))})" if isinstance(b, tuple) else str(b))


def _groups(what: str, a: str, b) -> str:
    """The groups in words."""
    if what == "groups":
        return f"consecutive groups of {', '.join(map(str, b))} {a} ranks"
    if what == "sets":
        a = f"({a}) flattened" if ", " in a else a
        return f"the groups of the {a} rank sets " + ", ".join("[" + ", ".join(map(str, s)) + "]" for s in b)
    if what == "strided":
        return f"strided groups of {a} ranks (r, r+{b}, r+{2 * b} ...)"
    if what == "first":
        return f"a group of the first {b} {a} ranks only (the others taking no part)"
    return f"groups of {b} consecutive {a} ranks"


def block_lines(st, params: list[dict], named: list, clipped: bool) -> list[tuple[str, list]]:
    """The plan lines of the step's calls over blocks (see above); what has no statement is added to
    ``st.items``."""
    blocks = st.layout.blocks
    if not blocks:
        return []
    lines: list[tuple[str, list]] = []
    in_programs = {(p["rank"], s) for p in params for s in ((p.get("grad") or {}).get("collectives") or [])}
    # parameter name -> (axis, size, kind, stack) of a gradient reduction over part of an axis
    held: dict[str, tuple[str, int, str, list]] = {}
    for p in params:
        for s in (p.get("grad") or {}).get("collectives") or []:
            c = st.by_seq[p["rank"]].get(s)
            if c is not None and frozenset(c["ranks"]) in blocks:
                i, b, what = blocks[frozenset(c["ranks"])]
                held.setdefault(p["name"], (axis_name(st.layout, i), b, what, c["stack"]))
    if held:
        lines.extend(_grad_lines(st, held, named))
    # the call sites of the gradient reductions the programs hold: the same call on another rank is its own
    sites = {_site(st.by_seq[p["rank"]][s]) for p in params for s in (p.get("grad") or {}).get("collectives") or []
             if s in st.by_seq[p["rank"]]}
    norm = None
    for r, part in sorted(st.ranks.items()):
        for c in part["collectives"]:
            if c["step"] != st.step_no or frozenset(c["ranks"]) not in blocks:
                continue
            i, b, what = blocks[frozenset(c["ranks"])]
            a = axis_name(st.layout, i)
            groups = _groups(what, a, b)
            if (r, c["seq"]) in in_programs or (held and _site(c) in sites):
                continue
            if c["phase"] == "forward" and c["kind"] == "broadcast" and held:
                note = (f"{a}: a broadcast in forward over {groups} (DDP's buffers over the same process group as "
                        "its gradients): the buffers are not part of the plan")
                if note not in st.notes:
                    st.notes.append(note)
                continue
            if c["phase"] == "backward" and c["kind"] in ("all_reduce", "reduce_scatter") and held:
                continue  # a gradient bucket read on another rank: its parameters' programs hold it on the observer
            if c["phase"] == "after_backward" and c["kind"] == "all_reduce" and clipped \
                    and str(c.get("dtype", "")).startswith(("float", "bfloat")):
                if not any(x in _placement_axes(q, st.layout) for q in params for x in a.split(", ")):
                    # the ranks of a replicated axis hold the same squared norms: the sum over a block counts
                    # them B times, stated as the norm's reduction over the axis (``clip_norm: reduce over``)
                    note = (f"{a}: the grad norm all-reduced within {groups}, an axis no gradient is sharded on: "
                            f"lifted as its reduction over {a} (a count, not a sum)")
                    if note not in st.notes:
                        st.notes.append(note)
                    continue
                norm = norm or (f"  override clip_norm: {VERB[what]} over ({a}) {_by(b)}  # observed: the grad norm "
                                f"all-reduced within {groups}", _frames([c["stack"]], st.script))
                continue
            st.items.append(Unliftable((r,), c["seq"], f"{c['kind']} ({c['api']}) over the group {sorted(c['ranks'])}",
                                       f"its group is one of {groups}: only gradient and grad-norm reductions "
                                       "over such groups are lifted", tuple(c["stack"])))
    if norm is not None:
        lines.append(norm)
    return lines


def _site(c: dict) -> tuple:
    """A call's site: its kind and innermost frame."""
    return (c["kind"], tuple((f.get("file"), f.get("line")) for f in c["stack"][:1]))


def _grad_lines(st, held: dict[str, tuple[str, int, str, list]], named: list) -> list[tuple[str, list]]:
    """``grads: reduce_blocks`` (``reduce_strided``, ``reduce_first``) where every parameter is reduced over the
    same groups, else per group."""
    kinds = {h[:3] for h in held.values()}
    every = {e[0]["name"] for _, _, members in named for e in members}
    first = next(iter(held.values()))
    frames = _frames([first[3]], st.script)

    def text(target: str, a: str, b: int, what: str) -> str:
        return (f"  override {target}: {VERB[what]} over ({a}) {_by(b)}  # observed: the gradient all-reduced within "
                f"{_groups(what, a, b)}")

    if len(kinds) == 1 and set(held) >= every:
        return [(text("grads", *next(iter(kinds))), frames)]
    lines = []
    for g, _, members in named:
        mine = [e[0]["name"] for e in members]
        got = {held[n][:3] for n in mine if n in held}
        if not got:
            continue
        if len(got) == 1 and all(n in held for n in mine):
            lines.append((text(f"grads[{g}]", *next(iter(got))), _frames([held[mine[0]][3]], st.script)))
        else:
            st.items.append(Unliftable((st.observer,), -1, f"the reductions over blocks of group {g}",
                                       f"some of its parameters' gradients are reduced over blocks of an axis "
                                       f"({', '.join(f'{VERB[w]} {a} {_by(b)}' for a, b, w in sorted(got, key=str))}), the "
                                       "others not: one statement per group, not lifted",
                                       tuple(held[next(n for n in mine if n in held)][3])))
    return lines


def outside_first(st, p: dict, r: int, reds: tuple[str, ...]) -> tuple[str, ...]:
    """``reds`` (parameter ``p``'s reductions on its rank) less the axes it was reduced over within a group of the
    first K ranks that does not hold ``r``: the program ``r`` runs when it takes no part (``reduce_first``)."""
    out = list(reds)
    coords = st.layout.coords
    for s in (p.get("grad") or {}).get("collectives") or []:
        c = st.by_seq[p["rank"]].get(s)
        got = st.layout.blocks.get(frozenset(c["ranks"])) if c is not None else None
        if got is None or got[2] != "first" or r in c["ranks"] or st.layout.names[got[0]] not in out:
            continue
        # r on the group's line of ranks: it differs from the parameter's rank along the group's axis alone
        if all(x == y for j, (x, y) in enumerate(zip(coords[r], coords[p["rank"]])) if j != got[0]):
            out.remove(st.layout.names[got[0]])
    return tuple(out)
