"""What each install costs: fresh virtual environments, one per extra, sized and timed.

    .venv/bin/python benchmarks/bench_install.py [--keep DIR] [--only base,train]

For each install (base, train, report, hf) it creates an empty venv with this Python, runs
`pip install '<repo>[extra]'` (train: the CPU build of torch first, as scripts/setup.sh does), and
prints the wall time, the disk it added over an empty venv, and the packages it pulled. In the base
venv it then runs every `fsdpmon` command's --help and a real `manifests` and `report` run, and
checks torch is not installed at all. Uses this machine's pip configuration as it is (a pip set up
with local wheels gives local figures; a stock pip downloads). Not a test: it takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from fsdpmon.cli import COMMANDS  # noqa: E402
from tests.report_logs import write_run  # noqa: E402

INSTALLS = {"base": "", "train": "[train]", "report": "[report]", "hf": "[hf]"}
TORCH = "torch==2.13.0"  # what scripts/setup.sh installs


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin" / "python"


def pip(python: Path, *args: str) -> None:
    out = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                          "-q", *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"pip install {' '.join(args)} failed:\n{out.stderr[-3000:]}")


def packages(python: Path) -> list[str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json",
                          "--disable-pip-version-check"], capture_output=True, text=True,
                         check=True)
    return sorted(p["name"].lower() for p in json.loads(out.stdout))


def check_base(python: Path, work: Path) -> list[str]:
    """Every base command really runs in the base venv; torch is not even installed."""
    bad = []
    fsdpmon = python.parent / "fsdpmon"
    runs = [[str(fsdpmon), name, "--help"] for name in COMMANDS]
    runs.append([str(fsdpmon), "manifests", "--job-name", "j", "--image", "r.example/x:1"])
    (work / "logs").mkdir(exist_ok=True)
    for world in (1, 2):
        write_run(work / "logs" / f"n{world}.jsonl", world)
    runs.append([str(fsdpmon), "report", str(work / "logs"), "--out", str(work / "report")])
    runs.append([str(python), "-m", "fsdpmon.dashboards", "--check"])
    for argv in runs:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=work,
                             stdin=subprocess.DEVNULL)
        if out.returncode or "Traceback" in out.stderr:
            bad.append(f"{' '.join(argv[1:4])}: exit {out.returncode}: {out.stderr[-300:]}")
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        bad.append("torch is installed in the base venv")
    return bad


def source_copy(work: Path) -> Path:
    """The repository's tracked files only: building from the checkout itself would make
    setuptools walk .venv (tens of thousands of files) and time that instead of the install."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    dest = work / "src"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def measure(name: str, work: Path, empty_bytes: int, src: Path) -> dict:
    path = work / f"venv-{name}"
    python = venv(path)
    start = time.monotonic()
    if name == "train":
        pip(python, TORCH)
    pip(python, f"{src}{INSTALLS[name]}")
    seconds = time.monotonic() - start
    result = {"install": f"fsdpmon{INSTALLS[name]}", "seconds": round(seconds, 1),
              "added_mb": round((du(path) - empty_bytes) / 1e6, 1),
              "packages": len(packages(python)),
              "nvidia_packages": sum(p.startswith("nvidia-") for p in packages(python)
                                     if p != "nvidia-ml-py")}
    if name == "base":
        result["base_commands_problems"] = check_base(python, work)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(INSTALLS),
                        help=f"comma list of {','.join(INSTALLS)} (default: all)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="build the venvs here and keep them (default: a temporary dir)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="fsdpmon-install-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        empty = du(venv(work / "venv-empty").parent.parent)
        print(f"python {sys.version.split()[0]}, empty venv {empty / 1e6:.1f} MB, pip config: "
              f"{os.environ.get('PIP_CONFIG_FILE') or 'default'}")
        print(f"{'install':<18} {'time':>8} {'added':>10} {'packages':>9} {'nvidia-*':>9}")
        src = source_copy(work)
        for name in args.only.split(","):
            r = measure(name.strip(), work, empty, src)
            print(f"{r['install']:<18} {r['seconds']:>7.1f}s {r['added_mb']:>8.1f}MB "
                  f"{r['packages']:>9} {r['nvidia_packages']:>9}", flush=True)
            for problem in r.get("base_commands_problems", []):
                print(f"  base install problem: {problem}")
            if name == "base" and not r["base_commands_problems"]:
                print(f"  base venv: every command's --help, manifests, report and "
                      f"dashboards --check ran without torch ({len(COMMANDS)} commands)")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
