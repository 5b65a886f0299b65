"""Mutation testing of the detector and figure modules: does some fast test fail when the code
is wrong?

Each mutant (benchmarks/mutants.py: a comparison, a constant or unit, a boolean or arithmetic
operator changed) is written into a copy of the repository and the non-slow tests of its area
run against it (`pytest -x -m "not slow"`); a mutant no test notices survives. Tests are chosen
per mutant from a traced run of the area (the tests that ran the mutated line, and those that
start subprocesses, which the trace cannot see into; all of the area's when no test ran the
line in-process), so most mutants cost one short pytest. Prints each module's mutation score,
killed / (mutants - equivalent), and every surviving mutant. Equivalent mutants (no input
tells them apart, or none a user would be told differently) are listed with their reasons in
benchmarks/mutation_equivalents.toml.

Why a script of our own: mutmut 3 mutates only inside functions (never a module's constants
and units, such as the MIB = 1024 of the NVLink rates), also mutates every string, and runs
from its own rewritten copy of the code; cosmic-ray needs a session database and a config per
run. Here the operators are the ones a reviewer asks about, keys survive edits, and nothing is
added to the project's dependencies.

Not part of the test suite (minutes to an hour on 2 cores). Run:
  python benchmarks/mutation.py                        # every area
  python benchmarks/mutation.py fsdpmon/scrape/rows.py # one module (or several)
  python benchmarks/mutation.py --list MODULE          # the mutants and their keys, no runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import tomllib
from mutants import Mutant, mutants

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.toml")

# module -> the test files of its area (tests/test_<name>.py); adding a module is one line.
AREAS = {
    "fsdpmon/monitor/straggling.py": "straggling monitor_stats",
    "fsdpmon/monitor/stats.py": "monitor_stats straggling monitor",
    "fsdpmon/monitor/watchdog.py": "monitor_watchdog monitor_state monitor",
    "fsdpmon/scrape/rows.py": "aggregate fused targets_asking",
    "fsdpmon/monitor/exit_record.py": "exit_record",
    "fsdpmon/diagnose/exits.py": "diagnose_crash diagnose",
    "fsdpmon/diagnose/gpu_rules.py": "diagnose diagnose_cli",
    "fsdpmon/monitor/records.py": "monitor monitor_jsonl monitor_stats",
    "fsdpmon/diagnose/stacks.py": "diagnose diagnosis_view",
    "fsdpmon/monitor/stacks.py": "monitor_stacks",
    "fsdpmon/monitor/flops.py": "flops monitor",
    "fsdpmon/diagnose/engine.py": "diagnose diagnose_crash diagnose_cli progress",
    "fsdpmon/monitor/collector.py": "monitor_collector monitor_collector_bounds progress",
    "fsdpmon/monitor/publish.py": "publish_units progress monitor",
    "fsdpmon/diagnose/observe.py": "diagnose diagnose_crash diagnose_cli",
    "fsdpmon/diagnose/window.py": "diagnose diagnose_crash",
    "exporters/nvml_fields.py": "nvml exporter_collector",
    "fsdpmon/diagnose/glance.py": "glance glance_naming health aggregate views",
    "fsdpmon/diagnose/straggler_rules.py": "diagnose glance glance_naming",
    "fsdpmon/diagnose/cpu_rules.py": "diagnose_cpu diagnose",
    "fsdpmon/diagnose/loss_rules.py": "diagnose_nonfinite diagnose nonfinite",
    "fsdpmon/monitor/cpustat.py": "cpustat monitor_stats",
    "fsdpmon/monitor/nonfinite.py": "monitor_nonfinite monitor_jsonl",
    "fsdpmon/job/goodput.py": "goodput goodput_units",
    "fsdpmon/job/run_goodput.py": "goodput goodput_run incidents",
    "fsdpmon/incidents/incidents.py": "incidents incidents_units",
    "fsdpmon/monitor/goodput_meter.py": "goodput goodput_units",
    "fsdpmon/monitor/flight.py": "incidents incidents_flight",
    "fsdpmon/incidents/history.py": "incidents_history_judge incidents_history incidents",
    "fsdpmon/incidents/history_reader.py": "incidents_history_judge",
    "fsdpmon/diagnose/replay.py": "incidents_units incidents incidents_history_judge",
    "fsdpmon/diagnose/after.py": "incidents_units incidents incidents_history_judge",
    "fsdpmon/job/run_snapshots.py": "incidents_units incidents",
}
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
_COPY_SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".hypothesis", "*_cache",
                                    "runs", "out", "build", "dist", "*.egg-info")


@dataclass
class Result:
    mutant: Mutant
    status: str  # killed, survived, timeout, invalid
    by: str = ""  # the first test that failed
    seconds: float = 0.0


def tests_of(module: str) -> list[str]:
    return [f"tests/test_{name}.py" for name in AREAS[module].split()]


def environment(copy: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(copy), str(copy / "benchmarks")]),
               **extra)
    env.pop("FSDPMON_FAULT", None)
    return env


def pytest(copy: Path, args: list[str], env: dict[str, str],
           timeout: float) -> tuple[int | None, str, float]:
    """(exit status or None on timeout, output, seconds) of one pytest in ``copy``."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, *PYTEST, *args], cwd=copy, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this call started, tests' children too
        out, _ = proc.communicate()
        return None, out, time.monotonic() - started
    return proc.returncode, out, time.monotonic() - started


def trace_area(copy: Path, module: str) -> tuple[dict[int, list[str]], list[str], float]:
    """line -> the tests (function ids) that ran it, from one traced, passing run; the tests
    that start subprocesses (they may run any line where the trace cannot see); seconds."""
    out_file = copy / f".trace-{module.replace('/', '_')}.json"
    env = environment(copy, MUTATION_TRACE_FILES=str(copy / module),
                      MUTATION_TRACE_OUT=str(out_file))
    rc, out, seconds = pytest(copy, ["-p", "mutation_trace", *tests_of(module)], env, 3600)
    if rc != 0:
        raise SystemExit(f"{module}: its tests fail before any mutation:\n{out[-3000:]}")
    by_line: dict[int, set[str]] = {}
    spawners: set[str] = set()
    for test, files in json.loads(out_file.read_text()).items():
        if test.startswith("<"):
            continue
        name = test.split("[", 1)[0]
        if files.pop("<subprocess>", None):
            spawners.add(name)
        for line in next(iter(files.values()), []):
            by_line.setdefault(line, set()).add(name)
    return {line: sorted(tests) for line, tests in by_line.items()}, sorted(spawners), seconds


def run_mutant(copy: Path, mutant: Mutant, original: bytes, tests: list[str],
               timeout: float) -> Result:
    target = copy / mutant.path
    mutated = mutant.apply(original)
    try:
        compile(mutated, mutant.path, "exec")
    except SyntaxError:
        return Result(mutant, "invalid")
    for cached in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        cached.unlink()
    target.write_bytes(mutated)
    try:
        env = environment(copy, PYTHONDONTWRITEBYTECODE="1")
        rc, out, seconds = pytest(copy, ["-x", *tests], env, timeout)
    finally:
        target.write_bytes(original)
    if rc is None:
        return Result(mutant, "timeout", f"over {timeout:.0f}s", seconds)
    failed = next((line.split()[1] for line in out.splitlines()
                   if line.startswith(("FAILED ", "ERROR "))), "")
    return Result(mutant, "survived" if rc == 0 else "killed", failed or f"exit {rc}", seconds)


def load_equivalents() -> dict[str, str]:
    if not EQUIVALENTS.exists():
        return {}
    doc = tomllib.loads(EQUIVALENTS.read_text())
    return {e["mutant"]: e["reason"] for e in doc.get("equivalent", [])}


def run_module(copies: list[Path], module: str, equivalents: dict[str, str],
               verbose: bool) -> tuple[list[Result], int]:
    """Every mutant's result, and how many more are listed as equivalent (not run)."""
    original = (ROOT / module).read_bytes()
    every = mutants(module, original)
    found = [m for m in every if m.key not in equivalents]
    covered, spawners, baseline = trace_area(copies[0], module)
    everything = tests_of(module)
    timeout = max(60.0, 3 * baseline)

    def one(i: int, mutant: Mutant) -> Result:
        copy = copies[i % len(copies)]
        ran = {t for line in range(mutant.lines[0], mutant.lines[1] + 1)
               for t in covered.get(line, ())}
        tests = sorted(ran | set(spawners)) if ran else everything
        result = run_mutant(copy, mutant, original, tests, timeout)
        if verbose:
            print(f"  {result.status:8} {mutant.line:4} {mutant.key}  [{result.by}]",
                  flush=True)
        return result

    # one mutant per copy at a time: each worker owns its copy
    with ThreadPoolExecutor(len(copies)) as pool:
        lanes = [pool.submit(lambda lane: [one(i, m) for i, m in enumerate(found)
                                           if i % len(copies) == lane], lane)
                 for lane in range(len(copies))]
        results = [r for lane in lanes for r in lane.result()]
    return sorted(results, key=lambda r: r.mutant.line), len(every) - len(found)


def report(by_module: dict[str, tuple[list[Result], int]]) -> int:
    print(f"\n{'module':34} {'mutants':>7} {'killed':>6} {'equiv':>5} {'survived':>8} "
          f"{'score':>6}")
    survivors = []
    for module, (results, equal) in by_module.items():
        killed = sum(r.status in ("killed", "timeout") for r in results)
        left = [r for r in results if r.status == "survived"]
        survivors += left
        judged = killed + len(left)
        score = f"{100 * killed / judged:.1f}%" if judged else "-"
        print(f"{module:34} {judged + equal:7} {killed:6} {equal:5} {len(left):8} {score:>6}")
    if survivors:
        print("\nsurviving mutants:")
        for r in survivors:
            print(f"  {r.mutant.path}:{r.mutant.line}  {r.mutant.key.split('::', 1)[1]}")
    return 1 if survivors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"some of: {', '.join(AREAS)}")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run side by side")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--quiet", action="store_true", help="no line per mutant")
    parser.add_argument("--json", metavar="PATH", help="write every mutant's result here")
    args = parser.parse_args(argv)
    modules = args.modules or list(AREAS)
    unknown = [m for m in modules if m not in AREAS]
    if unknown:
        parser.error(f"no area for {', '.join(unknown)} (add it to AREAS)")
    equivalents = load_equivalents()
    stale = [k for k in equivalents
             if not any(m.key == k for m in mutants(k.split("::")[0],
                                                    (ROOT / k.split("::")[0]).read_bytes()))]
    for key in stale:
        print(f"warning: listed as equivalent but no longer a mutant: {key}", file=sys.stderr)
    if args.list:
        for module in modules:
            for m in mutants(module, (ROOT / module).read_bytes()):
                mark = " (equivalent)" if m.key in equivalents else ""
                print(f"{m.path}:{m.line} [{m.kind}] {m.key}{mark}")
        return 0
    with tempfile.TemporaryDirectory(prefix="fsdpmon-mutation-") as tmp:
        copies = []
        for i in range(max(1, args.jobs)):
            copies.append(Path(tmp) / f"copy{i}")
            shutil.copytree(ROOT, copies[-1], ignore=_COPY_SKIP)
        by_module = {}
        for module in modules:
            started = time.monotonic()
            print(f"{module}: tests {AREAS[module]}", flush=True)
            by_module[module] = run_module(copies, module, equivalents, not args.quiet)
            print(f"{module}: {len(by_module[module][0])} mutants run in "
                  f"{time.monotonic() - started:.0f}s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([
            {"module": r.mutant.path, "line": r.mutant.line, "key": r.mutant.key,
             "kind": r.mutant.kind, "status": r.status, "by": r.by,
             "seconds": round(r.seconds, 2)} for rs, _ in by_module.values() for r in rs],
            indent=1))
    return report(by_module)


if __name__ == "__main__":
    sys.exit(main())
