"""`fsdpmon demo`'s parts without a training run: config, plan, child processes, progress."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from fsdpmon.demo import _headless, progress_line
from fsdpmon.demo.processes import spawn, stop_all
from fsdpmon.demo.session import (
    DemoConfig,
    Plan,
    Session,
    describe,
    make_plan,
    real_gpu_count,
)
from fsdpmon.demo.source import LocalLogs
from fsdpmon.errors import ConfigError, JobUnhealthyError
from fsdpmon.job.snapshot import JobSnapshot, JobState, RankRow, TargetStatus


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nproc": 0}, "--nproc"),
        ({"duration_s": 0}, "--duration"),
        ({"interval_s": -1}, "--interval"),
        ({"metrics_port": 70000}, "--metrics-port"),
        ({"exporter_port": -1}, "--exporter-port"),
        ({"max_steps": 0}, "--max-steps"),
    ],
)
def test_bad_config_names_the_flag(change, field):
    with pytest.raises(ConfigError) as caught:
        DemoConfig(**change).validate()
    assert caught.value.field == field


def test_plan_without_gpus_trains_on_cpu_and_simulates_marked_gpus(tmp_path):
    plan = make_plan(DemoConfig(log_dir=tmp_path), gpus=0)
    assert plan.simulated_gpus == 2 and not plan.cuda
    assert plan.trainer_env["CUDA_VISIBLE_DEVICES"] == ""
    assert plan.trainer_env["FSDPMON_LISTEN_ADDRESS"] == "127.0.0.1"
    assert plan.metrics_port != plan.exporter_port and 0 not in (plan.metrics_port,
                                                                 plan.exporter_port)
    assert "--nproc_per_node=2" in plan.trainer_argv
    assert plan.trainer_argv[plan.trainer_argv.index("--metrics-port") + 1] == str(
        plan.metrics_port)
    assert plan.trainer_argv[plan.trainer_argv.index("--log-jsonl") + 1] == str(
        tmp_path / "train.jsonl")
    exporter = " ".join(plan.exporter_argv)
    assert "--simulate-gpus 2" in exporter and "--listen-address 127.0.0.1" in exporter
    said = "\n".join(describe(plan, DemoConfig()))
    assert "SIMULATED" in said and str(tmp_path) in said and plan.metrics_url in said


def test_faults_go_to_the_trainer_and_the_simulated_gpus_and_are_announced(tmp_path):
    spec = "gpu-throttle:gpu=1,after=20,reason=thermal; hang:rank=1,at_step=40;xid:gpu=0,code=79"
    cfg = DemoConfig(log_dir=tmp_path, fault=spec)
    cfg.validate()
    plan = make_plan(cfg, gpus=0)
    trainer = plan.trainer_argv[plan.trainer_argv.index("--fault") + 1]
    exporter = plan.exporter_argv[plan.exporter_argv.index("--fault") + 1]
    assert trainer == "hang:rank=1,at_step=40,where=data,after=0.0"
    assert exporter == ("gpu-throttle:gpu=1,after=20.0,reason=thermal;"
                        "xid:gpu=0,code=79,after=0.0")
    said = "\n".join(describe(plan, cfg))
    assert said.count("fault injected:") == 3 and "hang:rank=1" in said
    healthy = make_plan(DemoConfig(log_dir=tmp_path), gpus=0)
    assert "--fault" not in healthy.trainer_argv + healthy.exporter_argv


@pytest.mark.parametrize(("spec", "gpus", "problem"), [
    ("hang:rank=2", 0, "names rank 2, but the demo runs 2"),
    ("xid:gpu=2,code=79", 0, "names GPU 2, but the demo simulates 2"),
    ("gpu-lost:gpu=0", 2, "simulated GPUs only"),
    ("melt:rank=0", 0, "unknown kind 'melt'"),
])
def test_bad_fault_specs_name_the_flag(tmp_path, spec, gpus, problem):
    with pytest.raises(ConfigError) as caught:
        cfg = DemoConfig(log_dir=tmp_path, fault=spec)
        cfg.validate()
        make_plan(cfg, gpus)
    assert caught.value.field == "--fault" and problem in str(caught.value), str(caught.value)


@pytest.mark.parametrize(("gpus", "cuda"), [(1, False), (2, True), (8, True)])
def test_plan_uses_cuda_only_with_a_gpu_per_rank(tmp_path, gpus, cuda):
    plan = make_plan(DemoConfig(log_dir=tmp_path, metrics_port=9600, exporter_port=9601), gpus)
    assert plan.cuda is cuda and plan.simulated_gpus == 0  # real GPUs are exported as they are
    hidden = plan.trainer_env.get("CUDA_VISIBLE_DEVICES") == ""
    assert hidden is not cuda  # fewer GPUs than ranks: the ranks are kept off CUDA
    assert (plan.metrics_port, plan.exporter_port) == (9600, 9601)
    assert "--simulate-gpus" not in plan.exporter_argv


STUBBORN_TREE = textwrap.dedent("""
    import signal, subprocess, sys, time
    # a grandchild in a session of its own (as torchrun starts its workers) that ignores SIGTERM
    subprocess.Popen([sys.executable, "-c",
                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('ready', flush=True); time.sleep(600)"],
                     start_new_session=True)
    time.sleep(600)
""")


def test_stop_all_reaches_descendants_in_other_sessions(tmp_path):
    child = spawn("tree", [sys.executable, "-c", STUBBORN_TREE], tmp_path / "tree.log",
                  env=dict(os.environ))
    deadline = time.monotonic() + 30
    while "ready" not in (tmp_path / "tree.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    child.remember_tree()
    tree = list(child.known.values())
    assert len(tree) == 2 and psutil.Process(tree[1].pid).pid != child.pid
    killed = stop_all([child], grace_s=1.0)
    assert len(killed) == 1 and str(tree[1].pid) in killed[0]  # only the stubborn one
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert child.popen.returncode is not None


def test_a_child_that_dies_is_reported_with_its_log(tmp_path):
    plan = Plan(tmp_path, 1, 2, 2, False,
                trainer_argv=[sys.executable, "-c", "import time; time.sleep(600)"],
                exporter_argv=[sys.executable, "-c", "print('port in use'); raise SystemExit(3)"],
                trainer_env=dict(os.environ))
    session = Session(plan, say=lambda _: None)
    try:
        session.start()
        session.children[0].popen.wait(timeout=30)
        with pytest.raises(JobUnhealthyError, match=r"exporter exited with status 3; see .*"
                           r"exporter\.log \(last lines: port in use\)"):
            session.check_children()
    finally:
        session.stop()
    assert session.children == []


def test_progress_line_shows_every_rank():
    snap = JobSnapshot(time=0.0, source="t", state=JobState.RUNNING, tokens_per_second=12345.6,
                       ranks=(RankRow(rank=0, step=40), RankRow(rank=1, step=39)))
    assert progress_line(snap, 12.3) == (
        "t=12s state=RUNNING steps: rank0=40 rank1=39 | 12,346 tokens/s")


def test_live_view_without_a_terminal_is_a_one_line_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "demo", "--log-dir",
                           str(tmp_path)], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "fsdpmon demo: error: --headless: no terminal for the live view; use --headless")
    assert not list(Path(tmp_path).iterdir())  # nothing was started
    done = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "demo", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--json: goes with --headless" in done.stderr


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a machine with an NVIDIA driver")
def test_no_nvml_means_no_real_gpus():
    assert real_gpu_count() == 0  # so the demo plans simulated GPUs


class FakeSession:
    """What _headless uses of a Session: fetch() snapshots, children that finish."""

    def __init__(self, snaps: list[JobSnapshot], finish_after: int) -> None:
        self.snaps = snaps
        self.fetches = 0
        self.finish_after = finish_after
        self.source = self

    def fetch(self) -> JobSnapshot:
        self.fetches += 1
        return self.snaps[min(self.fetches, len(self.snaps)) - 1]

    def check_children(self, finished_ok: bool = False) -> None:
        assert finished_ok

    def training_finished(self) -> bool:
        return self.fetches >= self.finish_after


def _snap(step: int, up: bool) -> JobSnapshot:
    return JobSnapshot(time=float(step), source="t", state=JobState.RUNNING, step=step,
                       targets=(TargetStatus("http://a", "train", up),
                                TargetStatus("http://b", "exporter", True)))


def test_headless_takes_the_final_snapshot_after_the_training_ended():
    """At --max-steps the trainer's endpoint goes away: the final snapshot is taken after that
    (the source says DONE then, from torchrun's exit status)."""
    session = FakeSession([_snap(10, True), _snap(20, True), _snap(20, False)], finish_after=3)
    cfg = DemoConfig(headless=True, duration_s=60, interval_s=0.01)
    final = _headless(session, cfg, session.fetch())  # the start-up's look comes first
    assert session.fetches == 4 and final is session.snaps[-1]


def test_a_done_snapshot_while_the_ranks_still_serve_is_not_the_final_one():
    """The ranks at their last step, still serving, already make a DONE snapshot (seen once in
    a fresh-clone CI run: the final JSON had both ranks unfinished); the final snapshot still
    waits for torchrun's exit."""
    serving = replace(_snap(20, True), state=JobState.DONE)
    session = FakeSession([_snap(10, True), serving, _snap(20, False)], finish_after=3)
    final = _headless(session, DemoConfig(headless=True, duration_s=60, interval_s=0.01),
                      session.fetch())
    assert final is session.snaps[-1], (session.fetches, final.state, final.targets_up)


def test_headless_stops_after_its_duration():
    session = FakeSession([_snap(i, True) for i in range(1, 1000)], finish_after=10**9)
    started = time.monotonic()
    snap = _headless(session, DemoConfig(headless=True, duration_s=0.3, interval_s=0.05),
                     session.fetch())
    assert 0.3 <= time.monotonic() - started < 5 and snap.step == session.fetches


def test_headless_prints_the_start_up_look_first(capsys):
    """A training over within one interval still shows a line from while it ran."""
    session = FakeSession([_snap(7, True), _snap(9, False)], finish_after=2)
    final = _headless(session, DemoConfig(headless=True, duration_s=60, interval_s=0.01),
                      session.fetch())
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "fsdpmon demo: t=0s state=RUNNING steps:  | - tokens/s", lines
    assert final is session.snaps[-1] and session.fetches == 3, session.fetches


def test_a_training_over_by_the_start_up_look_prints_no_progress_and_looks_once_more(capsys):
    """torchrun had exited by the time _headless began (the start-up's look may have come just
    before that): no progress line, and the final snapshot is a look taken after the exit."""
    session = FakeSession([_snap(9, True), _snap(9, False)], finish_after=1)
    final = _headless(session, DemoConfig(headless=True, interval_s=0.01), session.fetch())
    assert final is session.snaps[-1] and session.fetches == 2, session.fetches
    assert capsys.readouterr().err.splitlines() == [
        "fsdpmon demo: training finished (--max-steps reached)"]


def test_local_logs_follow_what_is_appended(tmp_path):
    train, exporter = tmp_path / "train.log", tmp_path / "exporter.log"
    train.write_text("[rank0] starting\n[rank1] start")
    exporter.write_text("exporter up\n")
    logs = LocalLogs([("training", train), ("exporter", exporter)])
    assert logs.read() == ("training", ("[rank0] starting",))  # a half-written line waits
    with train.open("a") as fh:
        fh.write("ing\nstep 1/40 | loss 2.5\n")
    assert logs.read()[1][-2:] == ("[rank1] starting", "step 1/40 | loss 2.5")
    logs.follow(7)  # the Logs view's `]` past the end: the last file
    assert logs.read() == ("exporter", ("exporter up",))
    logs.follow("some-pod")  # a rank's screen: the demo's ranks share the training log
    assert logs.read()[0] == "exporter"
    exporter.write_text("")  # truncated: starts over
    assert logs.read() == ("exporter", ())


def test_the_demo_source_passes_on_which_view_is_shown(tmp_path):
    """The live view tells its source which screen is up (process tables on it fetch their
    families every refresh); the demo's source hands that to the scraping source it wraps."""
    from fsdpmon.demo.source import DemoSource

    source = DemoSource(["http://127.0.0.1:1/metrics"], "demo", tmp_path, set, lambda: None)
    try:
        for view, processes, expected in (("ranks", True, True), ("gpus", False, False),
                                          ("processes", False, True), ("ranks", False, False)):
            source.showing(view, processes)
            assert source.inner.cadence.processes_open is expected, (view, processes)
    finally:
        source.close()
