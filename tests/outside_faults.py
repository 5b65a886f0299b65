"""Faults made from outside a library's loop: run an example under this shim.

    torchrun --nproc_per_node 2 tests/outside_faults.py examples/NAME.py --max-steps N

Lightning, Accelerate and the plain loops own their loops, so the trainer's injector
(trainer/faults.py) cannot reach them. The shim patches what every example shares instead, before
the example runs (``runpy``), with the one fault grammar (``FSDPMON_FAULT``):
- ``compute-slow:rank=R,factor=F``: the model's forward
  (``fsdpmon.trainer.model.Transformer.forward``, whatever wraps it) sleeps (F - 1) x the CPU
  time it took, as the trainer's fault does;
- ``hang:rank=R,where=data``: ``next()`` on a torch DataLoader iterator never returns (the frame
  ``hang_in_data_loader`` under ``__next__``, as the trainer's fault shows).
A fault acts once the file ``$FSDPMON_TEST_GATES/<kind>`` exists (the test opens each gate when
the earlier phase is over: conditions, not clocks); without FSDPMON_TEST_GATES, from the start.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

import torch.utils.data.dataloader as dataloader

from fsdpmon import faultspec as fs
from fsdpmon.trainer import model as llama

RANK = int(os.environ.get("RANK", "0"))
GATES = os.environ.get("FSDPMON_TEST_GATES")


class Gate:
    """Open once ``GATES/kind`` exists (then it stays open without looking again)."""

    def __init__(self, kind: str) -> None:
        self.path = Path(GATES, kind) if GATES else None
        self.opened = self.path is None

    def __bool__(self) -> bool:
        if not self.opened and self.path is not None and self.path.exists():
            self.opened = True
        return self.opened


def hang_in_data_loader() -> None:
    """Never returns: a loader stuck on its input (the frame a stack dump should show)."""
    while True:
        time.sleep(1.0)


def slow_forward(factor: float) -> None:
    forward, gate = llama.Transformer.forward, Gate("compute-slow")

    def slowed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        began = time.process_time()
        out = forward(self, *args, **kwargs)
        if gate:
            time.sleep((factor - 1.0) * (time.process_time() - began))
        return out

    llama.Transformer.forward = slowed


def hang_loader() -> None:
    next_batch, gate = dataloader._BaseDataLoaderIter.__next__, Gate("hang")

    def __next__(self):  # type: ignore[no-untyped-def]  (named so: the frame a dump shows)
        if gate:
            hang_in_data_loader()
        return next_batch(self)

    dataloader._BaseDataLoaderIter.__next__ = __next__


def main() -> None:
    for fault in fs.parse(os.environ.get(fs.ENV_VAR)):
        if getattr(fault, "rank", None) != RANK:
            continue
        if isinstance(fault, fs.ComputeSlow):
            slow_forward(fault.factor)
        elif isinstance(fault, fs.Hang) and fault.where == "data":
            hang_loader()
        else:
            raise SystemExit(f"outside_faults: {fs.describe(fault)} is not made from outside")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
