"""Launching the trainer from tests: torchrun with a timeout, and no process left behind.

torchrun starts each worker in its own session, so killing torchrun's process group is not
enough; cleanup is ``proc_tree.kill_tree``, which walks the tree and kills every descendant too.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from proc_tree import kill_tree

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", FSDPMON_PORT="0")
    env.update(extra)
    return env


def torchrun_args(nproc: int, target: Sequence[str], max_restarts: int = 0) -> list[str]:
    return [*TORCHRUN, "--standalone", "--nproc_per_node", str(nproc),
            "--max-restarts", str(max_restarts), *target]


@contextlib.contextmanager
def launched(args: Sequence[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    """Start ``args`` in its own session with stdout+stderr to ``log``; kill the tree at exit."""
    with open(log, "w") as out:
        proc = subprocess.Popen(list(args), cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            kill_tree(proc)


def run(args: Sequence[str], log: Path, timeout: float, **env: str) -> tuple[int, str]:
    """Run to completion (or kill at ``timeout`` and fail); returns (exit code, output)."""
    with launched(args, child_env(**env), log) as proc:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"timed out after {timeout}s:\n{log.read_text()[-3000:]}") \
                from None
    return code, log.read_text()
