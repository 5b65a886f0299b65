"""`fsdpmon manifests`: the training job, exporter, monitoring and RBAC as Kubernetes YAML."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from fsdpmon import __version__
from fsdpmon.conventions import RUNBOOK_URL_ENV
from fsdpmon.errors import ConfigError
from fsdpmon.manifests.config import (
    COMPONENTS,
    KINDS,
    MODELS,
    RDZV_BACKENDS,
    ManifestConfig,
    build_config,
    reject_tokens,
)
from fsdpmon.manifests.envfile import read_env_file
from fsdpmon.manifests.render import generate, to_stream, write_dir

log = logging.getLogger(__name__)

# argparse dest -> ManifestConfig field, for flags whose names differ from the field.
_RENAMED = {"train_arg": "train_args"}
_NOT_CONFIG = {"env_file", "hf_token_from_env", "out", "hf_token", "components"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ("Flags override the env file (--env-file, aws-do-fsdp style: JOB_NAME, "
                     "REGISTRY/IMAGE/TAG, NUM_WORKERS, GPU_PER_WORKER, EFA_PER_WORKER, "
                     "INSTANCE_TYPE, MODEL_NAME, ...).")
    a = parser.add_argument
    d = _default
    a("--env-file", help="KEY=value settings file (export lines, quotes and comments allowed; "
      "default: none)")
    a("--kind", choices=KINDS, default=None,
      help=f"PyTorchJob or Trainer v2 TrainJob {d('kind')}")
    a("--job-name", help="job name (DNS-1123 label); required, here or as JOB_NAME")
    a("--namespace", help=f"namespace of the job {d('namespace')}")
    a("--monitoring-namespace", help="namespace of the exporter, rules and dashboards "
      f"{d('monitoring_namespace')}")
    a("--nodes", type=int, help=f"number of nodes (pods) {d('nodes')}")
    a("--gpus-per-node", type=int, help="GPUs = processes per node (default: by --instance-type, "
      "else 8)")
    a("--efa-per-node", type=int, help="EFA interfaces per node (default: by --instance-type, "
      "else 0)")
    a("--instance-type", help="node.kubernetes.io/instance-type to run on, e.g. p5.48xlarge "
      "(default: any node)")
    a("--image", help="trainer image (built from trainer/Dockerfile); required, here or as "
      "REGISTRY/IMAGE/TAG")
    a("--exporter-image", help="exporter image (default: fsdpmon-exporter next to --image)")
    a("--model", help=f"trainer model flavour: {', '.join(MODELS)} (or "
      f"meta-llama/Llama-2-7b-hf) {d('model')}")
    a("--max-steps", type=int, help=f"optimiser steps to train for {d('max_steps')}")
    a("--batch-size", type=int, help=f"sequences per GPU per micro-batch {d('batch_size')}")
    a("--seq-len", type=int, help=f"tokens per sequence {d('seq_len')}")
    a("--grad-accum", type=int, help=f"micro-batches per optimiser step {d('grad_accum')}")
    a("--data", help="'synthetic' or a path inside the container (e.g. under --data-mount) "
      f"{d('data')}")
    a("--tokenizer", help="tokenizer directory inside the container (default: bytes)")
    a("--hf-checkpoint", help="HF checkpoint directory inside the container (default: random "
      "init)")
    a("--checkpoint-every", type=int,
      help=f"steps between checkpoints (0: only at the end) {d('checkpoint_every')}")
    a("--log-every", type=int, help=f"steps per log window {d('log_every')}")
    a("--train-arg", action="append", default=None, metavar="ARG",
      help="extra argument for fsdpmon.trainer.train, repeatable, checked with the trainer's own "
      "parser: "
      "--train-arg=--warmup-steps=100 (default: none)")
    a("--data-pvc", help="PersistentVolumeClaim for data, checkpoints and logs, e.g. FSx "
      "(default: an emptyDir)")
    a("--data-mount", help=f"where the data volume is mounted {d('data_mount')}")
    a("--shm-size", help=f"size limit of the memory-backed /dev/shm {d('shm_size')}")
    a("--elastic", action="store_true", default=None, help="elastic PyTorchJob with rendezvous")
    a("--min-nodes", type=int, help="elastic: fewest nodes to run with (default: --nodes)")
    a("--max-restarts", type=int, help=f"restarts before the job fails {d('max_restarts')}")
    a("--rdzv-backend", choices=RDZV_BACKENDS, default=None,
      help=f"elastic: rendezvous backend {d('rdzv_backend')}")
    a("--rdzv-host", help="elastic: rendezvous host (default: the master pod)")
    a("--rdzv-port", type=int, help=f"elastic: rendezvous port {d('rdzv_port')}")
    a("--runtime-name", help=f"TrainingRuntime the TrainJob uses {d('runtime_name')}")
    a("--hf-token-secret", help=f"Secret holding the Hugging Face token {d('hf_token_secret')}")
    a("--hf-token-from-env", action="store_true",
      help="read HF_TOKEN from the environment and also emit the Secret")
    a("--hf-token", help=argparse.SUPPRESS)  # exists only to refuse a token on the command line
    a("--release-label", help="`release` label kube-prometheus-stack selects on ('' for none) "
      f"{d('release_label')}")
    a("--scrape-interval", help=f"training scrape interval {d('scrape_interval')}")
    a("--runbook-url", help="runbook page the alerts link to, as URL#<cause> (default: "
      f"{RUNBOOK_URL_ENV}, else the fsdpmon repository's docs/runbook.md)")
    a("--components", help=f"comma list of {','.join(COMPONENTS)} (default: all)")
    a("--out", type=Path, help="write a kustomize directory (default: one YAML stream on stdout)")


def _default(name: str) -> str:
    """``(default: X)`` from ManifestConfig itself, so the help cannot drift from the code."""
    return f"(default: {ManifestConfig.__dataclass_fields__[name].default})"


def run(args: argparse.Namespace) -> int:
    values = vars(args)
    if args.hf_token is not None:
        raise ConfigError("--hf-token", "tokens are never accepted as flags (they end up in "
                          "shell history and process lists); export HF_TOKEN and pass "
                          "--hf-token-from-env")
    reject_tokens({"--" + k.replace("_", "-"): v for k, v in values.items()})
    env = read_env_file(args.env_file) if args.env_file else {}
    flags = {_RENAMED.get(k, k): v for k, v in values.items() if k not in _NOT_CONFIG}
    if flags.get("train_args") is not None:
        flags["train_args"] = tuple(flags["train_args"])
    if flags.get("runbook_url") is None:
        flags["runbook_url"] = os.environ.get(RUNBOOK_URL_ENV) or None
    if args.components is not None:
        flags["components"] = tuple(c.strip() for c in args.components.split(",") if c.strip())
    cfg = build_config(flags, env, os.environ, args.hf_token_from_env, __version__)
    bundle = generate(cfg)
    if args.out is None:
        sys.stdout.write(to_stream(bundle))
    else:
        for path in write_dir(bundle, args.out):
            log.info("wrote %s", path)
    return 0
