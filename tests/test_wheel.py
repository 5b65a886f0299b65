"""The wheel installs `fsdpmon` and nothing beside it.

The repository keeps trainer/, exporters/ and dashboards/ at its top; pyproject.toml's
package-dir installs them as fsdpmon.trainer, fsdpmon.exporters and fsdpmon.dashboards, so a
user's own `trainer` or `dashboards` package never collides with ours. The wheel is built from
a copy of what the images copy (pyproject.toml, README.md and the four folders), so the build
leaves nothing in the working tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each folder of the repository and where the wheel puts it.
FOLDERS = {"fsdpmon": "fsdpmon", "trainer": "fsdpmon/trainer",
           "exporters": "fsdpmon/exporters", "dashboards": "fsdpmon/dashboards"}


def _tracked(folder: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    return out.stdout.split()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=180)
    assert built.returncode == 0, built.stdout + built.stderr
    [path] = out.glob("fsdpmon-*.whl")
    with zipfile.ZipFile(path) as whl:
        yield whl


def test_the_top_level_is_fsdpmon_only(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1, top
    assert top - dist_info == {"fsdpmon"}, f"installed beside fsdpmon: {sorted(top - dist_info)}"
    top_level = wheel.read(f"{dist_info.pop()}/top_level.txt").decode().split()
    assert top_level == ["fsdpmon"], top_level


def test_every_module_and_data_file_is_shipped_where_it_is_imported(
        wheel: zipfile.ZipFile) -> None:
    """A package left out of pyproject.toml's explicit list (a new sub-package) fails here."""
    names = set(wheel.namelist())
    shipped: dict[str, list[str]] = {f: [] for f in FOLDERS}
    missing = []
    for folder, where in FOLDERS.items():
        for path in _tracked(folder):
            if not (path.endswith(".py") or path.startswith("dashboards/generated/")):
                continue  # READMEs and Dockerfiles stay in the repository
            inside = where + path[len(folder):]
            (shipped[folder] if inside in names else missing).append(inside)
    assert not missing, f"{len(missing)} files not in the wheel: {missing}"
    assert any(p.endswith(".json") for p in shipped["dashboards"]), "no dashboard in the wheel"
    assert "fsdpmon/dashboards/generated/fsdpmon-rules.yaml" in names
    assert "fsdpmon/trainer/train.py" in names and "fsdpmon/exporters/cli.py" in names


def test_the_command_is_the_one_entry_point(wheel: zipfile.ZipFile) -> None:
    [entry] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry).decode()
    assert "fsdpmon = fsdpmon.cli:main" in text, text


def test_the_install_imports_the_folders_under_fsdpmon_from_any_directory(tmp_path: Path) -> None:
    """The editable install (scripts/setup.sh) maps the folders too: torchrun's workers and the
    tests start `python -m fsdpmon.trainer.train` from other directories. Outside the
    repository, `trainer` by its folder name is not importable: it is not installed."""
    code = ("import importlib.util, fsdpmon.trainer.config, fsdpmon.exporters.cli, "
            "fsdpmon.dashboards.build as b\n"
            "print(fsdpmon.trainer.config.__file__, b.__file__)\n"
            "print([n for n in ('trainer', 'exporters', 'dashboards') "
            "if importlib.util.find_spec(n)])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    files, top = out.stdout.splitlines()
    config, build = (Path(f) for f in files.split())
    # This checkout's files (editable) or copies of them (installed): the same text either way.
    assert config.read_text() == (ROOT / "trainer" / "config.py").read_text(), config
    assert build.read_text() == (ROOT / "dashboards" / "build.py").read_text(), build
    assert top == "[]", f"importable by their folder names outside the repository: {top}"
