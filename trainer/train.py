"""Entry point: ``torchrun --nproc_per_node N -m fsdpmon.trainer.train [flags]`` (see ``--help``).

The flags are read and checked before torch is imported (``fsdpmon.trainer.config`` imports no
torch): a mistyped flag, a missing data file or an unwritable log path fails in a fraction of a
second, on every rank alike, not after each rank's seconds of ``import torch``. Errors a user can
cause end as one line via ``guarded``. The loop is ``fsdpmon.trainer.loop``.
"""

from __future__ import annotations

import sys

from fsdpmon.errors import guarded
from fsdpmon.trainer.config import TrainConfig, parse_config


def _train(cfg: TrainConfig) -> int:
    from fsdpmon.trainer.loop import train  # torch, once the flags are known good

    return train(cfg)


def main(argv: list[str] | None = None) -> int:
    return guarded(lambda: _train(parse_config(argv)), prog="trainer")


if __name__ == "__main__":
    code = main()
    if "fsdpmon.trainer.parallel" not in sys.modules:  # never trained: nothing of torch to skip
        raise SystemExit(code)
    from fsdpmon.trainer.parallel import exit_process

    exit_process(code)
