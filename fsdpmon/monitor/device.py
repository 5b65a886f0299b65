"""Which device the training loop runs on, and the device syncs the monitor makes on purpose."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


def uses_cuda(model: nn.Module | None) -> bool:
    """The model's parameters are on a GPU (without a model: CUDA is in use in this process)."""
    if model is not None:
        for p in model.parameters():
            return p.device.type == "cuda"
    return torch.cuda.is_available() and torch.cuda.is_initialized()


@contextlib.contextmanager
def intended_syncs(cuda: bool) -> Iterator[None]:
    """Log steps are where the monitor syncs on purpose (timers, loss, the gather): a loop that
    checks for stray syncs with torch.cuda.set_sync_debug_mode sees none of ours."""
    if not cuda:
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(0)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)
