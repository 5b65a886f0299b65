"""The Alertmanager route `fsdpmon manifests` writes: valid for amtool, grouped by job and cause
(one incident, one notification), fsdpmon's alerts routed to its receiver."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from fsdpmon.cli import main
from fsdpmon.manifests import alerting

pytestmark = pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool missing")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("manifests")
    assert main(["manifests", "--job-name", "llama", "--image", "registry.example/trainer:1",
                 "--components", "monitoring", "--out", str(out)]) == 0
    return out


def test_amtool_accepts_the_written_configuration(written):
    path = written / alerting.FILE
    run = subprocess.run(["amtool", "check-config", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 receivers" in run.stdout, run.stdout
    kustomization = yaml.safe_load((written / "kustomization.yaml").read_text())
    assert alerting.FILE not in kustomization["resources"]  # not a Kubernetes object


def test_it_groups_by_job_and_cause_and_routes_fsdpmon_alerts_to_its_receiver(written):
    config = yaml.safe_load((written / alerting.FILE).read_text())
    assert config["route"]["group_by"] == ["namespace", "job_name", "cause"]
    run = subprocess.run(["amtool", "config", "routes", "test",
                          f"--config.file={written / alerting.FILE}", "--verify.receivers",
                          alerting.RECEIVER, "alertname=FsdpmonTrainingStalled", "job_name=llama",
                          "cause=hang", "rank=1"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == alerting.RECEIVER, run.stdout


def _matched_route(written, *labels: str) -> str:
    """The deepest route amtool matches for an alert with these labels."""
    run = subprocess.run(["amtool", "config", "routes", "test", "--tree",
                          f"--config.file={written / alerting.FILE}",
                          "alertname=FsdpmonTrainingStalled", "job_name=llama", *labels],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    return [line for line in run.stdout.splitlines() if "└──" in line][-1]


def test_a_critical_alert_takes_the_short_wait_branch_a_warning_does_not(written):
    config = yaml.safe_load((written / alerting.FILE).read_text())
    branch = config["route"]["routes"][0]["routes"][0]
    assert branch["group_wait"] == alerting.CRITICAL_GROUP_WAIT
    assert alerting.CRITICAL in _matched_route(written, "cause=hang", "severity=critical")
    warning = _matched_route(written, "cause=straggler_compute", "severity=warning")
    assert alerting.CRITICAL not in warning and 'alertname=~"Fsdpmon.+"' in warning
