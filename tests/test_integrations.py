"""Each way of training in examples/ (plain FSDP1 and FSDP2 loops, Lightning, Accelerate), with the
real library: a 2-rank CPU job per library, the four side by side (one suite cost instead of
four: phases run in step across them), faults made from outside each loop
(tests/outside_faults.py) and opened one after another:

1. healthy: the pod endpoint serves both ranks, and `fsdpmon diagnose --json` over one evidence
   window names nobody (exit 0) once both ranks serve straggler scores;
2. rank 1's forward slowed (integration_job.SLOW_FACTOR): once its served score is below the
   line, `fsdpmon diagnose --json` names rank 1, and only rank 1, a compute straggler;
3. rank 1 hangs in its DataLoader's ``next``: /stacks shows rank 1 stalled in
   ``hang_in_data_loader`` under ``__next__`` in the "data" phase (every adapter opens the step
   before the fetch), and rank 0 stalled inside a torch.distributed call, one collective on;
and from the JSONL: tokens/s agrees with tokens over the records' wall clock, within the bound
derived in integration_job.tokens_per_second_check (asserted to be under 1%).
Side by side, eight ranks share two cores: busy time leaves out the time a rank waits for a CPU
(fsdpmon.monitor.schedstat), which is what keeps the straggler verdicts clean under that load.
That load is real CPU contention, though: which rank the scheduler starves for a window is its
choice, and `host_cpu_contention` naming it then is true (it named lightning's rank 1, waiting
53% of its steps for a CPU against the others' 28%, beside another test's job). So the verdicts
here leave that cause out and say so; its naming and its silence on a healthy run are proven
where the host is not contended on purpose (tests/test_e2e_blind.py, tests/test_doors_agree.py).
benchmarks/bench_integrations.py runs the same phases one library at a time and prints timings.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import time

import pytest
from diagnose_job import cli_findings, diagnose_cli, stepping
from integration_job import (
    EXAMPLES,
    example_job,
    get,
    open_gate,
    records,
    score_of,
    scored,
    tokens_per_second_check,
)

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS, STRAGGLER_SCORE_THRESHOLD

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WATCH = f"{DIAGNOSIS_EVIDENCE_SECONDS + 2:g}s"
CONTENDED = "host_cpu_contention"  # this test's own load (the module's docstring)
NEEDS = {"lightning": "lightning", "accelerate": "accelerate"}


def _installed() -> list[str]:
    return [lib for lib in EXAMPLES
            if lib not in NEEDS or importlib.util.find_spec(NEEDS[lib]) is not None]


def test_every_example_is_monitored_and_its_faults_named(tmp_path):
    libraries = _installed()
    assert {"fsdp1", "fsdp2"} <= set(libraries)
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        jobs = {}
        for lib in libraries:
            (tmp_path / lib).mkdir()
            jobs[lib] = stack.enter_context(example_job(tmp_path / lib, lib))
        for lib, job in jobs.items():
            job.wait(f"{lib}: both ranks stepping", stepping(2), 240)
            job.wait(f"{lib}: both ranks scored", scored, 120)
            body = get(job, "/metrics")
            for rank in ("0", "1"):
                labels = f'job_name="it-{lib}",local_rank="{rank}",rank="{rank}"'
                assert labels in body, f"{lib}: rank {rank} not served:\n{body[-1500:]}"
        marks["scored"] = time.monotonic() - t0

        verdicts = _diagnose_all(jobs)
        for lib, (code, findings) in verdicts.items():
            assert (code, findings) == (0, []), f"{lib} healthy: diagnose said {findings}"
        marks["healthy"] = time.monotonic() - t0

        for job in jobs.values():
            open_gate(job, "compute-slow")
        for lib, job in jobs.items():
            job.wait(f"{lib}: rank 1's score below the line",
                     lambda s: (score_of(s, 1) or 1.0) < STRAGGLER_SCORE_THRESHOLD, 90)
        _named_in_time(jobs, [("straggler_compute", 1)], 90)
        marks["slowed named"] = time.monotonic() - t0

        for job in jobs.values():
            open_gate(job, "hang")
        stacks = {lib: _both_stalled(lib, job) for lib, job in jobs.items()}
        marks["hang in /stacks"] = time.monotonic() - t0
    for lib, doc in stacks.items():
        _check_hang(lib, doc)
        for rank in (0, 1):
            served, truth, bound = tokens_per_second_check(records(jobs[lib], rank))
            # the bound is the longest step over the span (the slowed steps count): under 2% a
            # rate off by a unit, a window or a token count is still far outside it
            assert bound <= 0.02, f"{lib}: span too short for a 2% check (bound {bound:.2%})"
            assert served == pytest.approx(truth, rel=bound), (
                f"{lib} rank {rank}: served {served:.1f} tok/s vs JSONL {truth:.1f} "
                f"({served / truth - 1:+.3%}, bound {bound:.3%})")
    print(f"{', '.join(libraries)} side by side; seconds from start: "
          f"{ {k: round(v, 1) for k, v in marks.items()} }")


def _named_in_time(jobs: dict, named: list[tuple[str, int]], within: float) -> None:
    """Diagnose each job until it says exactly ``named``, within ``within`` seconds: a score
    below the line is not yet the monitor's straggling flag (it holds for a span of windows),
    so one verdict may still say nothing; none may ever name anything else."""
    deadline = time.monotonic() + within
    pending, last = dict(jobs), {}
    while pending and time.monotonic() < deadline:
        for lib, (_code, findings) in _diagnose_all(pending).items():
            said = [(f["cause"], f["rank"]) for f in findings]
            assert said in ([], named), f"{lib}: diagnose said {findings}"
            last[lib] = findings
            if said == named:
                del pending[lib]
    assert not pending, f"not named in {within:.0f} s: { {lib: last[lib] for lib in pending} }"


def _diagnose_all(jobs: dict) -> dict[str, tuple[int, list[dict]]]:
    """`fsdpmon diagnose --json` on each job at once (each on its own endpoint): its exit
    status and findings, less CONTENDED (printed when left out)."""
    procs = {lib: diagnose_cli(job, WATCH) for lib, job in jobs.items()}
    with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
        futures = {lib: pool.submit(cli_findings, proc) for lib, proc in procs.items()}
        said = {lib: future.result() for lib, future in futures.items()}
    out = {}
    for lib, (code, findings) in said.items():
        kept = [f for f in findings if f["cause"] != CONTENDED]
        if len(kept) < len(findings):  # a warning: the exit status (critical only) is as it was
            print(f"{lib}: left out {[f['summary'] for f in findings if f not in kept]}")
        out[lib] = (code, kept)
    return out


def _both_stalled(lib: str, job) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        doc = json.loads(get(job, "/stacks"))
        if len(doc["ranks"]) == 2 and all(r["stalled"] and r["frames"] for r in doc["ranks"]):
            return doc
        time.sleep(0.5)
    raise AssertionError(f"{lib}: both ranks' stacks not published:\n{job.log_tail()}")


def _check_hang(lib: str, doc: dict) -> None:
    ranks = {r["rank"]: r for r in doc["ranks"]}
    hung, waiting = ranks[1], ranks[0]
    functions = [f["function"] for f in hung["frames"]]
    assert "hang_in_data_loader" in functions and "__next__" in functions, (lib, hung)
    assert hung["phase"] == "data", (lib, hung["phase"])
    files = [f"{f['file']}:{f['function']}" for f in waiting["frames"]]
    assert any(_waiting_for_peers(f["file"]) for f in waiting["frames"]), (lib, files)
    assert "hang_in_data_loader" not in [f["function"] for f in waiting["frames"]], lib
    assert waiting["last_collective"]["seq"] > hung["last_collective"]["seq"], (lib, doc)


def _waiting_for_peers(path: str) -> bool:
    """Inside a collective: torch.distributed's files, the monitor's wrapper around one, DDP's
    file (its buffer broadcast), or autograd's backward (where DDP's C++ Reducer waits for the
    gradient all-reduce: no Python frame of its own)."""
    return ("torch/distributed/" in path or path.endswith("torch/nn/parallel/distributed.py")
            or path.endswith("fsdpmon/monitor/collectives.py") or "torch/autograd/" in path)
