"""Trace a user's PyTorch training script and lift what it really did into a plan.

``recorder`` (torch) records, on every rank, the process groups, every collective in
issue order with the parameters it carried and the user's line that issued it, the
gradient program of every parameter (the reductions and constant scales between its
computation and the optimizer step), the loss normalisation and the optimizer's view of
each parameter; ``bootstrap`` (torch) runs the script under it; ``launch`` starts the
ranks as torchrun would and merges their traces; ``schema`` reads a trace file back;
``lift`` turns a trace into a ``.place`` spec, with every call it cannot lift reported.
"""
