"""A hand-written FSDP2 loop (``fully_shard`` on each block, then the root), monitored by fsdpmon.

    torchrun --nproc_per_node 2 examples/fsdp2_loop.py --max-steps 50
    curl -s localhost:9520/metrics | grep fsdpmon_train_   # both ranks, one port per pod

What fsdpmon adds is marked "fsdpmon": the Monitor, ``with mon.step()`` around each optimiser
step, a phase around each part of it, ``mon.record`` and ``mon.close``. FSDP2's all-gathers and
reduce-scatters are timed by the monitor's collective wrapper with nothing more to add. Settings
come from FSDPMON_* variables (FSDPMON_PORT, FSDPMON_JOB_NAME, FSDPMON_JSONL, ...). Runs on CPU
(gloo) as well as on GPUs (nccl).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from fsdpmon.monitor import Monitor, MonitorConfig  # fsdpmon
from fsdpmon.trainer.model import Transformer
from fsdpmon.trainer.shapes import FLAVOURS

SEQ, BATCH = 64, 4


def synthetic_tokens(steps: int, vocab: int, rank: int) -> DataLoader:
    ids = torch.randint(0, vocab, (steps * BATCH, SEQ + 1),
                        generator=torch.Generator().manual_seed(rank))
    return DataLoader(TensorDataset(ids), batch_size=BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=50)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    torch.manual_seed(0)
    shape = FLAVOURS["tiny"]
    model = Transformer(shape).to(device)
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = synthetic_tokens(args.max_steps, shape.vocab_size, dist.get_rank())

    mon = Monitor(MonitorConfig.from_env(), model=model, seq_len=SEQ,  # fsdpmon
                  tokens_per_step=BATCH * SEQ, total_steps=args.max_steps)
    try:
        batches = iter(loader)
        for _ in range(args.max_steps):
            with mon.step():  # fsdpmon: one optimiser step
                with mon.phase("data"):
                    (ids,) = next(batches)
                    ids = ids.to(device)
                with mon.phase("forward"):
                    logits = model(ids[:, :-1])
                    loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
                with mon.phase("backward"):
                    loss.backward()
                with mon.phase("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                mon.record(loss=loss.detach(), lr=optimizer.param_groups[0]["lr"])  # fsdpmon
    finally:
        mon.close()  # fsdpmon
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
