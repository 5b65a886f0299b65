"""Hugging Face Accelerate helper: a plain Accelerate loop gets the monitor by iterating its
loader through ``batches`` (one changed line) and recording its loss.

    mon = AccelerateMonitor(accelerator, model, seq_len=SEQ)
    for batch in mon.batches(loader):
        with accelerator.accumulate(model):
            loss = ...; accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
        mon.record(loss=loss.detach())
    mon.close()

Accelerate has no callback system for custom loops, so the helper hooks the two points every
such loop has: the loader's ``next`` and ``accelerator.sync_gradients``. A monitor step is one
optimiser step: it opens before the first micro-batch is fetched (so loading is the "data"
phase and a rank slow to load is busy longer), counts each micro-batch's tokens, and closes when
the loop asks for the next batch after an iteration that synchronised gradients (Accelerate sets
``sync_gradients`` in ``accumulate()``; without accumulation it is always true). Gradient
all-reduces are seen by the collective wrapper: FSDP's directly, DDP's (Accelerate's CPU mode)
through fsdpmon.monitor.ddp.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from fsdpmon.monitor.batches import batch_tokens
from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.monitor import Monitor

T = TypeVar("T")


class AccelerateMonitor:
    def __init__(self, accelerator: Any, model: Any = None, config: MonitorConfig | None = None,
                 *, seq_len: int | None = None, tokens_per_batch: int | None = None,
                 total_steps: int | None = None, run_info: dict[str, Any] | None = None) -> None:
        self.accelerator = accelerator
        self.tokens_per_batch = tokens_per_batch
        inner = accelerator.unwrap_model(model) if model is not None else None
        info = run_info or {"model": type(inner).__name__ if inner is not None else "",
                            "config": {"accelerate": str(accelerator.distributed_type)}}
        self.monitor = Monitor(config or MonitorConfig.from_env(), model=inner, seq_len=seq_len,
                               total_steps=total_steps, run_info=info)
        self._open = False
        self._tokens = 0

    def batches(self, loader: Iterable[T]) -> Iterator[T]:
        """The loader's batches, each fetched inside the monitor step it belongs to."""
        mon, iterator = self.monitor, iter(loader)
        try:
            while True:
                if not self._open:
                    mon.begin_step()
                    self._open, self._tokens = True, 0
                mon.begin_phase("data")
                try:
                    batch = next(iterator)
                finally:
                    mon.end_phase("data")
                self._tokens += (self.tokens_per_batch if self.tokens_per_batch is not None
                                 else batch_tokens(batch))
                yield batch
                if self.accelerator.sync_gradients:
                    mon.record(tokens=self._tokens)
                    mon.end_step()
                    self._open = False
        except StopIteration:
            return
        finally:  # the loader ran out, or the loop broke out: the open step never completed
            if self._open:
                mon.abort_step()
                self._open = False

    def phase(self, name: str) -> Any:
        return self.monitor.phase(name)

    def record(self, **values: Any) -> None:
        self.monitor.record(**values)

    def close(self, error: BaseException | None = None) -> None:
        self.monitor.close(error)
