"""The one reading of the launcher's environment: which rank this process is, and of how many.

torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and
``TORCHELASTIC_RESTART_COUNT`` for every worker. The Kubeflow training operator sets the same
per pod, or ``PET_NPROC_PER_NODE`` for torchrun to read, so a pod it launches without torchrun
still knows its node's size. A plain process (no launcher) is rank 0 of 1.

Defaults, the one documented set (an unset or empty variable takes its default):

==============================  =================================================
``RANK``                        0
``LOCAL_RANK``                  0
``WORLD_SIZE``                  1
``LOCAL_WORLD_SIZE``            ``PET_NPROC_PER_NODE``, else ``WORLD_SIZE`` (one node)
``TORCHELASTIC_RESTART_COUNT``  0
==============================  =================================================

A variable that is set but not an integer raises ConfigError naming it: the trainer fails at
start with that line; the in-trainer monitor, which must not stop training, logs it and keeps
rank 0 of 1. Bottom layer: imports only fsdpmon.errors (no torch), so the trainer, the monitor
and tests share it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from fsdpmon.errors import ConfigError


def env_int(environ: Mapping[str, str], *names: str, default: int) -> int:
    """The first of ``names`` that is set and not empty, as an integer; else ``default``."""
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ConfigError(name, f"must be an integer, got {value!r}") from None
    return default


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    restart_count: int = 0

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        env = os.environ if environ is None else environ
        world = env_int(env, "WORLD_SIZE", default=1)
        return cls(
            rank=env_int(env, "RANK", default=0),
            local_rank=env_int(env, "LOCAL_RANK", default=0),
            world_size=world,
            local_world_size=env_int(env, "LOCAL_WORLD_SIZE", "PET_NPROC_PER_NODE",
                                     default=world),
            restart_count=env_int(env, "TORCHELASTIC_RESTART_COUNT", default=0),
        )
