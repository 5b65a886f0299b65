"""Checkpoints: atomic commit, resume picks only complete ones, keep-last-K, exact round trip.

Single process (DCP without a process group); the 2-rank crash and kill -9 cases are in
tests/test_e2e_training.py.
"""

from __future__ import annotations

import pytest
import torch

from fsdpmon.trainer.checkpoint import (
    MARKER,
    Checkpointer,
    TrainState,
    complete_checkpoints,
)
from fsdpmon.trainer.model import ModelArgs, Transformer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ARGS = ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=31, ffn_dim=24,
                 max_seq_len=16)


def trained(seed: int) -> tuple[Transformer, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = Transformer(ARGS)
    model.init_weights()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 31, (2, 8))).sum().backward()
    optim.step()
    return model, optim


def test_round_trip_restores_model_optimizer_and_train_state(tmp_path):
    model, optim = trained(0)
    ckpt = Checkpointer(tmp_path, keep=2, rank=0)
    path = ckpt.save(model, optim, TrainState(step=7, data_position=56, scheduler={"x": 1}))
    assert path.name == "step_00000007" and (path / MARKER).is_file()
    other, other_optim = trained(1)
    state = ckpt.load(path, other, other_optim)
    assert (state.step, state.data_position, state.scheduler) == (7, 56, {"x": 1})
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(optim.state[p]["exp_avg"], other_optim.state[q]["exp_avg"])


def test_keeps_only_the_last_k_complete_checkpoints(tmp_path):
    model, optim = trained(0)
    ckpt = Checkpointer(tmp_path, keep=2, rank=0)
    for step in (10, 20, 30):
        ckpt.save(model, optim, TrainState(step, step * 4, {}))
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [20, 30]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000020", "step_00000030"]


def test_resume_ignores_directories_without_the_marker(tmp_path):
    model, optim = trained(0)
    ckpt = Checkpointer(tmp_path, keep=5, rank=0)
    ckpt.save(model, optim, TrainState(10, 0, {}))
    # A save that died after DCP wrote everything but before the commit ...
    newer = ckpt.save(model, optim, TrainState(20, 0, {}))
    (newer / MARKER).unlink()
    # ... and a temp dir of one that died earlier still.
    (tmp_path / ".tmp-step_00000030").mkdir()
    assert complete_checkpoints(tmp_path) == [(10, tmp_path / "step_00000010")]
    ckpt.remove_incomplete()
    assert not (tmp_path / ".tmp-step_00000030").exists()
    assert complete_checkpoints(tmp_path / "missing") == []
