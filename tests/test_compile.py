"""`--compile` without any launcher (a laptop's `python -m fsdpmon.trainer.train`): each
transformer block goes through torch.compile (inductor) with the monitor's collective wrapper
and step hooks in place, and the run ends with its step record.

One process on one core (inductor's compile workers pinned to one thread), so it is not marked
``slow``: tests/conftest.py runs it beside the ``alone`` tests, whose jobs it loads no more than
a unit test does. Cold, inductor's C++ compile dominates; its cache (in the system's temp
directory) makes a second run several times faster.
"""

from __future__ import annotations

import json
import sys

import pytest
from trainer_launch import run

pytestmark = pytest.mark.timeout(300)


def test_plain_single_process_with_per_block_compile(tmp_path):
    args = [sys.executable, "-m", "fsdpmon.trainer.train", "--model", "custom", "--n-layers", "1",
            "--max-steps", "3", "--log-every", "3", "--seq-len", "32", "--compile",
            "--metrics-port", "0", "--log-jsonl", str(tmp_path / "run.jsonl")]
    code, log = run(args, tmp_path / "out.txt", timeout=240,
                    TORCHINDUCTOR_COMPILE_THREADS="1")
    assert code == 0, log[-4000:]
    records = [json.loads(line) for line in (tmp_path / "run.rank0.jsonl").read_text().splitlines()
               if line.strip()]
    (record,) = [r for r in records if r["kind"] == "step"]
    assert record["world_size"] == 1 and record["step"] == 3, record
    assert "step 3/3" in log, log[-2000:]
