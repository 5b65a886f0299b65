"""The exporter image ships what the exporter imports, and the exporter never needs torch.

No container daemon runs here, so the image is checked from its Dockerfile: it installs the
package's base install (pyproject's own dependencies, no extras, no second copy of the pins), those
dependencies cover every third-party import of the exporter, and the `fsdpmon exporter` command
starts with torch (and the other heavy packages) made unimportable.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "exporters" / "Dockerfile"
IMPORT_NAMES = {"prometheus-client": "prometheus_client", "nvidia-ml-py": "pynvml",
                "kubernetes": "kubernetes", "psutil": "psutil", "pyyaml": "yaml",
                "bcrypt": "bcrypt"}
FSDPMON_MODULES = ("__init__", "cli", "errors", "conventions", "catalog", "validate")


def base_dependencies() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower() for dep in deps}


def dockerfile_commands() -> str:
    return re.sub(r"#.*", "", DOCKERFILE.read_text())


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
    return roots - set(sys.stdlib_module_names) - {"fsdpmon", "__future__"}


def test_base_install_covers_every_exporter_import() -> None:
    provided = {IMPORT_NAMES[name] for name in base_dependencies() if name in IMPORT_NAMES}
    missing = third_party_imports() - provided
    assert not missing, f"exporter imports {sorted(missing)}, not in the base install"


def test_image_installs_the_base_install_from_the_package_metadata() -> None:
    installs = re.findall(r"pip install ([^&\n]+)", dockerfile_commands())
    assert installs == [". "], f"the image should run one `pip install .`, found {installs}"
    assert "==" not in dockerfile_commands(), "no pins of its own: pyproject.toml is the list"


def test_image_runs_the_exporter() -> None:
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["fsdpmon", "exporter"]' in text
    assert "EXPOSE 9521" in text and "torch" not in dockerfile_commands()


def test_exporter_starts_without_torch_or_other_heavy_packages() -> None:
    code = (
        "import sys\n"
        "for m in ('torch', 'rich', 'numpy', 'transformers', 'matplotlib', 'fsdpmon.trainer'):\n"
        "    sys.modules[m] = None\n"
        "from fsdpmon.cli import main\n"
        "import fsdpmon.exporters.cli, fsdpmon.exporters.exposition, fsdpmon.exporters.xid\n"
        "sys.exit(main(['exporter', '--help']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "--simulate-gpus" in result.stdout and "--web-config-file" in result.stdout
