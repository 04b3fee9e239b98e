"""Checkpoint save, load and the RNG state restored, lifted as ``override checkpoint`` statements (no torch).

Input: every rank's ``checkpoints`` records (``recorder_checkpoint``: each ``torch.save`` / ``torch.load``,
``torch.distributed.checkpoint`` save and load, ``torch.set_rng_state``, with the file named and the states the
object holds), the lifted layout and strategies. Output: the plan's checkpoint lines (each with the script frames
it was read from), what cannot be stated added to ``Step.items`` (PL614), notes.

- **Who writes** each state (the model's parameters, the optimizer's state): a ``torch.distributed.checkpoint``
  save on every rank writes each rank's shard and one copy of a replica, as the plan derives. Otherwise the ranks
  whose ``torch.save`` holds the state are read along each mesh axis: every rank of the axis, or its rank 0 alone.
  Rank 0 alone where the strategy shards the state there (ZeRO's optimizer, FSDP's parameters and optimizer, a
  tensor axis's split weights) is ``checkpoint: save_rank0 over (AXES)`` (the other shards are lost); every rank
  where the state is a replica is ``checkpoint: save_from over (AXES)`` (each replica written). Any other set of
  writers is reported. Parameters saved while the optimizer state (observed non-empty) never is:
  ``checkpoint: skip_optimizer``.
- **Loads**: a rank that reads a file another rank wrote, holding a state sharded along an axis the two differ
  on, restores that rank's shard: where every such rank reads rank 0's file, ``checkpoint: save_rank0 over
  (AXES)`` at the load (only rank 0's shards survive the save and load). A file no rank wrote in the run, or a
  load of no named file, is reported (what it holds is not observed). Under ZeRO-1 (parameters replicated over a
  sharded optimizer) a resume that loads the optimizer state and never the parameters is
  ``checkpoint: no_regather_after_load`` (the parameters are not rebuilt from the loaded state).
- **RNG state**: ``torch.set_rng_state`` of a state loaded from a file another rank wrote, the two ranks differing
  along an axis the dropout seed varies over (sequence parallelism's tensor axis, a lifted
  ``dropout_seed: vary``), is ``checkpoint: rng_shared`` at the call; along other axes it is what the plan
  derives (a note). A state of no observed origin is reported. Each load is compared with the generators'
  state the rank held before the save (``rng_before``) and the one it resumes from after the load
  (``rng_after``): where the step draws dropout masks and a rank resumes from another state with no
  ``set_rng_state`` after the load (the RNG state never saved or loaded, its load skipped: the generator left at
  the fresh process's seed), ``checkpoint: rng_not_restored`` at the load; equal, nothing; a load without both
  states observed is reported.

With anything saved or loaded the plan states ``checkpoint: resume`` (the transition ``save; load`` on the same
mesh); a resume on another mesh (``reshard``) is never lifted: the traced run has one mesh.
"""

from __future__ import annotations

from ..ir.overrides import OverrideVerb
from .lift_layout import Unliftable, _frames
from .lift_step import Axes, LiftRole, Step

SHARDS_PARAMS = ("zero3", "fsdp_full_shard", "fsdp_shard_grad_op")
SHARDS_OPTIMIZER = ("zero1", "zero2", *SHARDS_PARAMS)
STATES = ("params", "optimizer")
DCP = "torch.distributed.checkpoint."


def _stack(e: dict) -> tuple:
    return tuple(e.get("stack") or ())


def _shard(e: dict, state: str) -> bool | None:
    """Whether a save wrote the rank's own shard of ``state`` (DTensor shards, or no more elements than the rank
    holds), not a copy gathered from every rank (more: ZeroRedundancyOptimizer's consolidated state, a full state
    dict); None where the record does not say."""
    if state in (e.get("sharded") or ()):
        return True
    saved, held = (e.get("elements") or {}).get(state), (e.get("held") or {}).get(state)
    if saved is None or held is None:
        return None
    return saved <= held


class _Reader:
    """The records of every rank, the layout and what the plan shards where."""

    def __init__(self, st: Step, ax: Axes, bindings: dict[str, str], whole_on_tp: bool) -> None:
        self.st, self.ax, self.bindings, self.whole_on_tp = st, ax, bindings, whole_on_tp
        self.recs = {r: part.get("checkpoints") or [] for r, part in sorted(st.ranks.items())}
        self.layout = st.layout
        self.writers: dict[str, dict[int, list]] = {}  # file -> rank -> its save records of the file
        for r, evs in self.recs.items():
            for e in evs:
                if e["op"] == "save" and e["file"]:
                    self.writers.setdefault(e["file"], {}).setdefault(r, []).append(e)

    def item(self, ranks, what: str, reason: str, stack) -> None:
        self.st.items.append(Unliftable(tuple(sorted(set(ranks))), -1, what, reason, tuple(stack)))

    def sharded(self, state: str, axis: str) -> bool | None:
        """Whether the plan shards ``state`` over ``axis`` (None: a tensor axis, where it depends on the group)."""
        role = self.ax.roles.get(axis)
        if role is LiftRole.TENSOR:
            return None
        b = self.bindings.get(axis, "")
        return b in (SHARDS_PARAMS if state == "params" else SHARDS_OPTIMIZER)

    def coord(self, r: int, axis: str) -> int:
        return self.layout.coords[r][self.layout.names.index(axis)]


def checkpoint_pass(st: Step, ax: Axes, bindings: dict[str, str], whole_on_tp: bool,
                    seed_vary: tuple[str, ...]) -> list[tuple[str, list]]:
    """The plan's checkpoint lines; what they cannot state is added to ``st.items``."""
    rd = _Reader(st, ax, bindings, whole_on_tp)
    if not any(rd.recs.values()):
        return []
    for r, evs in rd.recs.items():
        for e in evs:
            if e.get("unread"):
                rd.item([r], e["api"], "the object it saves or loads could not be read: which states it holds is not "
                        "observed", _stack(e))
    if ax.pipe is not None:
        first = next(e for evs in rd.recs.values() for e in evs)
        rd.item(sorted(r for r, evs in rd.recs.items() if evs), first["api"],
                "a checkpoint under a pipeline (which stage writes which state) is not lifted", _stack(first))
        return []
    lines: list[tuple[str, list]] = []
    saved = [e for evs in rd.recs.values() for e in evs if e["op"] == "save"]
    loaded = [e for evs in rd.recs.values() for e in evs if e["op"] == "load"]
    if saved or loaded:
        first = (saved or loaded)[0]
        what = "saves and loads" if saved and loaded else ("saves" if saved else "loads")
        lines.append((f"  override checkpoint: resume  # observed: the script {what} a checkpoint",
                      _frames([_stack(first)], st.script)))
    written = _writers(rd)
    lines += written
    # every rank reading rank 0's file when rank 0 alone wrote the state: the save is the cause, stated once
    lost = {a.strip() for t, _ in written if "save_rank0 over (" in t for a in t.split("(")[1].split(")")[0].split(",")}
    lines += _loads(rd, lost)
    shared = _rng(rd, seed_vary)
    return lines + shared + _fresh(rd, bool(shared))


def _pattern(rd: _Reader, writers: set[int], axis: str) -> str | None:
    """'all' (every rank of the axis beside a writer writes), 'rank0' (only its rank 0), else None."""
    i = rd.layout.names.index(axis)
    line_of = {}
    for r, c in rd.layout.coords.items():
        line_of.setdefault(c[:i] + c[i + 1:], set()).add(r)
    lines = [ranks for ranks in line_of.values() if ranks & writers]
    if all(ranks <= writers for ranks in lines):
        return "all"
    if all(ranks & writers == {r for r in ranks if rd.coord(r, axis) == 0} for ranks in lines):
        return "rank0"
    return None


def _writers(rd: _Reader) -> list[tuple[str, list]]:
    """Who writes each state, read along every mesh axis, as save_rank0 / save_from / skip_optimizer."""
    st, out = rd.st, []
    verbs: dict[str, dict[str, list]] = {}  # verb -> axis -> stacks
    for state in STATES:
        dcp = {r for r, evs in rd.recs.items() for e in evs
               if e["op"] == "save" and e["api"].startswith(DCP) and state in e["states"]}
        if dcp == set(rd.recs):
            continue  # every rank's shard and one copy of each replica, as derived
        evs = [(r, e) for r, es in rd.recs.items() for e in es if e["op"] == "save" and state in e["states"]
               and not e["api"].startswith(DCP)]
        writers = {r for r, _ in evs}
        if not writers and not dcp:
            if state == "optimizer" and any(e["op"] == "save" for es in rd.recs.values() for e in es):
                if (st.step[st.observer].get("optimizer") or {}).get("state_bytes"):
                    saves = [e for es in rd.recs.values() for e in es if e["op"] == "save"]
                    out.append(("  override checkpoint: skip_optimizer  # observed: the optimizer's state is in no "
                                "file the script saves", _frames([_stack(saves[0])], st.script)))
            elif state == "params" and any(e["op"] == "save" for es in rd.recs.values() for e in es):
                saves = [e for es in rd.recs.values() for e in es if e["op"] == "save"]
                rd.item([r for r, es in rd.recs.items() if es], saves[0]["api"], "the model's parameters are in no "
                        "file the script saves: a checkpoint without them is not stated by any plan",
                        _stack(saves[0]))
            continue
        if dcp:
            rd.item(sorted(dcp), evs[0][1]["api"] if evs else DCP + "save", f"the {state} saved by "
                    "torch.distributed.checkpoint on some ranks only, or by it and torch.save together: who writes "
                    "which shard is not lifted", _stack(evs[0][1]) if evs else ())
            continue
        stacks = [_stack(e) for _, e in evs]
        for a, size in zip(rd.layout.names, rd.layout.sizes):
            if size == 1:
                continue
            pat = _pattern(rd, writers, a)
            if pat is None:
                rd.item(sorted(writers), evs[0][1]["api"], f"the {state} written by ranks {sorted(writers)}: along "
                        f"{a} neither every rank nor rank 0 alone writes it", stacks[0])
                return []
            sh = rd.sharded(state, a)
            if sh is None:  # a tensor axis: split groups are sharded there, whole ones replicas
                verb = OverrideVerb.SAVE_RANK0 if pat == "rank0" else (OverrideVerb.SAVE_FROM if rd.whole_on_tp else None)
            else:
                verb = OverrideVerb.SAVE_RANK0 if pat == "rank0" and sh else (OverrideVerb.SAVE_FROM if pat == "all" and not sh else None)
            if verb == OverrideVerb.SAVE_RANK0:
                own = {_shard(e, state) for _, e in evs}
                if None in own:
                    rd.item(sorted(writers), evs[0][1]["api"], f"rank 0 of {a} alone saves the {state}, which the plan "
                            f"shards over {a}: whether it wrote its own shard or a copy gathered from every rank is "
                            "not observed", stacks[0])
                    return []
                if own == {False}:  # a gathered copy (consolidated, a full state dict): every shard written once
                    st.notes.append(f"rank 0 of {a} saves the {state} gathered from every rank (more elements than it "
                                    "holds), as the plan derives")
                    verb = None
            if verb:
                verbs.setdefault(verb, {}).setdefault(a, []).extend(stacks)
    for verb, axes in verbs.items():
        clash = [a for a in axes if a in verbs.get(OverrideVerb.SAVE_FROM if verb == OverrideVerb.SAVE_RANK0 else OverrideVerb.SAVE_RANK0, {})]
        if clash:  # one state written by rank 0 alone, another by every rank: no plan-wide statement says both
            rd.item(sorted(rd.recs), "the checkpoint's writers", f"along {clash[0]} one state is written by rank 0 "
                    "alone and another by every rank: the checkpoint statements name the writers of a group's "
                    "parameters and optimizer state together", next(iter(axes.values()))[0])
            return [x for x in out if "skip_optimizer" in x[0]]
    for verb, axes in verbs.items():
        what = ("rank 0 of each alone saves a state sharded there (the other shards are never written)"
                if verb == OverrideVerb.SAVE_RANK0 else "every rank saves a state replicated there (each replica written)")
        frames = _frames([s for a in axes for s in axes[a]], st.script)
        out.append((f"  override checkpoint: {verb} over ({', '.join(axes)})  # observed: {what}", frames))
    return out


def _loads(rd: _Reader, lost: set[str]) -> list[tuple[str, list]]:
    """Loads of another rank's file holding sharded states, and a ZeRO-1 resume that never loads the params."""
    st, out = rd.st, []
    foreign: dict[str, list] = {}  # axis -> load stacks of ranks reading rank 0's shards
    for r, evs in rd.recs.items():
        for e in evs:
            if e["op"] != "load":
                continue
            if e["file"] in rd.writers and e["api"].startswith(DCP):
                continue  # torch.distributed.checkpoint remaps every shard by its global offset, as derived
            if not e["file"] or e["file"] not in rd.writers:
                rd.item([r], e["api"], ("it reads no named file" if not e["file"] else "it reads a file no rank "
                        "wrote in the traced run") + ": what it restores and whose state it is are not observed",
                        _stack(e))
                continue
            owners = rd.writers[e["file"]]
            if r in owners:
                continue
            w = min(owners)
            axes, why = _foreign(rd, r, w, owners[w])
            if why:
                rd.item([r], e["api"], why, _stack(e))
            for a in axes:
                if a not in lost:
                    foreign.setdefault(a, []).append(_stack(e))
    if foreign:
        out.append((f"  override checkpoint: save_rank0 over ({', '.join(foreign)})  # observed: every rank loads "
                    "the file rank 0 of the axis wrote, its own shards, so only rank 0's shards survive the resume",
                    _frames([s for a in foreign for s in foreign[a]], st.script)))
    # the states a resume puts back: load_state_dict / set_state_dict, and torch.distributed.checkpoint's load
    # (in place, into the live state dict)
    loads = [(r, e) for r, evs in rd.recs.items() for e in evs if e["op"] == "load"]
    if loads:
        back = {s for evs in rd.recs.values() for e in evs if e["op"] == "restore"
                or (e["op"] == "load" and e["api"].startswith(DCP)) for s in e["states"]}
        saved = {s for evs in rd.recs.values() for e in evs if e["op"] == "save" for s in e["states"]}
        at = _frames([_stack(loads[0][1])], st.script)
        if "optimizer" in saved and "optimizer" not in back \
                and (st.step[st.observer].get("optimizer") or {}).get("state_bytes"):
            out.append(("  override checkpoint: skip_optimizer  # observed: the optimizer's state is saved but never "
                        "loaded back into the optimizer", at))
        if "params" not in back:
            zero1 = [a for a, b in rd.bindings.items() if b in ("zero1", "zero2")]
            if zero1 and "optimizer" in back:
                out.append(("  override checkpoint: no_regather_after_load  # observed: the optimizer state (sharded "
                            f"over {', '.join(zero1)}) is loaded back and the parameters never are", at))
            else:
                rd.item(sorted({r for r, _ in loads}), loads[0][1]["api"], "the script loads a checkpoint but never "
                        "puts the model's parameters back (no load_state_dict, set_state_dict or distributed "
                        "checkpoint load of them): not lifted", _stack(loads[0][1]))
    return out


def _foreign(rd: _Reader, r: int, w: int, saves: list[dict]) -> tuple[list[str], str]:
    """The axes along which rank ``r``, reading the file rank ``w`` saved, restores rank ``w``'s shards (``w``
    rank 0 of each), or why that is not lifted."""
    axes = []
    for state in sorted({s for x in saves for s in x["states"]} & set(STATES)):
        own = {_shard(x, state) for x in saves if state in x["states"]}
        for a in rd.layout.names:
            if rd.coord(r, a) == rd.coord(w, a) or rd.sharded(state, a) is False or own == {False}:
                continue  # a replica, or a copy gathered from every rank: rank w's file holds rank r's part
            if None in own:
                return [], (f"rank {r} restores the {state} from the file rank {w} wrote: whether that file holds "
                            f"rank {w}'s shard or a copy gathered from every rank is not observed")
            if rd.coord(w, a) != 0:
                return [], (f"rank {r} restores the {state} from the file rank {w} wrote (another rank along {a}, not "
                            "its rank 0): not lifted")
            axes.append(a)
    return list(dict.fromkeys(axes)), ""


def _rng(rd: _Reader, seed_vary: tuple[str, ...]) -> list[tuple[str, list]]:
    """Each RNG state set: whose state it is (by the checksum of the states the rank loaded)."""
    st, shared, out = rd.st, [], []
    for r, evs in rd.recs.items():
        for i, e in enumerate(evs):
            if e["op"] != "set_rng_state":
                continue
            want = (e.get("rng") or [None])[0]
            src = next((x for x in reversed(evs[:i]) if x["op"] == "load" and want in (x.get("rng") or ())), None)
            own = any(x["op"] == "save" and want in (x.get("rng") or ()) for x in evs[:i])
            if src is None or not src["file"] or src["file"] not in rd.writers:
                if not own:
                    rd.item([r], e["api"], "the RNG state set was loaded from no file a rank wrote in the traced run "
                            "(or computed): whose state it is is not observed", _stack(e))
                continue
            owners = rd.writers[src["file"]]
            if r in owners:
                continue
            w = min(owners)
            apart = [a for a in rd.layout.names if rd.coord(r, a) != rd.coord(w, a)]
            if set(apart) & set(seed_vary):
                shared.append(_stack(e))
            else:
                st.notes.append(f"rank {r} restores the RNG state rank {w} saved; they differ along "
                                f"{', '.join(apart)}, where the plan's dropout seed does not vary")
    if shared:
        out.append(("  override checkpoint: rng_shared  # observed: ranks restore the RNG state another rank saved, "
                    f"apart along {', '.join(seed_vary)} where the dropout seed varies", _frames(shared, st.script)))
    return out


def _fresh(rd: _Reader, shared: bool) -> list[tuple[str, list]]:
    """Ranks resuming from another RNG state than they held before the save, with no RNG state set after the load:
    ``rng_not_restored`` at the load, where the step draws dropout masks."""
    st = rd.st
    if not any(d.get("p") for part in st.ranks.values() for d in part.get("dropouts") or ()):
        return []  # no mask drawn: the generator's state changes nothing the plan models
    fresh: list[tuple] = []
    for r, evs in rd.recs.items():
        for i, e in enumerate(evs):
            last_save = max((j for j in range(i) if evs[j]["op"] == "save"), default=-1)
            if e["op"] != "load" or any(x["op"] == "load" for x in evs[last_save + 1:i]):
                continue  # the first load of a resume: the rest share its states
            before, after = e.get("rng_before"), e.get("rng_after")
            if before is None or after is None:
                missing = "before the save" if before is None else "after the load"
                rd.item([r], e["api"], f"the generators' state {missing} is not observed (torch.get_rng_state(): "
                        "no optimizer step or save before the load, or a trace without it): whether the load "
                        "restores the RNG state is not lifted", _stack(e))
                continue
            if before == after:
                continue
            nxt = next((j for j in range(i + 1, len(evs)) if evs[j]["op"] == "save"), len(evs))
            sets = [x.get("rng") or [None] for x in evs[i + 1:nxt] if x["op"] == "set_rng_state"]
            if sets:
                if not any(_theirs(rd, r, evs[:nxt], w) for ws in sets for w in ws):  # another rank's: read by _rng
                    rd.item([r], e["api"], "after the load the rank sets an RNG state other than the one it held "
                            "before the save, not another rank's saved state: whose it is is not observed", _stack(e))
                continue
            fresh.append((r, _stack(e)))
    if not fresh:
        return []
    if shared:
        rd.item(sorted(r for r, _ in fresh), "torch.set_rng_state", "some ranks restore another rank's RNG state "
                "and others none: one checkpoint RNG statement states one of the two", fresh[0][1])
        return []
    ranks = sorted({r for r, _ in fresh})
    return [("  override checkpoint: rng_not_restored  # observed: ranks "
             f"{ranks} resume from another RNG state than they held before the save and set none after the load "
             "(their generator left at the fresh process's seed), while the step draws dropout masks",
             _frames([s for _, s in fresh], st.script))]


def _theirs(rd: _Reader, r: int, evs: list[dict], state: str) -> bool:
    """Whether rank ``r`` loaded RNG state ``state`` from a file only other ranks wrote."""
    return any(x["op"] == "load" and state in (x.get("rng") or ()) and x["file"] in rd.writers
               and r not in rd.writers[x["file"]] for x in evs)
