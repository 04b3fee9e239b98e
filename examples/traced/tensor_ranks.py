"""Megatron-LM's reduce-from-tensor-model-parallel region written by hand, shared by the traced
tensor-parallel examples: the tensor ranks' partial values summed in forward (one all-reduce over
the default process group), the gradient passed through unchanged in backward.
"""

import torch
import torch.distributed as dist


class ReduceFromTensorRanks(torch.autograd.Function):
    """Sum the tensor ranks' partial values in forward; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class CopyToTensorRanks(torch.autograd.Function):
    """The identity in forward; the input gradient all-reduced over the tensor ranks in backward (Megatron's
    copy-to-tensor-model-parallel region, before a column-parallel linear)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad
