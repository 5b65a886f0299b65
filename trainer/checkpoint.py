"""Atomic, resumable checkpoints with torch.distributed.checkpoint (DCP).

Layout under ``--checkpoint-dir``::

    step_00000020/          a complete checkpoint: DCP files + extra_rank*.pt + COMPLETE
    .tmp-step_00000030/     a save in progress (or one that crashed): never resumed from

Every rank writes its DCP shard and its ``extra_rank{r}.pt`` (scheduler, step, data position,
RNG) into the temporary directory; after a barrier rank 0 writes the ``COMPLETE`` marker and
renames the directory into place. A rename within one filesystem is atomic, so a crash at any
point leaves either the previous checkpoints or a new complete one, and resume only ever looks
at directories that hold the marker.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from fsdpmon.trainer import faults

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step_(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and (path / MARKER).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class TrainState:
    """What a checkpoint restores beside the model and optimiser."""

    step: int
    data_position: int
    scheduler: dict[str, Any]


class Checkpointer:
    def __init__(self, root: str | Path, keep: int, rank: int,
                 fault_plan: faults.FaultPlan | None = None) -> None:
        self.root, self.keep, self.rank = Path(root), keep, rank
        self.faults = fault_plan or faults.FaultPlan()

    def remove_incomplete(self) -> None:
        """Drop what crashed saves left behind (rank 0, before training starts)."""
        if self.rank == 0 and self.root.is_dir():
            for path in self.root.glob(".tmp-step_*"):
                log.warning("removing incomplete checkpoint %s", path)
                shutil.rmtree(path, ignore_errors=True)
        _barrier()

    def save(self, model: nn.Module, optim: torch.optim.Optimizer, state: TrainState) -> Path:
        final = self.root / step_dir_name(state.step)
        tmp = self.root / f".tmp-{final.name}"
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optim)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
        torch.save(
            {"step": state.step, "data_position": state.data_position,
             "scheduler": state.scheduler, "rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state() if torch.cuda.is_available() else None},
            tmp / f"extra_rank{self.rank}.pt",
        )
        self.faults.in_save(state.step)
        _barrier()  # every rank's files are written
        if self.rank == 0:
            self._commit(tmp, final, state.step)
            self._prune()
        _barrier()
        return final

    def _commit(self, tmp: Path, final: Path, step: int) -> None:
        marker = tmp / MARKER
        with open(marker, "w") as fh:
            json.dump({"step": step, "world_size": dist.get_world_size()
                       if dist.is_initialized() else 1}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if final.exists():  # a re-save of the same step after a resume
            shutil.rmtree(final)
        tmp.rename(final)
        _fsync_dir(self.root)

    def _prune(self) -> None:
        for _, path in complete_checkpoints(self.root)[: -self.keep]:
            # Remove the marker first, so a half-deleted directory is never taken as complete.
            (path / MARKER).unlink(missing_ok=True)
            shutil.rmtree(path, ignore_errors=True)

    def load(self, path: Path, model: nn.Module, optim: torch.optim.Optimizer) -> TrainState:
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optim, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        extra_file = path / f"extra_rank{self.rank}.pt"
        if not extra_file.exists():  # resumed with more ranks than saved: global parts agree
            extra_file = path / "extra_rank0.pt"
        extra = torch.load(extra_file, weights_only=True)
        torch.set_rng_state(extra["rng"])
        if extra.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(extra["cuda_rng"])
        return TrainState(extra["step"], extra["data_position"], extra["scheduler"])
