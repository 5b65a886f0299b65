"""Pod attribution through the official kubernetes client against a local API stand-in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsdpmon.errors import ConfigError
from fsdpmon.exporters.pods import PodIndex, api_from_config, index_pods
from fsdpmon.exporters.sample import PodRef
from tests.exporter_api_standin import CID, UID, FakeApi, pod, write_kubeconfig


@pytest.fixture
def fake_api() -> Iterator[FakeApi]:
    api = FakeApi()
    try:
        yield api
    finally:
        api.close()


def _wait(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_index_pods_recognises_training_pods_and_strips_runtime_prefixes() -> None:
    pods = [
        pod(UID, "llama-worker-0", labels={"training.kubeflow.org/job-name": "llama"}),
        pod("u2", "trainjob-node-0-0", labels={"jobset.sigs.k8s.io/jobset-name": "llama"}),
        pod("u3", "custom", ports=[{"name": "fsdpmon-train", "containerPort": 9520}]),
        pod("u4", "nginx"),
        {"metadata": "not a mapping"},
        {"spec": {}},
    ]
    index = index_pods(pods)
    assert sorted(index) == [UID, "u2", "u3", "u4"]
    assert [index[u].training for u in (UID, "u2", "u3", "u4")] == [True, True, True, False]
    assert index[UID].containers == {CID: "trainer"}


def test_pod_index_lists_this_node_through_the_official_client(
        fake_api: FakeApi, tmp_path: Path) -> None:
    fake_api.pods = [pod(UID, "llama-worker-0", labels={"training.kubeflow.org/job-name": "x"})]
    api = api_from_config(str(write_kubeconfig(tmp_path / "kubeconfig", fake_api.url)))
    index = PodIndex(api, "node-a", refresh_s=30)
    index.start()
    try:
        assert _wait(lambda: index.lists >= 1)
        assert index.lookup(UID, CID) == PodRef("ml", "llama-worker-0", "trainer", True)
        assert index.lookup(UID, "f" * 64) == PodRef("ml", "llama-worker-0", "", True)
        for _ in range(1000):  # lookups are served from the cache: never a request per scrape
            index.lookup(UID, CID)
        assert index.lists == 1
        request = fake_api.requests[0]
        assert request["path"] == "/api/v1/pods"
        assert request["query"]["fieldSelector"] == ["spec.nodeName=node-a"]
        assert request["auth"] == "Bearer s3cret-token"
        # A pod the index has not seen yet wakes the refresh early (not after 30 s).
        fake_api.pods.append(pod("new-uid", "llama-worker-1", containers=(("t", "b" * 64),)))
        assert index.lookup("new-uid", "b" * 64) is None
        assert _wait(lambda: index.lookup("new-uid", "b" * 64) is not None, timeout=6)
        assert index.lists == 2
    finally:
        index.stop()


def test_api_errors_keep_the_exporter_running(fake_api: FakeApi, tmp_path: Path) -> None:
    fake_api.status = 403
    api = api_from_config(str(write_kubeconfig(tmp_path / "kubeconfig", fake_api.url)))
    index = PodIndex(api, "node-a", refresh_s=0.1, min_early_refresh_s=0.1)
    index.start()
    try:
        assert _wait(lambda: index.errors >= 1)
        assert index.lookup(UID, CID) is None
        fake_api.status = 200
        fake_api.pods = [pod(UID, "p")]
        assert _wait(lambda: index.lookup(UID, CID) is not None, timeout=6)
    finally:
        index.stop()


def test_static_pods_are_found_by_their_config_hash() -> None:
    static = pod("mirror-uid", "etcd-node-a")
    static["metadata"]["annotations"] = {"kubernetes.io/config.hash": "0c0c0c0c1111222233334444"}
    index = index_pods([static])
    assert index["0c0c0c0c1111222233334444"].name == "etcd-node-a"


def test_an_unknown_uid_asks_for_one_early_refresh_per_period(
        fake_api: FakeApi, tmp_path: Path) -> None:
    api = api_from_config(str(write_kubeconfig(tmp_path / "kubeconfig", fake_api.url)))
    index = PodIndex(api, "node-a", refresh_s=30, min_early_refresh_s=0.05)
    index.start()
    try:
        assert _wait(lambda: index.lists >= 1)
        asked = time.monotonic()
        for _ in range(20):  # a process whose pod object is gone, seen on every sample
            assert index.lookup("gone-uid", CID) is None
            time.sleep(0.02)
        assert _wait(lambda: index.lists == 2)
        answered_in = time.monotonic() - asked  # how long an early refresh takes here
        # seen on every sample for three times that: no further early refresh
        until = time.monotonic() + max(3 * answered_in, 6 * index.min_early_refresh_s)
        while time.monotonic() < until:
            assert index.lookup("gone-uid", CID) is None
            time.sleep(0.02)
        assert index.lists == 2, f"{index.lists} lists: gone-uid asked again"
        index.lookup("other-uid", CID)  # another unknown one still asks
        assert _wait(lambda: index.lists == 3)
    finally:
        index.stop()


def test_bad_kubeconfig_is_a_config_error_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--kubeconfig"):
        api_from_config(str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(ConfigError, match="--kubeconfig"):
        api_from_config(str(bad))


def test_in_a_pod_without_a_service_account_token_is_a_config_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config import incluster_config

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", "/nonexistent/token")
    with pytest.raises(ConfigError, match="--kubeconfig: running in a pod"):
        api_from_config(None)


def test_outside_kubernetes_there_is_no_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert api_from_config(None) is None
