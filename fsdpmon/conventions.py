"""Names shared across components: ports, port names, label names, environment variables.

The monitor, the exporter, the Kubernetes manifests and `fsdpmon top` must agree on these, so
they live in one place.
"""

from __future__ import annotations

# Default ports. 9400 is dcgm-exporter's; we stay clear of it.
TRAINING_PORT = 9520
EXPORTER_PORT = 9521

# Kubernetes container port names (IANA service names: at most 15 characters).
TRAINING_PORT_NAME = "fsdpmon-train"
EXPORTER_PORT_NAME = "fsdpmon-node"

# Label names on training series. Prometheus adds `job` and `instance` itself, so the
# training job's identity is `job_name`.
JOB_LABEL = "job_name"
RANK_LABEL = "rank"
LOCAL_RANK_LABEL = "local_rank"
TRAINING_LABELS = (JOB_LABEL, RANK_LABEL, LOCAL_RANK_LABEL)

# Label names on GPU series, and the pod attribution labels added to GPU and process series.
GPU_LABELS = ("gpu", "uuid", "model", "node")
POD_LABELS = ("namespace", "pod", "container")

# The model name every simulated GPU reports, so simulated data can never pass for real.
SIMULATED_GPU_MODEL = "SIMULATED"

# Pod labels that identify training pods.
PYTORCHJOB_LABEL = "training.kubeflow.org/job-name"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
TRAINJOB_REPLICATED_JOB = "node"
EXPORTER_APP_LABEL = "app.kubernetes.io/name"
EXPORTER_APP_NAME = "fsdpmon-exporter"

# Stall bound: no step for max(factor x median step time, floor). The monitor's stalled gauge
# and the stall alert rule share these defaults.
DEFAULT_STALL_FACTOR = 10.0
DEFAULT_STALL_FLOOR_SECONDS = 120.0

# Monitor configuration from the environment (FSDPMON_PORT, FSDPMON_JOB_NAME, ...).
ENV_PREFIX = "FSDPMON_"
