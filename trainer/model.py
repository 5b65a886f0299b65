"""The Llama 2 architecture: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention.

Parameter names follow Meta's reference code (``layers.N.attention.wq`` …); ``hf_weights`` maps
Hugging Face names onto them. Rotary embeddings use Meta's interleaved pairing, which is why the
HF loader un-permutes ``q_proj``/``k_proj``.

The model can be built on the meta device; ``init_weights`` then fills whatever (sharded) storage
the parameters were given, so a 70B model is never materialised whole on one rank.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.utils.checkpoint import checkpoint

from fsdpmon.trainer.shapes import FLAVOURS, ModelArgs

__all__ = ["FLAVOURS", "ModelArgs", "Transformer"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as the reference does, then return in the input dtype.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_tables(head_dim: int, max_seq_len: int, theta: float,
                device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (max_seq_len, head_dim // 2) for Meta-style interleaved rotary pairs."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, device=device).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive pairs (x0, x1) of the head dim; x is (batch, seq, heads, head_dim)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, self.n_heads, self.head_dim)
        k = self.wk(x).view(bsz, seq, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(bsz, seq, self.n_kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        repeats = self.n_heads // self.n_kv_heads
        if repeats > 1:  # grouped-query attention: each kv head serves `repeats` query heads
            k = k.repeat_interleave(repeats, dim=2)
            v = v.repeat_interleave(repeats, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        # Set by fsdpmon.trainer.parallel; kept inside the block so parameter names never change.
        self.activation_checkpointing = False

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._forward, x, cos, sin, use_reentrant=False)
        return self._forward(x, cos, sin)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.config = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        # Derived tables, never checkpointed; rebuilt by init_buffers after meta-device init.
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        if not self.output.weight.is_meta:
            self.init_buffers()

    def init_buffers(self, device: torch.device | None = None) -> None:
        device = device or self.output.weight.device
        cos, sin = rope_tables(self.config.head_dim, self.config.max_seq_len,
                               self.config.rope_theta, device)
        self.rope_cos, self.rope_sin = cos, sin

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Reference init: N(0, 0.02), output projections scaled by depth, norms at one.

        Values depend only on (seed, parameter name, row), never on how the parameters are
        sharded, so every world size starts from the same model for a seed.
        """
        std = 0.02
        depth_std = std / math.sqrt(2 * self.config.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
                fill_normal(param, depth_std, f"{seed}/{name}")
            else:
                fill_normal(param, std, f"{seed}/{name}")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.output(self.norm(h))


INIT_CHUNK_ROWS = 128


def local_rows(param: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """This rank's storage of ``param`` and the global rows it holds (FSDP2 shards dim 0)."""
    if not isinstance(param, DTensor):
        return param.data, 0, param.shape[0]
    local = param.to_local()
    _, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    return local, offset[0], offset[0] + local.shape[0]


def fill_normal(param: torch.Tensor, std: float, key: str) -> None:
    """N(0, std) drawn in fixed chunks of rows, each from its own generator seeded by
    (key, chunk): a rank draws only the chunks its shard overlaps, and gets the same values
    as any other sharding would."""
    local, start, stop = local_rows(param)
    for chunk in range(start // INIT_CHUNK_ROWS, -(-stop // INIT_CHUNK_ROWS)):
        first = chunk * INIT_CHUNK_ROWS
        last = min(first + INIT_CHUNK_ROWS, param.shape[0])
        digest = hashlib.blake2b(f"{key}/{chunk}".encode(), digest_size=8).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        values = torch.randn((last - first, *param.shape[1:]), generator=gen) * std
        lo, hi = max(first, start), min(last, stop)
        local[lo - start : hi - start].copy_(values[lo - first : hi - first])


def count_parameters(model: nn.Module) -> int:
    """Global parameter count (DTensor.numel() is the global size)."""
    return sum(p.numel() for p in model.parameters())
