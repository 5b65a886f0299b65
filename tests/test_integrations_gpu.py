"""The libraries' real FSDP modes, which refuse CPU (Lightning's FSDPStrategy: "requires a GPU
accelerator"; Accelerate ignores its FSDP plugin without an accelerator), run where a CUDA GPU
is present: each example on every local GPU, monitored; skipped elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize(("example", "library", "mode"), [
    ("lightning_fsdp.py", "lightning", "FSDPStrategy"),
    ("accelerate_fsdp.py", "accelerate", "DistributedType.FSDP"),
])
def test_real_fsdp_mode_on_gpus_is_monitored(tmp_path, example, library, mode):
    pytest.importorskip(library)
    gpus = torch.cuda.device_count()
    extra = ["--devices", str(gpus)] if library == "lightning" else []
    env = {**os.environ, "FSDPMON_PORT": "0", "FSDPMON_JSONL": str(tmp_path / "run.jsonl"),
           "FSDPMON_LOG_INTERVAL": "5"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(gpus), str(REPO / "examples" / example), "--max-steps", "20", *extra],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "run.rank0.jsonl").read_text().splitlines()]
    run, steps = lines[0], [r for r in lines if r["kind"] == "step"]
    assert run["device"].startswith("cuda"), run
    assert mode in json.dumps(run["config"]) or mode in done.stdout, (run, done.stdout[-2000:])
    assert [s["step"] for s in steps] == [5, 10, 15, 20]
    if gpus > 1:  # FSDP's collectives seen by the wrapper, timed with CUDA events
        assert all(s["collective_calls"] > 0 for s in steps), steps
