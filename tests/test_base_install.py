"""The base install (`pip install fsdpmon`, no extras) runs every command but the trainer's.

Each command runs in a fresh interpreter where torch, matplotlib and the other extras' packages
cannot be imported: a finder refuses them and records every attempt, so a command that tried one
and swallowed the error is caught too. `benchmarks/bench_install.py` does the same in real fresh
virtual environments and measures each install's size.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from fsdpmon.cli import COMMANDS
from tests.proc_tree import kill_tree
from tests.report_logs import write_run
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[1]
# What the extras add (train: torch, numpy; report: matplotlib; hf: tokenizers, safetensors).
EXTRAS_ONLY = ("torch", "numpy", "matplotlib", "tokenizers", "safetensors", "transformers")
BLOCK = f"""
import atexit, importlib.abc, sys
BLOCKED = {EXTRAS_ONLY!r}
tried = []
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            tried.append(name)
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
atexit.register(lambda: print("TRIED-EXTRAS:", sorted(set(tried)), file=sys.stderr))
"""


def base_python(*args: str) -> list[str]:
    """A command line: python with the extras refused, then ``fsdpmon ARGS`` (or ``-m M``)."""
    if args and args[0] == "-m":
        tail = f"import runpy; sys.argv = {list(args[1:])!r}; runpy.run_module({args[1]!r}, " \
               "run_name='__main__')"
    else:
        tail = f"from fsdpmon.cli import main; sys.exit(main({list(args)!r}))"
    return [sys.executable, "-c", BLOCK + tail]


def run_base(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(base_python(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, stdin=subprocess.DEVNULL)


def tried_extras(result: subprocess.CompletedProcess[str]) -> list[str]:
    line = result.stderr.split("TRIED-EXTRAS:")[-1].splitlines()[0]
    return ast.literal_eval(line.strip())


def assert_no_extras(result: subprocess.CompletedProcess[str], what: str) -> None:
    assert "Traceback" not in result.stderr, f"{what}: traceback\n{result.stderr[-2000:]}"
    tried = tried_extras(result)
    assert tried == [], f"{what} tried to import {tried}:\n{result.stderr[-1000:]}"


def test_every_command_help_works_without_the_extras():
    # One interpreter for all commands (a start costs ~0.5 s); each records what it tried.
    loop = (
        "import contextlib, io\n"
        "from fsdpmon.cli import main\n"
        f"for command in {sorted(COMMANDS)!r}:\n"
        "    before, out = len(tried), io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main([command, '--help'])\n"
        "        except SystemExit as exc:\n"
        "            code = exc.code\n"
        "    print('HELP', command, code, 'usage:' in out.getvalue(), tried[before:], "
        "file=sys.stderr)\n"
    )
    result = subprocess.run([sys.executable, "-c", BLOCK + loop], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = [line.split(" ", 4)[1:] for line in result.stderr.splitlines()
             if line.startswith("HELP ")]
    assert [command for command, *_ in lines] == sorted(COMMANDS), result.stderr
    for command, code, usage, tried in lines:
        assert code == "0" and usage == "True", f"fsdpmon {command} --help: exit {code}"
        assert tried == "[]", f"fsdpmon {command} --help tried to import {tried}"


def test_manifests_and_dashboards_work_without_the_extras(tmp_path: Path) -> None:
    result = run_base("manifests", "--job-name", "llama", "--image", "r.example/fsdp:1",
                      "--train-arg=--warmup-steps=5")
    assert result.returncode == 0, result.stderr
    assert "kind: PyTorchJob" in result.stdout
    assert_no_extras(result, "fsdpmon manifests")
    check = run_base("-m", "fsdpmon.dashboards", "--check")
    assert check.returncode == 0, check.stderr
    assert_no_extras(check, "python -m fsdpmon.dashboards --check")


def test_report_writes_table_and_json_without_matplotlib(tmp_path: Path) -> None:
    for world in (1, 2):
        write_run(tmp_path / f"n{world}.jsonl", world)
    out = tmp_path / "report"
    result = run_base("report", str(tmp_path), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert (out / "report.md").is_file() and (out / "report.json").is_file()
    assert not (out / "scaling.png").exists()
    assert "pip install 'fsdpmon[report]'" in result.stderr
    assert "scaling.png" not in (out / "report.md").read_text()
    # It looks for matplotlib (to draw the chart) and for nothing else of the extras.
    assert "Traceback" not in result.stderr, result.stderr
    tried = {name.split(".")[0] for name in tried_extras(result)}
    assert tried == {"matplotlib"}, f"fsdpmon report tried {sorted(tried)}"


@pytest.mark.slow
def test_exporter_and_top_run_without_the_extras() -> None:
    port = free_port()
    exporter = subprocess.Popen(
        base_python("exporter", "--simulate-gpus", "2", "--port", str(port),
                    "--listen-address", "127.0.0.1", "--interval", "0.5"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        _await_series(url, exporter, "fsdpmon_gpu_")
        top = run_base("top", "--json", "--targets", url)
        assert top.returncode in (0, 3, 4), f"top exit {top.returncode}: {top.stderr}"
        assert len(json.loads(top.stdout)["gpus"]) == 2, top.stdout[:500]
        assert_no_extras(top, "fsdpmon top --json")
    finally:
        exporter.terminate()
        try:
            _, err = exporter.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            kill_tree(exporter)
            _, err = exporter.communicate()
    assert "TRIED-EXTRAS: []" in err, f"exporter tried an extra's package:\n{err[-1000:]}"


def _await_series(url: str, proc: subprocess.Popen[str], prefix: str, wait_s: float = 30) -> None:
    """Until the exporter's first sample is served (GPU series appear after the first sample)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exporter exited {proc.returncode}: {proc.stderr.read()}"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if prefix in answer.read().decode():
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"exporter at {url} served no {prefix}* series within {wait_s} s")


def test_trainer_and_monitor_name_the_train_extra_without_torch():
    helped = run_base("-m", "fsdpmon.trainer.train", "--help")  # the flags need no torch
    assert helped.returncode == 0 and "--max-steps" in helped.stdout, helped.stderr
    trainer = run_base("-m", "fsdpmon.trainer.train", "--max-steps", "1")  # the loop does
    assert trainer.returncode == 2, trainer.stderr
    first = trainer.stderr.strip().splitlines()[0]
    assert first == ("trainer: error: the trainer needs the 'train' extra: "
                     "pip install 'fsdpmon[train]'"), trainer.stderr
    monitor = subprocess.run(
        [sys.executable, "-c", BLOCK + "\ntry:\n    from fsdpmon.monitor import Monitor\n"
         "except ModuleNotFoundError as exc:\n    print(exc)\n"],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "the in-trainer monitor needs the 'train' extra" in monitor.stdout, monitor
