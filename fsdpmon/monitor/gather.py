"""The one small collective per log interval: every rank's figures to every rank.

All ranks must call ``gather`` at the same log steps, whatever happened locally — a rank that
skipped it would hang the others — so callers pass NaNs when their own figures failed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Topology:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()


def topology() -> Topology:
    """Rank facts from torch.distributed when initialised, else from torchrun's variables."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank if world == 1 else 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    return Topology(rank, local_rank, world, local_world)


def gather_rows(values: list[float], topo: Topology) -> list[list[float]]:
    """All ranks' vectors, rank order; just ours when not distributed."""
    if not topo.distributed:
        return [list(values)]
    backend = dist.get_backend()
    device = (torch.device("cuda", torch.cuda.current_device())
              if "nccl" in str(backend) else torch.device("cpu"))
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(topo.world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default
