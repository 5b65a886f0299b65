"""Pure pod selection: PyTorchJob and TrainJob labels, named ports, exporters on the job's nodes."""

from __future__ import annotations

from fsdpmon.scrape.discovery import (
    exporter_metrics_port,
    exporters_for_nodes,
    find_job_pods,
    is_exporter_pod,
    job_names,
    label_selectors_for_job,
    training_container,
    training_metrics_port,
)


def pod(name: str, labels: dict, node: str = "n1", ports: list | None = None,
        containers: int = 1) -> dict:
    spec_containers = [{"name": "sidecar", "ports": []} for _ in range(containers - 1)]
    spec_containers.append({"name": "trainer", "ports": ports or []})
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": spec_containers},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}}


PYTORCHJOB = {"training.kubeflow.org/job-name": "llama",
              "training.kubeflow.org/replica-type": "worker"}
TRAINJOB = {"jobset.sigs.k8s.io/jobset-name": "llama",
            "jobset.sigs.k8s.io/replicatedjob-name": "node"}
TRAIN_PORT = [{"name": "fsdpmon-train", "containerPort": 9520}]


def test_selectors():
    assert label_selectors_for_job("llama") == [
        "training.kubeflow.org/job-name=llama",
        "jobset.sigs.k8s.io/jobset-name=llama,jobset.sigs.k8s.io/replicatedjob-name=node",
    ]


def test_finds_pytorchjob_and_trainjob_pods_only():
    pods = [
        pod("llama-worker-1", PYTORCHJOB), pod("llama-worker-0", PYTORCHJOB),
        pod("llama-node-0-0", TRAINJOB),
        pod("llama-initializer-0", {**TRAINJOB, "jobset.sigs.k8s.io/replicatedjob-name": "init"}),
        pod("other-worker-0", {"training.kubeflow.org/job-name": "other"}),
        {"metadata": {"name": "bare"}},
    ]
    names = [p["metadata"]["name"] for p in find_job_pods(pods, "llama")]
    assert names == ["llama-node-0-0", "llama-worker-0", "llama-worker-1"]
    assert job_names(pods) == ["llama", "other"]


def test_named_ports_and_training_container():
    p = pod("w", PYTORCHJOB, ports=TRAIN_PORT, containers=2)
    assert training_metrics_port(p) == 9520 and exporter_metrics_port(p) is None
    assert training_container(p) == "trainer"
    assert training_metrics_port({"metadata": {}}) is None
    assert training_metrics_port(pod("w", {}, ports=[{"name": "fsdpmon-train"}])) is None


def test_exporters_on_the_jobs_nodes():
    exp = {"app.kubernetes.io/name": "fsdpmon-exporter"}
    port = [{"name": "fsdpmon-node", "containerPort": 9521}]
    pods = [pod("exp-b", exp, "n2", port), pod("exp-a", exp, "n1", port),
            pod("exp-c", exp, "n3", port), pod("w", PYTORCHJOB, "n1")]
    assert is_exporter_pod(pods[0]) and not is_exporter_pod(pods[3])
    chosen = exporters_for_nodes(pods, ["n1", "n2"])
    assert [p["metadata"]["name"] for p in chosen] == ["exp-a", "exp-b"]
    assert exporter_metrics_port(chosen[0]) == 9521
