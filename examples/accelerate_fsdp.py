"""Hugging Face Accelerate with its FSDP plugin (FSDP2, one unit per block), monitored by fsdpmon.

    torchrun --nproc_per_node 2 examples/accelerate_fsdp.py --max-steps 50
    curl -s localhost:9520/metrics | grep fsdpmon_train_   # both ranks, one port per pod

What fsdpmon adds is marked "fsdpmon": an ``AccelerateMonitor``, the loader iterated through
``mon.batches`` (one optimiser step per monitor step, accumulation included), ``mon.record`` and
``mon.close``. On GPUs Accelerate shards the model with FSDP2. On CPU, Accelerate ignores the
FSDP plugin and wraps the model in DDP instead (its FSDP needs an accelerator); the monitor then
times DDP's gradient all-reduce through a communication hook (see docs/integrations/accelerate.md).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from torch.utils.data import DataLoader, TensorDataset

from fsdpmon.monitor import MonitorConfig
from fsdpmon.monitor.accelerate import AccelerateMonitor  # fsdpmon
from fsdpmon.trainer.model import Transformer
from fsdpmon.trainer.shapes import FLAVOURS

SEQ, BATCH, ACCUMULATE = 64, 2, 2


def synthetic_tokens(steps: int, vocab: int) -> DataLoader:
    ids = torch.randint(0, vocab, (steps * BATCH * ACCUMULATE, SEQ + 1),
                        generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(ids), batch_size=BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=50)
    args = parser.parse_args()
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["TransformerBlock"], reshard_after_forward=True)
    accelerator = Accelerator(fsdp_plugin=plugin, gradient_accumulation_steps=ACCUMULATE,
                              cpu=not torch.cuda.is_available())  # gloo processes on CPU
    torch.manual_seed(0)
    shape = FLAVOURS["tiny"]
    model = Transformer(shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # Accelerate shards the loader: each rank gets every world_size-th batch.
    loader = synthetic_tokens(args.max_steps * accelerator.num_processes, shape.vocab_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"accelerate: {accelerator.distributed_type}")

    mon = AccelerateMonitor(accelerator, model, MonitorConfig.from_env(),  # fsdpmon
                            seq_len=SEQ, tokens_per_batch=BATCH * SEQ,
                            total_steps=args.max_steps)
    try:
        for (ids,) in mon.batches(loader):  # fsdpmon: the loader through the monitor
            with accelerator.accumulate(model):
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            mon.record(loss=loss.detach(), lr=optimizer.param_groups[0]["lr"])  # fsdpmon
    finally:
        mon.close()  # fsdpmon
    accelerator.end_training()


if __name__ == "__main__":
    main()
