"""The training job: a Kubeflow PyTorchJob, or a Trainer v2 TrainJob with its runtime.

Both kinds run the same container: `torchrun -m fsdpmon.trainer.train` with the trainer's flags, the
monitor's environment, the metrics port `fsdpmon-train` declared, GPUs and EFA requested,
/dev/shm memory-backed, data and checkpoints on one volume, and the Hugging Face token only as
a reference to a Secret.
"""

from __future__ import annotations

import base64

from fsdpmon import conventions as conv
from fsdpmon.errors import ConfigError, FsdpmonError
from fsdpmon.manifests.config import HF_TOKEN_VAR, ManifestConfig
from fsdpmon.manifests.meta import Obj, common_labels

CONTAINER = "pytorch"  # the PyTorchJob webhook requires this name
TRAINJOB_CONTAINER = "node"  # the container name of the torch-distributed runtime
FIELD_MANAGER = "fsdpmon.dev/manifests"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
TRAINER_UID = 1000  # the user trainer/Dockerfile runs as


def pod_security() -> Obj:
    # The image runs as a non-root user; fsGroup lets it write the data volume.
    return {"fsGroup": TRAINER_UID, "fsGroupChangePolicy": "OnRootMismatch"}


def training_labels(cfg: ManifestConfig) -> dict[str, str]:
    # The training PodMonitor selects on component+part-of, whatever operator made the pod.
    return common_labels("training", cfg.job_name)


def torchrun_command(cfg: ManifestConfig) -> list[str]:
    """The container command. The operators set PET_NNODES/PET_NODE_RANK/PET_MASTER_* (and the
    rendezvous for elastic jobs) in the environment, which torchrun reads itself."""
    args = [
        "torchrun", f"--nproc-per-node={cfg.gpus_per_node}",
        "-m", "fsdpmon.trainer.train",
        "--model", cfg.model,
        "--max-steps", str(cfg.max_steps),
        "--batch-size", str(cfg.batch_size),
        "--seq-len", str(cfg.seq_len),
        "--grad-accum", str(cfg.grad_accum),
        "--data", cfg.data,
        "--checkpoint-dir", cfg.checkpoint_dir,
        "--checkpoint-every", str(cfg.checkpoint_every),
        "--log-jsonl", cfg.log_jsonl,
        "--log-every", str(cfg.log_every),
        "--metrics-port", str(conv.TRAINING_PORT),
        "--job-name", cfg.job_name,
    ]
    if cfg.tokenizer:
        args += ["--tokenizer", cfg.tokenizer]
    if cfg.hf_checkpoint:
        args += ["--hf-checkpoint", cfg.hf_checkpoint]
    return args + list(cfg.train_args)


def check_trainer_args(cfg: ManifestConfig) -> None:
    """Parse the container's trainer command with the trainer's own parser, so a bad
    --train-arg fails here rather than when the pods start. Paths are the pods', not ours."""
    from fsdpmon.trainer.config import model_args_for, parse_config  # torch-free

    command = torchrun_command(cfg)
    base = command[command.index("fsdpmon.trainer.train") + 1 :]
    args = base[: len(base) - len(cfg.train_args)]
    for field, argv in (("trainer command", args), ("--train-arg", base)):
        try:
            parsed = parse_config(argv, check_paths=False)
            if parsed.model.hf_checkpoint is None:  # else the shape comes from its config.json
                model_args_for(parsed)
        except FsdpmonError as exc:
            raise ConfigError(
                field, f"python -m fsdpmon.trainer.train would reject it: {exc}") from None


def container_env(cfg: ManifestConfig) -> list[Obj]:
    env: list[Obj] = [
        {"name": "FSDPMON_JOB_NAME", "value": cfg.job_name},
        {"name": "FSDPMON_PORT", "value": str(conv.TRAINING_PORT)},
        {"name": "FSDPMON_LOG_INTERVAL", "value": str(cfg.log_every)},
        # The endpoint listens on the pod's own IP only (kubelet probes and Prometheus reach
        # it there), not on every interface of the pod.
        {"name": "FSDPMON_LISTEN_ADDRESS", "valueFrom": {"fieldRef": {
            "fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        # Only a reference: the token's value never appears in the job spec.
        {"name": HF_TOKEN_VAR, "valueFrom": {"secretKeyRef": {
            "name": cfg.hf_token_secret, "key": cfg.hf_token_key, "optional": True}}},
        {"name": "HF_HOME", "value": f"{cfg.data_mount}/hf-cache"},
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"},
        {"name": "NCCL_DEBUG", "value": "WARN"},
    ]
    if cfg.efa_per_node > 0:
        env += [
            {"name": "FI_PROVIDER", "value": "efa"},
            {"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"},
            {"name": "FI_EFA_FORK_SAFE", "value": "1"},
        ]
    return env


def node_resources(cfg: ManifestConfig) -> Obj:
    amounts = {GPU: str(cfg.gpus_per_node)}
    if cfg.efa_per_node > 0:
        amounts[EFA] = str(cfg.efa_per_node)
    # Extended resources must have requests == limits.
    return {"requests": dict(amounts), "limits": dict(amounts)}


def volumes(cfg: ManifestConfig) -> list[Obj]:
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": cfg.shm_size}}
    if cfg.data_pvc:
        data: Obj = {"name": "data", "persistentVolumeClaim": {"claimName": cfg.data_pvc}}
    else:
        # Without --data-pvc checkpoints live and die with the pod; fine for a smoke test only.
        data = {"name": "data", "emptyDir": {}}
    return [shm, data]


def volume_mounts(cfg: ManifestConfig) -> list[Obj]:
    return [{"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "data", "mountPath": cfg.data_mount}]


def metrics_port() -> Obj:
    return {"name": conv.TRAINING_PORT_NAME, "containerPort": conv.TRAINING_PORT,
            "protocol": "TCP"}


def gpu_tolerations() -> list[Obj]:
    return [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
            {"key": EFA, "operator": "Exists", "effect": "NoSchedule"}]


def node_selector(cfg: ManifestConfig) -> dict[str, str]:
    return {INSTANCE_TYPE_LABEL: cfg.instance_type} if cfg.instance_type else {}


def training_container(cfg: ManifestConfig, name: str = CONTAINER) -> Obj:
    return {
        "name": name,
        "image": cfg.image,
        "imagePullPolicy": "IfNotPresent",
        "command": torchrun_command(cfg),
        "env": container_env(cfg),
        "ports": [metrics_port()],
        "resources": node_resources(cfg),
        "volumeMounts": volume_mounts(cfg),
    }


def training_pod_template(cfg: ManifestConfig) -> Obj:
    spec: Obj = {
        "containers": [training_container(cfg)],
        "volumes": volumes(cfg),
        "tolerations": gpu_tolerations(),
        "securityContext": pod_security(),
    }
    if cfg.instance_type:
        spec["nodeSelector"] = node_selector(cfg)
    return {"metadata": {"labels": training_labels(cfg)}, "spec": spec}


def pytorchjob(cfg: ManifestConfig) -> Obj:
    """Master (node rank 0) + Workers; with --elastic, torchrun's c10d/etcd rendezvous."""
    replicas: Obj = {"Master": _replica(cfg, 1)}
    if cfg.nodes > 1:
        replicas["Worker"] = _replica(cfg, cfg.nodes - 1)
    spec: Obj = {
        "nprocPerNode": str(cfg.gpus_per_node),
        "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": cfg.max_restarts},
        "pytorchReplicaSpecs": replicas,
    }
    if cfg.elastic:
        spec["elasticPolicy"] = {
            "rdzvBackend": cfg.rdzv_backend,
            # c10d: the master pod hosts the rendezvous store (its hostname matches).
            "rdzvHost": cfg.rdzv_host or f"{cfg.job_name}-master-0",
            "rdzvPort": cfg.rdzv_port,
            "minReplicas": cfg.min_nodes or cfg.nodes,
            "maxReplicas": cfg.nodes,
            "maxRestarts": cfg.max_restarts,
        }
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta(cfg.job_name, cfg.namespace, training_labels(cfg)),
        "spec": spec,
    }


def _replica(cfg: ManifestConfig, count: int) -> Obj:
    return {"replicas": count, "restartPolicy": "OnFailure", "template": training_pod_template(cfg)}


def training_runtime(cfg: ManifestConfig) -> Obj:
    """A namespaced copy of Trainer v2.3.0's `torch-distributed` ClusterTrainingRuntime that
    declares the metrics port: a TrainJob can patch env, volumes and scheduling, but not ports."""
    node_container = {
        "name": TRAINJOB_CONTAINER,
        "image": cfg.image,
        "command": ["torchrun"],
        "ports": [metrics_port()],
    }
    replicated_job = {
        "name": TRAINJOB_CONTAINER,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "fsdpmon",
                                                          "app.kubernetes.io/component":
                                                              "training"}},
                                  "spec": {"containers": [node_container]}}},
        },
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": _meta(cfg.runtime_name, cfg.namespace, {
            **common_labels("training-runtime", cfg.runtime_name),
            "trainer.kubeflow.org/framework": "torch",
        }),
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [replicated_job]}},
        },
    }


def trainjob(cfg: ManifestConfig) -> Obj:
    container = training_container(cfg, TRAINJOB_CONTAINER)
    pod_patch: Obj = {
        "volumes": volumes(cfg),
        "tolerations": gpu_tolerations(),
        "securityContext": pod_security(),
        "containers": [{"name": TRAINJOB_CONTAINER, "volumeMounts": volume_mounts(cfg)}],
    }
    if cfg.instance_type:
        pod_patch["nodeSelector"] = node_selector(cfg)
    patch = {
        "manager": FIELD_MANAGER,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
            "name": TRAINJOB_CONTAINER,
            "template": {"spec": {"template": {
                "metadata": {"labels": training_labels(cfg)},
                "spec": pod_patch,
            }}},
        }]}}},
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _meta(cfg.job_name, cfg.namespace, training_labels(cfg)),
        "spec": {
            "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                           "name": cfg.runtime_name},
            "trainer": {
                "image": cfg.image,
                "command": container["command"],
                "env": container["env"],
                "numNodes": cfg.nodes,
                "numProcPerNode": cfg.gpus_per_node,
                "resourcesPerNode": container["resources"],
            },
            "runtimePatches": [patch],
        },
    }


def hf_token_secret(cfg: ManifestConfig) -> Obj | None:
    """The Secret the job references; emitted only when the token came from the environment."""
    if cfg.hf_token is None:
        return None
    encoded = base64.b64encode(cfg.hf_token.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(cfg.hf_token_secret, cfg.namespace,
                          common_labels("hf-token", cfg.job_name)),
        "data": {cfg.hf_token_key: encoded},
    }


def training_objects(cfg: ManifestConfig) -> list[Obj]:
    """The job (and for TrainJob its runtime); the token Secret is separate (hf_token_secret)."""
    if cfg.kind == "trainjob":
        return [training_runtime(cfg), trainjob(cfg)]
    return [pytorchjob(cfg)]


def _meta(name: str, namespace: str | None, labels: dict[str, str]) -> Obj:
    meta: Obj = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = labels
    return meta
