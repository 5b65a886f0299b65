"""Pod UID and container ID from /proc/<pid>/cgroup across cgroup versions, drivers, runtimes."""

from __future__ import annotations

import pytest

from fsdpmon.exporters.cgroup import CgroupRef, parse_cgroup

UID = "5b9c2e3f-1d2a-4c6b-9e8f-0a1b2c3d4e5f"
UID_ = UID.replace("-", "_")
CID = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, systemd driver, containerd, each QoS class
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
         f"cri-containerd-{CID}.scope\n", CgroupRef(UID, CID, "containerd")),
        (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
         f"cri-containerd-{CID}.scope\n", CgroupRef(UID, CID, "containerd")),
        (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
         CgroupRef(UID, CID, "containerd")),
        # CRI-O (systemd driver)
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
         f"crio-{CID}.scope\n", CgroupRef(UID, CID, "cri-o")),
        # Docker through cri-dockerd (systemd driver)
        (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope\n",
         CgroupRef(UID, CID, "docker")),
        # cgroup v1, cgroupfs driver: every controller line names the same path
        (f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"
         f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n"
         f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n", CgroupRef(UID, CID, "")),
        (f"4:memory:/kubepods/pod{UID}/{CID}\n", CgroupRef(UID, CID, "")),
        # cgroup v1, systemd driver, containerd
        (f"10:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
         f"cri-containerd-{CID}.scope\n3:cpuset:/\n", CgroupRef(UID, CID, "containerd")),
        # kind / nested kubelet
        (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
         f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
         CgroupRef(UID, CID, "containerd")),
        # read from inside another container's cgroup namespace (cgroup v2 default): the path
        # is relative to the reader's root
        (f"0::/../../kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
         CgroupRef(UID, CID, "containerd")),
        # a process in a sub-cgroup of its container (systemd or a runtime inside it)
        (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/init.scope\n",
         CgroupRef(UID, CID, "containerd")),
        (f"0::/kubepods/burstable/pod{UID}/{CID}/system.slice/sshd.service\n",
         CgroupRef(UID, CID, "")),
        # pod-level cgroup only (the pause sandbox being set up): pod without container
        (f"0::/kubepods.slice/kubepods-pod{UID_}.slice\n", CgroupRef(UID, "", "")),
        # plain Docker, no Kubernetes: a container, no pod
        (f"0::/system.slice/docker-{CID}.scope\n", CgroupRef("", CID, "docker")),
        (f"12:memory:/docker/{CID}\n", CgroupRef("", CID, "docker")),
        # nothing to attribute
        ("0::/system.slice/ssh.service\n", None),
        ("0::/\n", None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("", None),
    ],
)
def test_parse_cgroup(text: str, expected: CgroupRef | None) -> None:
    assert parse_cgroup(text) == expected


def test_crio_conmon_is_not_taken_for_the_container() -> None:
    text = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope\n"
    ref = parse_cgroup(text)
    assert ref is not None and ref.pod_uid == UID and ref.container_id == ""


def test_mixed_v1_lines_prefer_the_line_with_pod_and_container() -> None:
    text = ("13:misc:/\n"
            f"5:pids:/kubepods/burstable/pod{UID}\n"
            f"4:memory:/kubepods/burstable/pod{UID}/{CID}\n")
    assert parse_cgroup(text) == CgroupRef(UID, CID, "")


@pytest.mark.parametrize("garbage", ["not a cgroup file", "::::", "0::\n", "\x00\x01", "1:2"])
def test_garbage_never_raises(garbage: str) -> None:
    assert parse_cgroup(garbage) is None
