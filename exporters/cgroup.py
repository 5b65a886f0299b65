"""Pod UID and container ID from the text of ``/proc/<pid>/cgroup``.

Covers cgroup v1 (one line per controller) and v2 (``0::/path``), the systemd and cgroupfs
cgroup drivers, and the containerd, CRI-O and Docker path formats, e.g.::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
    12:memory:/kubepods/burstable/pod<uid>/<id>
    0::/kubepods.slice/kubepods-pod<uid>.slice/crio-<id>.scope
    0::/system.slice/docker-<id>.scope            (plain Docker, no pod)

Pure functions only; the caller reads the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?(?:/|$)"
)
# One path component naming the container: the systemd driver wraps the ID in
# "<runtime>-<id>.scope"; cgroupfs uses the bare ID as the directory name. CRI-O's
# "crio-conmon-<id>" is its monitor, not the container. Processes may sit in sub-cgroups below
# the container's (systemd or nested runtimes inside it), so the deepest match wins.
_CONTAINER = re.compile(
    r"^(?:(cri-containerd|crio|docker|containerd|libpod)-)?([0-9a-f]{64})(?:\.scope)?$"
)


@dataclass(frozen=True)
class CgroupRef:
    """What the cgroup path says about a process: its pod (if any) and container (if any)."""

    pod_uid: str = ""
    container_id: str = ""
    runtime: str = ""  # containerd, cri-o, docker, podman, or "" when unknown


_RUNTIMES = {
    "cri-containerd": "containerd",
    "containerd": "containerd",
    "crio": "cri-o",
    "docker": "docker",
    "libpod": "podman",
}


def cgroup_paths(text: str) -> list[str]:
    """The cgroup paths of every hierarchy line (v1 and v2), v2's unified line first."""
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2]:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths.insert(0, parts[2])
        else:
            paths.append(parts[2])
    return paths


def parse_path(path: str) -> CgroupRef | None:
    """Pod UID and container ID from one cgroup path; None when it names neither."""
    pod = _POD_UID.search(path)
    pod_uid = pod.group(1).replace("_", "-") if pod else ""
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts) - 1, -1, -1):
        container = _CONTAINER.match(parts[depth])
        if container is None:
            continue
        runtime = _RUNTIMES.get(container.group(1) or "", "")
        if not runtime and depth > 0 and parts[depth - 1] == "docker":
            runtime = "docker"  # cgroupfs Docker: /docker/<id>
        return CgroupRef(pod_uid, container.group(2), runtime)
    return CgroupRef(pod_uid) if pod_uid else None


def parse_cgroup(text: str) -> CgroupRef | None:
    """The most specific reference any hierarchy line gives (pod and container beat pod alone)."""
    best: CgroupRef | None = None
    for path in cgroup_paths(text):
        ref = parse_path(path)
        if ref is None:
            continue
        if ref.pod_uid and ref.container_id:
            return ref
        if best is None or (ref.pod_uid and not best.pod_uid):
            best = ref
    return best
