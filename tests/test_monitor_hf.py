"""The HF TrainerCallback adapter, driven by a real (tiny) transformers.Trainer run on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from proc_tree import kill_tree
from support import free_port, rounded

transformers = pytest.importorskip("transformers")

from fsdpmon.monitor import MonitorConfig  # noqa: E402
from fsdpmon.monitor.hf import FsdpmonCallback  # noqa: E402

SEQ, BATCH, STEPS, LOG_EVERY = 32, 2, 6, 2
SERVER_START_S = 60  # a Python process importing fsdpmon, on a 2-core machine under a full suite


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def test_hf_trainer_run_is_monitored(tmp_path):
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=SEQ)
    model = transformers.LlamaForCausalLM(cfg)
    port = free_port()
    callback = FsdpmonCallback(
        MonitorConfig(port=port, listen_address="127.0.0.1", job_name="hf-test",
                      jsonl_path=str(tmp_path / "hf.jsonl"), state_dir=str(tmp_path / "state")),
        seq_len=SEQ)
    scraped: list[str] = []
    callback_scrape = _ScrapeOnLog(port, scraped)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=BATCH,
        logging_steps=LOG_EVERY, save_strategy="no", report_to=[], use_cpu=True,
        disable_tqdm=True, learning_rate=1e-3)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens(64, 128),
                                   callbacks=[callback, callback_scrape])
    trainer.train()

    lines = [json.loads(x) for x in (tmp_path / "hf.rank0.jsonl").read_text().splitlines()]
    run, steps = lines[0], [r for r in lines[1:] if r["kind"] == "step"]
    assert run["kind"] == "run" and run["model"] == "llama"
    # 6·(N − N_emb) + 12·L·H·hd·S with the HF config's names
    assert run["flops_per_token"] > 12 * 2 * 4 * 8 * SEQ
    assert [s["step"] for s in steps] == [2, 4, 6]
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [s["loss"] for s in steps] == rounded([h["loss"] for h in history])
    assert all(s["tokens_per_second"] > 0 for s in steps)
    assert steps[-1]["tokens_total"] == STEPS * BATCH * SEQ
    assert steps[-1]["phase_seconds"]["optimizer"] > 0
    # The endpoint served the run while it trained.
    body = scraped[-1]
    assert 'fsdpmon_train_loss{job_name="hf-test",local_rank="0",rank="0"}' in body
    assert "fsdpmon_train_steps_total" in body


class _ScrapeOnLog(transformers.TrainerCallback):
    """Scrapes the endpoint after each monitor log step (registered after the monitor)."""

    def __init__(self, port: int, out: list[str]) -> None:
        self.port, self.out = port, out

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            # The pod's server is a process of its own (monitor/spawn.py): on a loaded machine
            # it may still be starting at the first log step, so poll until it answers.
            url = f"http://127.0.0.1:{self.port}/metrics"
            deadline = time.monotonic() + SERVER_START_S
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=5) as resp:
                        self.out.append(resp.read().decode())
                    return
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


@pytest.mark.slow
def test_two_rank_hf_run_gathers_job_figures(tmp_path):
    """HF Trainer under torchrun (DDP over gloo): every rank joins the log step's gather."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FSDPMON_PORT": "0",
           "FSDPMON_JOB_NAME": "hf-ddp", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node",
         "2", str(root / "tests" / "hf_monitor_job.py"), str(tmp_path)],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        # The job dumps its stacks and exits by itself if it hangs (faulthandler).
        output, _ = proc.communicate(timeout=150)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, output.decode(errors="replace")[-3000:]
    ranks = [[r for r in map(json.loads, (tmp_path / f"hf.rank{rank}.jsonl").read_text(
        ).splitlines()) if r["kind"] in ("run", "step")] for rank in (0, 1)]  # no end record
    for rank, lines in enumerate(ranks):
        assert lines[0]["world_size"] == 2 and lines[0]["rank"] == rank
        assert [s["step"] for s in lines[1:]] == [2, 4, 6]
    job = ranks[0][-1]["job"]
    assert job["world_size"] == 2
    # HF logs the loss averaged over ranks, so both ranks report the same value.
    assert job["loss_mean"] == rounded(ranks[1][-1]["loss"])
    assert "job" not in ranks[1][-1]
