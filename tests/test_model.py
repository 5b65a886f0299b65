"""The Llama model: shapes, causality, rotary, GQA, published sizes (built on meta)."""

from __future__ import annotations

import math

import pytest
import torch

from fsdpmon.trainer.model import (
    FLAVOURS,
    ModelArgs,
    Transformer,
    apply_rope,
    count_parameters,
    rope_tables,
)

SMALL = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=97, ffn_dim=64,
                  max_seq_len=64)


def small_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(SMALL)
    model.init_weights()
    return model


def test_logits_shape_and_config_exposed():
    model = small_model()
    logits = model(torch.randint(0, 97, (3, 10)))
    assert logits.shape == (3, 10, 97)
    assert model.config is SMALL and model.config.head_dim == 8


def test_causal_future_tokens_do_not_change_past_logits():
    model = small_model()
    tokens = torch.randint(0, 97, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 97
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_rope_preserves_norm_and_encodes_relative_position():
    cos, sin = rope_tables(8, 32, 10000.0)
    q = torch.randn(1, 32, 1, 8)
    k = torch.randn(1, 32, 1, 8)
    rq = apply_rope(q, cos, sin)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    # Same vectors at every position: the score depends only on the distance between them.
    qs, ks = q[:, :1].expand(1, 32, 1, 8), k[:, :1].expand(1, 32, 1, 8)
    rq, rk = apply_rope(qs, cos, sin), apply_rope(ks, cos, sin)
    s1 = (rq[0, 5, 0] * rk[0, 2, 0]).sum()
    s2 = (rq[0, 20, 0] * rk[0, 17, 0]).sum()
    torch.testing.assert_close(s1, s2, rtol=1e-5, atol=1e-5)


def test_gqa_equals_full_attention_with_repeated_kv_heads():
    gqa = small_model()
    full_args = SMALL.replace(n_kv_heads=SMALL.n_heads)
    full = Transformer(full_args)
    state = gqa.state_dict()
    hd = SMALL.head_dim
    for i in range(SMALL.n_layers):
        for name in ("wk", "wv"):
            key = f"layers.{i}.attention.{name}.weight"
            w = state[key].view(SMALL.n_kv_heads, hd, SMALL.dim)
            state[key] = w.repeat_interleave(2, dim=0).reshape(-1, SMALL.dim)
    full.load_state_dict(state)
    tokens = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens), full(tokens), rtol=1e-5, atol=1e-5)


def test_activation_checkpointing_gives_same_gradients():
    model = small_model()
    tokens = torch.randint(0, 97, (2, 9))
    model(tokens).sum().backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    for block in model.layers:
        block.activation_checkpointing = True
    model(tokens).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], msg=name)


@pytest.mark.parametrize(("name", "count"), [("llama2-7b", 6_738_415_616),
                                             ("llama2-13b", 13_015_864_320),
                                             ("llama2-70b", 68_976_648_192)])
def test_published_flavours_have_published_parameter_counts(name, count):
    """The exact counts of Meta's Llama 2 checkpoints (as Hugging Face's model cards list)."""
    with torch.device("meta"):
        model = Transformer(FLAVOURS[name])
    assert count_parameters(model) == count


def test_meta_build_then_materialise_has_finite_weights():
    with torch.device("meta"):
        model = Transformer(FLAVOURS["tiny"])
    model.to_empty(device="cpu")
    model.init_buffers(torch.device("cpu"))
    model.init_weights()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.isfinite(model(torch.randint(0, 512, (1, 16)))).all()


def test_init_is_reproducible_per_seed_with_the_reference_scale():
    a, b, c = Transformer(SMALL), Transformer(SMALL), Transformer(SMALL)
    a.init_weights(5)
    b.init_weights(5)
    c.init_weights(6)
    for (name, x), y, z in zip(a.state_dict().items(), b.state_dict().values(),
                               c.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
        assert name.endswith("norm.weight") or not torch.equal(x, z), name
    # The std of n normal draws is off the true one by about 1 / sqrt(2 (n - 1)) (relative
    # standard error): six of those bound it (the draws are seeded, so it is one fixed sample).
    def within(weight: torch.Tensor, std: float) -> None:
        n = weight.numel()
        assert weight.std().item() == pytest.approx(std, rel=6 / math.sqrt(2 * (n - 1))), n

    within(a.tok_embeddings.weight, 0.02)
    assert torch.equal(a.norm.weight, torch.ones(SMALL.dim))
    within(a.layers[0].attention.wo.weight, 0.02 / (2 * SMALL.n_layers) ** 0.5)
