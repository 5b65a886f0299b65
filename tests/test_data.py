"""Data: synthetic and packed sources, per-rank shares, determinism, resume, tokenizers."""

from __future__ import annotations

import json

import pytest
import torch

from fsdpmon.errors import ConfigError, InputError
from fsdpmon.trainer.data import (
    BatchLoader,
    PackedSource,
    SyntheticSource,
    build_source,
    load_tokenizer,
    tokenize_files,
)


def batches(loader: BatchLoader, n: int) -> list[torch.Tensor]:
    return [next(loader)[0] for _ in range(n)]


def test_synthetic_is_deterministic_per_seed_and_targets_are_shifted_inputs():
    a = BatchLoader(SyntheticSource(100, 16, seed=1), 3, rank=0, world_size=1)
    b = BatchLoader(SyntheticSource(100, 16, seed=1), 3, rank=0, world_size=1)
    c = BatchLoader(SyntheticSource(100, 16, seed=2), 3, rank=0, world_size=1)
    inputs, targets = next(a)
    assert inputs.shape == targets.shape == (3, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert torch.equal(inputs, next(b)[0])
    assert not torch.equal(next(a)[0], next(c)[0])
    assert int(inputs.max()) < 100


def test_ranks_get_disjoint_shares_that_make_up_the_single_process_batch():
    source = SyntheticSource(1000, 8, seed=0)
    whole = BatchLoader(source, 4, rank=0, world_size=1)
    r0 = BatchLoader(source, 2, rank=0, world_size=2)
    r1 = BatchLoader(source, 2, rank=1, world_size=2)
    for _ in range(3):
        torch.testing.assert_close(torch.cat([next(r0)[0], next(r1)[0]]), next(whole)[0])


def test_resume_from_saved_position_continues_the_same_stream():
    source = SyntheticSource(1000, 8, seed=0)
    first = BatchLoader(source, 2, rank=1, world_size=2)
    batches(first, 5)
    state = first.state_dict()
    expected = batches(first, 3)
    resumed = BatchLoader(source, 2, rank=1, world_size=2)
    resumed.load_state_dict(state)
    for got, want in zip(batches(resumed, 3), expected, strict=True):
        assert torch.equal(got, want)


def test_packed_source_windows_cover_the_stream_and_reshuffle_each_epoch():
    source = PackedSource(torch.arange(201), seq_len=10, seed=3)
    assert len(source) == 20
    epoch0 = [source.sample(i) for i in range(20)]
    assert sorted(int(s[0]) for s in epoch0) == list(range(0, 200, 10))
    assert all(torch.equal(s, torch.arange(int(s[0]), int(s[0]) + 11)) for s in epoch0)
    epoch1 = [int(source.sample(i)[0]) for i in range(20, 40)]
    assert sorted(epoch1) == list(range(0, 200, 10))
    assert epoch1 != [int(s[0]) for s in epoch0]


def test_text_and_jsonl_files_with_byte_fallback(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "wörld"}) + "\n\n")
    tokens = tokenize_files(str(tmp_path), load_tokenizer(None))
    assert bytes(tokens.tolist()) == "hellowörld".encode()


def test_hf_tokenizer_json_from_a_local_directory(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"</s>": 0, "[UNK]": 1, "hello": 2, "world": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "corpus.txt").write_text("hello world hello")
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.vocab_size == 4 and loaded.eos_id == 0
    tokens = tokenize_files(str(tmp_path / "corpus.txt"), loaded)
    assert tokens.tolist() == [2, 3, 2, 0]


def test_bad_inputs_name_the_flag(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(InputError, match=r"--data: .*bad.jsonl:2"):
        build_source(str(tmp_path / "bad.jsonl"), None, 512, 4, 0)
    (tmp_path / "short.txt").write_text("ab")
    with pytest.raises(InputError, match="--data: only 2 tokens"):
        build_source(str(tmp_path / "short.txt"), None, 512, 8, 0)
    with pytest.raises(ConfigError, match="--tokenizer"):
        build_source(str(tmp_path / "short.txt"), None, 100, 1, 0)  # 256 bytes > 100
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="--data: no"):
        build_source(str(tmp_path / "empty"), None, 512, 4, 0)
