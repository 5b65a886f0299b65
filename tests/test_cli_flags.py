"""The command-line plumbing the commands share (fsdpmon.scrape.options): the source flags are
one declaration and parse the same way in `top`, `diagnose`, `incidents` and `report`; `--job`
is the one job flag (repeatable, comma-separated too; `report --jobs` still works, with a note);
one duration parser, whose bad values are one line naming the flag and exit status 2."""

from __future__ import annotations

import argparse
import importlib

import pytest
from support import free_port

from fsdpmon.cli import COMMANDS, HelpFormatter, main
from fsdpmon.errors import ConfigError
from fsdpmon.scrape.options import build_source, job_names, parse_duration

LIVE = ("top", "diagnose")  # a job's live view: one source, one job
HISTORY = ("incidents", "report")  # jobs' history from Prometheus
NOTE = "fsdpmon report: --jobs is deprecated; use --job (repeatable)"


def parser(command: str) -> argparse.ArgumentParser:
    """The command's own parser, as `fsdpmon COMMAND` builds it."""
    sub = argparse.ArgumentParser(prog=f"fsdpmon {command}", formatter_class=HelpFormatter)
    importlib.import_module(COMMANDS[command][0]).configure(sub)
    return sub


def _declared(command: str, flag: str) -> tuple:
    action = next(a for a in parser(command)._actions if flag in a.option_strings)
    return type(action), tuple(action.option_strings), action.dest, action.metavar, action.default


def dead_prometheus() -> str:
    return f"http://127.0.0.1:{free_port()}"


# -- one declaration, parsed the same way ---------------------------------------------------

@pytest.mark.parametrize("flag", ["--prometheus", "--job"])
def test_the_flags_every_command_reads_are_one_declaration(flag):
    assert len({_declared(c, flag) for c in (*LIVE, *HISTORY)}) == 1


@pytest.mark.parametrize("flag", ["--targets", "-n", "--selector", "--context", "--kubeconfig"])
def test_the_live_source_flags_are_one_declaration(flag):
    assert _declared("top", flag) == _declared("diagnose", flag)


@pytest.mark.parametrize("command", [*LIVE, *HISTORY])
def test_job_repeats_and_splits_at_commas_in_every_command(command, capsys):
    args = parser(command).parse_args(
        ["--prometheus", "http://p:9090", "--job", "a,b", "--job", " c "])
    assert (args.prometheus, job_names(args)) == ("http://p:9090", ["a", "b", "c"])
    assert parser(command).parse_args([]).job is None and job_names(
        parser(command).parse_args([])) == []
    assert capsys.readouterr().err == ""  # no note for the flag's own name


@pytest.mark.parametrize("command", [*LIVE, *HISTORY])
@pytest.mark.parametrize("value", [",", " "])
def test_a_job_flag_naming_nobody_is_a_one_line_error(command, value, capsys):
    assert main([command, "--prometheus", "http://p:9090", "--job", value]) == 2
    err = capsys.readouterr().err
    assert err == f"fsdpmon {command}: error: --job: give at least one job name\n", err


@pytest.mark.parametrize("command", LIVE)
@pytest.mark.parametrize(("jobs", "error"), [
    (["--job", "a"], None),
    (["--job", "a,b"], "--job: name one job to watch, got 2: a, b"),
    (["--job", "a", "--job", "b"], "--job: name one job to watch, got 2: a, b"),
])
def test_a_live_view_watches_one_job(command, jobs, error):
    args = parser(command).parse_args(["--prometheus", "http://p:9090", *jobs])
    if error is None:
        source = build_source(args)  # builds without a query
        source.close()
        return
    with pytest.raises(ConfigError, match=error):
        build_source(args)


def test_the_run_arguments_are_one_declaration():
    runs = {c: next(a for a in parser(c)._actions if a.dest == "runs")
            for c in ("incidents", "goodput", "report")}
    assert {(a.metavar, a.help.split(", or ")[0]) for a in runs.values()} == {
        ("RUN", "a run's JSONL: the trainer's --log-jsonl PATH (its per-rank files "
                "PATH.rank<k>.jsonl are read), one per-rank file")}
    assert [runs[c].nargs for c in runs] == ["*", "+", "*"]  # goodput needs a run


# -- the renamed spelling -------------------------------------------------------------------

def test_report_jobs_still_works_and_says_it_is_deprecated(capsys):
    old = parser("report").parse_args(["--jobs", "a,b", "--jobs", "c"])
    assert capsys.readouterr().err == f"{NOTE}\n{NOTE}\n"  # one line each time it is given
    new = parser("report").parse_args(["--job", "a,b", "--job", "c"])
    assert job_names(old) == job_names(new) == ["a", "b", "c"]
    assert capsys.readouterr().err == ""
    assert "--jobs" not in parser("report").format_help()  # --help names the new spelling only


def test_report_jobs_reaches_prometheus_like_job(capsys):
    url = dead_prometheus()
    for flag in ("--jobs", "--job"):
        assert main(["report", "--prometheus", url, flag, "a", "--out", "unused"]) == 3
        err = capsys.readouterr().err.splitlines()
        assert err[:-1] == ([NOTE] if flag == "--jobs" else []), err
        assert err[-1].startswith("fsdpmon report: error: ") and url in err[-1], err


@pytest.mark.parametrize("command", ["top", "diagnose", "incidents"])
def test_jobs_is_a_spelling_of_report_only(command, capsys):
    with pytest.raises(SystemExit) as done:
        parser(command).parse_args(["--jobs", "a"])
    assert done.value.code == 2 and "unrecognized arguments: --jobs" in capsys.readouterr().err


# -- one duration parser --------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [
    ("45", 45), ("1ms", 0.001), ("90s", 90), ("30m", 1800), ("1.5h", 5400), ("7d", 604800),
    ("2w", 1209600), (" 30 s ", 30), ("0.001", 0.001)])
def test_durations(text, seconds):
    assert parse_duration("--since", text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "1.5x", "1.h", ".5s", "-1s", "1e3", "s", "", "24H"])
def test_what_is_not_a_duration_names_the_flag(text):
    with pytest.raises(ConfigError) as bad:
        parse_duration("--since", text)
    assert str(bad.value) == f"--since: {text!r} is not a duration like 45, 30s, 2m, 24h or 7d"


def test_zero_is_a_duration_only_where_the_flag_allows_it():
    with pytest.raises(ConfigError) as zero:
        parse_duration("--since", "0s")
    assert str(zero.value) == "--since: '0s' is not longer than 0"
    assert parse_duration("--for", "0s", allow_zero=True) == 0


def one_line(capsys, argv: list[str], code: int) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# Each side of each boundary, through each command: a positive --since (0 refused, a
# millisecond reaches Prometheus, which is not there: exit 3), and diagnose's --for (0 is one
# refresh, below 0 is no duration).
@pytest.mark.parametrize("command", HISTORY)
@pytest.mark.parametrize(("since", "code"), [("0", 2), ("0ms", 2), ("1ms", 3), ("0.5", 3),
                                             ("soon", 2), ("24h", 3)])
def test_since_through_the_history_commands(command, since, code, capsys, tmp_path):
    url = dead_prometheus()
    err = one_line(capsys, [command, "--prometheus", url, "--job", "j", "--since", since,
                            *(["--out", str(tmp_path)] if command == "report" else [])], code)
    assert err.startswith(f"fsdpmon {command}: error: "), err
    assert (f"--since: {since!r}" in err) == (code == 2) and (url in err) == (code == 3), err


@pytest.mark.parametrize(("watch", "code"), [("-1", 2), ("0", 3), ("0.01", 3), ("soon", 2),
                                             ("1x", 2)])
def test_for_through_diagnose(watch, code, capsys):
    err = one_line(capsys, ["diagnose", "--targets", f"127.0.0.1:{free_port()}", "--for",
                            watch, "--timeout", "0.5"], code)
    assert (f"error: --for: {watch!r} is not a duration" in err) == (code == 2), err
    assert ("no target answered" in err) == (code == 3), err
