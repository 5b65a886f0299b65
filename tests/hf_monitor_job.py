"""A tiny Hugging Face Trainer run with the fsdpmon callback, for ``torchrun`` (2 CPU ranks).

Usage: torchrun --standalone --nproc_per_node 2 tests/hf_monitor_job.py OUT_DIR
"""

from __future__ import annotations

import faulthandler
import os
import sys

import torch
import transformers

from fsdpmon.monitor import MonitorConfig
from fsdpmon.monitor.hf import FsdpmonCallback

SEQ, STEPS, LOG_EVERY, BATCH = 32, 6, 2, 2
HANG_SECONDS = 90


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, vocab: int) -> None:
        self.data = torch.randint(0, vocab, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main(out: str) -> None:
    # A hang (in HF, gloo or the monitor's gather) prints every thread's stack and exits.
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=SEQ)
    args = transformers.TrainingArguments(
        output_dir=out, max_steps=STEPS, per_device_train_batch_size=BATCH,
        logging_steps=LOG_EVERY, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True)
    callback = FsdpmonCallback(MonitorConfig.from_env(jsonl_path=f"{out}/hf.jsonl"), seq_len=SEQ)
    trainer = transformers.Trainer(model=transformers.LlamaForCausalLM(config), args=args,
                                   train_dataset=Tokens(64, 128), callbacks=[callback])
    trainer.train()  # the callback closes the monitor (and its JSONL file) at train end
    # Tearing down HF's DDP over gloo sometimes hangs or aborts ("terminate called without an
    # active exception") on this torch; the run is complete, so skip the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])

