"""HF Llama checkpoints: config mapping, the rotary un-permutation, loading, clear errors.

The 2-rank sharded load vs transformers' logits is in tests/test_train_distributed.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from fsdpmon.errors import InputError
from fsdpmon.trainer.hf_weights import (
    load_hf_weights,
    name_map,
    read_config,
    unpermute_rotary,
    unpermuted_rows,
)
from fsdpmon.trainer.model import Transformer

transformers = pytest.importorskip("transformers")


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers' convert_llama_weights_to_hf.permute, verbatim in effect."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def test_unpermute_inverts_the_hf_conversion():
    w = torch.randn(4 * 8, 16)
    assert torch.equal(unpermute_rotary(hf_permute(w, 4), 4), w)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf")
    config = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=48, vocab_size=71, max_position_embeddings=64, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def test_config_maps_to_model_args(hf_dir):
    args, _ = read_config(hf_dir[0])
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.ffn_dim,
            args.vocab_size, args.max_seq_len) == (32, 2, 4, 1, 48, 71, 64)
    assert len(name_map(args)) == 3 + 9 * 2


def test_plain_model_loads_and_matches_transformers(hf_dir):
    path, hf_model = hf_dir
    args, _ = read_config(path)
    model = Transformer(args)
    load_hf_weights(model, path)
    tokens = torch.randint(0, 71, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf_model(tokens).logits, rtol=0, atol=1e-5)


def test_errors_name_the_flag_and_the_problem(hf_dir, tmp_path):
    path, _ = hf_dir
    raw = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "model_type": "gpt2"}))
    with pytest.raises(InputError, match=r"--hf-checkpoint: .*model_type 'gpt2'"):
        read_config(tmp_path)
    args, _ = read_config(path)
    bigger = Transformer(args.replace(vocab_size=72))
    expected = r"--hf-checkpoint: \S+ has shape \(71, 32\), the model expects \(72, 32\)"
    with pytest.raises(InputError, match=expected):
        load_hf_weights(bigger, path)


@pytest.mark.parametrize(("start", "stop"), [(0, 32), (5, 27), (8, 16), (9, 9), (31, 32)])
def test_shard_rows_of_a_permuted_weight_read_only_the_heads_they_touch(start, stop):
    full = torch.randn(32, 4)  # 4 heads of head_dim 8, as stored by HF (permuted)
    reads = []

    def read(a: int, b: int) -> torch.Tensor:
        reads.append((a, b))
        return full[a:b]

    got = unpermuted_rows(read, 8, start, stop)
    torch.testing.assert_close(got, unpermute_rotary(full, 4)[start:stop])
    ((a, b),) = reads
    assert b - a <= stop - start + 14  # at most the rest of the two heads it cuts
