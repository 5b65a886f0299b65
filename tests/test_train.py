"""The training loop's pure parts: LR schedule, console line, optimiser groups, clipping."""

from __future__ import annotations

import itertools

import pytest
import torch
from support import rounded

from fsdpmon.trainer.config import parse_config
from fsdpmon.trainer.loop import build_optimizer, clip_gradients, console_line, lr_factor
from fsdpmon.trainer.model import ModelArgs, Transformer


def test_warmup_then_cosine_to_the_floor():
    factors = [lr_factor(s, warmup=4, total=20, min_ratio=0.1) for s in range(25)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(factors[4:21]))
    assert factors[20] == rounded(0.1) and factors[24] == rounded(0.1)
    assert lr_factor(12, 4, 20, 0.0) == rounded(0.5)


def test_norm_weights_get_no_weight_decay_and_clipping_caps_the_norm():
    model = Transformer(ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=2, vocab_size=11,
                                  ffn_dim=8, max_seq_len=8))
    optim, sched = build_optimizer(model, parse_config(["--weight-decay", "0.2"]))
    decay, no_decay = optim.param_groups
    assert decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 1 for p in no_decay["params"]) and len(no_decay["params"]) == 3
    for p in model.parameters():
        p.grad = torch.full_like(p, 10.0)
    before = clip_gradients(model, max_norm=1.0)
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    # torch scales by max_norm / (norm + 1e-6): 1e-6 / norm short of 1; and the float32 sums
    # of n squares behind each norm round by at most n x float32's epsilon
    n = sum(p.numel() for p in model.parameters())
    tolerance = 1e-6 / float(before) + 2 * n * torch.finfo(torch.float32).eps
    assert before > 100 and after.item() == pytest.approx(1.0, rel=tolerance), tolerance
    assert sched.get_last_lr()[0] == rounded(3e-4)


def test_console_line_prefers_the_job_mean_loss(capsys):
    emit = console_line(total_steps=30)
    emit({"step": 10, "loss": 2.0, "lr": 3e-4, "grad_norm": 0.5, "tokens_per_second": 12345.6,
          "step_time_s": 0.0421, "peak_memory_bytes": 3 * 2**20, "job": {"loss_mean": 1.5}})
    line = capsys.readouterr().out.strip()
    assert line == ("step 10/30 | loss 1.5000 | lr 3.00e-04 | grad_norm 0.500 | "
                    "tok/s 12,346 | step 0.042s | mem 3 MiB")
