"""DDP's gradient all-reduce, made visible to the collective wrapper (fsdpmon.monitor.collectives).

Why: ``DistributedDataParallel`` reduces gradients from C++ (its Reducer calls the process group
directly), so the c10d entry points the wrapper replaces never see those all-reduces. Where a
library trains with DDP — Accelerate and Lightning on CPU, the HF Trainer without FSDP — a rank's
wait for its peers at the gradient all-reduce then counted as its own busy time, every rank's
busy time was its step time, and the straggler did not stand out; a hung peer left no collective
number behind either.

How: the one public way into the Reducer is a communication hook. On the first forward of a DDP
module that has no hook of its own, ``watch`` registers torch's own ``allreduce_hook`` (the same
arithmetic as DDP's built-in reduction: each bucket divided by the group size and all-reduced),
wrapped. Its ``dist.all_reduce(async_op=True)`` goes through the wrapper, so it is numbered; the
wrapper does not time async calls, so the hook tells the timer when each bucket was launched and
when its all-reduce completed (a ``then`` callback on the Work's future, on gloo's thread). The
Reducer holds the backward until every bucket is done, and the buckets launched before the last
(``GradBucket.is_last``) overlap the backward's own compute, so the time blocked is the tail of
each backward: from its last launch to its buckets' last completion (``blocked_tails``).

Not covered, on purpose: a DDP that already has a hook (a user's, Accelerate's compression hook,
a built-in C++ one) keeps it, and its waits are not seen; on CUDA the hook is not registered
(host times of NCCL work say nothing, and DDP there keeps its C++ path untouched).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("fsdpmon.monitor")

_WATCHED = "_fsdpmon_ddp_watched"


def blocked_tails(ends: Sequence[float], completions: Sequence[tuple[int, float]]) -> float:
    """Seconds blocked at the end of the backwards: backward ``i``'s compute ended when it
    launched its last bucket (``ends[i]``), and it blocked until its last bucket completed
    (``completions``: (backward, time) per bucket). Buckets that completed while the backward
    still computed cost nothing; a backward still pending counts nothing."""
    done: dict[int, float] = {}
    for index, t in completions:
        done[index] = max(done.get(index, t), t)
    return sum(max(0.0, done[i] - end) for i, end in enumerate(ends) if i in done)


def _timed_hook(active_timer: Callable[[], Any]) -> Callable[[Any, Any], Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    # No annotations: DDP checks a hook's, and accepts only none or its own types.
    def fsdpmon_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
        future = allreduce_hook(process_group, bucket)  # numbered by the wrapper
        timer = active_timer()
        if timer is None or not timer.armed or timer.cuda:
            return future
        backward = timer.async_launched(last=bucket.is_last())

        def completed(done: Any) -> Any:
            timer.async_completed(backward)
            return done.value()

        return future.then(completed)

    return fsdpmon_allreduce_hook


def _register(module: Any, hook: Callable[[Any, Any], Any]) -> None:
    """Give ``module`` (a DDP) the timed hook, unless it has a hook or lives on CUDA."""
    object.__setattr__(module, _WATCHED, True)
    if module._comm_hooks or getattr(module, "device_type", "cpu") == "cuda":
        return
    try:
        module.register_comm_hook(module.process_group, hook)
    except Exception as exc:  # a built-in C++ hook is registered already: keep it
        log.info("fsdpmon monitor: DDP keeps its own communication hook; its gradient "
                 "all-reduce waits are not timed (%r)", exc)


def watch(active_timer: Callable[[], Any]) -> bool:
    """Hook every DDP module at its first forward (idempotent); False without torch DDP."""
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:
        return False
    forward = DDP.forward
    if getattr(forward, _WATCHED, False):
        return True
    hook = _timed_hook(active_timer)

    @functools.wraps(forward)
    def watched_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.__dict__.get(_WATCHED):
            try:
                _register(self, hook)
            except Exception as exc:  # never into training
                log.warning("fsdpmon monitor: could not watch a DDP module: %r", exc)
        return forward(self, *args, **kwargs)

    setattr(watched_forward, _WATCHED, True)
    DDP.forward = watched_forward
    return True
