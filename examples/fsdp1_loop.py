"""A plain FSDP1 loop, the shape of aws-do-fsdp's script: ``FullyShardedDataParallel`` with a
transformer auto-wrap policy (one flat parameter per block), monitored by fsdpmon.

    torchrun --nproc_per_node 2 examples/fsdp1_loop.py --max-steps 50
    curl -s localhost:9520/metrics | grep fsdpmon_train_   # both ranks, one port per pod

What fsdpmon adds is marked "fsdpmon". FSDP1 all-gathers each block's flat parameter
(``all_gather_single``) and reduce-scatters its gradient (``reduce_scatter_single``) through the
``torch.distributed`` entry points, so the monitor's collective wrapper times them with nothing
more to add. Settings come from FSDPMON_* variables. Runs on CPU (gloo) and GPUs (nccl).
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.utils.data import DataLoader, TensorDataset

from fsdpmon.monitor import Monitor, MonitorConfig  # fsdpmon
from fsdpmon.trainer.model import Transformer, TransformerBlock
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
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", dist.get_rank() % torch.cuda.device_count()) if cuda \
        else torch.device("cpu")
    torch.manual_seed(0)
    shape = FLAVOURS["tiny"]
    wrap = functools.partial(transformer_auto_wrap_policy,
                             transformer_layer_cls={TransformerBlock})
    model = FSDP(Transformer(shape), auto_wrap_policy=wrap, device_id=device,
                 use_orig_params=True)
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
                    grad_norm = model.clip_grad_norm_(1.0)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                mon.record(loss=loss.detach(), lr=optimizer.param_groups[0]["lr"],  # fsdpmon
                           grad_norm=grad_norm)
    finally:
        mon.close()  # fsdpmon
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
