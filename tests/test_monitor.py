"""The Monitor in one process: the contract's records, and that it never breaks training."""

from __future__ import annotations

import json
import logging
import math
import socket
import time
import urllib.request

import pytest
import torch
import torch.nn.functional as F
from prometheus_client.parser import text_string_to_metric_families
from support import free_port, rounded

from fsdpmon.monitor import Monitor, MonitorConfig
from fsdpmon.monitor import gather as gather_mod
from fsdpmon.monitor import log_window as log_window_mod
from fsdpmon.monitor import memory as memory_mod
from fsdpmon.monitor import monitor as monitor_mod
from fsdpmon.monitor import state as state_mod
from fsdpmon.monitor.jsonl import JsonlSink

STEP_KEYS = {"kind", "time", "rank", "local_rank", "world_size", "step", "loss", "lr",
             "grad_norm", "tokens_per_second", "step_time_s", "data_wait_ratio", "mfu",
             "peak_memory_bytes", "tokens_total", "loss_nonfinite"}
RUN_KEYS = {"kind", "time", "rank", "local_rank", "world_size", "nodes", "model", "config",
            "flops_per_token", "device", "peak_flops", "job_name"}
JOB_KEYS = {"step_time_min_s", "step_time_median_s", "step_time_max_s", "slowest_rank",
            "peak_memory_max_bytes", "peak_memory_max_rank", "loss_mean", "loss_max"}
SEQ, BATCH = 16, 4


def scrape_when_up(port: int, must_contain: str = "fsdpmon_") -> str:
    """The endpoint's text once it serves (the port is bound by a background thread)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                body = r.read().decode()
            if must_contain in body:
                return body
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"nothing served on port {port}")


def config(tmp_path, **kw) -> MonitorConfig:
    base = {"port": 0, "job_name": "unit", "log_interval": 5, "listen_address": "127.0.0.1",
            "state_dir": str(tmp_path / "state"), "jsonl_path": str(tmp_path / "run.jsonl"),
            "server_retry_seconds": 0.2}
    return MonitorConfig(**{**base, **kw})


def train(mon: Monitor | None, steps: int = 12) -> float:
    """A small deterministic LM loop; returns the final loss."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        ctx = mon.step() if mon else _null()
        with ctx:
            with mon.phase("data") if mon else _null():
                batch = torch.randint(0, 64, (BATCH, SEQ + 1), generator=gen)
            with mon.phase("forward") if mon else _null():
                logits = model(batch[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            with mon.phase("backward") if mon else _null():
                loss.backward()
            with mon.phase("optimizer") if mon else _null():
                opt.step()
                opt.zero_grad()
            if mon:
                mon.record(loss=loss.detach(), lr=0.5, grad_norm=torch.tensor(1.5))
    return float(loss.detach())


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def monitor(cfg: MonitorConfig, **kw) -> Monitor:
    args = {"flops_per_token": 1e6, "tokens_per_step": BATCH * SEQ, "total_steps": 12,
            "run_info": {"model": "toy", "config": {"lr": 0.5}}}
    return Monitor(cfg, **{**args, **kw})


@pytest.fixture(scope="module")
def baseline() -> float:
    return train(None)


def test_records_follow_the_contract(tmp_path, baseline, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)  # the host's name, then
    mon = monitor(config(tmp_path))
    seen: list[dict] = []
    mon.add_log_listener(seen.append)
    assert train(mon) == baseline
    mon.close()
    lines = [json.loads(x) for x in (tmp_path / "run.rank0.jsonl").read_text().splitlines()]
    run, steps, end = lines[0], lines[1:-1], lines[-1]
    assert (end["kind"], end["how"], end["step"]) == ("end", "exit", 12), end  # closed normally
    assert set(run) >= RUN_KEYS and run["kind"] == "run" and run["model"] == "toy"
    assert run["device"] == "cpu" and run["peak_flops"] is None
    assert run["node"] == socket.gethostname(), run
    assert steps == seen  # listeners get the very records the file holds
    assert [s["step"] for s in steps] == [5, 10, 12]  # every 5 and the last planned step
    for record in steps:
        assert set(record) >= STEP_KEYS
        assert set(record["job"]) >= JOB_KEYS
        assert record["mfu"] is None  # CPU: unknown peak
        assert record["grad_norm"] == 1.5 and record["lr"] == 0.5
        assert record["peak_memory_bytes"] > 0  # RSS on CPU
        # 12 steps: a busy median over fewer than BUSY_MIN_STEPS is not published
        assert record["busy_s"] is None and record["straggler_score"] is None, record
    assert steps[-1]["loss"] == rounded(baseline)
    assert steps[-1]["tokens_total"] == 12 * BATCH * SEQ
    assert steps[0]["job"]["slowest_rank"] == 0 and steps[0]["job"]["loss_max"] == steps[0]["loss"]


def test_the_run_record_names_the_dtype_and_the_node(monkeypatch):
    """The dtype the loop says, else the model's parameters'; the node Kubernetes names
    (NODE_NAME), else the host's."""
    from fsdpmon.distenv import DistEnv
    from fsdpmon.monitor.records import run_record

    def record(run_info: dict) -> dict:
        return run_record(DistEnv(), "j", torch.nn.Linear(2, 2), run_info, 1.0, "cpu", None)

    monkeypatch.delenv("NODE_NAME", raising=False)
    assert (record({})["dtype"], record({})["node"]) == ("float32", socket.gethostname())
    monkeypatch.setenv("NODE_NAME", "node-7")
    assert (record({"dtype": "bfloat16"})["dtype"], record({})["node"]) == ("bfloat16", "node-7")


def test_resumed_run_counts_from_its_start_step_and_variable_tokens(tmp_path):
    mon = monitor(config(tmp_path, jsonl_path=None), total_steps=None, start_step=100)
    seen: list[dict] = []
    mon.add_log_listener(seen.append)
    for i in range(10):
        with mon.step():
            mon.record(tokens=i)
    with mon.phase("checkpoint"):  # outside a step: lands in the next window
        time.sleep(0.01)
    mon.log_now()
    mon.close()
    assert [r["step"] for r in seen] == [105, 110, 110]
    assert [r["tokens_total"] for r in seen] == [10, 45, 45]
    assert seen[-1]["phase_seconds"] == {}  # no step in that window
    assert mon.steps_done == 10


def test_a_step_that_raises_is_not_counted_and_the_error_propagates(tmp_path):
    mon = monitor(config(tmp_path, jsonl_path=None), total_steps=None)
    with pytest.raises(torch.cuda.OutOfMemoryError), mon.step():
        raise torch.cuda.OutOfMemoryError("simulated OOM inside the loop")
    with mon.step():
        pass
    mon.close()
    assert mon.steps_done == 1 and mon.tokens_done == BATCH * SEQ
    assert mon.internal_errors == 0


def test_nonfinite_loss_is_flagged_and_published(tmp_path):
    """A window per step: the finite loss is not flagged, NaN, +Inf and -Inf are."""
    port = free_port()
    mon = monitor(config(tmp_path, port=port, log_interval=1, jsonl_path=None))
    seen: list[dict] = []
    mon.add_log_listener(seen.append)
    for loss in (1.0, math.inf, -math.inf, math.nan):
        with mon.step():
            mon.record(loss=torch.tensor(loss))
    body = scrape_when_up(port)
    mon.close()
    assert [r["loss_nonfinite"] for r in seen] == [False, True, True, True], seen
    assert seen[1]["loss"] == math.inf and seen[2]["loss"] == -math.inf
    assert seen[-1]["loss_nonfinite"] is True and math.isnan(seen[-1]["loss"])
    assert 'fsdpmon_train_loss_nonfinite{job_name="unit",local_rank="0",rank="0"} 1.0' in body
    assert 'fsdpmon_train_loss{job_name="unit",local_rank="0",rank="0"} NaN' in body


def test_disabled_monitor_still_logs_but_serves_nothing(tmp_path, baseline):
    port = free_port()
    mon = monitor(config(tmp_path, disabled=True, port=port))
    seen: list[dict] = []
    mon.add_log_listener(seen.append)
    assert train(mon) == baseline
    mon.close()
    assert len(seen) == 3 and (tmp_path / "run.rank0.jsonl").exists()
    assert not (tmp_path / "state").exists()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nobody took it


def test_port_in_use_training_goes_on(tmp_path, baseline):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        mon = monitor(config(tmp_path, port=blocker.getsockname()[1]))
        assert train(mon) == baseline
        mon.close()
    assert mon.internal_errors == 0
    # the run, three log steps and the end: the JSONL does not need the endpoint
    assert len((tmp_path / "run.rank0.jsonl").read_text().splitlines()) == 5


def test_unwritable_directories_training_goes_on(tmp_path, baseline):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = config(tmp_path, port=free_port(), state_dir=str(blocker / "state"),
                 jsonl_path=str(blocker / "run.jsonl"))
    mon = monitor(cfg)
    assert train(mon) == baseline
    mon.close()
    assert mon.internal_errors == 2  # the state directory and the JSONL file, once each


def test_internals_that_throw_never_reach_training(tmp_path, baseline, monkeypatch, caplog):
    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(state_mod.RankStateWriter, "heartbeat", boom)
    monkeypatch.setattr(memory_mod.MemoryReader, "read", boom)
    monkeypatch.setattr(log_window_mod, "gather_rows", boom)
    monkeypatch.setattr(JsonlSink, "write", boom)
    monkeypatch.setattr(monitor_mod.StepTimer, "begin_phase", boom)
    mon = monitor(config(tmp_path, port=free_port()))
    mon.add_log_listener(boom)
    with caplog.at_level(logging.WARNING, logger="fsdpmon.monitor"):
        assert train(mon) == baseline
    mon.close()
    assert mon.internal_errors > 12  # every step's heartbeat and phases, every log step
    # Each kind of failure is logged once, however often it happens.
    messages = [r.getMessage() for r in caplog.records if "internal error" in r.getMessage()]
    assert len(messages) == len(set(m.split(" (")[0] for m in messages))
    assert any("heartbeat" in m for m in messages)


def test_internal_errors_are_published(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(memory_mod.MemoryReader, "read", boom)
    port = free_port()
    mon = monitor(config(tmp_path, port=port))
    train(mon)
    body = scrape_when_up(port, "fsdpmon_monitor_internal_errors_total{")
    mon.close()
    line = next(x for x in body.splitlines()
                if x.startswith("fsdpmon_monitor_internal_errors_total{"))
    assert float(line.split()[-1]) == mon.internal_errors == 3
    assert "fsdpmon_train_steps_total" in body


def test_gather_failure_stays_off(tmp_path, monkeypatch):
    calls = []

    def broken(values, topo):
        calls.append(values)
        raise RuntimeError("collective broke")

    monkeypatch.setattr(log_window_mod, "gather_rows", broken)
    mon = monitor(config(tmp_path, jsonl_path=None))
    train(mon)
    mon.close()
    assert len(calls) == 1  # not retried at every log step


def test_a_rank_without_a_process_group_scores_its_own_row(tmp_path, monkeypatch):
    """RANK=1 of 2 in the environment, but no process group (set up later, or never): only our
    row comes back from the gather, and it is ours, not rank 1 of a list of one."""
    for name, value in (("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    mon = monitor(config(tmp_path, port=0))
    train(mon)
    mon.close()
    assert (mon.topo.rank, mon.internal_errors) == (1, 0), mon.internal_errors


def test_restart_count_comes_from_the_elastic_agent(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    port = free_port()
    mon = monitor(config(tmp_path, port=port))
    body = scrape_when_up(port)
    mon.close()
    assert mon.run_record["restarts"] == 3
    assert 'fsdpmon_train_restarts{job_name="unit",local_rank="0",rank="0"} 3.0' in body


def test_a_malformed_launcher_variable_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LOCAL_RANK", "one")
    with caplog.at_level(logging.WARNING):
        mon = monitor(config(tmp_path, port=0))
        mon.close()
    assert (mon.topo.rank, mon.topo.world_size, mon.internal_errors) == (0, 1, 1)
    assert "LOCAL_RANK" in caplog.text, caplog.text
    assert mon.run_record["model"] == "toy"  # the rest of set-up went on


def test_a_phase_between_steps_counts_as_progress_for_the_stall_clock(tmp_path):
    mon = monitor(config(tmp_path, jsonl_path=None, stall_floor_seconds=60))
    with mon.step():
        pass
    watchdog = mon.pub.watchdog
    before = watchdog._last_progress
    time.sleep(0.01)
    with mon.step(), mon.phase("forward"):  # inside a step: only the step end counts
        pass
    after_step = watchdog._last_progress
    time.sleep(0.01)
    with mon.phase("checkpoint"):
        pass
    mon.close()
    assert before < after_step < watchdog._last_progress
    assert len(watchdog.recent_durations()) == 2  # the save is not a step duration
    assert watchdog.history.longest_save > 0  # it bounds the next save instead


def test_topology_from_torchrun_variables(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    topo = gather_mod.topology()
    assert (topo.rank, topo.local_rank, topo.world_size, topo.nodes) == (5, 1, 16, 2)
    assert not gather_mod.is_distributed(topo)  # no process group: no collective attempted


def test_the_goodput_counters_are_served_from_zero_before_the_first_step(tmp_path):
    # Prometheus' increase() counts a counter's rise from its first sample: a series that first
    # appeared at the first log step would lose that step's rise
    port = free_port()
    mon = monitor(config(tmp_path, port=port))
    try:
        body = scrape_when_up(port, "fsdpmon_train_badput_seconds_total{")
    finally:
        mon.close()
    served = {s.labels["cause"]: s.value for family in text_string_to_metric_families(body)
              for s in family.samples if s.name == "fsdpmon_train_badput_seconds_total"}
    assert served == dict.fromkeys(
        ["startup", "data_wait", "checkpoint_save", "checkpoint_restore", "restart",
         "recompute", "stall", "straggler_wait"], 0.0), served
    assert "fsdpmon_train_productive_seconds_total{" in body, body[-2000:]
