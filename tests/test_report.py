"""`fsdpmon report` on logs in the JSONL contract format: loading, figures, table, chart, errors."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from report_logs import read_records, write_run
from support import printed, rounded

from fsdpmon.errors import ConfigError, InputError
from fsdpmon.report.loader import load_runs
from fsdpmon.report.stats import percentile, run_stats, with_scaling
from fsdpmon.report.table import markdown_report


def fsdpmon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fsdpmon.cli", *args], capture_output=True, text=True, timeout=120
    )


def expected_figures(paths: list[Path]) -> dict[str, float]:
    """Recompute the report's figures from the raw records, independently of fsdpmon."""
    rates, step_times = [], []
    for path in paths:
        steps = [r for r in read_records(path) if r["kind"] == "step"]
        first, last = steps[0], steps[-1]  # the first window is warm-up
        elapsed = last["time"] - first["time"]
        rates.append((last["tokens_total"] - first["tokens_total"]) / elapsed)
        step_times += [r["step_time_s"] for r in steps[1:]]
    world_size = read_records(paths[0])[0]["world_size"]
    return {
        "per_gpu": float(np.mean(rates)),
        "total": float(np.mean(rates)) * world_size,
        "median": float(np.percentile(step_times, 50)),
        "p90": float(np.percentile(step_times, 90)),
    }


@pytest.mark.parametrize("q", [0, 10, 50, 90, 99, 100])
def test_percentile_matches_numpy(q):
    values = [0.3, 0.1, 0.25, 0.7, 0.15, 0.5, 0.2]
    assert percentile(values, q) == rounded(np.percentile(values, q))


def test_figures_leave_warmup_out_and_match_recomputation(tmp_path):
    paths = write_run(tmp_path / "n2.jsonl", 2, log_steps=10, step_time_s=0.2)
    [run] = load_runs([str(tmp_path / "n2.jsonl")])
    stats = run_stats(run)
    want = expected_figures(paths)
    assert (run.world_size, stats.ranks_seen, stats.last_step) == (2, 2, 50)
    assert stats.tokens_per_second == rounded(want["total"])
    assert stats.tokens_per_second_per_gpu == rounded(want["per_gpu"])
    assert stats.step_time_median_s == rounded(want["median"])
    assert stats.step_time_p90_s == rounded(want["p90"])
    # warm-up (3x slower first window) is out: the rate is close to 512 / 0.2 per rank
    assert 0.9 * 2560 < stats.tokens_per_second_per_gpu < 1.1 * 2560
    assert stats.mfu is None and stats.memory_source == "rss"
    assert stats.data_wait_ratio == rounded(0.01)
    assert stats.peak_memory_bytes_per_gpu == max(
        r["peak_memory_bytes"] for p in paths for r in read_records(p) if r["kind"] == "step"
    )


def test_warmup_steps_flag_and_mfu_from_peak_flops(tmp_path):
    write_run(tmp_path / "g.jsonl", 1, log_steps=6, device="NVIDIA H100 80GB HBM3",
              peak_flops=989e12)
    [run] = load_runs([str(tmp_path / "g.jsonl")])
    stats = run_stats(run, warmup_steps=10)
    assert stats.measured_steps == 20  # steps 11..30
    assert stats.mfu == rounded(stats.tokens_per_second_per_gpu * 1.5e6 / 989e12)
    assert stats.memory_source == "device"
    with pytest.raises(ConfigError, match="--warmup-steps"):
        run_stats(run, warmup_steps=30)


def test_scaling_efficiency_against_the_smallest_run(tmp_path):
    write_run(tmp_path / "n4.jsonl", 4, step_time_s=0.25, seed=3)
    write_run(tmp_path / "n1.jsonl", 1, step_time_s=0.2, seed=1)
    write_run(tmp_path / "n2.jsonl", 2, step_time_s=0.22, seed=2)
    stats = with_scaling([run_stats(r) for r in load_runs([str(tmp_path)])])
    assert [s.world_size for s in stats] == [1, 2, 4]
    base = stats[0].tokens_per_second_per_gpu
    assert stats[0].scaling_efficiency == rounded(1.0)
    for s in stats[1:]:
        assert s.scaling_efficiency == rounded(s.tokens_per_second_per_gpu / base)
    assert stats[2].scaling_efficiency < stats[1].scaling_efficiency < 1.0
    text = markdown_report(stats, warmup="first window")
    assert text.count("\n| `") == 3 and "process RSS" in text


def test_run_argument_forms(tmp_path):
    write_run(tmp_path / "a.jsonl", 2)
    write_run(tmp_path / "b.jsonl", 1)
    assert [r.name for r in load_runs([str(tmp_path / "a.jsonl")])] == ["a"]
    assert load_runs([str(tmp_path / "a.rank1.jsonl")])[0].ranks.keys() == {0, 1}
    assert [r.world_size for r in load_runs([str(tmp_path)])] == [2, 1]


def test_partial_logs_scale_per_gpu_mean_to_world_size(tmp_path):
    paths = write_run(tmp_path / "big.jsonl", 4)
    for path in paths[2:]:
        path.unlink()  # only node 0's files were copied back
    stats = run_stats(load_runs([str(tmp_path / "big.jsonl")])[0])
    assert stats.ranks_seen == 2 and stats.world_size == 4
    assert stats.tokens_per_second == rounded(4 * stats.tokens_per_second_per_gpu)


def test_torn_last_line_is_skipped(tmp_path):
    [path] = write_run(tmp_path / "t.jsonl", 1, log_steps=5)
    whole = run_stats(load_runs([str(tmp_path / "t.jsonl")])[0])
    with path.open("a") as f:
        f.write('{"kind": "step", "time": 17')  # the process died mid-write
    torn = run_stats(load_runs([str(tmp_path / "t.jsonl")])[0])
    assert torn == whole


def test_a_torn_record_a_resumed_run_appended_to_is_skipped_with_a_warning(tmp_path, caplog):
    [path] = write_run(tmp_path / "t.jsonl", 1, log_steps=5)
    lines = path.read_text().splitlines(keepends=True)
    # the old sink: a crash cut line 4 short, the resumed run's header went on the same line
    glued = lines[3][: len(lines[3]) // 2] + lines[0]
    path.write_text("".join(lines[:3]) + glued + "".join(lines[4:]))
    with caplog.at_level(logging.WARNING, logger="fsdpmon.report.loader"):
        [run] = load_runs([str(tmp_path / "t.jsonl")])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"{path}:4: skipped a record cut short" in warnings[0], warnings
    assert "glued after it is kept" in warnings[0], warnings
    assert run_stats(run).world_size == 1


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.write_text(""), "empty log"),
        (lambda p: p.write_text(p.read_text().replace('"step", "time"', '"step", "tim"', 1)),
         "field 'time' must be a finite number"),
        (lambda p: p.write_text("not json\n" + p.read_text()), ":1: not a JSON record"),
        (lambda p: p.write_text("\n".join(p.read_text().splitlines()[1:]) + "\n"),
         "step record before the run header"),
        (lambda p: p.write_text(p.read_text().splitlines()[0] + "\n"), "no step records"),
    ],
)
def test_bad_logs_raise_input_error_naming_the_file(tmp_path, damage, message):
    [path] = write_run(tmp_path / "bad.jsonl", 1)
    damage(path)
    with pytest.raises(InputError, match=message) as caught:
        load_runs([str(tmp_path / "bad.jsonl")])
    assert str(path) in str(caught.value)


def test_missing_log_names_the_expected_files(tmp_path):
    with pytest.raises(InputError, match=r"nope\.jsonl: no such log.*nope\.rank0\.jsonl"):
        load_runs([str(tmp_path / "nope.jsonl")])
    with pytest.raises(InputError, match="holds no per-rank logs"):
        load_runs([str(tmp_path)])


def test_cli_writes_table_chart_and_json(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    p1 = write_run(runs / "n1.jsonl", 1, seed=1)
    p2 = write_run(runs / "n2.jsonl", 2, seed=2, step_time_s=0.21)
    out = tmp_path / "out"
    done = fsdpmon("report", str(runs / "n2.jsonl"), str(runs / "n1.jsonl"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "report.json").read_text())
    assert [r["world_size"] for r in summary["runs"]] == [1, 2]
    table = (out / "report.md").read_text()
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| `")]
    for cells, paths in zip(rows, (p1, p2), strict=True):
        want = expected_figures(paths)
        assert float(cells[3].replace(",", "")) == printed(want["total"], 1)
        assert float(cells[4].replace(",", "")) == printed(want["per_gpu"], 1)
        assert float(cells[5]) == printed(want["median"], 4)
        assert float(cells[6]) == printed(want["p90"], 4)
    with Image.open(out / "scaling.png") as image:
        assert image.format == "PNG" and image.size[0] >= 1200 and image.size[1] >= 400
    assert rows[0][0] in done.stdout and "scaling.png" in done.stdout


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["{tmp}/missing.jsonl"], 2, "missing.jsonl: no such log"),
        ([], 2, "RUN: name at least one run log"),
        (["--job", "a"], 2, "--prometheus and --job go together"),
        (["--prometheus", "ftp://x", "--job", "a"], 2, "--prometheus: 'ftp://x' is not"),
        (["--prometheus", "http://127.0.0.1:9", "--job", "a", "--since", "soon"], 2,
         "--since: 'soon' is not a duration"),
        (["--prometheus", "http://127.0.0.1:9", "--job", "a", "--step", "0"], 2,
         "--step: must be > 0 seconds"),
        (["--prometheus", "http://127.0.0.1:9", "--job", "a", "--until", "yesterday"], 2,
         "--until: 'yesterday' is neither unix seconds nor an ISO 8601 time"),
        (["{tmp}", "--warmup-steps", "-1"], 2, "--warmup-steps: must be >= 0"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, args, code, needle):
    done = fsdpmon("report", *[a.format(tmp=tmp_path) for a in args], "--out", str(tmp_path / "o"))
    assert done.returncode == code
    assert needle in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_times():
    from fsdpmon.report.cli import parse_time

    assert parse_time("f", "2026-11-30T07:00:00Z") == parse_time("f", "1796022000")
    with pytest.raises(ConfigError, match="no time zone"):
        parse_time("--until", "2026-11-30T07:00:00")


@pytest.mark.parametrize(("score", "charged"), [(1.0, 0.0), (None, 7.5)])
def test_the_reports_straggler_time_is_where_the_judge_names_a_straggler(tmp_path, score,
                                                                         charged):
    """Rank 1 works 0.5 s more per step in 15 steps; its recorded score says so (None: the
    judge names it) or stays 1.0 (nobody is named): the report charges what `fsdpmon goodput`
    charges, not the windows' own figures (7.5 s either way before)."""
    from test_incidents_units import straggling_run

    life = straggling_run(0.5, score=score).incarnations[-1]
    for rank, header in life.runs.items():
        records = [{**header, "time": 100.0, "model": "tiny", "device": "cpu"}] + [
            {**s, "tokens_total": 64.0 * s["step"], "tokens_per_second": 64.0}
            for s in life.steps[rank]]
        (tmp_path / f"run.rank{rank}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records))
    (run,) = load_runs([str(tmp_path)])
    assert run.badput_seconds is not None, run
    assert run.badput_seconds["straggler_wait"] == pytest.approx(charged), run.badput_seconds
