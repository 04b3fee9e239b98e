"""A concrete simulator of the activations and activation gradients of a tensor-parallel layer
region, written from docs/semantics.md ("Activations and their gradients") without the checker's
code (it imports nothing from ``placement_logic.check`` or ``placement_logic.ir.actflow``).

Every device of the mesh holds real matrices of exact fractions: its samples (one per coordinate of
the non-tensor axes), its column block of the column-parallel weight A and its row block of the
row-parallel weight B (the head: its column block of the vocabulary weight). The collectives the
plan states run over the real device groups (every device that agrees with this one off the
collective's axes, in mesh order): an all-reduce sums the matrices, an all-gather stacks their rows,
a reduce-scatter sums and keeps the device's block of rows. A device whose matrices do not fit a
collective or a product holds nothing (None). Each device's forward output and input gradient is
compared with the single-device region's.

A declared type (``assert_*``; ``activation_grads[r]: assert_output_*`` for the output gradient, read
whole by the row-parallel linear's backward and the embedding's weight gradient) is redistributed to
the type needed there as DTensor does: Partial by a sum, Shard by a gather, Replicate to Shard by a
chunk, an equal type by nothing; what the device really holds is what gets summed or gathered.

The vocabulary-parallel embedding: a table E of per·n words (rows), rows [r·per, (r+1)·per) on
tensor rank r; each sample is a sequence of token ids, whole on every tensor rank. Forward: each
rank looks up the tokens of its rows (a zero row for the others), then the collectives after it.
Backward: the output gradient (the device's sequence block under sequence parallelism) through the
collectives before the weight gradient, then rank r's gradient of its rows: the sum of the output
gradient's rows over the positions holding each of its words (an output gradient without one row
per position does not fit). The embedding's ``("grad", "embedding")`` is its weight gradient.

The vocabulary-parallel cross entropy (``loss``): each device holds, per token of its samples,
the integer logits of its vocabulary block; it takes its local max logit, runs the stated all-reduce
MAX passes (``activations[loss]: reduce_max``), subtracts, and all-reduces (sum) the shifted target
logit (zero on a device whose block lacks the target; ``reduce_target``) and the sum of base-2
exponentials (``reduce_sumexp``), each derived over the tensor axes. Its ``("act", "loss")`` compares
2^loss = S·2^-t per token with the single-device value (base 2 keeps every number a fraction), its
``("grad", "loss")`` the device's softmax-minus-one-hot entries.

The MoE layer (``experts``): every device holds one token per block, a block for every mesh
coordinate c (its value unique over the mesh), bound for the expert given by c's coordinates on the
expert axes; a device's local expert is given by its own coordinates there, and expert j multiplies
by j + 2 (times 2s + 1 on pipeline stage s, whose layers are others). An all-to-all over axes G
sends the device's block c to the device whose G-coordinates are c's, into the block named by the sender's G-coordinates (all_to_all_single over equal chunks). The
forward runs the dispatch all-to-alls, the local expert and the combine all-to-alls, the backward
combine's conjugates, the expert, dispatch's conjugates, each derived over the expert axes and
replaced by ``activations[experts]`` / ``activation_grads[experts]: dispatch | combine over (AXES)``;
every block is compared with its token times the single-device expert's factor.

``violations(plan, sizes)`` returns ``("act", region)`` (the forward output is wrong on some
device) and ``("grad", region)`` (the input gradient is).
"""

from __future__ import annotations

from fractions import Fraction
from itertools import product
from math import lcm
from operator import mul

from placement_logic import ir

REGIONS = ("attention", "mlp", "head", "embedding", "loss")
Mat = list[list[Fraction]] | None


def _scaled(m: list) -> tuple[int, list[list[int]]]:
    """A matrix of fractions as L and the integer matrix L·m (L the least common denominator)."""
    den = lcm(*(v.denominator for r in m for v in r))
    return den, [[v.numerator * (den // v.denominator) for v in r] for r in m]


def _mm(x: Mat, y: Mat) -> Mat:
    """The exact product, summed in integers over the two matrices' common denominators (Fraction
    arithmetic per term is most of the simulator's time)."""
    if x is None or y is None or not x or len(x[0]) != len(y):
        return None
    (dx, xi), (dy, yi) = _scaled(x), _scaled(_t(y))
    return [[Fraction(sum(map(mul, r, c)), dx * dy) for c in yi] for r in xi]


def _t(x: Mat) -> Mat:
    return None if x is None else [list(c) for c in zip(*x)]


def _cols(x: list, lo: int, hi: int) -> list:
    return [r[lo:hi] for r in x]


class Mesh:
    def __init__(self, plan: ir.Plan, sizes: dict[str, int]):
        self.names = plan.mesh.names
        self.sizes = sizes
        # the tensor axes that split the layers: on one whose params are whole (R) every rank runs the whole layer
        # (docs/semantics.md, "Activations and their gradients"), so it is an axis like any other there
        split = (ir.Mode.S, ir.Mode.S_STAR, ir.Mode.O)
        self.tensor = [a for a in self.names if plan.role(a) in (ir.Role.TENSOR, ir.Role.SEQUENCE)
                       and plan.placement(ir.State.PARAMS).mode(a) in split]
        self.devices = [dict(zip(self.names, c)) for c in product(*(range(sizes[a]) for a in self.names))]

    def key(self, d: dict) -> tuple:
        return tuple(d[a] for a in self.names)

    def group(self, d: dict, axes: tuple[str, ...]) -> list[tuple]:
        """The devices of d's group over axes, in mesh (row-major) order."""
        ax = [a for a in self.names if a in axes]
        return [self.key({**d, **dict(zip(ax, c))}) for c in product(*(range(self.sizes[a]) for a in ax))]

    def tp(self, d: dict) -> tuple[int, int]:
        """(the device's tensor rank, the tensor group's size) over every tensor axis together."""
        r, n = 0, 1
        for a in self.tensor:
            r, n = r * self.sizes[a] + d[a], n * self.sizes[a]
        return r, n

    def sample(self, d: dict) -> int:
        s = 0
        for a in self.names:
            if a not in self.tensor:
                s = s * self.sizes[a] + d[a]
        return s


def collective(mesh: Mesh, kind: str, axes: tuple[str, ...], vals: dict) -> dict:
    out = {}
    for d in mesh.devices:
        grp = mesh.group(d, axes)
        mine = grp.index(mesh.key(d))
        ms = [vals[k] for k in grp]
        if kind == "copy" or len(grp) == 1:
            out[mesh.key(d)] = vals[mesh.key(d)]
            continue
        if any(m is None for m in ms):
            out[mesh.key(d)] = None
            continue
        if kind == "gather":
            out[mesh.key(d)] = [row for m in ms for row in m]
            continue
        if kind == "chunk":
            m = ms[mine]
            k, rem = divmod(len(m), len(grp))
            out[mesh.key(d)] = None if rem else m[mine * k:(mine + 1) * k]
            continue
        if len({(len(m), len(m[0])) for m in ms}) != 1:
            out[mesh.key(d)] = None
            continue
        total = [[sum(c, Fraction(0)) for c in zip(*rows)] for rows in zip(*ms)]
        if kind == "sum":
            out[mesh.key(d)] = total
        else:  # "sum_scatter"
            k, rem = divmod(len(total), len(grp))
            out[mesh.key(d)] = None if rem else total[mine * k:(mine + 1) * k]
    return out


def _stated(plan: ir.Plan, target: str, region: str, verbs: tuple[str, ...]):
    found = None
    for o in plan.overrides:
        if o.target == target and o.group in (None, region) and o.verb in verbs:
            found = o
    return found


def _ops(plan: ir.Plan, mesh: Mesh, region: str, where: str) -> list[tuple[str, tuple[str, ...]]]:
    """The collectives at one point of the region, as docs/semantics.md's table and the overrides say."""
    sp = plan.sequence_parallel or bool(plan.axes_with_role(ir.Role.SEQUENCE))
    t = tuple(mesh.tensor)
    reduce_kind = "sum_scatter" if sp else "sum"
    need = "S" if sp else "R"
    if where == "entry":
        o = _stated(plan, "activations", region, ("gather",))
        return _per_pass("gather", o.axes) if o else ([("gather", t)] if sp else [])
    if where == "exit":
        o = _stated(plan, "activations", region, ("reduce", "assert_replicate", "assert_partial", "assert_shard"))
        if o is None:
            return [(reduce_kind, t)]
        if o.verb == "reduce":
            return _per_pass(reduce_kind, o.axes)
        return _redistribute(o.verb, need, o.axes)
    if where == "grad_exit":
        o = _stated(plan, "activation_grads", region, ("gather",) + tuple(OUTPUT_DECLARED))
        if o is not None and o.verb in OUTPUT_DECLARED:  # declared, redistributed to the whole gradient
            return _redistribute(o.verb, "R", o.axes)
        return _per_pass("gather", o.axes) if o else ([("gather", t)] if sp else [])
    o = _stated(plan, "activation_grads", region,
                ("reduce", "no_reduce", "reduce_copy", "assert_replicate", "assert_partial", "assert_shard"))
    if o is None:
        return [(reduce_kind, t)]
    if o.verb == "reduce":
        return _per_pass(reduce_kind, o.axes)
    if o.verb == "no_reduce":
        return []
    if o.verb == "reduce_copy":
        return [("copy", t)]
    return _redistribute(o.verb, need, o.axes)


def _per_pass(kind: str, axes) -> list:
    out, cur = [], []
    for a in axes:
        if a in cur:
            out.append((kind, tuple(cur)))
            cur = []
        cur.append(a)
    return out + ([(kind, tuple(cur))] if cur else [])


# the output gradient's declared type (to_local's grad_placements), before the row-parallel linear's backward
OUTPUT_DECLARED = {"assert_output_replicate": "R", "assert_output_partial": "P", "assert_output_shard": "S"}


def _redistribute(verb: str, need: str, axes) -> list:
    declared = {"assert_replicate": "R", "assert_partial": "P", "assert_shard": "S", **OUTPUT_DECLARED}[verb]
    kind = {("P", "R"): "sum", ("S", "R"): "gather", ("P", "S"): "sum_scatter", ("R", "S"): "chunk"}.get(
        (declared, need))
    return [(kind, tuple(a for a in axes))] if kind else []


def _apply(mesh: Mesh, ops, vals: dict) -> dict:
    for kind, axes in ops:
        vals = collective(mesh, kind, axes, vals)
    return vals


def _matrix(rows: int, cols: int, seed: int) -> list[list[Fraction]]:
    return [[Fraction((seed * 31 + i * 7 + j * 13) % 17 + 1, 1 + (i + j) % 3) for j in range(cols)]
            for i in range(rows)]


def _rows(m: list, r: int, n: int) -> list:
    k = len(m) // n
    return m[r * k:(r + 1) * k]


def embedding_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    mesh = Mesh(plan, sizes)
    sp = plan.sequence_parallel or bool(plan.axes_with_role(ir.Role.SEQUENCE))
    n = mesh.tp(mesh.devices[0])[1]
    seq, hid, per = 2 * n, 2, 2
    E = _matrix(per * n, hid, 3)
    found = set()
    fwd, want_f, bwd, want_b = {}, {}, {}, {}
    for d in mesh.devices:
        r, _ = mesh.tp(d)
        s = mesh.sample(d)
        toks = [(5 * i + 3 * s + 1) % (per * n) for i in range(seq)]
        mine = range(r * per, (r + 1) * per)
        k = mesh.key(d)
        fwd[k] = [list(E[w]) if w in mine else [Fraction(0)] * hid for w in toks]
        full = [list(E[w]) for w in toks]
        want_f[k] = _rows(full, r, n) if sp else full
        G = _matrix(seq, hid, 70 + s)
        bwd[k] = (_rows(G, r, n) if sp else G, toks)
        want_b[k] = [[sum((G[i][j] for i in range(seq) if toks[i] == w), Fraction(0)) for j in range(hid)]
                     for w in mine]
    h = _apply(mesh, _ops(plan, mesh, "embedding", "exit"), fwd)
    if any(h[k] != want_f[k] for k in h):
        found.add(("act", "embedding"))
    g = _apply(mesh, _ops(plan, mesh, "embedding", "grad_exit"), {k: v[0] for k, v in bwd.items()})
    for d in mesh.devices:
        k = mesh.key(d)
        r, _ = mesh.tp(d)
        toks, v = bwd[k][1], g[k]
        if v is None or len(v) != len(toks):
            dW = None
        else:
            dW = [[sum((v[i][j] for i in range(len(toks)) if toks[i] == w), Fraction(0)) for j in range(hid)]
                  for w in range(r * per, (r + 1) * per)]
        if dW != want_b[k]:
            found.add(("grad", "embedding"))
    return found


def loss_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    mesh = Mesh(plan, sizes)
    n = mesh.tp(mesh.devices[0])[1]
    seq, per = 2, 2
    V = per * n
    t_axes = tuple(mesh.tensor)

    def passes(verb):
        o = _stated(plan, "activations", "loss", (verb,))
        return _per_pass("x", o.axes) if o else [("x", t_axes)]

    def reduce(vals, verb, op):
        for _, axes in passes(verb):
            out = {}
            for d in mesh.devices:
                grp = mesh.group(d, axes)
                out[mesh.key(d)] = [op(col) for col in zip(*(vals[k] for k in grp))]
            vals = out
        return vals

    logits, target = {}, {}
    for d in mesh.devices:
        s = mesh.sample(d)
        logits[mesh.key(d)] = [[(3 * i + 5 * w + 7 * s) % 7 - 3 for w in range(V)] for i in range(seq)]
        target[mesh.key(d)] = [(i + 2 * s) % V for i in range(seq)]
    block = {mesh.key(d): range(mesh.tp(d)[0] * per, (mesh.tp(d)[0] + 1) * per) for d in mesh.devices}
    two = Fraction(2)
    m = reduce({k: [max(z[i][w] for w in block[k]) for i in range(seq)] for k, z in logits.items()}, "reduce_max", max)
    t = reduce({k: [z[i][target[k][i]] - m[k][i] if target[k][i] in block[k] else 0 for i in range(seq)]
                for k, z in logits.items()}, "reduce_target", sum)
    S = reduce({k: [sum((two ** (z[i][w] - m[k][i]) for w in block[k]), Fraction(0)) for i in range(seq)]
                for k, z in logits.items()}, "reduce_sumexp", sum)
    found = set()
    for k, z in logits.items():
        full = [sum((two ** v for v in z[i]), Fraction(0)) for i in range(seq)]
        if any(S[k][i] * two ** -t[k][i] != full[i] * two ** -z[i][target[k][i]] for i in range(seq)):
            found.add(("act", "loss"))
        for i in range(seq):
            hot = [1 if w == target[k][i] else 0 for w in block[k]]
            got = [two ** (z[i][w] - m[k][i]) / S[k][i] - h for w, h in zip(block[k], hot)]
            want = [two ** z[i][w] / full[i] - h for w, h in zip(block[k], hot)]
            if got != want:
                found.add(("grad", "loss"))
    return found


def region_violations(plan: ir.Plan, sizes: dict[str, int], region: str) -> set:
    if region == "loss":
        return loss_violations(plan, sizes)
    if region == "embedding":
        return embedding_violations(plan, sizes)
    mesh = Mesh(plan, sizes)
    sp = plan.sequence_parallel or bool(plan.axes_with_role(ir.Role.SEQUENCE))
    n = mesh.tp(mesh.devices[0])[1]
    seq, hid, per = 2 * n, 2, 2
    A = _matrix(hid, per * n, 1)  # column-parallel: columns [r·per, (r+1)·per) on tensor rank r
    B = _matrix(per * n, hid, 2)  # row-parallel: rows [r·per, (r+1)·per) on tensor rank r
    found = set()
    fwd_in, bwd_in, want_f, want_b = {}, {}, {}, {}
    for d in mesh.devices:
        r, _ = mesh.tp(d)
        s = mesh.sample(d)
        X, G = _matrix(seq, hid, 10 + s), _matrix(seq, per * n if region == "head" else hid, 50 + s)
        if region == "head":
            Y = _cols(_mm(X, A), r * per, (r + 1) * per)  # this rank's logits
            dX = _mm(G, _t(A))
            bwd_in[mesh.key(d)] = _cols(G, r * per, (r + 1) * per)
        else:
            Y, dX = _mm(_mm(X, A), B), _mm(_mm(G, _t(B)), _t(A))
            bwd_in[mesh.key(d)] = _rows(G, r, n) if sp else G
            Y = _rows(Y, r, n) if sp else Y
        fwd_in[mesh.key(d)] = _rows(X, r, n) if sp else X
        want_f[mesh.key(d)] = Y
        want_b[mesh.key(d)] = _rows(dX, r, n) if sp else dX

    def local(vals, fn):
        return {mesh.key(d): fn(vals[mesh.key(d)], *mesh.tp(d)) for d in mesh.devices}

    a_blk = lambda r: _cols(A, r * per, (r + 1) * per)  # noqa: E731
    b_blk = lambda r: B[r * per:(r + 1) * per]  # noqa: E731
    h = _apply(mesh, _ops(plan, mesh, region, "entry"), fwd_in)
    h = local(h, lambda v, r, _n: _mm(v, a_blk(r)))
    if region != "head":
        h = local(h, lambda v, r, _n: _mm(v, b_blk(r)))
        h = _apply(mesh, _ops(plan, mesh, region, "exit"), h)
    if any(h[k] != want_f[k] for k in h):
        found.add(("act", region))
    g = bwd_in
    if region != "head":
        g = _apply(mesh, _ops(plan, mesh, region, "grad_exit"), g)
        g = local(g, lambda v, r, _n: _mm(v, _t(b_blk(r))))
    g = local(g, lambda v, r, _n: _mm(v, _t(a_blk(r))))
    g = _apply(mesh, _ops(plan, mesh, region, "grad_entry"), g)
    if any(g[k] != want_b[k] for k in g):
        found.add(("grad", region))
    return found


def _all_to_all(mesh: Mesh, axes: tuple[str, ...], bufs: dict) -> dict:
    out: dict = {k: {} for k in bufs}
    g = [i for i, a in enumerate(mesh.names) if a in axes]
    for d, buf in bufs.items():
        for c, v in buf.items():
            dest, slot = list(d), list(c)
            for i in g:
                dest[i], slot[i] = c[i], d[i]
            out[tuple(dest)][tuple(slot)] = v
    return out


def experts_violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    names = plan.mesh.names
    experts = [i for i, a in enumerate(names) if plan.role(a) is ir.Role.EXPERT]
    if not experts:
        return set()
    mesh = Mesh(plan, sizes)
    keys = [mesh.key(d) for d in mesh.devices]

    def expert(c: tuple) -> int:
        j = 0
        for i in experts:
            j = j * sizes[names[i]] + c[i]
        return j

    def stage(c: tuple) -> int:  # the layers of a pipeline stage: their experts are other experts
        j = 0
        for i, a in enumerate(names):
            if plan.role(a) is ir.Role.PIPELINE:
                j = j * sizes[a] + c[i]
        return 2 * j + 1

    derived = tuple(names[i] for i in experts)
    found = set()
    for tag, target, order in (("act", "activations", ("dispatch", "combine")),
                               ("grad", "activation_grads", ("combine", "dispatch"))):
        def passes(verb, target=target):
            o = _stated(plan, target, "experts", (verb,))
            return _per_pass("a2a", derived if o is None else tuple(o.axes or ()))
        x = {d: {c: Fraction(1000 * (len(keys) * n + m) + 1) for m, c in enumerate(keys)} for n, d in enumerate(keys)}
        bufs = x
        for _, axes in passes(order[0]):
            bufs = _all_to_all(mesh, axes, bufs)
        bufs = {d: {c: v * (expert(d) + 2) * stage(d) for c, v in buf.items()} for d, buf in bufs.items()}
        for _, axes in passes(order[1]):
            bufs = _all_to_all(mesh, axes, bufs)
        if any(bufs[d][c] != x[d][c] * (expert(c) + 2) * stage(d) for d in keys for c in keys):
            found.add((tag, "experts"))
    return found


def violations(plan: ir.Plan, sizes: dict[str, int]) -> set:
    found = experts_violations(plan, sizes)
    if not Mesh(plan, {a: 1 for a in plan.mesh.names}).tensor:
        return found  # no tensor axis splits the layers: every rank runs them whole
    return found.union(*(region_violations(plan, sizes, r) for r in REGIONS))
