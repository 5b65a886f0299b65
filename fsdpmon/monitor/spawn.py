"""A rank's side of the pod's endpoint: make sure the pod's server process runs.

Every serving rank runs one small thread that checks, every ``server_retry_seconds``, whether a
server holds the state directory's lock (``podserver.running``: one shared ``flock`` attempt),
and starts one when none does. Local rank 0 checks at once, the others after one period, so a
pod normally starts one server; a race starts two, and the second leaves at once. When the
server dies (killed, OOM), the next check starts another. The last rank to close asks the server
to end (SIGTERM) and waits for it, so a finished job leaves nothing running and nothing behind.

Nothing here runs on the training thread, and nothing of it touches a step: the check is one
``open`` + ``flock`` every few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsdpmon
from fsdpmon.monitor import podserver, state, statedir
from fsdpmon.monitor.config import MonitorConfig

log = logging.getLogger(__name__)


def server_command(directory: Path, config: MonitorConfig) -> list[str]:
    """The server's command line: paths and figures only (a secret never goes on it: TLS keys
    and password hashes stay in the web-config file, read by the server itself)."""
    cmd = [sys.executable, "-m", podserver.MODULE, "--dir", str(directory),
           "--job-name", config.job_name, "--address", config.listen_address,
           "--port", str(config.port), "--retry-seconds", repr(config.server_retry_seconds),
           "--max-per-second", repr(config.max_scrapes_per_second)]
    if config.web_config_file:
        cmd += ["--web-config", os.path.abspath(config.web_config_file)]
    return cmd


def _server_env() -> dict[str, str]:
    """The rank's environment, with this fsdpmon first on the path (a rank may have found it
    through its own sys.path, which a new interpreter would not share)."""
    root = str(Path(fsdpmon.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


class ServerKeeper:
    def __init__(self, directory: Path, config: MonitorConfig, first_check_delay: float) -> None:
        self.directory = directory
        self.config = config
        self.first_check_delay = first_check_delay
        self.started = 0  # servers this rank started
        self._last_start = -math.inf  # monotonic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fsdpmon-server-keeper",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.first_check_delay):
            return
        while not self._stop.is_set():
            try:
                if not podserver.running(self.directory):
                    self._start_server()
            except Exception as exc:  # never into training; tried again next period
                log.warning("fsdpmon: could not start the pod's metrics server: %r", exc)
            self._stop.wait(self.config.server_retry_seconds)

    def _start_server(self) -> None:
        proc = subprocess.Popen(server_command(self.directory, self.config), env=_server_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
        proc.wait()  # the server forks at once; this is its short-lived parent
        self.started += 1
        self._last_start = time.monotonic()
        if self.started == 1:
            log.info("fsdpmon: started the pod's metrics server for %s", self.directory.name)

    def close(self) -> None:
        """Stop checking; when no other rank of the pod is alive, end the server too."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        others = set(statedir.live_pids(self.directory).values()) - {os.getpid()}
        if others:
            return
        # A server started a moment ago may not hold its lock yet: give it that moment.
        deadline = self._last_start + podserver.LOCK_WAIT_SECONDS
        while not podserver.running(self.directory) and time.monotonic() < deadline:
            time.sleep(0.02)
        podserver.stop(self.directory)
        # On SIGTERM the rank's own files (and its tidy) went first, perhaps while a server
        # killed a moment ago still held its lock: the last rank's tidy again, now that no
        # server holds it, and the directory with it.
        state.tidy(self.directory)
        with contextlib.suppress(OSError):
            self.directory.rmdir()
