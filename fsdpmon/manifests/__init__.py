"""Kubernetes manifests for fsdpmon: the training job, the exporter, monitoring and RBAC.

`generate(ManifestConfig(...))` returns every object as plain dicts; `fsdpmon manifests` is the
command-line front end (flags and/or an aws-do-fsdp style env file).
"""

from fsdpmon.manifests.config import ManifestConfig, build_config
from fsdpmon.manifests.render import Bundle, generate, to_stream, write_dir

__all__ = ["Bundle", "ManifestConfig", "build_config", "generate", "to_stream", "write_dir"]
