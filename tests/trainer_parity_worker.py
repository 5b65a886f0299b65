"""Run under ``torchrun --nproc_per_node 2`` by tests/test_train_distributed.py.

Part 1 (parity): build the trainer exactly as ``fsdpmon.trainer.train`` does, record the full
initial weights, run one optimiser step through the trainer's own methods, and save (rank 0) the
full gradients and parameters. The test replays the same global batch in one plain process.

Part 2 (fidelity): load a Hugging Face checkpoint through ``--hf-checkpoint`` onto the sharded
model and save the logits for fixed tokens; the test compares them with transformers'.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.trainer.config import parse_config
from fsdpmon.trainer.data import build_source
from fsdpmon.trainer.loop import build_trainer
from fsdpmon.trainer.parallel import DistEnv, choose_device, exit_process, init_distributed

PARITY_FLAGS = ["--model", "tiny", "--batch-size", "2", "--grad-accum", "2", "--seq-len", "32",
                "--lr", "1e-3", "--seed", "3", "--metrics-port", "0"]
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.full_tensor().cpu() for name, p in model.named_parameters()}


def parity(out: Path, env: DistEnv, device: torch.device, mesh: object) -> None:
    cfg = parse_config(PARITY_FLAGS)
    source = build_source("synthetic", None, 512, cfg.data.seq_len, cfg.seed)
    trainer = build_trainer(cfg, env, device, mesh, source)
    initial = get_model_state_dict(trainer.model, options=FULL)
    mon = Monitor(MonitorConfig.from_env(port=0, log_interval=1000), model=trainer.model,
                  seq_len=cfg.data.seq_len, tokens_per_step=1, total_steps=1, start_step=0,
                  run_info={"model": "tiny", "config": cfg.to_json()})
    try:
        with mon.step():
            loss = trainer.accumulate_gradients(mon)
            grads = full_grads(trainer.model)
            grad_norm, _ = trainer.optimizer_step()
    finally:
        mon.close()
    after = get_model_state_dict(trainer.model, options=FULL)
    global_loss = loss.clone()
    dist.all_reduce(global_loss)
    if env.rank == 0:
        torch.save({"initial": initial, "grads": grads, "after": after,
                    "loss": float(global_loss) / env.world_size, "grad_norm": float(grad_norm)},
                   out / "parity_fsdp.pt")


def fidelity(out: Path, hf_dir: str, env: DistEnv, device: torch.device, mesh: object) -> None:
    cfg = parse_config(["--hf-checkpoint", hf_dir, "--seq-len", "24", "--metrics-port", "0"])
    source = build_source("synthetic", None, 256, cfg.data.seq_len, cfg.seed)
    trainer = build_trainer(cfg, env, device, mesh, source)
    tokens = torch.load(out / "tokens.pt")
    with torch.no_grad():
        logits = trainer.model(tokens.to(device))
    if env.rank == 0:
        torch.save(logits.cpu(), out / "logits_ours.pt")


def main() -> None:
    out, hf_dir = Path(sys.argv[1]), sys.argv[2]
    env = DistEnv.from_env()
    device = choose_device(env)
    mesh = init_distributed(env, device)
    try:
        parity(out, env, device, mesh)
        fidelity(out, hf_dir, env, device, mesh)
        dist.barrier()  # leave together (see fsdpmon.trainer.train.train)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_process(0)
