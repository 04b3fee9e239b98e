"""How a measurement rank ends (torch).

``finish`` is called by a rank once every result it owes is written: a barrier (so no rank
tears its connections down while another still exchanges with it), then a marker file
``done.<rank>`` that says the rank's results are complete, then the process group destroyed and
the interpreter left at once with ``os._exit(0)``. Interpreter teardown is skipped on purpose:
gloo's background threads destroyed during it can abort the process ("terminate called
without an active exception") after every result was written. The launcher reads the markers:
a rank that exits abnormally *after* every rank wrote its marker lost nothing, and its results
stand (``runner.collect_status``); a rank that dies before is a failed run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def finish(outdir: str, rank: int) -> None:
    import torch.distributed as dist

    dist.barrier()
    Path(outdir, f"done.{rank}").write_text("")
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
