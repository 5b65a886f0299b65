"""The code's layout holds: names come from the catalog by symbol, imports only go down.

Layers, bottom first (an import may only point at its own layer or one below):

0. the bottom layer: ``fsdpmon`` (the package root), ``catalog``, ``conventions``, ``errors``,
   ``validate``, ``faultspec``, ``families``, ``distenv``, and the endpoint both servers share
   (``httpserve``, ``webconfig``, ``basicauth``); it imports nothing else of ours.
1. ``exporters`` and ``dashboards``: the bottom layer and themselves only, never each other.
2. the rest of ``fsdpmon``; only the modules that run an exporter or ship the dashboards
   (``RUNNERS``) may import layer 1.
3. ``trainer``: the training code, instrumented with the monitor; nothing imports it, except
   that the manifests check the trainer command they generate (``--train-arg`` included) with
   the trainer's own torch-free parser (``TRAINER_CLI``).

Parsed with ``ast`` (nothing is imported), so these checks see every function body, including
lazy imports and code no other test runs.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from fsdpmon import catalog

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fsdpmon", "exporters", "dashboards", "trainer")


@functools.cache
def _tree(path: Path) -> ast.Module:
    """Each file parsed once for all the checks here."""
    return ast.parse(path.read_text(), str(path))


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


BOTTOM = frozenset({"fsdpmon", "fsdpmon.catalog", "fsdpmon.conventions", "fsdpmon.errors",
                    "fsdpmon.validate", "fsdpmon.faultspec", "fsdpmon.families",
                    "fsdpmon.distenv",
                    # the one HTTP endpoint both the exporter and the monitor serve through
                    "fsdpmon.httpserve", "fsdpmon.webconfig", "fsdpmon.basicauth"})
# fsdpmon modules that run an exporter (the demo) or wrap the dashboards (the manifests).
RUNNERS = ("fsdpmon.demo", "fsdpmon.manifests")
# The trainer's command line and model shapes (no torch), and the one module that may read them.
TRAINER_CLI = frozenset({"trainer.config", "trainer.shapes"})
TRAINER_CLI_USER = "fsdpmon.manifests.training"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, known: set[str]) -> set[str]:
    """Our modules a file imports (``from a import b`` is module ``a.b`` where that exists)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                    else node.module for a in node.names}
    return {name for name in out if name.split(".")[0] in PACKAGES}


def _layer(module: str) -> int:
    if module in BOTTOM:
        return 0
    top = module.split(".")[0]
    return {"exporters": 1, "dashboards": 1, "fsdpmon": 2, "trainer": 3}[top]


def _upward(source: str, target: str) -> bool:
    if source == TRAINER_CLI_USER and target in TRAINER_CLI:
        return False
    if _layer(target) > _layer(source):
        return True
    if _layer(source) == 1 == _layer(target):  # exporters and dashboards stay apart
        return source.split(".")[0] != target.split(".")[0]
    if _layer(source) == 2 and _layer(target) == 1:
        return not source.startswith(RUNNERS)
    return False


def test_imports_only_point_down():
    paths = _sources(*PACKAGES)
    known = {_module(p) for p in paths}
    edges = {(_module(p), t) for p in paths
             for t in _imports(_tree(p), known)}
    assert len(edges) > 100, f"only {len(edges)} import edges found: is the parser blind?"
    up = sorted(f"{a} -> {b}" for a, b in edges if _upward(a, b))
    assert not up, f"{len(up)} imports point up a layer:\n" + "\n".join(up)


def _catalog_aliases(tree: ast.Module) -> set[str]:
    """Local names bound to the catalog module (``from fsdpmon import catalog [as x]``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "fsdpmon":
            names |= {a.asname or a.name for a in node.names if a.name == "catalog"}
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "fsdpmon.catalog" and a.asname}
    return names


def test_every_catalog_attribute_used_exists():
    """``catalog.TRAIN_LOS`` in a function body would only fail when called: fail here."""
    missing = []
    for path in _sources(*PACKAGES, "tests", "benchmarks"):
        tree = _tree(path)
        aliases = _catalog_aliases(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and not hasattr(catalog, node.attr)):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: catalog.{node.attr}")
    assert not missing, f"{len(missing)} unknown catalog symbols:\n" + "\n".join(missing)


# A metric or recorded-series name inside a string literal: fsdpmon_ then lower case, digits,
# underscores and colons (FSDPMON_ environment variables and file names with dots do not match).
QUOTED_NAME = re.compile(r"(?<![A-Za-z0-9_])fsdpmon_[a-z0-9_:]*[a-z0-9_]")


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def _quoted_names(path: Path) -> list[str]:
    tree = _tree(path)
    prose = _docstrings(tree)
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in prose:
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if isinstance(text, str):
                found += [f"{where}:{node.lineno}: {name}"
                          for name in QUOTED_NAME.findall(text)]
    return found


def test_no_metric_name_is_retyped_outside_the_catalog():
    """Every metric and recorded-series name is spelt once, in fsdpmon/catalog.py.

    Scope: all code in the packages and benchmarks, and the helpers in tests/ that produce or
    read metrics (the synthetic job, the fakes). The test files themselves (tests/test_*.py)
    may spell names out where they assert on what Prometheus and users see (exposition text,
    generated dashboards and rules): there the literal is the contract, and a rename should
    make them fail. Docstrings and comments are prose and are not checked.
    """
    helpers = [p for p in _sources("tests") if not p.name.startswith("test_")]
    paths = [p for p in _sources(*PACKAGES, "benchmarks") + helpers
             if p != ROOT / "fsdpmon" / "catalog.py"]
    assert len(paths) > 100, f"only {len(paths)} files checked"
    retyped = [hit for p in paths for hit in _quoted_names(p)]
    assert not retyped, (f"{len(retyped)} retyped metric names (use catalog.SYMBOL):\n"
                         + "\n".join(retyped))


def test_the_retyped_name_check_sees_names_in_strings_bytes_and_f_strings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""fsdpmon_in_docstring is prose."""\n'
                      'A = "fsdpmon_train_loss"\nB = b"fsdpmon_gpu_up{"\n'
                      'C = f"rate(fsdpmon_job:loss:avg[{A}])"\nD = "FSDPMON_PORT"\n')
    names = [hit.split(": ")[1] for hit in _quoted_names(sample)]
    assert names == ["fsdpmon_train_loss", "fsdpmon_gpu_up", "fsdpmon_job:loss:avg"], names
