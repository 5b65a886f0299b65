"""Resume from the newest checkpoint that loads; a damaged one never traps the job.

A checkpoint can carry the completion marker and still fail to load (a truncated shard after a
disk fault, a file someone edited). Then it is renamed aside to ``damaged-step_N`` (never
deleted: someone may want to look at it), one line says why, and the next older complete one is
tried. Every rank must load the same checkpoint, so ranks agree after each attempt (a shard can be
damaged on one rank only). When none loads, a ``RESUME_FAILED`` note is left in the directory
and the job fails with one line; a restarted job (torchrun) then fails at once on that note
instead of training from scratch or retrying the same files; removing it starts afresh.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.logger import DCP_LOGGER_NAME

from fsdpmon.errors import InputError
from fsdpmon.trainer.checkpoint import Checkpointer, TrainState, complete_checkpoints

log = logging.getLogger(__name__)

FAILED_NOTE = "RESUME_FAILED"
DAMAGED_PREFIX = "damaged-"


def resume_newest(ckpt: Checkpointer, model: nn.Module,
                  optim: torch.optim.Optimizer) -> tuple[TrainState, Path] | None:
    """Load the newest checkpoint that loads on every rank; None when there are none."""
    note = ckpt.root / FAILED_NOTE
    if note.exists():
        raise InputError(f"--checkpoint-dir {ckpt.root}: no checkpoint loaded last time (see "
                         f"{note}; the damaged ones were renamed {DAMAGED_PREFIX}*); remove "
                         f"{FAILED_NOTE} to start from scratch")
    # Rank 0 decides, so every rank tries the same list even on a slow shared disk.
    found = [[str(path) for _, path in reversed(complete_checkpoints(ckpt.root))]]
    if dist.is_initialized():
        dist.broadcast_object_list(found, src=0)
    tried = []
    for name in found[0]:
        path = Path(name)
        state, problem = _try_load(ckpt, path, model, optim)
        problems = _agree(problem)
        if state is not None and not problems:
            return state, path
        tried.append(path.name)
        if ckpt.rank == 0:
            _set_aside(path, problems)
        _barrier()
    if not tried:
        return None
    if ckpt.rank == 0:
        note.write_text(json.dumps({"time": time.time(), "tried": tried}) + "\n")
    raise InputError(f"--checkpoint-dir {ckpt.root}: none of the {len(tried)} complete "
                     f"checkpoints loads ({', '.join(tried)}, renamed {DAMAGED_PREFIX}*)")


def _try_load(ckpt: Checkpointer, path: Path, model: nn.Module,
              optim: torch.optim.Optimizer) -> tuple[TrainState | None, str | None]:
    # DCP logs each failure with its whole traceback; ours is the one line that says it.
    dcp_log = logging.getLogger(DCP_LOGGER_NAME)
    level = dcp_log.level
    dcp_log.setLevel(logging.CRITICAL)
    try:
        return ckpt.load(path, model, optim), None
    # any damage: a truncated zip, a missing key, a wrong shape; DCP's own error is a
    # BaseException carrying every rank's traceback: its last line says what went wrong
    except (Exception, CheckpointException) as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return None, (lines[-1] if lines else type(exc).__name__)[:200]
    finally:
        dcp_log.setLevel(level)


def _agree(problem: str | None) -> list[str]:
    """Every rank's problem with the checkpoint just tried (empty: it loaded everywhere)."""
    if not dist.is_initialized():
        return [f"rank 0: {problem}"] if problem else []
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem)
    return [f"rank {r}: {p}" for r, p in enumerate(problems) if p]


def _set_aside(path: Path, problems: list[str]) -> None:
    target = path.with_name(DAMAGED_PREFIX + path.name)
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{DAMAGED_PREFIX}{path.name}.{n}")
    path.rename(target)
    log.error("checkpoint %s does not load (%s); renamed to %s, trying the next older one",
              path, problems[0] + (f" and {len(problems) - 1} more" if len(problems) > 1
                                   else ""), target.name)


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
