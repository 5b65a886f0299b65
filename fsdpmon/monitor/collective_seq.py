"""The last collective each rank entered, with a per-rank sequence number (stack evidence).

PyTorch's flight recorder keys a hang by (process group, collective sequence number): the ranks
that stopped at a lower number are the ones the others wait for. This is the cheap version for
any backend: the c10d Python entry points (``torch.distributed.all_reduce``, ...
``all_gather_into_tensor``, ``reduce_scatter_tensor``, which FSDP2 and user code call through
the module attribute) are wrapped once per process, and each call stores its name and bumps a
counter: two stores, nothing allocated, nothing written anywhere. The stack evidence reads it
only while the rank is stalled. A call made inside another (``all_gather_object`` calls
``all_gather``) counts once, as the outer one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

NAMES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_to_all",
    "all_to_all_single", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "reduce",
    "barrier", "gather", "scatter", "all_gather_object", "broadcast_object_list", "send", "recv",
)
_MARK = "_fsdpmon_collective_seq"


class _Last:
    op: str | None = None
    seq = 0
    depth = 0


_last = _Last()


def last_entered() -> tuple[str, int] | None:
    """(op, seq) of the last collective this process entered; None before the first."""
    op, seq = _last.op, _last.seq
    return None if op is None else (op, seq)


def _counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        last = _last
        if last.depth:
            return fn(*args, **kwargs)
        last.op, last.seq, last.depth = name, last.seq + 1, 1
        try:
            return fn(*args, **kwargs)
        finally:
            last.depth = 0

    setattr(wrapper, _MARK, True)
    return wrapper


def install() -> bool:
    """Wrap the collectives once per process (idempotent); False without torch.distributed."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    if not dist.is_available():
        return False
    from torch.distributed import distributed_c10d as c10d

    for module in (dist, c10d):
        for name in NAMES:
            fn = getattr(module, name, None)
            if fn is not None and not getattr(fn, _MARK, False):
                setattr(module, name, _counted(name, fn))
    return True
