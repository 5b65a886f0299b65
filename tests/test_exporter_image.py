"""The exporter image ships what the exporter imports, and the exporter never needs torch.

No container daemon runs here, so the image is checked from its Dockerfile: the pinned packages
cover every third-party import of the exporter, pins match what the suite tests with, and the
`fsdpmon exporter` command starts with torch (and the other heavy packages) made unimportable.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "exporters" / "Dockerfile"
IMPORT_NAMES = {"prometheus-client": "prometheus_client", "nvidia-ml-py": "pynvml",
                "kubernetes": "kubernetes", "psutil": "psutil", "pyyaml": "yaml",
                "bcrypt": "bcrypt"}
FSDPMON_MODULES = ("__init__", "cli", "errors", "conventions", "catalog", "validate")


def pinned() -> dict[str, str]:
    return dict(re.findall(r'"([a-z0-9-]+)==([^"]+)"', DOCKERFILE.read_text()))


def third_party_imports() -> set[str]:
    files = [*sorted((ROOT / "exporters").glob("*.py")),
             *(ROOT / "fsdpmon" / f"{m}.py" for m in FSDPMON_MODULES)]
    roots: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots.add(node.module.split(".")[0])
    return roots - set(sys.stdlib_module_names) - {"exporters", "fsdpmon", "__future__"}


def test_image_packages_cover_every_exporter_import() -> None:
    provided = {IMPORT_NAMES[name] for name in pinned()}
    assert third_party_imports() <= provided


def test_image_pins_are_what_the_suite_tests() -> None:
    for name, pin in pinned().items():
        assert version(name) == pin, f"{name}: image pins {pin}, tests run {version(name)}"


def test_image_runs_the_exporter() -> None:
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["fsdpmon", "exporter"]' in text
    assert "EXPOSE 9521" in text and "torch" not in re.sub(r"#.*", "", text)


def test_exporter_starts_without_torch_or_other_heavy_packages() -> None:
    code = (
        "import sys\n"
        "for m in ('torch', 'rich', 'numpy', 'transformers', 'matplotlib', 'trainer'):\n"
        "    sys.modules[m] = None\n"
        "from fsdpmon.cli import main\n"
        "import exporters.cli, exporters.exposition, exporters.xid\n"
        "sys.exit(main(['exporter', '--help']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "--simulate-gpus" in result.stdout and "--web-config-file" in result.stdout
