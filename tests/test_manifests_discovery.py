"""The pods these manifests create are the pods `fsdpmon top` and Prometheus look for.

No API server runs here, so the operators' part is played by `operator_pods`: it turns the
generated templates into the Pod JSON the training operator (PyTorchJob) or JobSet (TrainJob)
would create, adding exactly the labels those controllers add. The discovery functions of
`fsdpmon.scrape.discovery` (contract) and the monitors' selectors then have to find them.
"""

import copy

import pytest

from fsdpmon import conventions as conv
from fsdpmon.manifests import ManifestConfig, generate
from fsdpmon.scrape import discovery

JOB = "llama2-7b"


def config(kind: str, job_name: str = JOB) -> ManifestConfig:
    return ManifestConfig(job_name=job_name, image="reg.io/fsdp:1", exporter_image="reg.io/e:1",
                          kind=kind, nodes=3, namespace="ml", instance_type="p5.48xlarge")


def pod(name: str, namespace: str, labels: dict, spec: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": copy.deepcopy(spec),
            "status": {"phase": "Running", "podIP": "10.0.0.1"}}


def pytorchjob_pods(job: dict) -> list[dict]:
    """What the training operator creates: <job>-<type>-<index> with its labels."""
    out = []
    name = job["metadata"]["name"]
    for rtype, rspec in job["spec"]["pytorchReplicaSpecs"].items():
        for index in range(rspec["replicas"]):
            labels = {**rspec["template"]["metadata"]["labels"],
                      "training.kubeflow.org/operator-name": "pytorchjob-controller",
                      conv.PYTORCHJOB_LABEL: name,
                      "training.kubeflow.org/replica-type": rtype.lower(),
                      "training.kubeflow.org/replica-index": str(index)}
            if rtype == "Master":
                labels["training.kubeflow.org/job-role"] = "master"
            out.append(pod(f"{name}-{rtype.lower()}-{index}", job["metadata"]["namespace"],
                           labels, rspec["template"]["spec"]))
    return out


def trainjob_pods(runtime: dict, job: dict) -> list[dict]:
    """What Trainer v2 + JobSet create: the runtime's pod template, overridden by the TrainJob's
    trainer fields and runtimePatches, with JobSet's and the Job controller's labels."""
    (rjob,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    template = copy.deepcopy(rjob["template"]["spec"]["template"])
    trainer = job["spec"]["trainer"]
    (container,) = template["spec"]["containers"]
    container.update(image=trainer["image"], command=trainer["command"], env=trainer["env"],
                     resources=trainer["resourcesPerNode"])
    (patch,) = job["spec"]["runtimePatches"]
    (pjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    ptemplate = pjob["template"]["spec"]["template"]
    template["metadata"]["labels"].update(ptemplate["metadata"]["labels"])
    for key, value in ptemplate["spec"].items():
        if key == "containers":
            (cpatch,) = value
            container.setdefault("volumeMounts", []).extend(cpatch["volumeMounts"])
        else:
            template["spec"][key] = value
    name = job["metadata"]["name"]
    return [pod(f"{name}-{rjob['name']}-0-{index}-abcde", job["metadata"]["namespace"],
                {**template["metadata"]["labels"],
                 conv.JOBSET_NAME_LABEL: name,
                 conv.JOBSET_REPLICATED_JOB_LABEL: rjob["name"],
                 "jobset.sigs.k8s.io/job-index": "0",
                 "batch.kubernetes.io/job-completion-index": str(index)},
                template["spec"])
            for index in range(trainer["numNodes"])]


def operator_pods(cfg: ManifestConfig) -> tuple[list[dict], list[dict]]:
    objs = {o["kind"]: o for o in generate(cfg).objects}
    if cfg.kind == "pytorchjob":
        training = pytorchjob_pods(objs["PyTorchJob"])
    else:
        training = trainjob_pods(objs["TrainingRuntime"], objs["TrainJob"])
    ds = objs["DaemonSet"]
    exporters = [pod(f"fsdpmon-exporter-{i}", ds["metadata"]["namespace"],
                     ds["spec"]["template"]["metadata"]["labels"], ds["spec"]["template"]["spec"])
                 for i in range(2)]
    return training, exporters


def matches(selector: str, labels: dict) -> bool:
    """Equality-based label selector, as the API server evaluates `k=v,k2=v2`."""
    pairs = [term.split("=", 1) for term in selector.split(",") if term]
    return all(labels.get(key) == value for key, value in pairs)


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_top_discovery_finds_the_job_and_its_ports(kind):
    training, exporters = operator_pods(config(kind))
    other_job, _ = operator_pods(config(kind, job_name="other-run"))
    unrelated = pod("web-0", "ml", {"app": "web"}, {"containers": [{"name": "web"}]})
    everything = [*training, *other_job, *exporters, unrelated]

    found = discovery.find_job_pods(everything, JOB)
    assert sorted(p["metadata"]["name"] for p in found) == sorted(
        p["metadata"]["name"] for p in training)
    assert len(found) == 3
    for p in found:
        assert discovery.training_metrics_port(p) == conv.TRAINING_PORT
        assert not discovery.is_exporter_pod(p)

    selectors = discovery.label_selectors_for_job(JOB)
    selected = [p for p in everything
                if any(matches(s, p["metadata"]["labels"]) for s in selectors)]
    assert {p["metadata"]["name"] for p in selected} == {p["metadata"]["name"] for p in training}

    assert [discovery.is_exporter_pod(p) for p in exporters] == [True, True]
    assert {discovery.exporter_metrics_port(p) for p in exporters} == {conv.EXPORTER_PORT}
    assert not discovery.is_exporter_pod(unrelated)


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_prometheus_monitors_select_the_same_pods(kind):
    cfg = config(kind)
    objs = {o["kind"]: o for o in generate(cfg).objects}
    training, exporters = operator_pods(cfg)

    pm = objs["PodMonitor"]["spec"]
    for p in training:
        labels = p["metadata"]["labels"]
        assert pm["selector"]["matchLabels"].items() <= labels.items()
        assert p["metadata"]["namespace"] in pm["namespaceSelector"]["matchNames"]
        ports = [port["name"] for c in p["spec"]["containers"] for port in c.get("ports", [])]
        assert pm["podMetricsEndpoints"][0]["port"] in ports
        # Each relabelling that should fire for this kind reads a label the pod really has.
        meta = {"__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in k)
                for k in labels}
        sources = {r["sourceLabels"][0]: r["targetLabel"]
                   for r in pm["podMetricsEndpoints"][0]["relabelings"]}
        produced = {target for source, target in sources.items() if source in meta}
        expected = ({"job_name", "replica_type", "replica_index"} if kind == "pytorchjob"
                    else {"job_name", "node_rank"})
        assert produced == expected

    service = objs["Service"]
    sm = objs["ServiceMonitor"]["spec"]
    assert sm["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    for p in exporters:
        assert service["spec"]["selector"].items() <= p["metadata"]["labels"].items()
