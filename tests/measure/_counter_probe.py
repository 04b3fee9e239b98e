"""A two-rank probe of CollectiveCounter: known collectives in, their records out (JSON).

Run as ``python _counter_probe.py OUTDIR RANK WORLD PORT`` by tests/measure/test_counter.py.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from placement_logic.measure.ranks.counter import CollectiveCounter

outdir, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
counter = CollectiveCounter()
with counter:
    dist.all_reduce(torch.ones(1000, dtype=torch.float32))
    out = torch.empty(2 * 500, dtype=torch.float32)
    dist.all_gather_into_tensor(out, torch.ones(500, dtype=torch.float32))
    dist.reduce_scatter_tensor(torch.empty(250, dtype=torch.float32), torch.ones(500, dtype=torch.float32))
    dist.broadcast(torch.ones(10, dtype=torch.float64), src=0)
    from torch.distributed._functional_collectives import all_reduce as funcol_all_reduce

    funcol_all_reduce(torch.ones(300, dtype=torch.float32), "sum", dist.group.WORLD).wait()
    # point to point: blocking, non-blocking and batched, rank 0 -> 1 then 1 -> 0
    peer = 1 - rank
    if rank == 0:
        dist.send(torch.ones(100, dtype=torch.float32), dst=1)
    else:
        dist.recv(torch.empty(100, dtype=torch.float32), src=0)
    work = (dist.isend(torch.ones(7, dtype=torch.float64), dst=peer) if rank == 1
            else dist.irecv(torch.empty(7, dtype=torch.float64), src=peer))
    work.wait()
    tagged = torch.ones(20, dtype=torch.float32)
    counter.tags[tagged.data_ptr()] = "backward"
    ops = [dist.P2POp(dist.isend, tagged, peer), dist.P2POp(dist.irecv, torch.empty(20, dtype=torch.float32), peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
Path(outdir, f"{rank}.json").write_text(json.dumps([r.__dict__ for r in counter.records]))
# an op of the collective namespaces the counter cannot size: it still runs, then check() refuses
unknown = CollectiveCounter()
with unknown:
    dist.reduce(torch.ones(3), dst=0)
try:
    unknown.check()
    refusal = ""
except Exception as exc:  # UnknownCollective
    refusal = f"{type(exc).__name__}: {exc}"
Path(outdir, f"{rank}.refusal").write_text(refusal)
# the reduce's sender may still hold its send when the group is destroyed, and gloo's threads
# may still be joinable at interpreter teardown: either aborts the process at exit ("terminate
# called without an active exception"). Everything is written: leave without the teardown.
dist.barrier()
os._exit(0)
