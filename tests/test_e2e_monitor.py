"""End to end: a real 2-rank FSDP2 job under torchrun, monitored, scraped over HTTP.

One run (module fixture) checks truth (tokens/s vs the job's own clock, exact counters), the
straggler (rank 1 slowed by a sleep in its data phase), the exposition (promtool, both ranks on
one endpoint) and that a dead rank's series disappear. A second run freezes rank 1 with SIGSTOP
and checks the stall flag, the heartbeat age, the stack dump and the recovery.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from proc_tree import kill_tree, resume_tree
from prometheus_client.parser import text_string_to_metric_families
from support import free_port

from fsdpmon.monitor.server import RENDER_SECONDS
from fsdpmon.monitor.stats import BUSY_MIN_STEPS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS, LOG_EVERY, BATCH, SEQ = 50, 10, 4, 64
# Rank 1's extra data time per step: well above the few hundredths of a second by which busy
# time (step time less collective wait) wanders between ranks on a loaded 2-core machine.
SLOW_SECONDS = 0.1


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def samples(text: str, name: str) -> dict[str, float]:
    """rank label -> value for one metric (job-level ones under key "")."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get("rank", "")] = s.value
    return out


def wait_until(predicate: Callable[[], object], seconds: float, what: str) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds}s waiting for {what}")


@dataclass
class Job:
    control: Path
    port: int
    proc: subprocess.Popen
    log_path: Path
    jsonl: Path
    seen: dict[str, object] = field(default_factory=dict)

    def file(self, name: str) -> Path:
        return self.control / name

    def pid(self, rank: int) -> int:
        path = self.file(f"pid.rank{rank}")
        wait_until(path.exists, 60, f"rank {rank} to start")
        return int(path.read_text())

    def done(self, rank: int) -> dict:
        path = self.file(f"done.rank{rank}")
        wait_until(path.exists, 90, f"rank {rank} to finish training")
        return json.loads(path.read_text())

    def release(self, rank: int) -> None:
        self.file(f"release.rank{rank}").touch()

    def records(self, rank: int) -> list[dict]:
        path = self.jsonl.with_name(f"run.rank{rank}.jsonl")
        records = [json.loads(line) for line in path.read_text().splitlines()]
        # the flight recorder's records (a save, the end) are tests/test_incidents.py's
        return [r for r in records if r["kind"] in ("run", "step")]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def launch(tmp: Path, *job_args: str, **env_overrides: str) -> Job:
    control = tmp / "control"
    control.mkdir(parents=True)
    port = free_port()
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
        "FSDPMON_PORT": str(port), "FSDPMON_LISTEN_ADDRESS": "127.0.0.1",
        "FSDPMON_JOB_NAME": "e2e", "FSDPMON_LOG_INTERVAL": str(LOG_EVERY),
        "FSDPMON_JSONL": str(tmp / "run.jsonl"),  # state files: the default, /dev/shm
        "FSDPMON_SERVER_RETRY_SECONDS": "0.5", **env_overrides,
    }
    log_path = tmp / "torchrun.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(TORCHRUN), "--standalone", "--nproc_per_node", "2",
             str(ROOT / "tests" / "monitor_job.py"), "--control-dir", str(control),
             "--batch", str(BATCH), "--seq-len", str(SEQ), *job_args],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return Job(control, port, proc, log_path, tmp / "run.jsonl")


def finish(job: Job) -> None:
    """Let every rank go, wait for a clean exit, and never leave a process behind."""
    try:
        job.release(0)
        job.release(1)
        job.proc.wait(timeout=60)
    finally:
        stop(job)


def stop(job: Job) -> None:
    # The workers run in sessions of their own (torchrun does that): kill the whole tree.
    resume_tree(job.proc)
    kill_tree(job.proc)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory) -> Iterator[Job]:
    job = launch(tmp_path_factory.mktemp("main"), "--steps", str(STEPS),
                 "--slow-rank", "1", "--slow-seconds", str(SLOW_SECONDS))
    try:
        job.seen["done"] = {r: job.done(r) for r in (0, 1)}
        job.seen["both"] = scrape(job.port)
        job.release(1)  # rank 1 exits abruptly, leaving its state files behind
        rank1 = job.pid(1)
        wait_until(lambda: not _alive(rank1), 30, "rank 1 to exit")
        # the endpoint serves a rendering at most RENDER_SECONDS old: poll, generously, for
        # one without rank 1 (and with rank 0)
        job.seen["after"] = wait_until(lambda: _without_rank_1(scrape(job.port)),
                                       RENDER_SECONDS + 30, "a rendering without rank 1")
        finish(job)
        yield job
    finally:
        stop(job)


def _alive(pid: int) -> bool:
    from fsdpmon.monitor.state import pid_alive

    return pid_alive(pid)


def test_job_ran_to_completion(main_run: Job):
    assert main_run.proc.returncode == 0, main_run.output()[-3000:]


def test_counters_equal_the_jobs_own_counts(main_run: Job):
    both = main_run.seen["both"]
    steps = samples(both, "fsdpmon_train_steps_total")
    tokens = samples(both, "fsdpmon_train_tokens_total")
    for rank in (0, 1):
        done = main_run.seen["done"][rank]
        assert steps[str(rank)] == done["steps"] == STEPS
        assert tokens[str(rank)] == done["tokens"] == STEPS * BATCH * SEQ
        assert main_run.records(rank)[-1]["tokens_total"] == done["tokens"]
    assert samples(both, "fsdpmon_train_step") == {"0": STEPS, "1": STEPS}


def test_flops_per_token_counts_global_parameters_on_every_rank(main_run: Job):
    from fsdpmon.monitor.flops import model_flops_per_token
    from fsdpmon.trainer.model import FLAVOURS, Transformer

    # Each rank holds half of every parameter; DTensor.numel() is global, so both ranks
    # report the unsharded model's figure.
    expected = model_flops_per_token(Transformer(FLAVOURS["tiny"]), SEQ)
    runs = [main_run.records(rank)[0] for rank in (0, 1)]
    assert [r["flops_per_token"] for r in runs] == [expected, expected]
    assert [(r["rank"], r["world_size"], r["nodes"]) for r in runs] == [(0, 2, 1), (1, 2, 1)]
    published = samples(main_run.seen["both"], "fsdpmon_train_model_flops_per_token")
    assert published == {"0": expected, "1": expected}


def test_tokens_per_second_agrees_with_the_jobs_wall_clock(main_run: Job):
    for rank in (0, 1):
        marks = main_run.seen["done"][rank]["marks"]
        records = [r for r in main_run.records(rank) if r["kind"] == "step"]
        assert [r["step"] for r in records] == [m[0] for m in marks[1:]]
        for (s0, a0, b0), (s1, a1, b1), record in zip(marks, marks[1:], records,
                                                      strict=False):
            # The monitor read its clock for the window's start between a0 and b0, for its
            # end between a1 and b1 (the job's marks around those moments): its rate lies
            # between the window's tokens over the longest and over the shortest span the
            # marks allow, at any load. A rate off by a unit, a token count or a window is
            # outside (each window spans 10 steps; the brackets, a log's work each).
            tokens = (s1 - s0) * BATCH * SEQ
            low, high = tokens / (b1 - a0), tokens / (a1 - b0)
            served = record["tokens_per_second"]
            assert low <= served <= high, (
                f"rank {rank} step {s1}: {served:.1f} tok/s outside [{low:.1f}, {high:.1f}] "
                f"(brackets {b0 - a0:.4f} s and {b1 - a1:.4f} s)")
            # under 2: a rate off by a factor of 2 or more (a window, a batch) falls outside
            assert high / low < 2, f"rank {rank} step {s1}: brackets {high / low:.2f}x apart"
    published = samples(main_run.seen["both"], "fsdpmon_train_tokens_per_second")
    # the same float, copied (repr in JSON and in the exposition): exact
    assert published["0"] == main_run.records(0)[-1]["tokens_per_second"]


def test_the_slowed_rank_is_named_the_straggler_with_its_step_time(main_run: Job):
    rank0, rank1 = main_run.records(0)[1:], main_run.records(1)[1:]
    # windows whose busy median spans fewer than BUSY_MIN_STEPS steps: no score yet
    early = [r["straggler_score"] for r in rank0 if r["step"] < BUSY_MIN_STEPS]
    assert early and all(score is None for score in early), early
    rank0 = [r for r in rank0 if r["step"] >= BUSY_MIN_STEPS]
    rank1 = [r for r in rank1 if r["step"] >= BUSY_MIN_STEPS]
    assert len(rank0) >= 2, f"only {len(rank0)} scored windows in {STEPS} steps"
    for mine, theirs in zip(rank0, rank1, strict=True):
        assert mine["job"]["slowest_rank"] == 1, (mine, theirs)
        # gathered as float64: rank 1's own figure, exactly
        assert mine["job"]["slowest_rank_step_time_s"] == theirs["step_time_s"]
        # the slowed rank waits least at the collectives: busy longer, scored lower
        assert theirs["busy_s"] > mine["busy_s"], (theirs["busy_s"], mine["busy_s"])
        assert theirs["straggler_score"] < 1 < mine["straggler_score"], (
            theirs["straggler_score"], mine["straggler_score"])
        assert theirs["data_wait_ratio"] > mine["data_wait_ratio"]
        # Synchronous FSDP: the step time itself includes the wait, so it is >= the sleep.
        assert theirs["step_time_s"] >= SLOW_SECONDS
    assert "job" not in rank1[-1]
    assert samples(main_run.seen["both"], "fsdpmon_job_slowest_rank") == {"": 1.0}
    scores = samples(main_run.seen["both"], "fsdpmon_train_straggler_score")
    assert scores == {"0": rank0[-1]["straggler_score"], "1": rank1[-1]["straggler_score"]}
    assert set(samples(main_run.seen["both"], "fsdpmon_train_busy_seconds")) == {"0", "1"}
    assert samples(main_run.seen["both"], "fsdpmon_job_slowest_rank_step_time_seconds") == {
        "": rank1[-1]["step_time_s"]}


def promtool_check(text: str, tmp_path: Path) -> None:
    exposition = tmp_path / "metrics.txt"
    exposition.write_text(text)
    with open(exposition) as fh:
        result = subprocess.run(["promtool", "check", "metrics"], stdin=fh, capture_output=True,
                                text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_exposition_passes_promtool_and_carries_both_ranks(main_run: Job, tmp_path):
    both = main_run.seen["both"]
    promtool_check(both, tmp_path)
    info = {s.labels["rank"]: s.labels for f in text_string_to_metric_families(both)
            for s in f.samples if s.name == "fsdpmon_train_info"}
    for rank in ("0", "1"):
        assert info[rank]["model"] == "tiny" and info[rank]["world_size"] == "2"
        assert info[rank]["nodes"] == "1" and info[rank]["dtype"] == "float32"
        assert info[rank]["local_rank"] == rank and info[rank]["job_name"] == "e2e"
    for name in ("fsdpmon_train_info", "fsdpmon_train_loss", "fsdpmon_train_step_time_seconds",
                 "fsdpmon_train_heartbeat_age_seconds", "fsdpmon_train_process_rss_bytes",
                 "fsdpmon_train_model_flops_per_token"):
        assert set(samples(both, name)) == {"0", "1"}, name
    # CPU: no peak FLOPs, so no MFU series at all rather than a wrong one.
    assert "fsdpmon_train_mfu_ratio" not in both
    assert samples(both, "fsdpmon_train_stalled") == {"0": 0.0, "1": 0.0}
    assert samples(both, "fsdpmon_train_unresponsive") == {"0": 0.0, "1": 0.0}


def test_a_dead_ranks_series_disappear(main_run: Job):
    after = main_run.seen["after"]
    assert set(samples(after, "fsdpmon_train_steps_total")) == {"0"}
    assert set(samples(after, "fsdpmon_train_loss")) == {"0"}
    assert 'rank="1"' not in after


# ---- stall -----------------------------------------------------------------------------------

STALL_FLOOR = 2.0


def test_a_frozen_rank_is_reported_stalled_and_recovers(tmp_path):
    job = launch(tmp_path, "--steps", "100000", FSDPMON_STALL_FLOOR_SECONDS=str(STALL_FLOOR),
                 FSDPMON_STALL_FACTOR="3", FSDPMON_LOG_INTERVAL="5")
    try:
        frozen = job.pid(1)
        running = wait_until(lambda: _both_past(scrape(job.port), 10), 60, "10 steps")
        promtool_check(running, tmp_path)  # mid-training, both ranks on the one endpoint
        os.kill(frozen, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            # The bound is max(factor x median step, floor): on a loaded machine the median, and
            # so the wait, grows; wait for the bound the job itself published, plus 20 s.
            bound = max(samples(running, "fsdpmon_train_stall_threshold_seconds").values())
            polls: list[float] = []

            def rank0_stalled() -> str | None:
                polls.append(time.monotonic())
                return _stalled_text(job.port, "0", 1.0)

            text = wait_until(rank0_stalled, bound + 20, "rank 0 stalled")
            detected = time.monotonic() - stopped_at
            threshold = samples(text, "fsdpmon_train_stall_threshold_seconds")["0"]
            assert threshold >= STALL_FLOOR
            # Named within the threshold plus: one step rank 0 may still finish after the stop
            # (served before it), the watchdog's tick (a tenth of the threshold, 0.05..1 s),
            # the endpoint's rendering age, and one poll of this loop, scrape included, as
            # long as the slowest this machine ran one (measured: load stretches it).
            step = max(samples(running, "fsdpmon_train_step_time_seconds").values())
            tick = min(1.0, max(0.05, threshold / 10))
            gap = max((b - a for a, b in itertools.pairwise(polls)), default=0.1)
            late = detected - (threshold + step + tick + RENDER_SECONDS + gap)
            assert late <= 0, (f"stalled {detected:.2f}s after the stop, {late:.2f}s past "
                               f"threshold {threshold:.2f} + step {step:.2f} + tick {tick:.2f}"
                               f" + rendering {RENDER_SECONDS} + poll {gap:.2f}")
            # The frozen rank's own watchdog cannot run, yet its age is computed per scrape
            # (it may have finished its last step a moment after rank 0: wait for its own
            # crossing rather than assume the same instant).
            text = wait_until(lambda: _stalled_text(job.port, "1", 1.0), 5, "rank 1 stalled")
            age = samples(text, "fsdpmon_train_heartbeat_age_seconds")
            assert age["1"] >= threshold
            assert samples(text, "fsdpmon_train_stalled")["1"] == 1.0
            # Which rank hangs: the frozen one stops ticking; rank 0 only waits for it.
            text = wait_until(lambda: _value_is(job.port, "fsdpmon_train_unresponsive", "1",
                                                1.0), 20, "rank 1 unresponsive")
            assert samples(text, "fsdpmon_train_unresponsive")["0"] == 0.0
        finally:
            os.kill(frozen, signal.SIGCONT)
        wait_until(lambda: _stalled_text(job.port, "0", 0.0), 20, "rank 0 to recover")
        wait_until(lambda: _stalled_text(job.port, "1", 0.0), 20, "rank 1 to recover")
        wait_until(lambda: _value_is(job.port, "fsdpmon_train_unresponsive", "1", 0.0), 20,
                   "rank 1 responsive again")
        text = scrape(job.port)
        step_now = max(samples(text, "fsdpmon_train_step").values())
        step_time = min(samples(text, "fsdpmon_train_step_time_seconds").values())
        # Both ranks stop at exactly this step (monitor_job), so it must still lie ahead when
        # they read it: the served step may be up to a second old (the endpoint re-renders
        # at log steps or each second), so aim two seconds of steps ahead at this machine's
        # speed, and never fewer than 10.
        ahead = max(10, math.ceil(2.0 / step_time)) if step_time > 0 else 10
        job.file("stop").write_text(str(int(step_now) + ahead))
        job.done(0)
        finish(job)
        log = job.output()
        assert "stalled; stacks of all threads follow" in log
        assert "most recent call first" in log  # faulthandler's dump of every thread
        assert "steps resumed after a stall" in log
        # (Once per stall episode: tests/test_monitor_watchdog.py; here rank 1 may also report
        # one on waking, and a loaded box may stretch a warm-up step past the floor.)
    finally:
        stop(job)


def _both_past(text: str, step: int) -> str | None:
    steps = samples(text, "fsdpmon_train_step")
    return text if len(steps) == 2 and min(steps.values()) >= step else None


def _without_rank_1(text: str) -> str | None:
    return text if 'rank="1"' not in text and 'rank="0"' in text else None


def _stalled_text(port: int, rank: str, value: float) -> str | None:
    return _value_is(port, "fsdpmon_train_stalled", rank, value)


def _value_is(port: int, name: str, rank: str, value: float) -> str | None:
    text = scrape(port)
    return text if samples(text, name).get(rank) == value else None
