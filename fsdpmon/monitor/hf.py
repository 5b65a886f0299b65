"""Hugging Face ``transformers.TrainerCallback`` adapter: HF Trainer (+ FSDP) users get the same
metrics by adding ``callbacks=[FsdpmonCallback(seq_len=...)]``.

One monitor step spans ``on_step_begin`` .. ``on_step_end`` (all micro-batches of one optimiser
step); the optimizer phase spans ``on_pre_optimizer_step`` .. ``on_optimizer_step``. HF computes
the loss only when it logs — after ``on_step_end`` and on every rank — so the monitor's log step
(read timers, gather, publish) runs from ``on_log`` with HF's loss, learning rate and grad norm,
at HF's ``logging_steps``. The batch fetch happens before ``on_step_begin`` and is not seen.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from fsdpmon.monitor.config import MonitorConfig
from fsdpmon.monitor.monitor import Monitor


class FsdpmonCallback(TrainerCallback):
    def __init__(self, config: MonitorConfig | None = None, *, seq_len: int | None = None,
                 tokens_per_step: int | None = None, run_info: dict[str, Any] | None = None
                 ) -> None:
        self.config = config
        self.seq_len = seq_len
        self.tokens_per_step = tokens_per_step
        self.run_info = run_info
        self.monitor: Monitor | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: Any = None, **kwargs: Any) -> None:
        tokens = self.tokens_per_step
        if tokens is None and self.seq_len:
            micro_batches = args.per_device_train_batch_size * args.gradient_accumulation_steps
            tokens = micro_batches * self.seq_len
        info = self.run_info or {
            "model": getattr(getattr(model, "config", None), "model_type", "") or "",
            "config": {"learning_rate": args.learning_rate, "max_steps": state.max_steps},
        }
        # (HF's logging_steps may be a ratio of the run; HF decides when to log anyway.)
        interval = max(1, int(args.logging_steps or 1))
        self.monitor = Monitor(
            self.config or MonitorConfig.from_env(log_interval=interval),
            model=model, seq_len=self.seq_len, tokens_per_step=tokens or 0,
            total_steps=state.max_steps or None, start_step=state.global_step, run_info=info)
        # HF decides when to log; our log step follows its on_log.
        self.monitor.auto_log = False

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.begin_step()

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState,
                              control: TrainerControl, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.begin_phase("optimizer")

    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState,
                          control: TrainerControl, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.end_phase("optimizer")

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.end_step()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # Training logs carry "loss"; evaluation and the final summary do not (every rank
        # sees the same logs, so every rank takes part in the log step's gather).
        if self.monitor is None or not logs or "loss" not in logs:
            return
        self.monitor.record(loss=logs.get("loss"), lr=logs.get("learning_rate"),
                            grad_norm=logs.get("grad_norm"))
        self.monitor.log_now()

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()
