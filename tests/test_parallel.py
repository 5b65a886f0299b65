"""Distributed setup: launcher environments, dtype/offload rules, the FSDP2 model in one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from fsdpmon.errors import ConfigError
from fsdpmon.trainer.config import ParallelConfig
from fsdpmon.trainer.model import FLAVOURS
from fsdpmon.trainer.parallel import DistEnv, build_fsdp_model, init_distributed, param_dtype

LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "PET_NPROC_PER_NODE",
               "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_USE_AGENT_STORE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_torchrun_environment(clean_env):
    for name, value in {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16",
                        "LOCAL_WORLD_SIZE": "8", "TORCHELASTIC_RESTART_COUNT": "2"}.items():
        clean_env.setenv(name, value)
    env = DistEnv.from_env()
    assert (env.rank, env.local_rank, env.world_size, env.nodes, env.restart_count) == (
        9, 1, 16, 2, 2)


def test_kubeflow_pod_without_torchrun_uses_pet_nproc(clean_env):
    # The training operator sets RANK/WORLD_SIZE per pod and PET_* for torchrun.
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "1"}.items():
        clean_env.setenv(name, value)
    env = DistEnv.from_env()
    assert (env.rank, env.world_size, env.local_world_size, env.nodes) == (3, 4, 1, 4)


def test_plain_process_defaults_and_bad_values(clean_env):
    assert DistEnv.from_env() == DistEnv(0, 0, 1, 1, 0)
    clean_env.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        DistEnv.from_env()


def test_dtype_and_offload_rules_on_cpu():
    cpu = torch.device("cpu")
    assert param_dtype(ParallelConfig(), cpu) == torch.float32
    assert param_dtype(ParallelConfig(), torch.device("cuda", 0)) == torch.bfloat16
    with pytest.raises(ConfigError, match="--dtype"):
        param_dtype(ParallelConfig(dtype="bf16"), cpu)


def test_single_process_fsdp_model_is_sharded_per_block_and_root(clean_env):
    mesh = init_distributed(DistEnv.from_env(), torch.device("cpu"))
    try:
        with pytest.raises(ConfigError, match="--cpu-offload"):
            build_fsdp_model(FLAVOURS["tiny"], ParallelConfig(cpu_offload=True), mesh,
                             torch.device("cpu"))
        torch.manual_seed(0)
        model = build_fsdp_model(FLAVOURS["tiny"], ParallelConfig(activation_checkpointing=True),
                                 mesh, torch.device("cpu"))
        assert isinstance(model, FSDPModule)
        assert all(isinstance(b, FSDPModule) and b.activation_checkpointing
                   for b in model.layers)
        assert all(isinstance(p, DTensor) and p.dtype == torch.float32
                   for p in model.parameters())
        loss = model(torch.randint(0, 512, (2, 16))).float().mean()
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_mixed_precision_bf16_compute_fp32_master_weights_and_grads(clean_env):
    device = torch.device("cuda", 0)
    mesh = init_distributed(DistEnv.from_env(), device)
    try:
        model = build_fsdp_model(FLAVOURS["tiny"], ParallelConfig(), mesh, device)
        logits = model(torch.randint(0, 512, (2, 16), device=device))
        assert logits.dtype == torch.bfloat16
        logits.float().mean().backward()
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32
                   for p in model.parameters())
    finally:
        dist.destroy_process_group()


def test_one_reading_of_the_launcher_environment_for_trainer_and_monitor(clean_env):
    """The monitor's topology and the trainer's DistEnv are the same reading (fsdpmon.distenv)."""
    from fsdpmon.monitor.gather import topology
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "PET_NPROC_PER_NODE": "2",
                        "TORCHELASTIC_RESTART_COUNT": "1"}.items():
        clean_env.setenv(name, value)
    assert topology() == DistEnv.from_env() == DistEnv(3, 0, 4, 2, 1)
    clean_env.setenv("LOCAL_RANK", "")  # empty counts as unset
    assert DistEnv.from_env().local_rank == 0
