"""trainer/Dockerfile: pinned, non-root, and consistent with the repository and the manifests.

No Docker daemon runs here, so this reads the file the way a reviewer would: every base image
and version pinned, nothing copied that does not exist, a non-root user, the metrics port.
"""

import re
from pathlib import Path

import tomllib

from fsdpmon import conventions as conv
from fsdpmon.manifests.training import TRAINER_UID

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "trainer" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "")
            for ln in lines]


def test_base_image_and_versions_are_pinned():
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE.read_text(), re.M))
    base = args["CUDA_IMAGE"]
    assert ":" in base and not base.endswith(":latest")
    for name in ("EFA_INSTALLER_VERSION", "TORCH_VERSION"):
        assert re.fullmatch(r"\d+(\.\d+)+", args[name]), name
    froms = [arg for op, arg in instructions() if op == "FROM"]
    assert froms == ["${CUDA_IMAGE}"]


def test_copies_only_what_exists_and_installs_a_real_extra():
    for op, arg in instructions():
        if op == "COPY":
            *sources, _ = arg.split()
            for src in sources:
                assert (ROOT / src).exists(), src
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    installed = [extra for group in re.findall(r'pip install "\.\[([\w,]+)\]"',
                                               DOCKERFILE.read_text())
                 for extra in group.split(",")]
    assert "train" in installed, f"the trainer image must install the train extra: {installed}"
    assert set(installed) <= set(extras), f"unknown extras {set(installed) - set(extras)}"


def test_runs_as_non_root_and_exposes_the_metrics_port():
    ops = instructions()
    users = [arg for op, arg in ops if op == "USER"]
    assert users and users[-1].split(":")[0] == str(TRAINER_UID)  # pods' fsGroup matches
    assert ("EXPOSE", str(conv.TRAINING_PORT)) in ops
    cmd = next(arg for op, arg in ops if op == "CMD")
    assert '"fsdpmon.trainer.train"' in cmd and (ROOT / "trainer" / "train.py").exists()
