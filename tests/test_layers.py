"""The code's layout holds: names come from the catalog by symbol, imports only go down.

Parsed with ``ast`` (nothing is imported), so these checks see every function body, including
ones no other test runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

from fsdpmon import catalog

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fsdpmon", "exporters", "dashboards", "trainer")


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


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
        tree = ast.parse(path.read_text(), str(path))
        aliases = _catalog_aliases(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and not hasattr(catalog, node.attr)):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: catalog.{node.attr}")
    assert not missing, f"{len(missing)} unknown catalog symbols:\n" + "\n".join(missing)
