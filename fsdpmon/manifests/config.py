"""What `fsdpmon manifests` generates from: one typed, validated config.

Values come from three places, strongest first: command-line flags, the aws-do-fsdp style env
file (`--env-file`), built-in defaults (some per instance type). Every bad value raises
ConfigError naming the field; the Hugging Face token is kept out of every message and repr.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdpmon import conventions as conv
from fsdpmon import validate
from fsdpmon.errors import ConfigError

log = logging.getLogger(__name__)

KINDS = ("pytorchjob", "trainjob")
COMPONENTS = ("job", "exporter", "monitoring", "rbac")
# The trainer's model flavours (fsdpmon.trainer.model.FLAVOURS; a test keeps the two in step).
MODELS = ("tiny", "llama2-7b", "llama2-13b", "llama2-70b")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")

# GPUs and EFA interfaces per node of the instance types the EKS workflow runs on.
INSTANCE_TYPES: dict[str, tuple[int, int]] = {
    "p4d.24xlarge": (8, 4),
    "p4de.24xlarge": (8, 4),
    "p5.48xlarge": (8, 32),
    "p5e.48xlarge": (8, 32),
    "p5en.48xlarge": (8, 16),
    "g5.48xlarge": (8, 1),
    "g6e.48xlarge": (8, 4),
}

# Env-file keys: aws-do-fsdp's names first, then fsdpmon's own spellings.
ENV_KEYS: dict[str, tuple[str, ...]] = {
    "job_name": ("JOB_NAME",),
    "namespace": ("NAMESPACE",),
    "nodes": ("NUM_WORKERS", "NUM_NODES", "NODES"),
    "gpus_per_node": ("GPU_PER_WORKER", "NPROC_PER_NODE", "PROC_PER_NODE", "GPUS_PER_NODE"),
    "efa_per_node": ("EFA_PER_WORKER", "EFA_PER_NODE"),
    "instance_type": ("INSTANCE_TYPE",),
    "model": ("MODEL_NAME", "MODEL"),
    "exporter_image": ("EXPORTER_IMAGE",),
    "rdzv_backend": ("RDZV_BACKEND",),
    "rdzv_host": ("RDZV_HOST",),
    "rdzv_port": ("RDZV_PORT",),
    "release_label": ("RELEASE_LABEL",),
    "data_pvc": ("DATA_PVC",),
    "max_steps": ("MAX_STEPS",),
}
INT_FIELDS = frozenset(
    {"nodes", "gpus_per_node", "efa_per_node", "rdzv_port", "max_steps", "batch_size",
     "seq_len", "grad_accum", "checkpoint_every", "log_every", "min_nodes", "max_restarts"}
)
HF_TOKEN_VAR = "HF_TOKEN"
# Hugging Face user access tokens: "hf_" and 30+ letters/digits.
_TOKEN_LIKE = re.compile(r"hf_[A-Za-z0-9]{20,}")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class ManifestConfig:
    job_name: str
    image: str
    kind: str = "pytorchjob"
    namespace: str = "default"
    monitoring_namespace: str = "monitoring"
    nodes: int = 2
    gpus_per_node: int = 8
    efa_per_node: int = 0
    instance_type: str | None = None
    model: str = "llama2-7b"
    exporter_image: str = ""
    # trainer flags
    max_steps: int = 1000
    batch_size: int = 1
    seq_len: int = 4096
    grad_accum: int = 1
    data: str = "synthetic"
    tokenizer: str | None = None
    hf_checkpoint: str | None = None
    checkpoint_every: int = 100
    log_every: int = 10
    train_args: tuple[str, ...] = ()
    # storage
    data_pvc: str | None = None
    data_mount: str = "/data"
    shm_size: str = "64Gi"
    # launch
    elastic: bool = False
    min_nodes: int = 0  # 0: same as nodes
    max_restarts: int = 3
    rdzv_backend: str = "c10d"
    rdzv_host: str | None = None
    rdzv_port: int = 29400
    runtime_name: str = "torch-distributed"
    # Hugging Face token: only ever referenced through a Secret
    hf_token_secret: str = "hf-token"
    hf_token_key: str = "token"
    hf_token: str | None = field(default=None, repr=False)
    # monitoring
    release_label: str = "kube-prometheus-stack"
    # the PodMonitor's: one of the terms of a hang's page (docs/alerts.md)
    scrape_interval: str = f"{conv.TRAINING_SCRAPE_INTERVAL_SECONDS}s"
    # where the alerts' runbook_url points (None: FSDPMON_RUNBOOK_URL, else
    # fsdpmon.dashboards.rulebase's default, the repository's docs/runbook.md); checked when the
    # rules are built
    runbook_url: str | None = None
    components: tuple[str, ...] = COMPONENTS

    def __post_init__(self) -> None:
        check(self)

    @property
    def checkpoint_dir(self) -> str:
        return f"{self.data_mount}/checkpoints/{self.job_name}"

    @property
    def log_jsonl(self) -> str:
        return f"{self.data_mount}/runs/{self.job_name}/train.jsonl"


def check(cfg: ManifestConfig) -> None:
    validate.one_of("--kind", cfg.kind, KINDS)
    _job_name(cfg)
    validate.dns1123_label("--namespace", cfg.namespace)
    validate.dns1123_label("--monitoring-namespace", cfg.monitoring_namespace)
    validate.positive("--nodes", cfg.nodes)
    validate.positive("--gpus-per-node", cfg.gpus_per_node)
    validate.non_negative("--efa-per-node", cfg.efa_per_node)
    validate.one_of("--model", cfg.model, MODELS)
    _image("--image", cfg.image)
    _image("--exporter-image", cfg.exporter_image)
    for name, value in (("--max-steps", cfg.max_steps), ("--batch-size", cfg.batch_size),
                        ("--seq-len", cfg.seq_len), ("--grad-accum", cfg.grad_accum),
                        ("--log-every", cfg.log_every)):
        validate.positive(name, value)
    validate.non_negative("--checkpoint-every", cfg.checkpoint_every)
    _label_value("--instance-type", cfg.instance_type or "")
    _label_value("--release-label", cfg.release_label)
    _subdomain("--hf-token-secret", cfg.hf_token_secret)
    if cfg.data_pvc is not None:
        _subdomain("--data-pvc", cfg.data_pvc)
    if not cfg.data_mount.startswith("/"):
        raise ConfigError("--data-mount", "must be an absolute path")
    if not _QUANTITY.match(cfg.shm_size):
        raise ConfigError("--shm-size", f"{cfg.shm_size!r} is not a quantity such as 64Gi")
    if not re.fullmatch(r"[0-9]+(s|m)", cfg.scrape_interval):
        raise ConfigError("--scrape-interval", "must be a duration such as 15s or 1m")
    validate.one_of("--rdzv-backend", cfg.rdzv_backend, RDZV_BACKENDS)
    validate.port("--rdzv-port", cfg.rdzv_port)
    if cfg.elastic and cfg.kind != "pytorchjob":
        raise ConfigError("--elastic", "is a PyTorchJob feature; drop it or use --kind pytorchjob")
    if not 0 <= cfg.min_nodes <= cfg.nodes:
        raise ConfigError("--min-nodes", f"must be in 1..--nodes ({cfg.nodes})")
    if cfg.elastic and cfg.rdzv_backend != "c10d" and not cfg.rdzv_host:
        raise ConfigError("--rdzv-host", f"is needed with --rdzv-backend {cfg.rdzv_backend}")
    validate.non_negative("--max-restarts", cfg.max_restarts)
    validate.dns1123_label("--runtime-name", cfg.runtime_name)
    if not cfg.components:
        raise ConfigError("--components", f"name at least one of {', '.join(COMPONENTS)}")
    for component in cfg.components:
        validate.one_of("--components", component, COMPONENTS)
    if cfg.hf_token is not None and not cfg.hf_token.strip():
        raise ConfigError(HF_TOKEN_VAR, "is empty")


def _job_name(cfg: ManifestConfig) -> None:
    if not cfg.job_name:
        raise ConfigError("--job-name", "is required (or JOB_NAME in the --env-file)")
    validate.dns1123_label("--job-name", cfg.job_name)
    if not cfg.job_name[0].isalpha():
        # The operators name Services after the job, and Service names must start with a letter.
        raise ConfigError("--job-name", f"{cfg.job_name!r} must start with a letter")
    # The longest name derived from it is a pod's hostname: <job>-worker-<n> / <job>-node-0-<n>.
    longest = len(cfg.job_name) + len("-worker-") + len(str(cfg.nodes))
    if longest > 63:
        raise ConfigError("--job-name", f"too long: pod hostnames would have {longest} > 63 "
                          "characters")


def _image(name: str, value: str) -> None:
    if not value:
        raise ConfigError(name, "no container image given (set it, or IMAGE in the env file)")
    if any(ch.isspace() for ch in value) or value.startswith(("-", "/", ":")):
        raise ConfigError(name, f"{value!r} is not a container image reference")


def _label_value(name: str, value: str) -> None:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ConfigError(name, f"{value!r} is not a valid Kubernetes label value")


def _subdomain(name: str, value: str) -> None:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise ConfigError(name, f"{value!r} is not a valid Kubernetes object name")


def looks_like_token(value: str) -> bool:
    return bool(_TOKEN_LIKE.search(value))


def reject_tokens(values: Mapping[str, Any], what: str = "flag") -> None:
    """Refuse a Hugging Face token given where it would leak (shell history, `ps`, the job spec).

    The message names the field but never repeats the value.
    """
    for name, value in values.items():
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if isinstance(item, str) and looks_like_token(item):
                raise ConfigError(name, f"this {what} value looks like a Hugging Face token; "
                                  "tokens are only read from the HF_TOKEN environment variable "
                                  "with --hf-token-from-env and stored in a Secret")


def normalize_model(name: str) -> str:
    """Map Hugging Face repo names (meta-llama/Llama-2-7b-hf) to the trainer's flavour names."""
    short = name.strip().rsplit("/", 1)[-1].lower()
    short = re.sub(r"-(chat-)?hf$", "", short)
    match = re.fullmatch(r"llama-?2-(7b|13b|70b)", short)
    return f"llama2-{match.group(1)}" if match else short


def image_from_env(env: Mapping[str, str]) -> str | None:
    """aws-do-fsdp composes the image as ${REGISTRY}${IMAGE}${TAG} (TAG starts with ':')."""
    if not env.get("IMAGE"):
        return None
    return f"{env.get('REGISTRY', '')}{env['IMAGE']}{env.get('TAG', '')}"


def default_exporter_image(image: str, version: str) -> str:
    """The exporter image next to the trainer's, in the same registry, tagged with our version."""
    repo = image.split("@", 1)[0]
    slash, colon = repo.rfind("/"), repo.rfind(":")
    if colon > slash:
        repo = repo[:colon]
    registry = repo[: repo.rfind("/") + 1] if "/" in repo else ""
    return f"{registry}fsdpmon-exporter:{version}"


def settings_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Config fields named by an env file; unknown keys are ignored (the file has many)."""
    out: dict[str, Any] = {}
    for field_name, keys in ENV_KEYS.items():
        key = next((k for k in keys if env.get(k, "") != ""), None)
        if key is None:
            continue
        value: Any = env[key]
        if field_name in INT_FIELDS:
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(key, f"must be an integer, got {value!r}") from None
        out[field_name] = value
    image = image_from_env(env)
    if image:
        out["image"] = image
    if "model" in out:
        out["model"] = normalize_model(out["model"])
    if "CMD" in env:
        log.info("env file: CMD is ignored; fsdpmon builds the torchrun command itself")
    return out


def _per_node_defaults(merged: Mapping[str, Any]) -> tuple[int, int]:
    """GPUs and EFA interfaces per node for the instance type; a warning when it is unknown
    and the user left either count to it."""
    instance = merged.get("instance_type") or ""
    if instance and instance not in INSTANCE_TYPES and not (
            "gpus_per_node" in merged and "efa_per_node" in merged):
        log.warning("unknown instance type %r: assuming 8 GPUs and no EFA per node; set them "
                    "with --gpus-per-node and --efa-per-node (env file: GPU_PER_WORKER, "
                    "EFA_PER_WORKER); known types: %s", instance, ", ".join(INSTANCE_TYPES))
    return INSTANCE_TYPES.get(instance, (8, 0))


def build_config(flags: Mapping[str, Any], env: Mapping[str, str],
                 environ: Mapping[str, str], hf_token_from_env: bool,
                 version: str) -> ManifestConfig:
    """Merge flags (set ones only) over env-file settings over defaults, then validate."""
    reject_tokens({k: v for k, v in env.items() if k != HF_TOKEN_VAR}, what="env file")
    from_file = settings_from_env(env)
    merged: dict[str, Any] = {**from_file, **{k: v for k, v in flags.items() if v is not None}}
    # aws-do-fsdp's env file names a rendezvous host because its PyTorchJob is elastic.
    if ("rdzv_host" in from_file or "rdzv_backend" in from_file) and merged.get(
            "kind", "pytorchjob") == "pytorchjob":
        merged.setdefault("elastic", True)
    if "model" in merged:
        merged["model"] = normalize_model(merged["model"])
    gpus, efa = _per_node_defaults(merged)
    merged.setdefault("gpus_per_node", gpus)
    merged.setdefault("efa_per_node", efa)
    for required in ("job_name", "image"):
        merged.setdefault(required, "")
    if not merged.get("exporter_image") and merged["image"]:
        merged["exporter_image"] = default_exporter_image(merged["image"], version)
    if hf_token_from_env:
        token = environ.get(HF_TOKEN_VAR) or env.get(HF_TOKEN_VAR)
        if not token:
            raise ConfigError(HF_TOKEN_VAR, "--hf-token-from-env was given but HF_TOKEN is not "
                              "set in the environment or the env file")
        merged["hf_token"] = token.strip()
    elif env.get(HF_TOKEN_VAR):
        log.warning("env file: HF_TOKEN is not copied into the manifests; pass "
                    "--hf-token-from-env to emit the Secret, or create it yourself")
    try:
        return ManifestConfig(**merged)
    except TypeError as exc:  # an unknown field from a caller, not a user error
        raise ConfigError("config", str(exc)) from None
