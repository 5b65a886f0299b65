"""The Kubernetes source with the official client, through a kubeconfig, against a loopback
stand-in API server: discovery for PyTorchJob and TrainJob, pod proxy scrapes, logs, and the
one-line errors for 403, a missing job and timeouts."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from kube_standin import KubeStandIn
from synthetic_job import GpuSpec, RankSpec, exporter_exposition, training_exposition

from fsdpmon.diagnose import judge
from fsdpmon.errors import ConfigError, UnreachableError
from fsdpmon.job.snapshot import JobSnapshot, JobState
from fsdpmon.scrape.sources.kube import KubeSource, KubeSourceConfig
from fsdpmon.top.cli import check_health

PYTORCHJOB = {"training.kubeflow.org/job-name": "llama",
              "training.kubeflow.org/replica-type": "worker"}
TRAINJOB = {"jobset.sigs.k8s.io/jobset-name": "llama",
            "jobset.sigs.k8s.io/replicatedjob-name": "node"}


def pod(name: str, namespace: str, labels: dict, node: str, port_name: str, port: int,
        ip: str = "10.0.0.1") -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node, "containers": [
            {"name": "istio-proxy", "image": "proxy"},
            {"name": "trainer", "image": "trainer",
             "ports": [{"name": port_name, "containerPort": port, "protocol": "TCP"}]}]},
        "status": {"phase": "Running", "podIP": ip},
    }


def populate(api: KubeStandIn, labels: dict, prefix: str = "llama-worker") -> None:
    world = 4
    specs = [RankSpec(rank=r, local_rank=r % 2, node=f"node-{r // 2}", world_size=world)
             for r in range(world)]
    for n in range(2):
        name = f"{prefix}-{n}"
        api.pods.append(pod(name, "ml", labels, f"node-{n}", "fsdpmon-train", 9520))
        api.metrics[f"ml/{name}:9520"] = training_exposition("llama", specs[2 * n:2 * n + 2], specs)
        exp = f"fsdpmon-exporter-{n}"
        api.pods.append(pod(exp, "monitoring", {"app.kubernetes.io/name": "fsdpmon-exporter"},
                            f"node-{n}", "fsdpmon-node", 9521))
        gpus = [GpuSpec(gpu=i, pod=name, pid=100 + i) for i in range(2)]
        api.metrics[f"monitoring/{exp}:9521"] = exporter_exposition(f"node-{n}", gpus, "ml")
        api.logs[f"ml/{name}/trainer"] = [f"step {i} loss 2.{i}" for i in range(5)]
    # an exporter on a node the job does not use, and another job's pod
    api.pods.append(pod("fsdpmon-exporter-9", "monitoring",
                        {"app.kubernetes.io/name": "fsdpmon-exporter"}, "node-9",
                        "fsdpmon-node", 9521))
    api.pods.append(pod("other-worker-0", "ml", {"training.kubeflow.org/job-name": "other"},
                        "node-0", "fsdpmon-train", 9520))


@pytest.fixture
def api():
    standin = KubeStandIn()
    yield standin
    standin.close()


def source(api: KubeStandIn, tmp_path, **kw) -> KubeSource:
    cfg = KubeSourceConfig(kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")),
                           timeout_s=kw.pop("timeout_s", 2.0), **kw)
    return KubeSource(cfg)


@pytest.mark.parametrize("labels", [PYTORCHJOB, TRAINJOB], ids=["pytorchjob", "trainjob"])
def test_finds_and_scrapes_the_job_through_the_pod_proxy(api, tmp_path, labels):
    populate(api, labels)
    src = source(api, tmp_path, job="llama")
    try:
        snap = src.fetch()
    finally:
        src.close()
    assert src.namespace == "ml"  # from the kubeconfig context
    assert snap.state is JobState.RUNNING and snap.source == "kubernetes"
    assert [(r.rank, r.pod) for r in snap.ranks] == [
        (0, "llama-worker-0"), (1, "llama-worker-0"), (2, "llama-worker-1"),
        (3, "llama-worker-1")]
    assert {t.pod for t in snap.targets} == {"llama-worker-0", "llama-worker-1",
                                            "fsdpmon-exporter-0", "fsdpmon-exporter-1"}
    assert len(snap.gpus) == 4 and snap.gpus[0].pod == "llama-worker-0"
    assert any("/pods/llama-worker-0%3A9520/proxy/metrics" in p for p in api.requests)


def test_selector_and_inside_cluster_scrapes_by_pod_ip(api, tmp_path):
    from payload_server import PayloadServer

    populate(api, {"app": "custom"}, prefix="custom")
    body = api.metrics["ml/custom-0:9520"]
    direct = PayloadServer({"/metrics": body})
    try:
        api.pods[0]["status"]["podIP"] = "127.0.0.1"
        api.pods[0]["spec"]["containers"][1]["ports"][0]["containerPort"] = direct.port
        src = source(api, tmp_path, selector="app=custom")
        src.inside = True  # what in-cluster config sets: scrape pods by IP, not via the proxy
        try:
            snap = src.fetch()
        finally:
            src.close()
    finally:
        direct.close()
    up = {t.pod: t.up for t in snap.targets}
    assert up["custom-0"] and [r.rank for r in snap.ranks if not r.down][:2] == [0, 1]
    assert snap.targets[0].url == f"http://127.0.0.1:{direct.port}/metrics"


def test_forbidden_names_the_rbac_role(api, tmp_path):
    populate(api, PYTORCHJOB)
    api.forbidden = {"list-namespaced", "list-all"}
    src = source(api, tmp_path, job="llama")
    with pytest.raises(UnreachableError) as err:
        src.fetch()
    src.close()
    message = str(err.value)
    assert "forbidden (HTTP 403)" in message and "fsdpmon-top" in message
    assert "\n" not in message


def test_exporters_outside_the_namespace_may_be_invisible(api, tmp_path):
    populate(api, PYTORCHJOB)
    api.forbidden = {"list-all"}  # a namespaced Role: the training pods only
    src = source(api, tmp_path, job="llama")
    try:
        snap = src.fetch()
    finally:
        src.close()
    assert len(snap.ranks) == 4 and snap.gpus == ()
    assert "exporter pods not visible" in src.notice


def test_missing_job_lists_the_jobs_that_exist(api, tmp_path):
    populate(api, PYTORCHJOB)
    src = source(api, tmp_path, job="lama")
    with pytest.raises(ConfigError) as err:
        src.fetch()
    src.close()
    assert err.value.field == "--job"
    assert "jobs there: llama, other" in str(err.value)


def test_api_server_timeouts_retry_then_fail_in_one_line(api, tmp_path):
    populate(api, PYTORCHJOB)
    api.hang_s = 1.0
    src = source(api, tmp_path, job="llama", timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(UnreachableError, match="timed out"):
        src.fetch()
    src.close()
    assert 3 <= len(api.requests) <= 3 + 1 and time.monotonic() - start < 10


def test_a_hung_pod_is_marked_down_and_the_rest_goes_on(api, tmp_path):
    populate(api, PYTORCHJOB)
    api.hang_pods = {"llama-worker-1"}
    src = source(api, tmp_path, job="llama", timeout_s=0.5)
    try:
        snap = src.fetch()
    finally:
        src.close()
    down = [t for t in snap.targets if not t.up]
    assert [t.pod for t in down] == ["llama-worker-1"] and down[0].error == "timed out"
    assert snap.state is JobState.DEGRADED and len(snap.ranks) == 2


def test_logs_of_the_training_container_are_followed_live(api, tmp_path):
    populate(api, PYTORCHJOB)
    src = source(api, tmp_path, job="llama")
    try:
        src.fetch()
        src.follow_logs(1)
        lines = api.logs["ml/llama-worker-1/trainer"]
        deadline = time.monotonic() + 10
        while len(src.fetch().logs) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        lines.append("step 5 loss 2.05")
        while "step 5 loss 2.05" not in src.fetch().logs and time.monotonic() < deadline:
            time.sleep(0.05)
        snap = src.fetch()
    finally:
        src.close()
    assert snap.log_pod == "llama-worker-1"
    assert snap.logs[0] == "step 0 loss 2.0" and snap.logs[-1] == "step 5 loss 2.05"
    assert any("/log?" in p and "container=trainer" in p and "follow=true" in p
               for p in api.requests)


def test_a_ranks_screen_follows_its_own_pods_log(api, tmp_path):
    populate(api, PYTORCHJOB)
    src = source(api, tmp_path, job="llama")
    try:
        src.fetch()
        src.follow_logs("llama-worker-1")  # Enter on rank 2 or 3: their pod's log, by name
        deadline = time.monotonic() + 10
        while not (snap := src.fetch()).logs and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        src.close()
    assert snap.log_pod == "llama-worker-1" and snap.logs[0] == "step 0 loss 2.0", snap.logs


def test_cli_forbidden_is_exit_3_with_one_line(api, tmp_path):
    populate(api, PYTORCHJOB)
    api.forbidden = {"list-namespaced", "list-all"}
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    out = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "top", "--kubeconfig",
                          str(kubeconfig), "--job", "llama", "--once"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 3
    assert out.stderr.count("\n") == 1 and "fsdpmon-top" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "fsdpmon.cli", "top", "--kubeconfig",
                          str(tmp_path / "missing"), "--job", "llama", "--once"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("fsdpmon top: error: --kubeconfig")


def _job(api: KubeStandIn, kind: str, conditions: list[dict]) -> None:
    group, plural = (("kubeflow.org", "pytorchjobs") if kind == "pytorchjob"
                     else ("trainer.kubeflow.org", "trainjobs"))
    api.jobs[f"{group}/ml/{plural}/llama"] = {
        "apiVersion": f"{group}/v1", "kind": kind, "metadata": {"name": "llama"},
        "status": {"conditions": conditions}}


def _ended(api: KubeStandIn, phase: str) -> None:
    for p in api.pods:
        if p["metadata"]["namespace"] == "ml":
            p["status"]["phase"] = phase


def _top(api: KubeStandIn, tmp_path, *flags: str) -> subprocess.CompletedProcess:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    return subprocess.run([sys.executable, "-m", "fsdpmon.cli", "top", "--kubeconfig",
                           str(kubeconfig), "--job", "llama", "--once", *flags],
                          capture_output=True, text=True, timeout=60)


def _fetch(api: KubeStandIn, tmp_path) -> JobSnapshot:
    src = source(api, tmp_path, job="llama")
    try:
        return src.fetch()
    finally:
        src.close()


def test_the_jobs_own_conditions_say_done_and_failed(api, tmp_path):
    populate(api, PYTORCHJOB)
    running = [{"type": "Created", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
               {"type": "Running", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"}]
    _job(api, "pytorchjob", running)
    assert _fetch(api, tmp_path).state is JobState.RUNNING

    _ended(api, "Failed")
    failed = [{**running[1], "status": "False"},
              {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed",
               "message": "PyTorchJob llama is failed because 1 Worker replica(s) failed.",
               "lastTransitionTime": "2026-01-01T00:09:00Z"}]
    _job(api, "pytorchjob", [running[0], *failed])
    out = _top(api, tmp_path)
    assert out.returncode == 4, (out.returncode, out.stderr)
    title = out.stdout.split("\n")[0]
    assert "FAILED" in title and "PyTorchJobFailed" in title, out.stdout
    assert out.stderr.count("\n") == 1 and "1 Worker replica(s) failed" in out.stderr

    api.jobs.clear()
    _ended(api, "Succeeded")
    _job(api, "trainjob", [{"type": "Created", "status": "True"},
                           {"type": "Complete", "status": "True", "reason": "JobsCompleted"}])
    snap = _fetch(api, tmp_path)
    assert (snap.state, snap.reason, snap.targets) == (JobState.DONE, "", ())
    check_health(snap, judge([snap]))  # --once exits 0 for a job that is DONE
