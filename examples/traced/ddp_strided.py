"""Bug: DistributedDataParallel handed a strided process group for its gradient sync, modelled on FastMoE's
"perpendicular communicator" (laekov/fastmoe#105, built in laekov/fastmoe#106 as
``[j + group_size * i for i in range(group_size)]``: one rank per node): the groups {0, 2} and {1, 3} each average
their own two ranks' gradients, where the whole data axis is meant, so the two groups drift apart. Lifted as
`override grads: reduce_strided over (dp) by 2` at the gradient sync and refuted (`GI grads blocks`). Run on 4 ranks
(`--nproc 4`).

``--whole`` (the fix): DDP over every rank (the default group), proved.
"""

import sys

import tiny
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

WHOLE = "--whole" in sys.argv
GROUP_SIZE = 2  # ranks per node

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
members = [[j + GROUP_SIZE * i for i in range(world // GROUP_SIZE)] for j in range(GROUP_SIZE)]
groups = [dist.new_group(m) for m in members]  # every rank creates every group, in one order
perpendicular = next(g for g, m in zip(groups, members) if rank in m)
model = DDP(tiny.build(), process_group=dist.group.WORLD if WHOLE else perpendicular)  # the bug: one rank per node
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    x, y = tiny.batch(rank, step)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
