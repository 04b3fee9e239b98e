"""A vocabulary-parallel output layer (DTensor: the head ColwiseParallel, its logits Shard(-1), the cross-entropy
under ``loss_parallel``) whose loss adds a term computed by hand from each tensor rank's vocabulary slice.

Default (bug): PaLM's z-loss, 1e-2 · lse², with each rank's log-sum-exp taken over its own slice
(``logsumexp`` of the tensor ``to_local()`` returns), never all-reduced: the z-loss and its gradient are wrong
on every rank (NVIDIA/TransformerEngine#2707 takes the z-loss's lse from the all-reduced max and sum of
exponentials instead; pytorch/pytorch#190746: other consumers of the sharded logits get wrong gradients).
Lifted as ``logit_z_loss = true`` and ``override activations[loss]: reduce_zloss over ()``, refuted
(``GI activations[loss]``) at the term's line. ``--fixed``: the log-sum-exp from the max all-reduced with MAX and
the sum of exponentials all-reduced over the tensor ranks: ``reduce_zloss over (tp)``, proved.

``--smoothing`` (bug): label smoothing by hand, (1 − 0.1) · CE + 0.1 · (lse − mean logit), the mean logit taken
over the rank's slice (NVIDIA/Megatron-LM#737: ``log_probs.mean(dim=-1)`` of the vocabulary-parallel log-probs):
``override activations[loss]: reduce_smoothing over ()``, refuted. ``--smoothing --fixed``: the slice's sum of
the logits all-reduced, divided by the whole vocabulary: proved.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tensor_ranks import ReduceFromTensorRanks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

FIXED = "--fixed" in sys.argv
SMOOTHING = "--smoothing" in sys.argv
VOCAB, HIDDEN, TOKENS = 32, 16, 8
ALPHA, BETA = 0.1, 1e-2


def whole_lse(local):
    """The log-sum-exp over the whole vocabulary from each rank's slice of the logits."""
    m = local.detach().max(-1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    return m + ReduceFromTensorRanks.apply((local - m[:, None]).exp().sum(-1)).log()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, x):
        return self.head(torch.tanh(self.embed(x)))


dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
model = parallelize_module(Model(), mesh, {"head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    g = torch.Generator().manual_seed(step)  # the same batch on every tensor rank
    x, y = torch.randint(0, VOCAB, (TOKENS,), generator=g), torch.randint(0, VOCAB, (TOKENS,), generator=g)
    logits = model(x)
    local = logits.to_local()  # this rank's vocabulary slice
    with loss_parallel():
        ce = F.cross_entropy(logits, y).to_local()
        if SMOOTHING:
            mean_logit = ReduceFromTensorRanks.apply(local.sum(-1)) / VOCAB if FIXED else local.mean(-1)
            loss = (1 - ALPHA) * ce + ALPHA * (whole_lse(local) - mean_logit).mean()
        else:
            lse = whole_lse(local) if FIXED else local.logsumexp(-1)
            loss = ce + BETA * lse.pow(2).mean()
        loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
