"""Dashboards: generated from the catalog, committed output up to date, well-formed Grafana JSON.

The catalog is the only source of metric names. Every panel query and variable query is parsed
and each metric name it selects must be a catalogued series name, or a name recorded by
``dashboards/rules.py`` (recording rules are ``level:metric:operations`` names, deliberately not
in the catalog), or Prometheus' own ``ALERTS``.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from fsdpmon import catalog
from fsdpmon.conventions import STRAGGLER_SCORE_THRESHOLD
from fsdpmon.dashboards import build, generate, promql
from fsdpmon.dashboards.build import all_dashboards
from fsdpmon.dashboards.panels import GRAFANA_VERSIONS, expressions, substitute, variable_selector
from fsdpmon.dashboards.promql import metric_names
from fsdpmon.dashboards.rules import recorded_names, rule_groups

ROOT = Path(__file__).resolve().parents[1]
PROMETHEUS_OWN = {"ALERTS", "ALERTS_FOR_STATE"}


def allowed_names() -> set[str]:
    return set(catalog.all_series_names()) | recorded_names() | PROMETHEUS_OWN


def all_expressions() -> list[tuple[str, str]]:
    return [(f"{name}: {where}", expr)
            for name, dash in all_dashboards().items() for where, expr in expressions(dash)]


# --- the metric-name guarantee ---------------------------------------------------------------

def test_every_panel_and_variable_names_only_known_metrics():
    allowed = allowed_names()
    exprs = all_expressions()
    assert len(exprs) > 60
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, f"{where} selects no metric: {expr}"
        assert names <= allowed, f"{where} names unknown metrics {names - allowed}: {expr}"


def test_no_expression_hides_a_metric_name_in_a_matcher():
    rule_exprs = [r["expr"] for g in rule_groups() for r in g["rules"]]
    for expr in [e for _, e in all_expressions()] + rule_exprs:
        assert "__name__" not in expr, expr  # the name parser would not see it there


def test_dashboards_use_every_recorded_job_figure_they_reference_and_no_dcgm_names():
    used = set().union(*(metric_names(e) for _, e in all_expressions()))
    assert not {n for n in used if n.startswith("DCGM_")}, "dashboards read catalog names only"
    # the dashboards lean on the job-level recording rules rather than re-deriving them
    assert {"fsdpmon_job:tokens_per_second:sum", "fsdpmon_job:eta_seconds:estimate",
            "fsdpmon_job:step_time_seconds:p50"} <= used


def test_every_recorded_figure_is_used_by_a_dashboard_or_an_alert():
    used = set().union(*(metric_names(e) for _, e in all_expressions()))
    for group in rule_groups():
        for rule in group["rules"]:
            used |= metric_names(rule["expr"])
    unused = {n for n in recorded_names() - used if n not in catalog.BY_NAME}
    assert not unused, f"recording rules nothing reads: {unused}"


def test_a_misspelled_metric_is_caught():
    bad = 'sum by (job_name) (rate(fsdpmon_train_tokens_totl{job_name=~"$job"}[5m]))'
    assert metric_names(bad) - allowed_names() == {"fsdpmon_train_tokens_totl"}
    misspelt = "TRAIN_TOKENS_TOTL"  # the symbol's spelling fails before any query is built
    with pytest.raises(AttributeError, match=misspelt):
        promql.m(getattr(catalog, misspelt))


@pytest.mark.parametrize(("expr", "names"), [
    ('fsdpmon_train_loss{rank="0", job_name=~"$job"}', {"fsdpmon_train_loss"}),
    ("sum by (node, gpu) (rate(fsdpmon_gpu_energy_joules_total[$__rate_interval]))",
     {"fsdpmon_gpu_energy_joules_total"}),
    ("a / on (namespace, job_name) group_left (world_size) max without (rank) (b)", {"a", "b"}),
    ('label_replace(up, "node", "$1", "instance", "(.*):.*") unless on (node) x offset 5m',
     {"up", "x"}),
    ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m]))) > bool 2",
     {"h_bucket"}),
    ("fsdpmon_job:loss:avg > 1.5 * min_over_time(fsdpmon_job:loss:avg[1h] @ end())",
     {"fsdpmon_job:loss:avg"}),
    ("quantile by (job_name) (0.5, x) and count_values(\"v\", y)", {"x", "y"}),
    ("vector(1) + time()", set()),
])
def test_metric_name_parser(expr, names):
    assert metric_names(expr) == names


@pytest.mark.parametrize("expr", ["sum(rate(x[5m])", "x{a=\"1\"", "x[5m"])
def test_parser_rejects_unbalanced_expressions(expr):
    with pytest.raises(ValueError, match="unbalanced"):
        metric_names(expr)


def test_histograms_must_be_selected_by_series():
    with pytest.raises(ValueError, match="histogram"):
        promql.m(catalog.TRAIN_STEP_DURATION_SECONDS)
    assert promql.bucket(catalog.TRAIN_STEP_DURATION_SECONDS, 'rank="1"') == (
        'fsdpmon_train_step_duration_seconds_bucket{rank="1"}')
    with pytest.raises(ValueError, match="not a histogram"):
        promql.bucket(catalog.TRAIN_LOSS)


def test_every_query_parses_in_prometheus_after_variable_substitution(tmp_path):
    """promtool parses each query (as a recording rule) with "All" selected everywhere."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool missing: run scripts/setup.sh --test")
    values = {"namespace": ".*", "job": ".*", "node": ".*", "rank": ".*"}
    rules = [{"record": f"panel:query_{i}:check", "expr": substitute(expr, values)}
             for i, (_, expr) in enumerate(all_expressions())]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_substitution_follows_grafana_syntax():
    assert substitute('x{job=~"$job", node=~"${node}"}[$__rate_interval]',
                      {"job": "a|b", "node": ".*"}) == 'x{job=~"a|b", node=~".*"}[1m]'
    with pytest.raises(KeyError):
        substitute("x{rank=~\"$rank\"}", {})


# --- committed output ------------------------------------------------------------------------

def test_committed_output_matches_a_fresh_generation():
    stale = generate.stale_files()
    assert not stale, f"run `python -m fsdpmon.dashboards` and commit: {stale}"


def test_stale_check_notices_edits_and_leftovers(tmp_path):
    for name, text in generate.render().items():
        (tmp_path / name).write_text(text)
    assert generate.stale_files(tmp_path) == []
    first = sorted(generate.render())[0]
    (tmp_path / first).write_text("{}\n")
    (tmp_path / "old-dashboard.json").write_text("{}\n")
    assert generate.stale_files(tmp_path) == sorted([first, "old-dashboard.json"])


def test_module_entry_point_checks_the_committed_files():
    out = subprocess.run([sys.executable, "-m", "fsdpmon.dashboards", "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


# --- Grafana structure -----------------------------------------------------------------------

def test_four_dashboards_with_unique_uids_and_titles():
    dashes = all_dashboards()
    assert set(dashes) == {"fsdpmon-job-overview.json", "fsdpmon-ranks.json",
                           "fsdpmon-nodes.json", "fsdpmon-runs.json"}
    uids = [d["uid"] for d in dashes.values()]
    assert len(set(uids)) == 4 and all(len(u) <= 40 for u in uids)
    for dash in dashes.values():
        assert dash["title"].startswith("fsdpmon / ")
        assert dash["schemaVersion"] >= 36
        json.dumps(dash)  # plain JSON all the way down


def test_datasource_is_a_variable_everywhere():
    for dash in all_dashboards().values():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${datasource}"
                assert v["includeAll"] and v["allValue"] == ".*"  # "All" matches a missing label
        for panel in dash["panels"]:
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize(("name", "variables"), [
    ("fsdpmon-job-overview.json", {"namespace", "job"}),
    ("fsdpmon-ranks.json", {"namespace", "job", "rank"}),
    ("fsdpmon-nodes.json", {"node"}),
    ("fsdpmon-runs.json", {"namespace", "job"}),
])
def test_variables_are_defined_and_used(name, variables):
    dash = all_dashboards()[name]
    defined = {v["name"] for v in dash["templating"]["list"]}
    assert defined == {"datasource", *variables}
    queries = " ".join(e for _, e in expressions(dash))
    for var in variables - {"namespace"} if name == "fsdpmon-nodes.json" else variables:
        assert f"${var}" in queries, f"{name} never filters by ${var}"
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            selector, label = variable_selector(v)
            assert label in {"namespace", "job_name", "node", "rank"}
            assert metric_names(selector)


def test_panels_tile_the_grid_without_overlap():
    for name, dash in all_dashboards().items():
        ids, cells = set(), set()
        for panel in dash["panels"]:
            assert panel["id"] not in ids
            ids.add(panel["id"])
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, (name, panel["title"])
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in cells, f"{name}: {panel['title']} overlaps"
                    cells.add((x, y))
            if panel["type"] != "row":
                refs = [t["refId"] for t in panel["targets"]]
                assert refs and len(set(refs)) == len(refs)


def _metrics_of(dash: dict) -> set[str]:
    return set().union(*(metric_names(e) for _, e in expressions(dash)))


def test_each_dashboard_covers_what_the_issue_asks_for():
    dashes = all_dashboards()
    job = _metrics_of(dashes["fsdpmon-job-overview.json"])
    assert {"fsdpmon_job:tokens_per_second:sum", "fsdpmon_job:tokens_per_second_per_rank:avg",
            "fsdpmon_job:step_time_seconds:max", "fsdpmon_job:mfu_ratio:avg",
            "fsdpmon_job:loss:avg", "fsdpmon_train_learning_rate", "fsdpmon_train_grad_norm",
            "fsdpmon_job:eta_seconds:estimate", "fsdpmon_train_restarts",
            "fsdpmon_train_stalled", "ALERTS"} <= job
    # the Diagnosis row: straggler score, busy vs collective wait, throttled GPUs by rank
    assert {"fsdpmon_train_straggler_score", "fsdpmon_train_busy_seconds",
            "fsdpmon_train_collective_wait_ratio", "fsdpmon_gpu_clock_event_active",
            "fsdpmon_process_info"} <= job
    ranks = _metrics_of(dashes["fsdpmon-ranks.json"])
    assert {"fsdpmon_train_step_time_seconds", "fsdpmon_train_data_wait_ratio",
            "fsdpmon_train_memory_peak_active_bytes", "fsdpmon_job_slowest_rank"} <= ranks
    assert any(p["type"] == "heatmap" for p in dashes["fsdpmon-ranks.json"]["panels"])
    nodes = _metrics_of(dashes["fsdpmon-nodes.json"])
    assert {"fsdpmon_gpu_utilization_ratio", "fsdpmon_gpu_memory_used_bytes",
            "fsdpmon_gpu_temperature_celsius", "fsdpmon_gpu_power_watts",
            "fsdpmon_gpu_sm_clock_hertz", "fsdpmon_gpu_clock_event_active",
            "fsdpmon_gpu_xid_errors_total", "fsdpmon_gpu_ecc_errors_total",
            "fsdpmon_gpu_pcie_bytes_per_second", "fsdpmon_gpu_nvlink_bytes_per_second",
            "fsdpmon_pod:gpu_memory_used_bytes:sum"} <= nodes
    runs = dashes["fsdpmon-runs.json"]
    assert "world_size" in " ".join(e for _, e in expressions(runs))
    assert {"fsdpmon_job:tokens_per_second_per_rank:avg",
            "fsdpmon_job:peak_memory_bytes:max"} <= _metrics_of(runs)


def test_straggler_score_panel_draws_the_threshold_the_alert_uses():
    panels = all_dashboards()["fsdpmon-job-overview.json"]["panels"]
    score = next(p for p in panels if p["title"] == "Straggler score per rank")
    defaults = score["fieldConfig"]["defaults"]
    steps = [s["value"] for s in defaults["thresholds"]["steps"]]
    assert steps == [None, STRAGGLER_SCORE_THRESHOLD], steps
    assert defaults["custom"]["thresholdsStyle"] == {"mode": "dashed"}
    alert = next(r for g in rule_groups() for r in g["rules"]
                 if r.get("alert") == "FsdpmonRankStraggling")
    # the alert compares with the line each rank publishes, which is this one
    line = catalog.TRAIN_STRAGGLER_SCORE_THRESHOLD.name
    assert f"< {line} and" in alert["expr"], alert["expr"]


def test_device_only_list_names_real_metrics():
    known = set(catalog.all_series_names()) | recorded_names()
    assert not build.DEVICE_ONLY - known


def _schema_problems(bundle: dict, dash: dict) -> list[str]:
    """Where ``dash`` breaks the schema ``bundle`` (tests/schemas/grafana_schema.py): the
    dashboard's own, and each panel's options and field config by its panel type."""
    def found(validator: jsonschema.Draft7Validator, value: object, where: str) -> list[str]:
        return [f"{where}/{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
                for e in validator.iter_errors(value)]

    problems = found(jsonschema.Draft7Validator(bundle["dashboard"]), dash, "")
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        kind = bundle["panels"].get(panel["type"])
        if kind is None:
            problems.append(f"panel {panel['title']!r}: no schema of type {panel['type']!r}: "
                            "add it to tests/schemas/grafana_schema.py's PANEL_TYPES")
            continue
        where = f"panel {panel['title']!r} "
        problems += found(jsonschema.Draft7Validator(kind["options"]), panel["options"],
                          where + "options")
        problems += found(jsonschema.Draft7Validator(kind["custom"]),
                          panel["fieldConfig"]["defaults"].get("custom", {}), where + "custom")
    return problems


def _grafana_schema(version: str) -> dict:
    return json.loads((Path(__file__).parent / "schemas" / f"grafana-{version}.json").read_text())


@pytest.mark.parametrize("version", GRAFANA_VERSIONS)
def test_dashboards_pass_grafanas_schema_of_each_supported_release(version):
    """Grafana's own dashboard model, generated from that release's @grafana/schema: unknown
    keys are errors (query variables' ``definition`` and tables' ``footer`` were), keys Grafana
    requires without a default must be there. And fsdpmon's own rule: every panel says what it
    shows (Grafana's (i) tooltip)."""
    bundle = _grafana_schema(version)
    assert bundle["grafana"] == version, (bundle["grafana"], version)
    problems = [f"{name}: {problem}" for name, dash in all_dashboards().items()
                for problem in _schema_problems(bundle, dash)]
    assert problems == [], f"{len(problems)} schema errors:\n" + "\n".join(problems)
    for name, dash in all_dashboards().items():
        bare = [p["title"] for p in dash["panels"] if p["type"] != "row" and not p["description"]]
        assert not bare, f"{name}: panels without a description: {bare}"


def test_the_schema_check_sees_what_grafana_rejects():
    """The keys the dashboards used to carry, and a key Grafana requires, left out."""
    bundle = _grafana_schema(GRAFANA_VERSIONS[-1])
    dash = copy.deepcopy(all_dashboards()["fsdpmon-ranks.json"])
    variable = next(v for v in dash["templating"]["list"] if v["type"] == "query")
    variable["definition"] = variable["query"]["query"]
    table = next(p for p in dash["panels"] if p["type"] == "table")
    table["options"]["footer"] = {"show": False}
    heatmap = next(p for p in dash["panels"] if p["type"] == "heatmap")
    del heatmap["options"]["color"]["fill"]
    problems = _schema_problems(bundle, dash)
    assert len(problems) == 3 and all(
        any(word in p for p in problems) for word in ("'definition'", "'footer'", "'fill'")), \
        problems


def test_each_dashboard_uses_every_variable_it_declares():
    """A variable no query reads (the nodes dashboard's old `namespace`) only confuses; a link
    forwarding a variable the dashboard lacks sends `${x:queryparam}` literally."""
    for name, dash in all_dashboards().items():
        text = json.dumps(dash["panels"]) + json.dumps(
            [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"])
        declared = {v["name"] for v in dash["templating"]["list"]} - {"datasource"}
        unused = {v for v in declared if f"${v}" not in text and f"${{{v}" not in text}
        assert not unused, (name, unused)
        for link in dash["links"]:
            forwarded = set(re.findall(r"\$\{(\w+):queryparam\}", link["url"]))
            assert forwarded <= declared, (name, link["url"])
