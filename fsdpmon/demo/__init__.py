"""`fsdpmon demo`: a monitored 2-rank FSDP training on this machine, with `top` watching it.

Starts the per-node exporter and `torchrun -m fsdpmon.trainer.train --model tiny` (CPU and gloo, or
CUDA when there is a GPU per rank), waits until both serve metrics, then shows `fsdpmon top`'s live
view of them. Ctrl-C, `q` or SIGTERM stops everything. ``--headless --duration S`` prints
progress instead, then the final snapshot (``--json`` for top's JSON), for scripts and CI.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import shutil
import signal
import sys
import time
from pathlib import Path

from fsdpmon.demo.session import DemoConfig, Session, describe, make_plan, real_gpu_count
from fsdpmon.diagnose import Verdict, judge
from fsdpmon.errors import ConfigError, MissingExtraError
from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.signals import Catcher


def configure(parser: argparse.ArgumentParser) -> None:
    d = DemoConfig()
    parser.add_argument("--headless", action="store_true",
                        help="no live view: print progress, then the final snapshot")
    parser.add_argument("--duration", type=float, default=d.duration_s, metavar="SECONDS",
                        help="with --headless: how long to train once ready (default: 30)")
    parser.add_argument("--json", action="store_true",
                        help="with --headless: print the final snapshot as top's JSON")
    parser.add_argument("--nproc", type=int, default=d.nproc, metavar="N",
                        help="ranks; on CUDA only with a GPU per rank (default: 2)")
    parser.add_argument("--model", default=d.model, help="trainer flavour (default: tiny)")
    parser.add_argument("--max-steps", type=int, default=d.max_steps, metavar="N",
                        help="stop training after this many steps (default: run until stopped)")
    parser.add_argument("--interval", type=float, default=d.interval_s, metavar="SECONDS",
                        help="refresh interval of the view (default: 2)")
    parser.add_argument("--log-dir", type=Path, default=None, metavar="DIR",
                        help="where the children's logs go (default: a new temporary directory)")
    parser.add_argument("--metrics-port", type=int, default=0, metavar="PORT",
                        help="training metrics port (default: a free port)")
    parser.add_argument("--exporter-port", type=int, default=0, metavar="PORT",
                        help="exporter port (default: a free port)")
    parser.add_argument("--fault", default="", metavar="SPEC",
                        help="inject faults to watch them being found, e.g. "
                             "'gpu-throttle:gpu=1,after=20,reason=thermal' or "
                             "'hang:rank=1,at_step=40,where=data' (several joined by ';'; "
                             "kinds and keys in the README)")
    parser.add_argument("--startup-timeout", type=float, default=d.startup_timeout_s,
                        metavar="SECONDS", help="give up if not ready by then (default: 180)")


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    cfg = DemoConfig(
        nproc=args.nproc, model=args.model, max_steps=args.max_steps, headless=args.headless,
        duration_s=args.duration, json=args.json, interval_s=args.interval,
        startup_timeout_s=args.startup_timeout, log_dir=args.log_dir,
        metrics_port=args.metrics_port, exporter_port=args.exporter_port, fault=args.fault,
    )
    cfg.validate()
    if cfg.json and not cfg.headless:
        raise ConfigError("--json", "goes with --headless (the live view is not JSON)")
    if not cfg.headless and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise ConfigError("--headless", "no terminal for the live view; use --headless")
    return cfg


def say(message: str) -> None:
    # After SIGHUP the terminal may be gone; clean-up must go on regardless.
    with contextlib.suppress(OSError, ValueError):
        print(f"fsdpmon demo: {message}", file=sys.stderr, flush=True)


def fsdpmon_command() -> str:
    """How to type `fsdpmon` in another terminal: bare when it is on PATH, else its full path."""
    script = Path(sys.executable).parent / "fsdpmon"
    on_path = shutil.which("fsdpmon")
    if on_path and Path(on_path).resolve() == script.resolve():
        return "fsdpmon"
    return str(script) if script.exists() else f"{sys.executable} -m fsdpmon.cli"


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if importlib.util.find_spec("torch") is None:
        raise MissingExtraError("the demo trains a model; it", "train")
    plan = make_plan(cfg, real_gpu_count())
    for line in describe(plan, cfg):
        say(line)
    session = Session(plan, say)
    # SIGTERM and SIGHUP end the demo like Ctrl-C: through the finally below. Only the first
    # of them raises (fsdpmon.signals): a second one, or a second Ctrl-C, must not cut the
    # clean-up short and leave the training behind. Never a forced exit, for the same reason:
    # the clean-up is bounded (stop_all's grace, then SIGKILL).
    Catcher((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), force_after=None,
            interrupt=True).install()
    try:
        session.start()
        ready = session.wait_ready(cfg.nproc, cfg.startup_timeout_s)
        if session.training_finished():
            say("the training ended before every rank was seen stepping")
        else:
            say(f"ready: {cfg.nproc} ranks training. In another terminal: "
                f"{fsdpmon_command()} top --targets {plan.metrics_url},{plan.exporter_url}")
        if cfg.headless:
            snap = _headless(session, cfg, ready)
        else:
            return _live(session, cfg)
    finally:
        session.stop()
        say(f"stopped. Logs: {plan.log_dir}  (scaling report: {fsdpmon_command()} report "
            f"{plan.jsonl_path})")
    from fsdpmon.top.cli import check_health

    verdict = judge([snap])  # as `top --once` judges its one refresh
    _print_snapshot(snap, verdict, cfg.json)
    check_health(snap, verdict)
    return 0


def _headless(session: Session, cfg: DemoConfig, ready: JobSnapshot) -> JobSnapshot:
    """Train for ``cfg.duration_s``, printing one progress line per interval; the last snapshot.

    The first line is the start-up's look (``ready``, every rank stepping): a training shorter
    than one interval (a few steps on a fast machine) still shows where it was while it ran.

    When the training reaches --max-steps and exits, the final snapshot is taken after it
    ended: its ranks keep their last figures and the job is DONE (torchrun exited 0).
    """
    end = time.monotonic() + cfg.duration_s
    start = time.monotonic()
    snap = ready
    if not session.training_finished():
        say(progress_line(ready, 0.0))
    while not session.training_finished():
        time.sleep(max(0.0, min(cfg.interval_s, end - time.monotonic())))
        session.check_children(finished_ok=True)
        if session.training_finished():
            break
        snap = session.source.fetch()
        say(progress_line(snap, time.monotonic() - start))
        if time.monotonic() >= end:
            return snap
    # A snapshot can say DONE while the ranks, at their last step, still serve (``ready``
    # too): the final one is taken once torchrun has exited, every rank gone and finished.
    say("training finished (--max-steps reached)")
    return session.source.fetch()


def progress_line(snap: JobSnapshot, elapsed_s: float) -> str:
    steps = " ".join(f"rank{r.rank}={r.step}" for r in snap.ranks)
    rate = f"{snap.tokens_per_second:,.0f} tokens/s" if snap.tokens_per_second else "- tokens/s"
    return f"t={elapsed_s:.0f}s state={snap.state.value} steps: {steps} | {rate}"


def _print_snapshot(snap: JobSnapshot, verdict: Verdict, as_json: bool) -> None:
    if as_json:
        from fsdpmon.top.cli import snapshot_json

        sys.stdout.write(snapshot_json(snap, verdict) + "\n")
    else:
        from rich.console import Console

        from fsdpmon.top.views import once_frame

        Console(soft_wrap=False).print(once_frame(snap, verdict))
    sys.stdout.flush()


def _live(session: Session, cfg: DemoConfig) -> int:
    """`fsdpmon top`'s live view on the demo's two endpoints, until `q` or Ctrl-C."""
    from fsdpmon.top.app import run_live

    say("starting the live view (q or Ctrl-C to stop everything)")
    time.sleep(1.0)
    return run_live(session.source, cfg.interval_s)
