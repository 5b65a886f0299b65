"""`fsdpmon manifests`: the training job, exporter, monitoring and RBAC as Kubernetes YAML."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from fsdpmon import __version__
from fsdpmon.errors import ConfigError
from fsdpmon.manifests.config import (
    COMPONENTS,
    KINDS,
    MODELS,
    RDZV_BACKENDS,
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
    a("--env-file", help="KEY=value settings file (export lines, quotes and comments allowed)")
    a("--kind", choices=KINDS, default=None, help="PyTorchJob (default) or Trainer v2 TrainJob")
    a("--job-name", help="job name (DNS-1123 label)")
    a("--namespace", help="namespace of the job (default: default)")
    a("--monitoring-namespace", help="namespace of the exporter, rules and dashboards "
      "(default: monitoring)")
    a("--nodes", type=int, help="number of nodes (pods), default 2")
    a("--gpus-per-node", type=int, help="GPUs = processes per node (default: by instance type)")
    a("--efa-per-node", type=int, help="EFA interfaces per node (default: by instance type)")
    a("--instance-type", help="node.kubernetes.io/instance-type to run on, e.g. p5.48xlarge")
    a("--image", help="trainer image (built from trainer/Dockerfile)")
    a("--exporter-image", help="exporter image (default: fsdpmon-exporter next to --image)")
    a("--model", help=f"trainer model flavour: {', '.join(MODELS)} (or meta-llama/Llama-2-7b-hf)")
    a("--max-steps", type=int)
    a("--batch-size", type=int, help="sequences per GPU per micro-batch")
    a("--seq-len", type=int)
    a("--grad-accum", type=int)
    a("--data", help="'synthetic' or a path inside the container (e.g. under --data-mount)")
    a("--tokenizer", help="tokenizer directory inside the container")
    a("--hf-checkpoint", help="HF checkpoint directory inside the container")
    a("--checkpoint-every", type=int)
    a("--log-every", type=int)
    a("--train-arg", action="append", default=None, metavar="ARG",
      help="extra argument for trainer.train, repeatable: --train-arg=--warmup-steps=100")
    a("--data-pvc", help="PersistentVolumeClaim for data, checkpoints and logs (e.g. FSx)")
    a("--data-mount", help="where the data volume is mounted (default /data)")
    a("--shm-size", help="size limit of the memory-backed /dev/shm (default 64Gi)")
    a("--elastic", action="store_true", default=None, help="elastic PyTorchJob with rendezvous")
    a("--min-nodes", type=int, help="elastic: fewest nodes to run with (default --nodes)")
    a("--max-restarts", type=int)
    a("--rdzv-backend", choices=RDZV_BACKENDS, default=None)
    a("--rdzv-host", help="elastic: rendezvous host (default: the master pod)")
    a("--rdzv-port", type=int)
    a("--runtime-name", help="TrainingRuntime the TrainJob uses (default torch-distributed)")
    a("--hf-token-secret", help="Secret holding the Hugging Face token (default hf-token)")
    a("--hf-token-from-env", action="store_true",
      help="read HF_TOKEN from the environment and also emit the Secret")
    a("--hf-token", help=argparse.SUPPRESS)  # exists only to refuse a token on the command line
    a("--release-label", help="`release` label kube-prometheus-stack selects on "
      "(default kube-prometheus-stack; '' for none)")
    a("--scrape-interval", help="training scrape interval (default 15s)")
    a("--components", help=f"comma list of {','.join(COMPONENTS)} (default: all)")
    a("--out", type=Path, help="write a kustomize directory instead of stdout")


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
