"""Pipeline stages read from point-to-point calls: the axis, the stage order, microbatches, schedule.

Ranks that send activations forward and gradients backward to their neighbours along one
mesh axis are the stages of a pipeline over that axis. ``send``/``recv`` records carry
``ranks = [source, destination]`` (``isend``/``irecv``, ``batch_isend_irecv`` and the
schedules of ``torch.distributed.pipelining`` dispatch the same c10d ops), so:

- the axis: the one axis along which every such pair differs, by one coordinate step;
- the stage order: the stage that computes the loss (its ranks record the backward passes
  of a scalar) is the last; stages follow the coordinates towards it;
- microbatches: the first stage's forward sends (towards the next stage) in the step;
- schedule: GPipe when, on every stage, every forward-direction call (activations) comes
  before every backward-direction call (gradients); one forward-backward (1F1B) when a
  gradient moves before the last activation. With one microbatch the orders are the same
  and GPipe is assumed (a note says so). A last stage that sends towards the first before
  its backward (the activations of an interleaved schedule's next model chunk) is not lifted.

Sends and recvs in forward and backward between ranks that all compute a loss are no pipeline:
they are ring attention over a context axis (``find_context_axes``), lifted as ``context_parallel``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

from .lift_layout import Unliftable, _frames, _Layout

P2P_KINDS = ("send", "recv")


@dataclass
class Pipeline:
    axis: str
    size: int
    coords: list[int]  # coords[s]: the coordinate along the axis of stage s
    microbatches: int
    schedule: str  # a std.pipeline strategy: gpipe | one_f_one_b
    frames: list[dict] = field(default_factory=list)  # the first stage's forward sends
    notes: list[str] = field(default_factory=list)

    def stage_of(self, layout: _Layout, rank: int) -> int:
        return self.coords.index(layout.coords[rank][layout.names.index(self.axis)])

    def rank_of(self, layout: _Layout, like: int, stage: int) -> int:
        """The rank of ``stage`` whose coordinates on the other axes are ``like``'s."""
        i = layout.names.index(self.axis)
        want = list(layout.coords[like])
        want[i] = self.coords[stage]
        return next(r for r, c in layout.coords.items() if list(c) == want)

    def forward(self, layout: _Layout, c: dict) -> bool:
        """A point-to-point call that moves data towards the last stage (activations)."""
        src, dst = c["ranks"][0], c["ranks"][1]
        return self.stage_of(layout, src) < self.stage_of(layout, dst)


def p2p_axis(layout: _Layout, c: dict) -> str | None:
    """The axis along which a send/recv's two ranks are neighbours (one coordinate step apart), else None."""
    return layout.along(*c["ranks"]) if len(c["ranks"]) == 2 else None


def find_context_axes(ranks: dict, layout: _Layout, step_no: int) -> list[str]:
    """Axes along which the step's sends and recvs run between neighbours, in forward and in backward, where every
    rank computes a loss: each holds a part of every sequence and passes keys and values around a ring (and
    their gradients back), the ring attention of context parallelism. Not a pipeline: no rank waits for
    another's activations to compute its loss."""
    calls = [c for part in ranks.values() for c in part["collectives"] if c["kind"] in P2P_KINDS
             and c["step"] == step_no]
    steps = {r: next((s for s in part["steps"] if s["step"] == step_no), {}) for r, part in ranks.items()}
    if not calls or not all(steps[r].get("losses") for r in ranks):
        return []
    out = []
    for axis in layout.names:
        along = [c for c in calls if p2p_axis(layout, c) == axis]
        phases = {c["phase"] for c in along}
        if "forward" in phases and phases & {"backward", "after_backward"}:
            out.append(axis)
    # every send or recv must run along one of them
    return out if all(p2p_axis(layout, c) in out for c in calls) else []


def find_pipeline(ranks: dict, layout: _Layout, step_no: int, observer: int, script: str = "") -> tuple[
        Pipeline | None, str | None]:
    """The pipeline the step's point-to-point calls form; (None, why) when they form none (None, None: no calls)."""
    calls = [(r, c) for r, part in ranks.items() for c in part["collectives"]
             if c["kind"] in P2P_KINDS and c["step"] == step_no]
    if not calls:
        return None, None
    axes = Counter(p2p_axis(layout, c) for _, c in calls)
    axes.pop(None, None)
    if not axes:
        return None, ("no two ranks that exchange are neighbouring stages of one mesh axis (a pipeline axis: stages "
                      "exchanging with the next and the previous only)")
    # the axis most calls run along; a call off it is reported by the caller
    axis = axes.most_common(1)[0][0]
    ranks = {r: dict(part, collectives=[c for c in part["collectives"]
                                        if c["kind"] not in P2P_KINDS or p2p_axis(layout, c) == axis])
             for r, part in ranks.items()}
    size = layout.size((axis,))
    i = layout.names.index(axis)
    steps = {r: next((s for s in part["steps"] if s["step"] == step_no), {}) for r, part in ranks.items()}
    # the stage that computes the loss is the last
    lossy = {layout.coords[r][i] for r in ranks if steps[r].get("losses")}
    notes = []
    if lossy == {size - 1} or not lossy:
        coords = list(range(size))
        if not lossy:
            notes.append("pipeline over <axis>: no rank recorded a loss; the stages are taken in the order of "
                         "their coordinates along <axis>")
    elif lossy == {0}:
        coords = list(range(size - 1, -1, -1))
    elif lossy == set(range(size)):
        return None, ("every rank along the axis of the sends computes a loss on its own part of the inputs: an "
                      "exchange within each layer (the ring attention of context parallelism, the sequence split "
                      "over the axis), not a chain of stages")
    else:
        return None, (f"the loss is computed at coordinates {sorted(lossy)} along the axis of the sends, not at "
                      "one end of the chain of stages")
    pipe = Pipeline(axis, size, coords, 0, "gpipe", notes=notes)
    if lossy:
        # the last stage sends back only gradients, after a backward: a send towards the first stage
        # while it still runs forward carries activations (an interleaved, virtual-stage schedule)
        for r in ranks:
            if layout.coords[r][i] != coords[-1]:
                continue
            early = [c for c in ranks[r]["collectives"] if c["step"] == step_no and c["kind"] == "send"
                     and not pipe.forward(layout, c) and c["phase"] in ("before_forward", "forward")]
            if early:
                return None, ("the last stage sends towards the first stage before its backward "
                              "(activations of a later model chunk): interleaved, virtual-stage schedules are not "
                              "lifted")
    first = pipe.rank_of(layout, observer, 0)
    fwd = [c for c in ranks[first]["collectives"] if c["step"] == step_no and c["kind"] == "send"
           and pipe.forward(layout, c)]
    if not fwd:
        return None, "the first stage sends no activations forward in the step"
    pipe.microbatches = len(fwd)
    pipe.frames = _frames((c["stack"] for c in fwd), script)
    one_f_one_b = False
    for s in range(size):
        r = pipe.rank_of(layout, observer, s)
        order = [pipe.forward(layout, c) for c in ranks[r]["collectives"]
                 if c["step"] == step_no and c["kind"] in P2P_KINDS]
        if True in order and False in order and order.index(False) < len(order) - 1 - order[::-1].index(True):
            one_f_one_b = True  # a gradient moved before the last activation
        sent = sum(1 for c in ranks[r]["collectives"] if c["step"] == step_no and c["kind"] == "send"
                   and pipe.forward(layout, c))
        if s < size - 1 and sent != pipe.microbatches:
            notes.append(f"pipeline over <axis>: stage {s} sends {sent} activations forward, stage 0 sends "
                         f"{pipe.microbatches}; microbatches taken from stage 0")
    last = pipe.rank_of(layout, observer, size - 1)
    backward_passes = len(steps[last].get("losses", []))
    if lossy and backward_passes != pipe.microbatches:
        notes.append(f"pipeline over <axis>: the last stage ran {backward_passes} backward passes for "
                     f"{pipe.microbatches} microbatches")
    if one_f_one_b:
        pipe.schedule = "one_f_one_b"
        notes.append("pipeline over <axis>: gradients move between stages before the last microbatch's "
                     "activations: lifted as one_f_one_b")
    elif pipe.microbatches == 1:
        notes.append("pipeline over <axis>: one microbatch, for which GPipe and 1F1B run the same order: lifted "
                     "as gpipe")
    else:
        notes.append(f"pipeline over <axis>: every stage moves all {pipe.microbatches} microbatches' activations "
                     "before any gradient: lifted as gpipe")
    return pipe, None


_ITEMSIZE = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def _zeros(p: dict) -> bool:
    """The parameter's values are all zero (the recorder's checksum of that many zero bytes): two such matrices
    are equal without being one weight (zero-initialised adapters), so they are no evidence of a tie."""
    numel = 1
    for d in p.get("local_shape") or p["shape"]:
        numel *= d
    size = _ITEMSIZE.get(p.get("dtype", "float32"))
    return size is not None and p["checksum"] == hashlib.sha1(bytes(numel * size)).hexdigest()[:16]


def tied_pairs(stage_ranks: list[int], initial: dict) -> list[tuple[int, str, int, str]]:
    """(stage, name, later stage, name) of the matrices equal before the first update on two stages: weights
    tied across the stages (a tied embedding: the first stage's input embedding, the last stage's head)."""
    out = []
    seen: dict[tuple, tuple[int, str]] = {}
    for s, r in enumerate(stage_ranks):
        for own, p in initial.get(r, {}).items():
            if len(p.get("shape", [])) < 2 or not p.get("checksum") or _zeros(p):
                continue
            key = (tuple(p["shape"]), p["checksum"])
            if key in seen and seen[key][0] != s:
                out.append((*seen[key], s, own))
            else:
                seen.setdefault(key, (s, own))
    return out


@dataclass
class Tie:
    """A weight tied across the first and last stage, lifted: the model's ``tied_embeddings`` and, where its
    copies' gradients are not summed exactly once across the stages, ``override embedding: tie_reduce``."""
    names: set  # the tied copies' parameter names (rank-qualified), which must share the dense program
    comment: str  # the model line's comment: what was observed
    line: tuple | None  # the override line and its frames, or None (summed once: the derivation)


def _tied_across_stages(pp: str, stage_ranks: list[int], pairs: list, summed: dict, step: dict,
                        script: str) -> tuple[Tie | None, list]:
    """Weights shared by two stages (``tied_pairs``), with ``summed``: (stage, name) -> (the stacks of its
    reductions across the stages, how many). A tie of the first and last stage whose copies are all summed the
    same number of times is lifted (``Tie``: once is the derivation; never or twice is ``tie_reduce over ()`` or
    ``over (pp, pp)`` at the line that updates them unsummed or reduces them again); any other tie (between
    inner stages, copies reduced differently) is reported, never proved as two independent weights."""
    out, counts, stacks = [], set(), []
    last = len(stage_ranks) - 1
    for s0, own0, s, own in pairs:
        k0, k = (summed.get(key, ([], 0))[1] for key in ((s0, own0), (s, own)))
        counts |= {k0, k}
        stacks.extend(summed.get((s, own), ([], 0))[0])
        if (s0, s) == (0, last) and k0 == k:
            continue
        how = (f"its copies' gradients are reduced across the stages {k0} and {k} times" if k0 != k else
               f"stages {s0} and {s} are not the first and last")
        out.append(Unliftable((stage_ranks[s0], stage_ranks[s]), -1, f"{own0} (stage {s0}) and {own} (stage {s})",
                              f"equal before the first update: a weight tied across the stages of {pp}; {how}, "
                              "which no plan states (a tied embedding lives on the first and last stage)",
                              tuple(_frames([step[stage_ranks[s]].get("optimizer", {}).get("stack", [])], script))))
    if out or not pairs:
        return None, out
    (k,) = counts
    names = ", ".join(f"{a} (stage {x}) and {b} (stage {y})" for x, a, y, b in pairs)
    comment = (f"observed: {names} equal before the first update, their gradients "
               + ("never summed across the stages" if k == 0 else f"all-reduced {k} time(s) over {pp}"))
    line = None
    if k == 0:  # each stage updates its copy with its own part of the gradient
        line = (f"  override embedding: tie_reduce over ()  # observed: the tied copies' gradients are never summed "
                f"across the stages of {pp}", _frames([step[stage_ranks[-1]].get("optimizer", {}).get("stack", [])],
                                                      script))
    elif k > 1:
        line = (f"  override embedding: tie_reduce over ({', '.join([pp] * k)})  # observed: the tied copies' "
                f"gradients all-reduced {k} times across the stages", _frames(stacks, script))
    return Tie(set(), comment, line), []
