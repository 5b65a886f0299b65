"""Lightning's ``Trainer`` with FSDP, monitored by fsdpmon through a Lightning ``Callback``.

    torchrun --nproc_per_node 2 examples/lightning_fsdp.py --max-steps 50
    curl -s localhost:9520/metrics | grep fsdpmon_train_   # both ranks, one port per pod

What fsdpmon adds is marked "fsdpmon": one callback. On GPUs the run uses Lightning's
``FSDPStrategy`` (one FSDP unit per block). Lightning refuses that strategy on CPU ("requires a
GPU accelerator"), so on CPU the example runs the closest mode Lightning allows: its
``ModelParallelStrategy`` with ``fully_shard`` (FSDP2) applied per block in ``configure_model``,
every rank in the data-parallel dimension. The callback's hooks are the same either way.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from fsdpmon.monitor.lightning import FsdpmonCallback  # fsdpmon
from fsdpmon.trainer.model import Transformer, TransformerBlock
from fsdpmon.trainer.shapes import FLAVOURS

SEQ, BATCH = 64, 4


class LlamaModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = Transformer(FLAVOURS["tiny"])

    def configure_model(self) -> None:
        if isinstance(self.trainer.strategy, ModelParallelStrategy):  # CPU: FSDP2 by hand
            mesh = self.device_mesh["data_parallel"]
            for block in self.model.layers:
                fully_shard(block, mesh=mesh)
            fully_shard(self.model, mesh=mesh)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        logits = self.model(ids[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--devices", type=int, default=2, help="processes per node (torchrun's)")
    args = parser.parse_args()
    vocab = FLAVOURS["tiny"].vocab_size
    ids = torch.randint(0, vocab, (args.max_steps * BATCH * args.devices, SEQ + 1),
                        generator=torch.Generator().manual_seed(0))
    if torch.cuda.is_available():
        accelerator, strategy = "gpu", FSDPStrategy(auto_wrap_policy={TransformerBlock})
    else:
        accelerator = "cpu"
        strategy = ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1)
    trainer = L.Trainer(
        accelerator=accelerator, devices=args.devices, strategy=strategy,
        max_steps=args.max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[FsdpmonCallback(seq_len=SEQ, tokens_per_batch=BATCH * SEQ)])  # fsdpmon
    trainer.fit(LlamaModule(), DataLoader(TensorDataset(ids), batch_size=BATCH))


if __name__ == "__main__":
    main()
