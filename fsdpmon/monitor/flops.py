"""Model FLOPs per token and the peak-FLOPs table that MFU divides by.

FLOPs per trained token (forward + backward) = 6·(N − N_embedding) + 12·layers·heads·head_dim·seq
(the PaLM / torchtitan estimate: the dense matmuls plus the attention scores and weighted sum).
An unknown device has no peak figure, so it gets no MFU at all rather than a wrong one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch import nn

# Dense (no sparsity) BF16 tensor-core peak FLOP/s per GPU, from NVIDIA's data sheets.
# Order matters: the first pattern that matches the device name wins.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    (r"\bB200\b", 2.25e15),
    (r"\bGH200\b", 989e12),
    (r"\bH200\b", 989e12),
    (r"\bH100\b.*\bPCIe\b", 756e12),
    (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b", 989e12),  # SXM: "NVIDIA H100 80GB HBM3"
    (r"\bH800\b", 989e12),
    (r"\bA100\b", 312e12),
    (r"\bA800\b", 312e12),
    (r"\bL40S\b", 362e12),
    (r"\bL40\b", 181e12),
    (r"\bL4\b", 121e12),
    (r"\bA10\b", 125e12),  # A10 only; the AWS A10G runs lower clocks and is left unknown
)


def peak_flops_for(device_name: str | None) -> float | None:
    """Peak dense BF16 FLOP/s for a ``torch.cuda.get_device_name`` string, or None if unknown."""
    if not device_name:
        return None
    for pattern, flops in PEAK_BF16_FLOPS:
        if re.search(pattern, device_name):
            return flops
    return None


@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    n_heads: int
    head_dim: int


def model_shape(config: Any) -> ModelShape | None:
    """Layers, query heads and head size from our ModelArgs or a Hugging Face config."""
    if config is None:
        return None
    layers = _first_attr(config, "n_layers", "num_hidden_layers")
    heads = _first_attr(config, "n_heads", "num_attention_heads")
    dim = _first_attr(config, "dim", "hidden_size")
    head_dim = _first_attr(config, "head_dim")
    if layers is None or heads is None:
        return None
    if head_dim is None:
        if dim is None:
            return None
        head_dim = dim // heads
    return ModelShape(int(layers), int(heads), int(head_dim))


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(all parameters, embedding parameters), global sizes (DTensor.numel() is global)."""
    total = sum(p.numel() for p in model.parameters())
    embedding = sum(
        p.numel()
        for module in model.modules()
        if isinstance(module, nn.Embedding)
        for p in module.parameters(recurse=False)
    )
    return total, embedding


def flops_per_token(n_params: int, n_embedding: int, shape: ModelShape | None,
                    seq_len: int) -> float:
    """Training FLOPs per token; without a known shape the attention term is left out."""
    dense = 6.0 * (n_params - n_embedding)
    if shape is None:
        return dense
    return dense + 12.0 * shape.n_layers * shape.n_heads * shape.head_dim * seq_len


def model_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """FLOPs per token for a model exposing ``.config`` (ours or Hugging Face's)."""
    total, embedding = parameter_counts(model)
    return flops_per_token(total, embedding, model_shape(getattr(model, "config", None)), seq_len)


def mfu(tokens_per_second: float, flops_per_token_: float, peak: float | None) -> float | None:
    if peak is None or peak <= 0 or flops_per_token_ <= 0:
        return None
    return tokens_per_second * flops_per_token_ / peak


def _first_attr(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None and not callable(value):
            return value
    return None
