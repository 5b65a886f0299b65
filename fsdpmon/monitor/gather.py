"""The one small collective per log interval: every rank's figures to every rank.

All ranks must call ``gather`` at the same log steps, whatever happened locally — a rank that
skipped it would hang the others — so callers pass NaNs when their own figures failed.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from fsdpmon.distenv import DistEnv


def topology() -> DistEnv:
    """Rank facts from torchrun's variables (fsdpmon.distenv); an initialised process group's
    rank and size win over them."""
    environ: dict[str, str] = dict(os.environ)
    if dist.is_available() and dist.is_initialized():
        environ.update(RANK=str(dist.get_rank()), WORLD_SIZE=str(dist.get_world_size()))
    return DistEnv.from_env(environ)


def is_distributed(topo: DistEnv) -> bool:
    """Whether a collective can run: more than one rank and a process group to run it in."""
    return topo.world_size > 1 and dist.is_available() and dist.is_initialized()


def gather_rows(values: list[float], topo: DistEnv) -> list[list[float]]:
    """All ranks' vectors, rank order; just ours when not distributed."""
    if not is_distributed(topo):
        return [list(values)]
    backend = dist.get_backend()
    device = (torch.device("cuda", torch.cuda.current_device())
              if "nccl" in str(backend) else torch.device("cpu"))
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(mine) for _ in range(topo.world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]

