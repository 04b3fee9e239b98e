"""What runs inside the rank processes of a measurement (every module here imports torch).

``worker`` is the process entry point (``python -m placement_logic.measure.ranks.worker``);
``torch_plan`` applies a realisation with PyTorch's own APIs (DDP/replicate, FSDP2, DTensor
tensor parallelism through ``tensor_parallel``, ZeRO-1/2 through ``flat_zero``,
torch.distributed.pipelining through ``pipeline``; ``common`` holds the optimizer and the
clipping step); ``counter`` records
the collectives; ``model`` is the tiny transformer; ``training`` what a rank and the
single-process reference share. The host side of ``measure`` imports none of them.
"""
