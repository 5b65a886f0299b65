"""Llama model shapes: the architecture's hyperparameters and the published flavours.

Kept free of torch so that the trainer's command line (fsdpmon.trainer.config) can be parsed and
checked where torch is not installed: `fsdpmon manifests` validates `--train-arg` with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 4096

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def replace(self, **changes: object) -> ModelArgs:
        return dataclasses.replace(self, **changes)


# Published Llama 2 hyperparameters (Touvron et al. 2023; the HF config.json of each release).
FLAVOURS: dict[str, ModelArgs] = {
    "tiny": ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, ffn_dim=176,
                      max_seq_len=1024),
    "llama2-7b": ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, vocab_size=32000,
                           ffn_dim=11008),
    "llama2-13b": ModelArgs(dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, vocab_size=32000,
                            ffn_dim=13824),
    "llama2-70b": ModelArgs(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=32000,
                            ffn_dim=28672),
}
# "custom" starts from tiny's shape; every field can be overridden from the command line.
FLAVOURS["custom"] = FLAVOURS["tiny"]
