"""Every alert links to a runbook section that exists, at an address the rules generator is told.

Each alert's ``runbook_url`` is ``<base>#<cause>``. The fragment must be an anchor of
docs/runbook.md as GitHub (and most Markdown renderers) make it from a ``## heading``; the base
is ``rulebase.DEFAULT_RUNBOOK_URL`` unless ``python -m fsdpmon.dashboards --runbook-url`` or
``FSDPMON_RUNBOOK_URL`` names another. The committed rule file uses the default.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fsdpmon.cli import main as fsdpmon_main
from fsdpmon.conventions import RUNBOOK_URL_ENV
from fsdpmon.dashboards.generate import GENERATED, RULES_FILE
from fsdpmon.dashboards.rulebase import ALERT_CAUSES, DEFAULT_RUNBOOK_URL
from fsdpmon.dashboards.rules import alert_names, rule_groups

ROOT = Path(__file__).resolve().parents[1]
RUNBOOK = ROOT / "docs" / "runbook.md"
TEAM_URL = "https://wiki.example.internal/ml-platform/fsdpmon-runbook"


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than ``-``/``_`` dropped,
    spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_anchors() -> set[str]:
    headings = re.findall(r"^#{1,6} +(.+?) *#*$", RUNBOOK.read_text(), flags=re.M)
    return {github_anchor(h) for h in headings}


def alert_links(groups: list[dict]) -> dict[str, str]:
    return {r["alert"]: r["annotations"]["runbook_url"]
            for g in groups for r in g["rules"] if "alert" in r}


def test_every_alert_links_to_an_anchor_that_exists_in_the_runbook():
    anchors = runbook_anchors()
    links = alert_links(rule_groups())
    assert sorted(links) == sorted(alert_names()) == sorted(ALERT_CAUSES)
    missing = {name: url for name, url in links.items()
               if url.partition("#")[2] not in anchors}
    assert not missing, f"{len(missing)} alerts link to anchors docs/runbook.md lacks: {missing}"
    for name, url in links.items():
        assert url == f"{DEFAULT_RUNBOOK_URL}#{ALERT_CAUSES[name]}", (name, url)
    assert DEFAULT_RUNBOOK_URL.endswith("/docs/runbook.md")


def test_committed_rule_file_links_to_the_default_runbook():
    doc = yaml.safe_load((GENERATED / RULES_FILE).read_text())
    assert alert_links(doc["groups"]) == alert_links(rule_groups())


def test_a_team_url_replaces_the_base_and_nothing_else():
    default, team = rule_groups(), rule_groups(runbook_url=TEAM_URL)
    assert {n: u.replace(DEFAULT_RUNBOOK_URL, TEAM_URL)
            for n, u in alert_links(default).items()} == alert_links(team)
    for group in default:  # everything but runbook_url is the same
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("runbook_url", None)
    for group in team:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("runbook_url", None)
    assert default == team


@pytest.mark.parametrize("bad", ["docs/runbook.md", "ftp://host/runbook.md",
                                 f"{TEAM_URL}#hang", f"{TEAM_URL}#", "https://"])
def test_an_address_that_cannot_take_a_cause_is_refused(bad):
    with pytest.raises(ValueError, match="runbook URL"):
        rule_groups(runbook_url=bad)


def generate(tmp_path: Path, *args: str, env_url: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != RUNBOOK_URL_ENV}
    if env_url is not None:
        env[RUNBOOK_URL_ENV] = env_url
    return subprocess.run([sys.executable, "-m", "fsdpmon.dashboards", "--output", str(tmp_path),
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def generated_links(folder: Path) -> set[str]:
    doc = yaml.safe_load((folder / RULES_FILE).read_text())
    return {u.partition("#")[0] for u in alert_links(doc["groups"]).values()}


def test_generator_takes_the_url_from_the_flag_or_the_environment(tmp_path):
    out = generate(tmp_path / "env", env_url=TEAM_URL)
    assert out.returncode == 0, out.stderr
    assert generated_links(tmp_path / "env") == {TEAM_URL}
    flag_url = TEAM_URL + "-v2"
    out = generate(tmp_path / "flag", "--runbook-url", flag_url, env_url=TEAM_URL)
    assert out.returncode == 0, out.stderr
    assert generated_links(tmp_path / "flag") == {flag_url}  # the flag wins
    out = generate(tmp_path / "flag", "--check")  # default URL: the team's files are stale
    assert out.returncode == 1 and RULES_FILE in out.stderr, out.stderr
    out = generate(tmp_path / "flag", "--check", "--runbook-url", flag_url)
    assert out.returncode == 0, out.stderr
    out = generate(tmp_path / "bad", env_url="docs/runbook.md")
    assert out.returncode == 2 and RUNBOOK_URL_ENV in out.stderr, out.stderr
    assert not (tmp_path / "bad").exists()


def test_manifests_prometheus_rule_takes_the_same_setting(tmp_path, monkeypatch, capsys):
    """`fsdpmon manifests` wraps the same rules in a PrometheusRule: --runbook-url, else the
    environment, else the default; a bad address fails naming the flag, writing nothing."""
    base = ["manifests", "--job-name", "llama2-7b", "--image", "registry.example/fsdp:1",
            "--components", "monitoring"]

    def rule_links(*extra: str) -> set[str]:
        assert fsdpmon_main([*base, *extra]) == 0
        docs = [d for d in yaml.safe_load_all(capsys.readouterr().out)
                if d and d["kind"] == "PrometheusRule"]
        return {u.partition("#")[0] for u in alert_links(docs[0]["spec"]["groups"]).values()}

    monkeypatch.delenv(RUNBOOK_URL_ENV, raising=False)
    assert rule_links() == {DEFAULT_RUNBOOK_URL}
    monkeypatch.setenv(RUNBOOK_URL_ENV, TEAM_URL)
    assert rule_links() == {TEAM_URL}
    assert rule_links("--runbook-url", TEAM_URL + "-v2") == {TEAM_URL + "-v2"}
    out = tmp_path / "out"
    assert fsdpmon_main([*base, "--runbook-url", "runbook.md", "--out", str(out)]) == 2
    assert "--runbook-url" in capsys.readouterr().err and not out.exists()


def test_default_runbook_is_the_runbook_page_of_the_declared_repository():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    expected = f"{urls['Repository']}/blob/main/docs/runbook.md"
    assert expected == DEFAULT_RUNBOOK_URL, (
        f"rules link {DEFAULT_RUNBOOK_URL}, the project declares {urls['Repository']}")
