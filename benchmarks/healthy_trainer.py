"""The bundled trainer with the pauses a healthy job makes, patched in from outside, run as
torchrun's script by ``bench_page.py --healthy-scenario`` (issue 49: none of them may page).

``HEALTHY_PAUSES=first=60,pace=0.2,eval_every=700,eval=30,export_every=450,export=20``:
- ``first``: every rank spends this many seconds more in its first step (a compile, a warm-up);
- ``pace``: seconds every rank sleeps in each step's data phase (a loader; keeps the CPU free);
- every ``eval_every`` steps, an evaluation pass of ``eval`` seconds on every rank in which no
  rank calls a collective (not wrapped in a monitor phase: a user's loop need not say so);
- every ``export_every`` steps, rank 0 alone works ``export`` seconds between steps while the
  others wait for it in a barrier (a rank-0-only export or upload).
Saves are slowed from outside too, by the LD_PRELOAD shim tests/slow_writes.c (the bench sets
it up). Each pause is printed with its start time, for the bench to count.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for `trainer`

PAUSES = "HEALTHY_PAUSES"


def _spec(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (part.split("=", 1) for part in text.split(","))}


def _said(what: str, step: int, seconds: float | None = None) -> None:
    took = "" if seconds is None else f" took {seconds:.1f}"
    print(f"healthy-pause {what} step {step} at {time.time():.3f}{took}", flush=True)


def patch(spec: dict[str, float]) -> None:
    import torch.distributed as dist

    from fsdpmon.trainer import loop

    rank = int(os.environ.get("RANK", "0"))
    train_step, run_loader = loop.Trainer.train_step, loop.Trainer.accumulate_gradients
    save = loop.Trainer.save

    def paced(self: Any, mon: Any) -> Any:
        with mon.phase("data"):
            time.sleep(spec.get("pace", 0.0))
        if self.step == 0 and spec.get("first"):
            _said("first", 1)
            time.sleep(spec["first"])
        return run_loader(self, mon)

    def stepped(self: Any, mon: Any) -> None:
        train_step(self, mon)
        step = self.step
        if spec.get("eval_every") and step % int(spec["eval_every"]) == 0:
            _said("eval", step)
            time.sleep(spec["eval"])  # every rank; no collective
        if spec.get("export_every") and step % int(spec["export_every"]) == 0:
            if rank == 0:
                _said("export", step)
                time.sleep(spec["export"])
            dist.barrier()

    def timed(self: Any, mon: Any) -> None:
        begun = time.monotonic()
        save(self, mon)
        if rank == 0 and self.checkpointer is not None:
            _said("save", self.step, time.monotonic() - begun)

    loop.Trainer.save = timed  # type: ignore[method-assign]
    loop.Trainer.accumulate_gradients = paced  # type: ignore[method-assign]
    loop.Trainer.train_step = stepped  # type: ignore[method-assign]


def main() -> None:
    spec = os.environ.get(PAUSES)
    if spec:
        patch(_spec(spec))
    from fsdpmon.trainer.parallel import exit_process
    from fsdpmon.trainer.train import main as train_main

    exit_process(train_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
