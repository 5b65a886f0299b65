"""A checkpoint that carries the completion marker but does not load never traps the job.

The real trainer (``fsdpmon.trainer.train.main``, one process, gloo) saves checkpoints; a shard of
the newest is truncated as a disk fault would; the next run renames it aside, says so in one line,
resumes from the older one and finishes. When none loads, it fails with one line, and a restart
fails at once on the note it left instead of retrying the same files or starting from scratch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from test_checkpoint import trained

from fsdpmon.errors import InputError
from fsdpmon.trainer.checkpoint import Checkpointer, TrainState
from fsdpmon.trainer.resume import FAILED_NOTE, resume_newest
from fsdpmon.trainer.train import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _train(ckpt: Path, steps: int) -> int:
    return main(["--model", "tiny", "--max-steps", str(steps), "--checkpoint-dir", str(ckpt),
                 "--checkpoint-every", "2", "--keep-checkpoints", "3", "--metrics-port", "0",
                 "--batch-size", "2", "--seq-len", "32"])


def _truncate_a_shard(step_dir: Path) -> None:
    shard = sorted(step_dir.glob("*.distcp"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
def test_damaged_newest_checkpoint_is_set_aside_and_the_older_one_resumed(tmp_path, caplog,
                                                                          capsys):
    ckpt = tmp_path / "ckpt"
    assert _train(ckpt, 4) == 0
    _truncate_a_shard(ckpt / "step_00000004")
    caplog.set_level(logging.INFO)
    assert _train(ckpt, 6) == 0, capsys.readouterr().err
    damage = [r.getMessage() for r in caplog.records if r.name == "fsdpmon.trainer.resume"]
    assert len(damage) == 1 and "step_00000004 does not load" in damage[0], damage
    assert "renamed to damaged-step_00000004" in damage[0], damage
    assert any("resumed from" in r.getMessage() and "step_00000002" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records][-5:]
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["damaged-step_00000004", "step_00000002", "step_00000004",
                     "step_00000006"], names  # step 4 saved again on the way to 6



def test_when_no_checkpoint_loads_one_line_and_a_restart_fails_at_once(tmp_path, monkeypatch):
    model, optim = trained(0)
    ckpt = Checkpointer(tmp_path, keep=3, rank=0)
    for step in (2, 4):
        _truncate_a_shard(ckpt.save(model, optim, TrainState(step, step, {})))
    with pytest.raises(InputError) as err:
        resume_newest(ckpt, model, optim)
    assert "none of the 2 complete checkpoints loads" in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
    assert (tmp_path / FAILED_NOTE).is_file()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted([FAILED_NOTE, "damaged-step_00000002", "damaged-step_00000004"]), kept

    def must_not_load(*args):
        raise AssertionError("a restart loaded again")

    monkeypatch.setattr(Checkpointer, "load", must_not_load)
    with pytest.raises(InputError, match="no checkpoint loaded last time"):
        resume_newest(ckpt, model, optim)
    assert sorted(p.name for p in tmp_path.iterdir()) == kept
