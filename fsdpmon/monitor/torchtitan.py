"""torchtitan adapter: ``monitored(Trainer)`` is torchtitan's ``Trainer`` with the monitor's hooks.

    from torchtitan.trainer import Trainer
    from fsdpmon.monitor.torchtitan import monitored
    trainer = monitored(Trainer)(config=config)   # instead of torchtitan's ``config.build()``
    trainer.train()

torchtitan has no callbacks. Per step ``Trainer.train()`` increments ``self.step`` and calls
``self.train_step(data_iterator)`` (every micro-batch's fetch, forward and backward, clipping,
the optimiser step), then saves a checkpoint; on log steps (1 and every ``metrics.log_freq``)
``train_step`` ends with ``metrics_processor.log(step, global_avg_loss, global_max_loss,
grad_norm, extra_metrics=...)`` on every rank. So one ``train_step`` is one monitor step, its
batch fetches are the "data" phase (tokens: the labels' elements, torchtitan's own count), the
wrapped ``log`` hands over loss, grad norm and learning rate, and the monitor's log step (a
collective) runs after that step on every rank. The Monitor is made at the first step, after
``train()`` has loaded a checkpoint, so its steps continue from ``self.step``.
``tests/test_torchtitan_adapter.py`` pins these names against torchtitan 0.3.0's source.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from fsdpmon.monitor.batches import batch_tokens
from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.monitor import Monitor

T = TypeVar("T")


class _TimedFetches:
    """The batches of torchtitan's ``data_iterator``, each fetch timed as the "data" phase."""

    def __init__(self, monitor: Monitor, batches: Iterator[Any]) -> None:
        self.monitor, self.batches, self.tokens = monitor, batches, 0

    def __iter__(self) -> _TimedFetches:
        return self

    def __next__(self) -> Any:
        self.monitor.begin_phase("data")
        try:
            batch = next(self.batches)
        finally:
            self.monitor.end_phase("data")
        # torchtitan yields (input_dict, labels) and counts labels.numel() as tokens seen.
        labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) > 1 else batch
        self.tokens += batch_tokens(labels)
        return batch


class FsdpmonTrainer:
    """Mixin for a torchtitan ``Trainer`` (class order: ``(FsdpmonTrainer, Trainer)``)."""

    # What torchtitan's Trainer has (pinned by the tests against its source).
    config: Any
    model_parts: list[Any]
    metrics_processor: Any
    step: int

    fsdpmon_config: MonitorConfig | None = None  # None: MonitorConfig.from_env()
    fsdpmon: Monitor | None = None
    _fsdpmon_log_due = False

    def train(self) -> Any:
        try:
            return super().train()
        finally:
            if self.fsdpmon is not None:
                self.fsdpmon.close()

    def train_step(self, data_iterator: Iterator[Any]) -> Any:
        monitor = self.fsdpmon or self._fsdpmon_start()
        fetches = _TimedFetches(monitor, data_iterator)
        self._fsdpmon_log_due = False
        with monitor.step():
            result = super().train_step(fetches)
            monitor.record(tokens=fetches.tokens)
        if self._fsdpmon_log_due:  # torchtitan logged during this step, on every rank
            monitor.log_now()
        return result

    def _fsdpmon_start(self) -> Monitor:
        config, spec = self.config, self.config.model_spec
        monitor = Monitor(
            self.fsdpmon_config or MonitorConfig.from_env(log_interval=config.metrics.log_freq),
            model=self.model_parts[0],
            flops_per_token=self.metrics_processor.num_flops_per_token or None,
            total_steps=config.training.steps,
            start_step=self.step - 1,  # train() counted this step already
            run_info={"model": f"{getattr(spec, 'name', '')} {getattr(spec, 'flavor', '')}",
                      "config": {"seq_len": config.training.seq_len,
                                 "local_batch_size": config.training.local_batch_size}})
        monitor.auto_log = False  # torchtitan decides when to log
        self._wrap_metrics_log(monitor)
        self.fsdpmon = monitor
        return monitor

    def _wrap_metrics_log(self, monitor: Monitor) -> None:
        processor = self.metrics_processor
        log = processor.log

        def logged(step: int, global_avg_loss: float, global_max_loss: float, grad_norm: float,
                   extra_metrics: dict[str, Any] | None = None, **kwargs: Any) -> Any:
            lrs = [v for k, v in (extra_metrics or {}).items() if k.startswith("lr/")]
            monitor.record(loss=global_avg_loss, grad_norm=grad_norm,
                           lr=lrs[0] if lrs else None)
            self._fsdpmon_log_due = True
            return log(step, global_avg_loss, global_max_loss, grad_norm,
                       extra_metrics=extra_metrics, **kwargs)

        processor.log = logged


def monitored(trainer_cls: type[T], config: MonitorConfig | None = None) -> type[T]:
    """``trainer_cls`` (torchtitan's ``Trainer`` or a subclass) with the monitor's hooks."""
    class Monitored(FsdpmonTrainer, trainer_cls):  # type: ignore[valid-type,misc]
        fsdpmon_config = config

    Monitored.__name__ = Monitored.__qualname__ = f"Monitored{trainer_cls.__name__}"
    return Monitored
