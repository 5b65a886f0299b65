"""FLOPs per token and the peak-FLOPs table behind MFU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from fsdpmon.monitor.flops import (
    ModelShape,
    flops_per_token,
    mfu,
    model_flops_per_token,
    model_shape,
    parameter_counts,
    peak_flops_for,
)
from fsdpmon.trainer.model import FLAVOURS, Transformer


@pytest.mark.parametrize(("name", "peak"), [
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100 80GB PCIe", 312e12),
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA H800", 989e12),
    ("NVIDIA A800-SXM4-80GB", 312e12),
    ("NVIDIA GH200 480GB", 989e12),
    ("NVIDIA B200", 2.25e15),
    ("NVIDIA L40S", 362e12),
    ("NVIDIA L40", 181e12),
    ("NVIDIA L4", 121e12),
    ("NVIDIA A10", 125e12),
])
def test_known_devices_have_their_dense_bf16_peak(name, peak):
    assert peak_flops_for(name) == peak


@pytest.mark.parametrize("name", ["NVIDIA A10G", "Tesla T4", "SIMULATED", "cpu", "", None,
                                  "NVIDIA GeForce RTX 4090"])
def test_unknown_devices_have_no_peak_and_so_no_mfu(name):
    assert peak_flops_for(name) is None
    assert mfu(1000.0, 1e9, peak_flops_for(name)) is None


def test_mfu_is_achieved_over_peak():
    assert mfu(2000.0, 1e9, 4e12) == 0.5  # 2e12 / 4e12: every figure exact in binary
    assert mfu(1.0, 0.5, 0.5) == 1.0  # small figures are figures all the same
    # no peak (0: unknown) or no FLOPs per token (0: no model to count): no MFU, not 0 or inf
    assert mfu(2000.0, 1e9, 0.0) is None and mfu(2000.0, 0.0, 4e12) is None


def test_formula_terms():
    shape = ModelShape(n_layers=2, n_heads=4, head_dim=16)
    assert flops_per_token(1000, 200, shape, 128) == 6 * 800 + 12 * 2 * 4 * 16 * 128
    assert flops_per_token(1000, 200, None, 128) == 6 * 800


def test_shape_from_our_model_args_and_from_hf_config():
    ours = model_shape(FLAVOURS["llama2-7b"])
    assert ours == ModelShape(n_layers=32, n_heads=32, head_dim=128)
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaConfig(hidden_size=256, num_hidden_layers=3, num_attention_heads=8,
                                  num_key_value_heads=2, intermediate_size=512)
    assert model_shape(hf) == ModelShape(n_layers=3, n_heads=8, head_dim=32)
    assert model_shape(object()) is None


def test_shape_from_whatever_the_config_names():
    """head_dim when the config gives it (not always dim / heads), else dim // heads; no shape
    without layers and heads, or without any size."""
    from types import SimpleNamespace as Config

    assert model_shape(Config(n_layers=2, n_heads=8, dim=256, head_dim=64)) == ModelShape(2, 8, 64)
    assert model_shape(Config(n_layers=2, n_heads=4, dim=64)) == ModelShape(2, 4, 16)
    assert model_shape(Config(n_layers=2, n_heads=4)) is None
    assert model_shape(Config(n_layers=2, dim=64)) is None
    assert model_shape(Config(n_heads=4, dim=64)) is None


def test_embedding_parameters_are_counted_separately():
    model = Transformer(FLAVOURS["tiny"])
    total, embedding = parameter_counts(model)
    args = FLAVOURS["tiny"]
    assert embedding == args.vocab_size * args.dim
    assert total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("seq_len", [64, 512])
def test_formula_agrees_with_torch_flop_counter_on_the_tiny_model(seq_len):
    """The counter counts matmuls: each Linear's n weights cost 2n FLOPs a token forward and
    4n backward (input and weight gradients), and the attention's two batched matmuls
    12·layers·heads·head_dim·seq (forward and backward; the math backend computes the full
    S x S scores, as the formula assumes). The formula's 6·(N - N_embedding) also counts the
    weights no matmul multiplies (the norms'), so it is above the count by exactly 6 x those
    weights per token, in integers."""
    torch.manual_seed(0)
    model = Transformer(FLAVOURS["tiny"])
    batch = 2
    tokens = torch.randint(0, FLAVOURS["tiny"].vocab_size, (batch, seq_len + 1))
    # The math backend runs attention as plain matmuls the counter sees (CPU's fused kernel
    # has no FLOP formula).
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
    multiplied = {id(p) for m in model.modules() if isinstance(m, (nn.Linear, nn.Embedding))
                  for p in m.parameters(recurse=False)}
    unmultiplied = sum(p.numel() for p in model.parameters() if id(p) not in multiplied)
    assert unmultiplied > 0, "the tiny model has norm weights"
    counted = batch * seq_len
    formula = model_flops_per_token(model, seq_len) * counted
    assert formula == int(formula), formula  # integer terms: the float holds them exactly
    gap = int(formula) - counter.get_total_flops()
    assert gap == 6 * unmultiplied * counted, (
        f"formula - counter = {gap} FLOPs, expected 6 x {unmultiplied} norm weights x "
        f"{counted} tokens = {6 * unmultiplied * counted}")
