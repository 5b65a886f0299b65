"""The CLI front door: help, unknown commands, and the one place errors become exit codes."""

import subprocess
import sys

from fsdpmon.errors import ConfigError, UnreachableError, guarded


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fsdpmon.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_help_lists_every_command():
    out = run_cli("--help")
    assert out.returncode == 0
    for name in ("demo", "top", "exporter", "manifests", "report"):
        assert name in out.stdout


def test_unknown_command_is_a_clean_usage_error():
    out = run_cli("frobnicate")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "invalid choice" in out.stderr


def test_guarded_turns_errors_into_one_line_and_exit_code(capsys):
    def bad_config() -> int:
        raise ConfigError("--port", "must be a TCP port in 0..65535, got 70000")

    assert guarded(bad_config, prog="fsdpmon x") == 2
    err = capsys.readouterr().err
    assert err.strip() == "fsdpmon x: error: --port: must be a TCP port in 0..65535, got 70000"

    def unreachable() -> int:
        raise UnreachableError("http://127.0.0.1:1/metrics: connection refused")

    assert guarded(unreachable) == 3
