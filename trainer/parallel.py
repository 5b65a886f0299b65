"""Distributed setup: process group from the launcher's environment, and the FSDP2 model.

Works under torchrun (RANK/LOCAL_RANK/WORLD_SIZE/MASTER_*, TORCHELASTIC_RESTART_COUNT), under
the Kubeflow training operator (which sets the same variables, or PET_* for torchrun to read),
and as a plain single process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
)

from fsdpmon.distenv import DistEnv
from fsdpmon.errors import ConfigError
from fsdpmon.trainer.config import ParallelConfig
from fsdpmon.trainer.model import ModelArgs, Transformer

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def choose_device(env: DistEnv) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(env: DistEnv, device: torch.device) -> DeviceMesh:
    """nccl on CUDA, gloo on CPU; an explicit 1-D mesh of the device type (FSDP2 needs it)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        store = _attempt_store(env)
        rendezvous = {"store": store} if store is not None else {"init_method": _init_method()}
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size, **rendezvous)
    return init_device_mesh(device.type, (env.world_size,), mesh_dim_names=("dp",))


def _init_method() -> str:
    """env:// where a launcher set MASTER_*, else a loopback rendezvous for a plain process."""
    if "MASTER_ADDR" in os.environ:
        return "env://"
    addr = os.environ.get("PET_MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("PET_MASTER_PORT") or str(_free_port())
    return f"tcp://{addr}:{port}"


def _attempt_store(env: DistEnv) -> dist.Store | None:
    """Under torchrun, a store whose keys are private to this restart attempt.

    torchrun keeps one TCPStore across restarts; without a per-attempt prefix a restarted
    rank can read the dead attempt's gloo addresses and hang or fail in connectFullMesh.
    """
    if "TORCHELASTIC_RESTART_COUNT" not in os.environ:
        return None  # default env:// rendezvous
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          env.world_size, is_master=not agent_store and env.rank == 0,
                          timeout=timedelta(minutes=10), multi_tenant=not agent_store)
    return dist.PrefixStore(f"fsdpmon/attempt_{env.restart_count}", store)


def param_dtype(cfg: ParallelConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "bf16" and device.type != "cuda":
        raise ConfigError("--dtype", "bf16 needs CUDA (gloo cannot reduce bf16); use fp32 on CPU")
    if cfg.dtype == "bf16" or (cfg.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def build_fsdp_model(args: ModelArgs, cfg: ParallelConfig, mesh: DeviceMesh,
                     device: torch.device, seed: int = 0) -> Transformer:
    """Build on meta, shard every block and the root, then materialise only the local shards.

    Parameters keep random init here; ``hf_weights.load`` overwrites them when asked.
    """
    if cfg.cpu_offload and device.type != "cuda":
        raise ConfigError("--cpu-offload", "only meaningful on CUDA (on CPU everything is there)")
    with torch.device("meta"):
        model = Transformer(args)
    dtype = param_dtype(cfg, device)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if cfg.cpu_offload else None
    kwargs = {"mesh": mesh, "mp_policy": mp}
    if offload is not None:
        kwargs["offload_policy"] = offload
    for block in model.layers:
        block.activation_checkpointing = cfg.activation_checkpointing
        if cfg.compile:
            block.compile()
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    # Loss is normalised by the global token count, so gradients must be summed, not averaged
    # (this also sidesteps the gloo averaging trap noted in DESIGN.md). Plain SUM collectives:
    # a divide factor alone would ask gloo for PREMUL_SUM, which it lacks.
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu" if cfg.cpu_offload else device)
    model.init_buffers(device)
    model.init_weights(seed)
    return model


def exit_process(code: int) -> None:
    """Flush and leave without interpreter finalisation.

    After a clean ``destroy_process_group`` on every rank, finalisation still sometimes aborts a
    gloo rank ("terminate called without an active exception": a C++ thread object destroyed
    while joinable), which torchrun reports as a failed job. Everything worth keeping is written
    by then, so skip finalisation.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
