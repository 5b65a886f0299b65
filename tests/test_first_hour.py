"""A new user's mistakes get one line naming the bad input (exit 2), before any work starts;
every flag of every command says what it does and its default.

In-process where the command's own code is what is tested; a real subprocess where the point is
what a terminal (or its absence) and the process's stderr show.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpmon.cli import COMMANDS, HelpFormatter, _top_parser, main

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "r.example/fsdp:1"


def one_line_error(capsys, *argv: str) -> str:
    """Run ``fsdpmon ARGV`` in-process; assert exit 2 and one stderr line; return that line."""
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    assert code == 2, f"exit {code}, stderr: {err}"
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_top_bad_ipv6_target_names_the_flag(capsys):
    err = one_line_error(capsys, "top", "--targets", "http://[::1", "--once")
    assert err.startswith("fsdpmon top: error: --targets: 'http://[::1' is not a valid URL"), err


@pytest.mark.parametrize("text", ["clusters: [\n  - name: x\n   bad: : :\n", "- a\n- b\n",
                                  "just a string\n"])
def test_top_malformed_kubeconfig_names_the_flag(capsys, tmp_path, text):
    path = tmp_path / "config"
    path.write_text(text)
    err = one_line_error(capsys, "top", "--job", "x", "--kubeconfig", str(path), "--once")
    assert "--kubeconfig: cannot load Kubernetes configuration" in err, err


@pytest.mark.parametrize(("argv", "flag", "source"), [
    (["--targets", "h:1", "--job", "x"], "--job", "--targets"),
    (["--targets", "h:1", "--kubeconfig", "k"], "--kubeconfig", "--targets"),
    (["--prometheus", "http://p:9090", "--selector", "a=b"], "--selector", "--prometheus"),
    (["--prometheus", "http://p:9090", "-n", "ml"], "--namespace", "--prometheus"),
])
def test_top_contradictory_sources_fail(capsys, argv, flag, source):
    err = one_line_error(capsys, "top", *argv, "--once")
    assert f"error: {flag}: cannot be combined with {source}" in err, err


def test_top_without_a_terminal_says_so_and_exits():
    # stdin from /dev/null, stdout a pipe: before, top printed nothing and never exited.
    out = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "top", "--targets", "127.0.0.1:1"],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 2, out
    assert out.stderr.strip() == "fsdpmon top: error: no terminal; use --once or --json"


def test_manifests_without_a_job_name_says_it_is_required(capsys):
    err = one_line_error(capsys, "manifests", "--image", IMAGE)
    assert err.endswith("--job-name: is required (or JOB_NAME in the --env-file)"), err


@pytest.mark.parametrize(("arg", "problem"), [
    ("--bogus-flag", "unrecognized arguments: --bogus-flag"),
    ("--lr=abc", "argument --lr: invalid float value: 'abc'"),
    ("--warmup-steps=-1", "--warmup-steps: must be >= 0"),
    ("--n-heads=7", "--dim: 4096 is not divisible by --n-heads 7"),
])
def test_manifests_train_args_go_through_the_trainers_parser(capsys, arg, problem):
    err = one_line_error(capsys, "manifests", "--job-name", "j", "--image", IMAGE,
                         f"--train-arg={arg}")
    assert "--train-arg: python -m fsdpmon.trainer.train would reject it" in err, err
    assert problem in err, err


def test_manifests_good_train_args_and_pod_paths_pass(capsys):
    # The checkpoint dir is the pod's: this machine's file system is not consulted.
    code = main(["manifests", "--job-name", "j", "--image", IMAGE, "--components", "job",
                 "--train-arg=--warmup-steps=100", "--train-arg=--checkpoint-dir=/proc/pod"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "--warmup-steps=100" in out.out


def manifests_stderr(tmp_path: Path, *extra: str) -> str:
    out = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "manifests", "--job-name", "j",
                          "--image", IMAGE, "--out", str(tmp_path / "out"), *extra],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_manifests_unknown_instance_type_warns_and_info_needs_v(tmp_path):
    err = manifests_stderr(tmp_path, "--instance-type", "p9.huge")
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected only the warning, got {len(lines)} lines:\n{err}"
    assert "unknown instance type 'p9.huge': assuming 8 GPUs and no EFA" in lines[0]
    assert "--gpus-per-node" in lines[0] and "--efa-per-node" in lines[0]
    # Both counts given: nothing to warn about; -v brings the INFO lines back.
    err = manifests_stderr(tmp_path, "--instance-type", "p9.huge", "--gpus-per-node", "4",
                           "--efa-per-node", "0", "-v")
    assert "unknown instance type" not in err and "INFO" in err and "wrote" in err, err


def all_parsers() -> dict[str, argparse.ArgumentParser]:
    parsers = {"fsdpmon": _top_parser()}
    for name, (module_name, text) in COMMANDS.items():
        sub = argparse.ArgumentParser(prog=f"fsdpmon {name}", description=text,
                                      formatter_class=HelpFormatter)
        importlib.import_module(module_name).configure(sub)
        parsers[f"fsdpmon {name}"] = sub
    from fsdpmon.trainer.config import build_parser

    parsers["python -m fsdpmon.trainer.train"] = build_parser()
    return parsers


def test_every_option_has_help_and_shows_its_default():
    problems = []
    for prog, parser in all_parsers().items():
        formatter = parser.formatter_class(prog=prog)
        for action in parser._actions:
            skip = argparse._HelpAction | argparse._VersionAction
            if not action.option_strings or isinstance(action, skip):
                continue
            flag = action.option_strings[-1]
            if action.help == argparse.SUPPRESS:
                continue  # deliberately hidden (e.g. manifests --hf-token exists to refuse one)
            if not action.help:
                problems.append(f"{prog} {flag}: no help")
                continue
            shown = formatter._get_help_string(action)
            has_default = not (action.default is None or action.default is False
                               or action.default == [] or action.default == argparse.SUPPRESS)
            if has_default and "default" not in shown.lower():
                problems.append(f"{prog} {flag}: default {action.default!r} not shown")
    assert not problems, f"{len(problems)} options lack help or a shown default:\n" + "\n".join(
        problems)


def test_top_help_lists_each_flag_once_with_its_defaults():
    text = all_parsers()["fsdpmon top"].format_help()
    assert text.count("--targets URL") == 2, text  # once in usage, once in the options
    for flag, default in (("--interval", "2.0"), ("--timeout", "3.0")):
        line = text[text.index(f"  {flag} "):].split("\n", 2)
        assert f"(default: {default})" in " ".join(line[:2]), line


def test_demo_hint_runs_from_a_fresh_shell():
    """The demo's "in another terminal: ..." line works where the venv is not on PATH."""
    from fsdpmon.demo import fsdpmon_command

    out = subprocess.run(f"{fsdpmon_command()} --version", shell=True, capture_output=True,
                         text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert out.returncode == 0 and out.stdout.startswith("fsdpmon "), out
