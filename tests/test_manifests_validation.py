"""Every generated object validates offline, the way the API server and webhooks would see it.

Core kinds: kubernetes-validate (strict). Custom resources: the upstream CRDs' schemas made
strict (unknown fields rejected), plus the PyTorchJob webhook's rules. Negative controls prove
the checks bite.
"""

import copy
import json
import re
import subprocess

import jsonschema
import kubernetes_validate
import pytest
from manifest_schemas import (
    CelRuleError,
    crd_schemas,
    pytorchjob_admission_errors,
    validate_object,
)

from fsdpmon import conventions as conv
from fsdpmon.manifests import ManifestConfig, generate
from fsdpmon.manifests.training import pytorchjob, trainjob

TOKEN = "hf_" + "Zz9" * 12


def config(**overrides) -> ManifestConfig:
    base = dict(job_name="llama2-7b", image="123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp:1",
                exporter_image="123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdpmon-exporter:1",
                instance_type="p5.48xlarge", efa_per_node=32, nodes=2)
    return ManifestConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def full_bundles():
    """All components, both kinds, plain and elastic, with and without a PVC and a token."""
    variants = [
        config(kind="pytorchjob"),
        config(kind="pytorchjob", elastic=True, nodes=4, min_nodes=2, hf_token=TOKEN,
               data_pvc="fsx-claim"),
        config(kind="pytorchjob", nodes=1, efa_per_node=0, instance_type=None),
        config(kind="trainjob", hf_token=TOKEN, data_pvc="fsx-claim"),
        config(kind="trainjob", nodes=16, release_label=""),
    ]
    return [(cfg, generate(cfg)) for cfg in variants]


def test_every_object_validates(full_bundles):
    kinds = set()
    for _, bundle in full_bundles:
        for obj in bundle.objects:
            validate_object(obj)
            kinds.add(obj["kind"])
    assert kinds >= {
        "PyTorchJob", "TrainJob", "TrainingRuntime", "Secret", "DaemonSet", "Service",
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "PodMonitor",
        "ServiceMonitor", "PrometheusRule", "ConfigMap",
    }


def test_pytorchjobs_pass_the_webhook_rules(full_bundles):
    jobs = [o for _, b in full_bundles for o in b.objects if o["kind"] == "PyTorchJob"]
    assert len(jobs) == 3
    for job in jobs:
        assert pytorchjob_admission_errors(job) == []


def test_strict_crd_schema_rejects_unknown_fields():
    job = pytorchjob(config())
    validate_object(job)
    bad = copy.deepcopy(job)
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(jsonschema.ValidationError, match="gpus"):
        validate_object(bad)
    tj = trainjob(config(kind="trainjob"))
    bad = copy.deepcopy(tj)
    bad["spec"]["trainer"]["ports"] = [{"containerPort": 9520}]  # not patchable in a TrainJob
    with pytest.raises(jsonschema.ValidationError, match="ports"):
        validate_object(bad)


def test_trainjob_name_rule_from_the_crd_is_checked():
    tj = trainjob(config(kind="trainjob"))
    bad = copy.deepcopy(tj)
    bad["metadata"]["name"] = "7b-run"  # a DNS-1123 label, but not RFC 1035
    with pytest.raises(CelRuleError, match="RFC 1035"):
        validate_object(bad)


def test_core_validation_is_strict():
    cfg = config()
    daemonset = next(o for o in generate(cfg).objects if o["kind"] == "DaemonSet")
    bad = copy.deepcopy(daemonset)
    bad["spec"]["template"]["spec"]["hostPid"] = True  # wrong case
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(bad)


def test_webhook_rule_checker_bites():
    job = pytorchjob(config())
    two_masters = copy.deepcopy(job)
    two_masters["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    chief = copy.deepcopy(job)
    chief["spec"]["pytorchReplicaSpecs"]["Chief"] = chief["spec"]["pytorchReplicaSpecs"]["Worker"]
    renamed = copy.deepcopy(job)
    renamed["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "name"] = "trainer"
    no_image = copy.deepcopy(job)
    del no_image["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "image"]
    assert "exactly one Master" in pytorchjob_admission_errors(two_masters)[0]
    assert "not allowed" in pytorchjob_admission_errors(chief)[0]
    assert "no container named pytorch" in pytorchjob_admission_errors(renamed)[0]
    assert "no image" in pytorchjob_admission_errors(no_image)[0]


def test_schemas_cover_every_custom_kind_we_emit():
    kinds = {kind for _, kind in crd_schemas()}
    assert {"PyTorchJob", "TrainJob", "TrainingRuntime", "PodMonitor", "ServiceMonitor",
            "PrometheusRule"} <= kinds


def test_training_pod_essentials():
    cfg = config()
    for template in [r["template"] for r in pytorchjob(cfg)["spec"]["pytorchReplicaSpecs"]
                     .values()]:
        spec = template["spec"]
        (container,) = spec["containers"]
        assert container["name"] == "pytorch"
        assert container["command"][:4] == ["torchrun", "--nproc-per-node=8", "-m",
                                            "fsdpmon.trainer.train"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "8",
                                                    "vpc.amazonaws.com/efa": "32"}
        assert container["ports"] == [{"name": conv.TRAINING_PORT_NAME,
                                       "containerPort": conv.TRAINING_PORT, "protocol": "TCP"}]
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
        env = {e["name"]: e for e in container["env"]}
        assert env["FSDPMON_JOB_NAME"]["value"] == "llama2-7b"
        assert env["FSDPMON_PORT"]["value"] == str(conv.TRAINING_PORT)
        # The endpoint listens on the pod's IP only, not on every interface.
        assert env["FSDPMON_LISTEN_ADDRESS"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "status.podIP"}}, env.get("FSDPMON_LISTEN_ADDRESS")
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf-token", "key": "token", "optional": True}}}


def test_trainer_flags_are_the_trainers_own():
    """The command parses with the trainer's real argument parser (contract: flag names)."""
    from fsdpmon.trainer.config import build_parser

    command = pytorchjob(config(train_args=("--warmup-steps", "10")))["spec"][
        "pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    ns = build_parser().parse_args(command[command.index("fsdpmon.trainer.train") + 1:])
    assert ns.model == "llama2-7b"
    assert ns.metrics_port == conv.TRAINING_PORT
    assert ns.job_name == "llama2-7b"
    assert ns.checkpoint_dir == "/data/checkpoints/llama2-7b"
    assert ns.log_jsonl == "/data/runs/llama2-7b/train.jsonl"
    assert ns.warmup_steps == 10


def test_exporter_args_are_the_exporters_own():
    import argparse

    from fsdpmon.exporters.cli import configure

    ds = next(o for o in generate(config(components=("exporter",))).objects
              if o["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["fsdpmon"] and container["args"][0] == "exporter"
    parser = argparse.ArgumentParser()
    configure(parser)
    # kubelet expands $(VAR) only for variables the container defines; others stay literal.
    defined = {e["name"] for e in container["env"]}
    refs = set(re.findall(r"\$\((\w+)\)", " ".join(container["args"])))
    assert refs <= defined, f"args refer to undefined variables {sorted(refs - defined)}"
    args = [a.replace("$(NODE_NAME)", "ip-10-0-0-1").replace("$(POD_IP)", "10.0.0.7")
            for a in container["args"][1:]]
    ns = parser.parse_args(args)
    assert ns.port == conv.EXPORTER_PORT and ns.node_name == "ip-10-0-0-1"
    assert ns.listen_address == "10.0.0.7", ns.listen_address  # the pod's IP, from status.podIP
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        container["env"])
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        container["env"])
    assert pod["hostPID"] is True
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["limits"] and container["resources"]["requests"]
    assert container["ports"][0]["name"] == conv.EXPORTER_PORT_NAME
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"] if "key" in t)


def test_monitoring_objects(full_bundles):
    _, bundle = full_bundles[0]
    by_kind = {}
    for obj in bundle.objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    (pm,) = by_kind["PodMonitor"]
    (sm,) = by_kind["ServiceMonitor"]
    (rule,) = by_kind["PrometheusRule"]
    for obj in (pm, sm, rule, *by_kind["ConfigMap"]):
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == conv.TRAINING_PORT_NAME
    targets = {r["targetLabel"] for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert targets == {"job_name", "replica_type", "replica_index", "node_rank", "node"}
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
    for cm in by_kind["ConfigMap"]:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (body,) = cm["data"].values()
        assert json.loads(body)["title"]
        assert len(body) < 256 * 1024  # fits kubectl apply's last-applied annotation
    # An empty --release-label drops the label instead of writing release: "".
    _, no_release = full_bundles[4]
    pm = next(o for o in no_release.objects if o["kind"] == "PodMonitor")
    assert "release" not in pm["metadata"]["labels"]


def test_prometheus_rule_groups_pass_promtool(full_bundles, tmp_path):
    import shutil

    import yaml

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (scripts/setup.sh --test installs it)")
    rule = next(o for o in full_bundles[0][1].objects if o["kind"] == "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_top_roles_grant_reads_only_where_top_looks():
    roles = [o for o in generate(config(namespace="ml", components=("rbac",))).objects]
    assert [(r["kind"], r["metadata"]["namespace"]) for r in roles] == [
        ("Role", "ml"), ("Role", "monitoring")]
    job_role, exporter_role = roles
    grants = {(g, res, verb) for rule in job_role["rules"] for g in rule["apiGroups"]
              for res in rule["resources"] for verb in rule["verbs"]}
    assert grants == {
        ("", "pods", "get"), ("", "pods", "list"), ("", "pods/proxy", "get"),
        ("", "pods/log", "get"),
        ("kubeflow.org", "pytorchjobs", "get"), ("kubeflow.org", "pytorchjobs", "list"),
        ("trainer.kubeflow.org", "trainjobs", "get"), ("trainer.kubeflow.org", "trainjobs", "list"),
    }
    assert {v for rule in exporter_role["rules"] for v in rule["verbs"]} == {"get", "list"}
    same_ns = generate(config(namespace="monitoring", components=("rbac",))).objects
    assert len(same_ns) == 1
