"""End to end under real torchrun with 2 CPU ranks: training, JSONL logs, and recovery.

Three runs of the same 30-step job (same seed), side by side (the state compared is exact
whatever the timing, so they share one start-up's wait): an uninterrupted reference; one whose
rank 1 is killed with SIGKILL from outside at step 15 under ``--max-restarts 1``; one whose last
rank dies in the middle of the step-20 checkpoint save. Both faulty runs must resume from the
step-10 checkpoint and end with exactly the reference's model and optimiser state.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from trainer_launch import TORCHRUN, child_env, launched, run, torchrun_args

from fsdpmon.faultspec import ENV_VAR as FAULT
from fsdpmon.trainer.checkpoint import MARKER, complete_checkpoints

pytestmark = pytest.mark.slow

SECRET = "hf_e2eSecretTokenValue123"
STEPS = 30
# Three 2-rank jobs share the cores: each bound is twice what one job alone had (120 s).
RUN_TIMEOUT_S = 240


def job_args(workdir: Path) -> list[str]:
    return ["-m", "fsdpmon.trainer.train", "--model", "tiny", "--max-steps", str(STEPS),
            "--batch-size", "4", "--seq-len", "64", "--lr", "1e-2", "--warmup-steps", "3",
            "--seed", "7", "--log-every", "5", "--metrics-port", "0",
            "--checkpoint-dir", str(workdir / "ckpt"), "--checkpoint-every", "10",
            "--keep-checkpoints", "3", "--log-jsonl", str(workdir / "logs" / "run.jsonl"),
            "--job-name", "e2e"]


def _reference(work: Path) -> dict:
    code, log = run(torchrun_args(2, job_args(work)), work / "out.txt", timeout=RUN_TIMEOUT_S,
                    HF_TOKEN=SECRET, FSDPMON_STATE_DIR=str(work / "state"))
    assert code == 0, log[-4000:]
    return {"work": work, "log": log}


def _killed_at_step_15(work: Path) -> tuple[int, str]:
    """Rank 1 paused at step 15 and SIGKILLed there from outside; (exit code, output)."""
    pause_dir = work / "pause"
    pause_dir.mkdir()
    env = child_env(**{FAULT: f"pause:at_step=15,dir={pause_dir}"},
                    FSDPMON_STATE_DIR=str(work / "state"))
    args = torchrun_args(2, job_args(work), max_restarts=1)
    with launched(args, env, work / "out.txt") as proc:
        wait_for(pause_dir / "pause.rank1", timeout=RUN_TIMEOUT_S)
        os.kill(int((pause_dir / "pause.rank1").read_text()), signal.SIGKILL)
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail("restarted job did not finish:\n" + (work / "out.txt").read_text())
    return code, (work / "out.txt").read_text()


def _crashed_in_save(work: Path) -> tuple[int, str]:
    args = torchrun_args(2, job_args(work), max_restarts=1)
    return run(args, work / "out.txt", timeout=RUN_TIMEOUT_S,
               **{FAULT: "crash-in-save:at_step=20"}, FSDPMON_STATE_DIR=str(work / "state"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The three runs, started together: name -> its result (the first to fail raises)."""
    jobs = {"reference": _reference, "killed": _killed_at_step_15, "crashed": _crashed_in_save}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: (pool.submit(job, work := tmp_path_factory.mktemp(name)), work)
                   for name, job in jobs.items()}
    return {name: (future.result(), work) for name, (future, work) in futures.items()}


@pytest.fixture(scope="module")
def reference(runs) -> dict:
    return runs["reference"][0]


def final_state(work: Path) -> dict:
    out = work / "final.pt"
    dcp_to_torch_save(str(work / "ckpt" / f"step_{STEPS:08d}"), str(out))
    return torch.load(out, weights_only=False)


def assert_same_state(actual: dict, expected: dict) -> None:
    flat_a, flat_e = flatten(actual), flatten(expected)
    assert flat_a.keys() == flat_e.keys()
    for key, value in flat_e.items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(flat_a[key], value, rtol=0, atol=0, msg=key)
        else:
            assert flat_a[key] == value, key


def flatten(tree: object, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        out: dict[str, object] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    if isinstance(tree, (list, tuple)):
        return flatten(dict(enumerate(tree)), prefix)
    return {prefix: tree}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_two_rank_run_finishes_and_loss_falls(reference):
    steps = [r for r in read_jsonl(reference["work"] / "logs" / "run.rank0.jsonl")
             if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [5, 10, 15, 20, 25, 30]
    losses = [r["job"]["loss_mean"] for r in steps]
    assert losses[-1] < 0.7 * losses[0], losses
    assert "finished: 30 steps" in reference["log"]
    console = [line for line in reference["log"].splitlines() if line.startswith("step ")]
    assert len(console) == 6 and "tok/s" in console[0] and "mem" in console[0]


def test_jsonl_per_rank_with_run_record_first(reference):
    for rank in (0, 1):
        records = read_jsonl(reference["work"] / "logs" / f"run.rank{rank}.jsonl")
        first = records[0]
        assert first["kind"] == "run" and first["rank"] == rank and first["world_size"] == 2
        assert first["model"] == "tiny" and first["config"]["max_steps"] == STEPS
        for record in records[1:]:
            assert record["rank"] == rank
            if record["kind"] == "step":  # the flight recorder's saves and end besides
                assert record["tokens_per_second"] > 0 and record["step_time_s"] > 0
        assert {r["kind"] for r in records} == {"run", "step", "checkpoint", "end"}


def test_checkpoints_complete_and_pruned_to_keep(reference):
    ckpt = reference["work"] / "ckpt"
    assert [step for step, _ in complete_checkpoints(ckpt)] == [10, 20, 30]
    assert not list(ckpt.glob(".tmp-*"))


def test_hf_token_never_reaches_logs(reference):
    assert SECRET not in reference["log"]
    for path in (reference["work"] / "logs").iterdir():
        assert SECRET not in path.read_text()


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.1)


def test_kill_9_one_rank_resumes_and_matches_uninterrupted_run(reference, runs):
    (code, log), work = runs["killed"]
    assert code == 0, log[-4000:]
    assert "resumed from" in log and "step_00000010 (step 10, restart 1)" in log, log[-4000:]
    assert_same_state(final_state(work), final_state(reference["work"]))


def test_crash_during_checkpoint_save_is_never_resumed_from(reference, runs):
    (code, log), work = runs["crashed"]
    assert code == 0, log[-4000:]
    # The first attempt died with the step-20 files written but not committed ...
    assert "removing incomplete checkpoint" in log and ".tmp-step_00000020" in log, log[-4000:]
    # ... so the restart went back to step 10, and redid 11..30 identically.
    assert "step_00000010 (step 10, restart 1)" in log, log[-4000:]
    assert (work / "ckpt" / "step_00000020" / MARKER).is_file()
    assert_same_state(final_state(work), final_state(reference["work"]))


def corpus_args(tmp_path: Path) -> list[str]:
    """A JSONL corpus and a word-level tokenizer, written here; the trainer's flags to read them
    with gradient accumulation and activation checkpointing."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["</s>", "[UNK]", *(f"w{i}" for i in range(60))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    lines = [json.dumps({"text": " ".join(f"w{(d + i) % 60}" for i in range(50))})
             for d in range(40)]
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    return ["--batch-size", "2", "--seq-len", "32", "--grad-accum", "2",
            "--activation-checkpointing", "--data", str(tmp_path / "corpus.jsonl"),
            "--tokenizer", str(tmp_path / "tok")]


def test_two_nodes_the_kubeflow_way_on_a_tokenized_corpus(tmp_path):
    """Two "pods" on loopback, each `torchrun -m fsdpmon.trainer.train` configured only by the
    PET_* variables the Kubeflow training operator sets (torchrun reads them as its flags),
    training on a JSONL corpus through a tokenizer with gradient accumulation and activation
    checkpointing (one job for both claims: one torchrun start-up less)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [*TORCHRUN, "-m", "fsdpmon.trainer.train", "--model", "tiny", "--max-steps", "4",
            "--log-every", "2", *corpus_args(tmp_path), "--metrics-port", "0",
            "--log-jsonl", str(tmp_path / "run.jsonl")]
    pods = []
    with contextlib.ExitStack() as stack:
        for node in (0, 1):
            env = child_env(PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(node),
                            PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))
            pods.append(stack.enter_context(launched(args, env, tmp_path / f"pod{node}.txt")))
        codes = [pod.wait(timeout=120) for pod in pods]
    logs = [(tmp_path / f"pod{n}.txt").read_text() for n in (0, 1)]
    assert codes == [0, 0], "\n".join(log[-2000:] for log in logs)
    for rank in (0, 1):
        run_record = read_jsonl(tmp_path / f"run.rank{rank}.jsonl")[0]
        assert (run_record["rank"], run_record["local_rank"]) == (rank, 0)
        assert (run_record["world_size"], run_record["nodes"]) == (2, 2)
    last = [r for r in read_jsonl(tmp_path / "run.rank1.jsonl") if r["kind"] == "step"][-1]
    assert last["step"] == 4 and last["tokens_total"] == 4 * 2 * 32 * 2
    assert 0 < last["loss"] < 10
