"""The bundled trainer with a collective desync patched in from outside (not through
FSDPMON_FAULT), run as torchrun's script: ``torchrun ... tests/desync_trainer.py <flags>``.

``OUTSIDE_DESYNC=rank=R,step=S``: in step S, rank R makes one extra ``all_reduce`` of one
float32 element before its forward, the way a collective under ``if rank == ...`` does; every
other rank goes on to the step's first FSDP all-gather. The trainer's step is wrapped by
monkeypatching, as a user's debugging hook would be.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for `trainer`

DESYNC = "OUTSIDE_DESYNC"


def patch_extra_all_reduce(rank: int, step: int) -> None:
    import torch
    import torch.distributed as dist

    from fsdpmon.trainer import loop

    accumulate = loop.Trainer.accumulate_gradients

    def desynced(self: Any, mon: Any) -> Any:
        if self.step + 1 == step and int(os.environ.get("RANK", "0")) == rank:
            dist.all_reduce(torch.zeros(1))  # the extra call: only this rank makes it
        return accumulate(self, mon)

    loop.Trainer.accumulate_gradients = desynced  # type: ignore[method-assign]


def main() -> None:
    spec = os.environ.get(DESYNC)
    if spec:
        where = {k: int(v) for k, v in (p.split("=", 1) for p in spec.split(","))}
        patch_extra_all_reduce(where["rank"], where["step"])
    from fsdpmon.trainer.parallel import exit_process
    from fsdpmon.trainer.train import main as train_main

    exit_process(train_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
