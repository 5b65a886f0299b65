"""`python -m fsdpmon.trainer.train` with bad input: one line naming the problem, non-zero, no
traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
from proc_tree import kill_tree
from trainer_launch import REPO, child_env

pytestmark = pytest.mark.slow


def cases(tmp) -> dict[str, tuple[list[str], str]]:
    (tmp / "tok").mkdir(exist_ok=True)
    return {
        "missing data": (["--data", str(tmp / "missing.jsonl")], "--data: "),
        "tokenizer without tokenizer.json": (
            ["--data", "synthetic", "--tokenizer", str(tmp / "tok")], "has no tokenizer.json"),
        "seq-len 0": (["--seq-len", "0"], "--seq-len: must be > 0"),
        "unknown model": (["--model", "llama9-1t"], "--model: unknown value 'llama9-1t'"),
        # written only at the final save / first log window: checked before training starts
        "checkpoint dir not creatable": (["--checkpoint-dir", "/proc/nope"],
                                         "--checkpoint-dir: cannot create /proc/nope"),
        "log not writable": (["--log-jsonl", "/proc/nope/x.jsonl"],
                             "--log-jsonl: cannot create /proc/nope"),
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_input")
    procs = {}
    try:  # all four at once: each is mostly `import torch`
        for name, (argv, _) in cases(tmp).items():
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "fsdpmon.trainer.train", "--metrics-port", "0", *argv],
                cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True)
        return {name: (p.wait(timeout=120), *p.communicate()) for name, p in procs.items()}
    finally:
        for p in procs.values():
            kill_tree(p)


@pytest.mark.parametrize("name", ["missing data", "tokenizer without tokenizer.json",
                                  "seq-len 0", "unknown model", "checkpoint dir not creatable",
                                  "log not writable"])
def test_one_line_error_and_exit_code_2(outcomes, tmp_path, name):
    code, stdout, stderr = outcomes[name]
    expected = cases(tmp_path)[name][1]
    assert code == 2, stderr
    assert "Traceback" not in stderr + stdout
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("trainer: error: ") and expected in lines[0]


def test_output_paths_are_checked_and_created_at_parse_time(tmp_path):
    from fsdpmon.errors import InputError
    from fsdpmon.trainer.config import parse_config

    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=r"--checkpoint-dir: .*file is not a directory"):
        parse_config(["--checkpoint-dir", str(tmp_path / "file")])
    with pytest.raises(InputError, match=r"--log-jsonl: .*file is not a directory"):
        parse_config(["--log-jsonl", str(tmp_path / "file" / "x.jsonl")])
    cfg = parse_config(["--checkpoint-dir", str(tmp_path / "ck" / "a"),
                        "--log-jsonl", str(tmp_path / "logs" / "run.jsonl")])
    assert (tmp_path / "ck" / "a").is_dir() and (tmp_path / "logs").is_dir()
    # manifests validates train args for pods: no path of this machine is looked at
    parse_config(["--checkpoint-dir", "/proc/nope"], check_paths=False)
    assert cfg.checkpoint.dir == str(tmp_path / "ck" / "a")
