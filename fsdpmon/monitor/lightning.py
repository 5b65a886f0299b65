"""Lightning ``Callback`` adapter: a Lightning run gets the monitor with
``Trainer(callbacks=[FsdpmonCallback(seq_len=...)])``.

Lightning owns the loop, so the monitor follows its hooks (Lightning 2.x, ``lightning.pytorch``,
else ``pytorch_lightning``):
- ``on_train_start``: the Monitor is made here, after the strategy has set up the process group
  and wrapped or sharded the model (``configure_model``), and after the sanity check.
- A monitor step is one optimiser step (``trainer.global_step`` advancing). It opens when the
  previous one closes, at ``on_train_batch_end``, or at ``on_train_epoch_start``, so fetching the
  next batch (which Lightning does between those hooks and ``on_train_batch_start``) is its
  "data" phase: a rank slow to load is busy longer, and a rank hung in its loader shows "data".
- ``on_before_optimizer_step`` .. ``on_train_batch_end``: the "optimizer" phase (Lightning calls
  the first after the closure's forward and backward, right before ``optimizer.step``).
- ``on_train_batch_end``: the loss Lightning returns in ``outputs``, the first optimiser's
  learning rate and the micro-batches' tokens are recorded, and the step closes when
  ``global_step`` has advanced (with ``accumulate_grad_batches`` > 1, after the last one).
- ``on_validation_start``/``_end``: an open step is dropped (evaluation is not training) and
  evaluation runs as a phase between steps, which the stall clock counts as progress.
- ``on_train_end`` / ``on_exception``: the open step is dropped and the monitor closed.
The monitor logs every ``log_interval`` steps on every rank at the same steps (its gather is a
collective). Strategies: FSDP and ``ModelParallelStrategy`` (FSDP2) collectives go through the
wrapper; DDP's gradient all-reduce through fsdpmon.monitor.ddp.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback

from fsdpmon.monitor.batches import batch_tokens
from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.monitor import Monitor


class FsdpmonCallback(Callback):
    def __init__(self, config: MonitorConfig | None = None, *, seq_len: int | None = None,
                 tokens_per_batch: int | None = None, run_info: dict[str, Any] | None = None
                 ) -> None:
        self.config = config
        self.seq_len = seq_len
        self.tokens_per_batch = tokens_per_batch
        self.run_info = run_info
        self.monitor: Monitor | None = None
        self._open = False
        self._tokens = 0
        self._step_at_open = 0
        self._in_optimizer = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        max_steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        info = self.run_info or {"model": type(pl_module).__name__, "config": {
            "strategy": type(trainer.strategy).__name__,
            "accumulate_grad_batches": trainer.accumulate_grad_batches}}
        self.monitor = Monitor(self.config or MonitorConfig.from_env(), model=pl_module,
                               seq_len=self.seq_len, total_steps=max_steps,
                               start_step=trainer.global_step, run_info=info)

    def _open_step(self, trainer: Any, fetching: bool) -> None:
        if self.monitor is None or self._open:
            return
        self.monitor.begin_step()
        self._open, self._tokens, self._step_at_open = True, 0, trainer.global_step
        if fetching:
            self.monitor.begin_phase("data")

    def _drop_step(self) -> None:
        if self.monitor is not None and self._open:
            self.monitor.abort_step()
        self._open = self._in_optimizer = False

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._open_step(trainer, fetching=True)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if self.monitor is None:
            return
        if self._open:
            self.monitor.end_phase("data")
        else:  # after an evaluation: this step's fetch was not seen
            self._open_step(trainer, fetching=False)
        self._tokens += (self.tokens_per_batch if self.tokens_per_batch is not None
                         else batch_tokens(batch))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.monitor is not None and self._open:
            self.monitor.begin_phase("optimizer")
            self._in_optimizer = True

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        mon = self.monitor
        if mon is None or not self._open or trainer.global_step == self._step_at_open:
            return  # no optimiser step yet (accumulating)
        if self._in_optimizer:
            mon.end_phase("optimizer")
            self._in_optimizer = False
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        mon.record(loss=getattr(loss, "detach", lambda: loss)(), lr=lr, tokens=self._tokens)
        mon.end_step()
        self._open = False
        self._open_step(trainer, fetching=True)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:  # (None in the sanity check, before on_train_start)
            self._drop_step()
            self.monitor.begin_phase("evaluation")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.end_phase("evaluation")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._drop_step()
        if self.monitor is not None:
            self.monitor.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._drop_step()
        if self.monitor is not None:
            self.monitor.close(exception)
