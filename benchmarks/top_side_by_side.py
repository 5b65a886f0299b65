"""Two versions of `fsdpmon top`'s refresh, side by side: which is faster, measured in one run.

On a shared machine the speed drifts by up to a third within minutes, more than most changes
to a refresh gain, so figures from two runs of bench_top.py cannot tell two versions apart.
Here each version (a git revision, checked out in a temporary worktree, or a directory holding a
checkout, such as ``.``) runs as its own `top` process (TargetsSource as the version has it, a
200x50 frame drawn), and the two refresh in turn, view by view, against the same stand-in pods
(256 nodes x 8 GPUs by default, served as bench_top.py serves them): drift hits both alike.
Prints, for each version, every view's p50 wall and CPU time (with its helper process's, in a
version that has one) and the slowest view's p50, then the ratio of the slowest views.

    python benchmarks/top_side_by_side.py HEAD~1 .        # the commit before against this tree
    python benchmarks/top_side_by_side.py --own-pods HEAD~1 .   # each served its own payloads
    python benchmarks/top_side_by_side.py --one-process OLD .   # OLD without its helper process

Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_top import VIEWS, pod_urls, start_servers  # noqa: E402 - after the path set-up
from synthetic_job import job_expositions  # noqa: E402

# One version's `top`: imports fsdpmon from the tree given, refreshes a view per input line and
# answers (wall, CPU of its processes) in seconds, as JSON.
_REFRESHER = """
import io, json, sys, time
sys.path.insert(0, sys.argv[1])
from rich.console import Console
from fsdpmon.scrape.sources.targets import TargetsSource
from fsdpmon.top.ui_state import ViewState
from fsdpmon.top.views import frame
try:  # as the live view does, where the version has it
    from fsdpmon.scrape.gcpause import top_owns_this_process
    top_owns_this_process()
except ImportError:
    pass
import inspect
one_process = sys.argv[2] == "one" and "split" in inspect.signature(TargetsSource).parameters
source = TargetsSource(json.loads(sys.stdin.readline()), timeout_s=10.0,
                       **({"split": False} if one_process else {}))
console = Console(width=200, height=50, color_system="truecolor", force_terminal=True)
for line in sys.stdin:
    view, key = line.split()
    source.showing(view)
    cpu, start = time.process_time(), time.perf_counter()
    snap = source.fetch()
    console.file = io.StringIO()
    console.print(frame(snap, ViewState(view=view, sort_key=key, descending=True), 50))
    wall = time.perf_counter() - start
    if snap.targets_up != len(snap.targets):
        sys.exit(f"refresh incomplete: {snap.targets_up}/{len(snap.targets)} up")
    helper = getattr(source, "helper_cpu_s", 0.0)  # a version with a helper process
    print(json.dumps([wall, time.process_time() - cpu + helper]), flush=True)
source.close()
"""


# One stand-in pod process rendering a version's own payloads (its tests/synthetic_job.py), for
# a change to what the pods serve: prints [port, paths], serves until its stdin closes.
_PODS = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests"]
from payload_server import PayloadServer
from synthetic_job import job_expositions
server = PayloadServer(job_expositions("llama2-7b", int(sys.argv[2]), int(sys.argv[3])))
print(json.dumps([server.port, sorted(server.payloads)]), flush=True)
sys.stdin.read()
server.close()
"""


class OwnPods:
    """``servers`` stand-in pod processes serving one version's own payloads."""

    def __init__(self, tree: Path, nodes: int, gpus: int, servers: int) -> None:
        self.processes = [subprocess.Popen([sys.executable, "-c", _PODS, str(tree), str(nodes),
                                            str(gpus)], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True)
                          for _ in range(servers)]
        answers = [json.loads(p.stdout.readline()) for p in self.processes]  # type: ignore[union-attr]
        ports, paths = [a[0] for a in answers], answers[0][1]
        self.urls = pod_urls(ports, paths)

    def close(self) -> None:
        for p in self.processes:
            with contextlib.suppress(OSError):
                p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=30)


class Version:
    """One version's `top` process."""

    def __init__(self, name: str, tree: Path, urls: list[str], one_process: bool) -> None:
        self.name = name
        self.process = subprocess.Popen([sys.executable, "-c", _REFRESHER, str(tree),
                                         "one" if one_process else "as-is"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, cwd=tree)
        self._send(json.dumps(urls))

    def _send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def refresh(self, view: str, key: str) -> tuple[float, float]:
        self._send(f"{view} {key}")
        assert self.process.stdout is not None
        answer = self.process.stdout.readline()
        if not answer:
            raise SystemExit(f"{self.name}: its top exited ({self.process.wait()})")
        wall, cpu = json.loads(answer)
        return wall, cpu

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        self.process.wait(timeout=30)


def checkout(revision: str, into: Path) -> Path:
    """The tree of ``revision``: a directory holding a checkout (``.``: this one) as it is, else
    a git revision of this repository checked out into ``into``."""
    if Path(revision).is_dir():
        return Path(revision).resolve()
    tree = into / revision.replace("/", "_").replace("~", "-").replace("^", "-")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet",
                    str(tree), revision], check=True)
    return tree


def report(results: dict[str, dict[str, list[Any]]]) -> None:
    slowest = {}
    for name, views in results.items():
        parts = [f"{view} {statistics.median(w for w, _ in rs) * 1e3:.0f} ms (CPU "
                 f"{statistics.median(c for _, c in rs) * 1e3:.0f})" for view, rs in views.items()]
        slowest[name] = max(statistics.median(w for w, _ in rs) for rs in views.values())
        print(f"{name}: p50 " + ", ".join(parts) + f"; slowest view {slowest[name] * 1e3:.0f} ms")
    (a, sa), (b, sb) = slowest.items()
    print(f"slowest view p50, {b} / {a}: {sb * 1e3:.0f} / {sa * 1e3:.0f} ms = {sb / sa:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", help="a git revision, or a checkout's directory (. for this)")
    parser.add_argument("after", help="a git revision, or a checkout's directory (. for this)")
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="3 refreshes per view each")
    parser.add_argument("--one-process", action="store_true",
                        help="a version with a helper process runs without it (split=False)")
    parser.add_argument("--own-pods", action="store_true",
                        help="serve each version the payloads of its own tests/synthetic_job.py "
                             "(for a change to what the exporter or the monitor serves)")
    args = parser.parse_args()
    if args.before == args.after:
        parser.error("give two different versions")
    ports, stop, procs = start_servers(0 if args.own_pods else args.servers, args.nodes,
                                       args.gpus)
    paths = [] if args.own_pods else sorted(job_expositions("llama2-7b", args.nodes, args.gpus))
    urls = pod_urls(ports, paths)
    scratch = Path(tempfile.mkdtemp(prefix="top-side-by-side-"))
    versions: list[Version] = []
    pods: list[OwnPods] = []
    try:
        trees = [checkout(r, scratch) for r in (args.before, args.after)]
        if args.own_pods:  # each version's top hits its own pods, idle while the other refreshes
            pods = [OwnPods(tree, args.nodes, args.gpus, args.servers) for tree in trees]
        versions = [Version(r, tree, pods[i].urls if pods else urls, args.one_process)
                    for i, (r, tree) in enumerate(zip((args.before, args.after), trees,
                                                      strict=True))]
        for version in versions:
            for _ in range(2):
                version.refresh(*VIEWS[0])  # warm-up: imports, the helper, the caches
        results: dict[str, dict[str, list[Any]]] = {v.name: {} for v in versions}
        for _ in range(args.rounds):
            for view, key in VIEWS:
                for _ in range(3):
                    for version in versions:
                        results[version.name].setdefault(view, []).append(
                            version.refresh(view, key))
        report(results)
    finally:
        for version in versions:
            version.close()
        for each in pods:
            each.close()
        stop.set()
        for p in procs:
            p.join(timeout=10)
        for tree in scratch.iterdir():  # the worktrees made here, not a directory given
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                           check=False)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
