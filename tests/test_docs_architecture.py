"""docs/architecture.md names every package of fsdpmon (issue 48: it named neither incidents
nor goodput), so the person who changes the code finds each one's place in the picture."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def packages(root: Path) -> list[str]:
    """Each directory under ``root``/fsdpmon holding an __init__.py, as its path below it."""
    base = root / "fsdpmon"
    return sorted(p.parent.relative_to(base).as_posix() for p in base.rglob("__init__.py")
                  if p.parent != base and "__pycache__" not in p.parts)


def unnamed(text: str, found: list[str]) -> list[str]:
    """Those of ``found`` the text names neither as a path (fsdpmon/x/y, or `x/y/` for a tree
    that moved under the package) nor dotted (fsdpmon.x.y)."""
    return [rel for rel in found
            if not any(name in text for name in (f"fsdpmon/{rel}", "fsdpmon." +
                                                 rel.replace("/", "."), f"`{rel}/`"))]


def test_every_package_is_named_in_the_architecture():
    missing = unnamed((REPO / "docs" / "architecture.md").read_text(), packages(REPO))
    assert not missing, f"packages docs/architecture.md does not name: {missing}"


def test_a_new_package_that_is_not_named_fails(tmp_path):
    for pkg in ("fsdpmon/job", "fsdpmon/newdoor", "fsdpmon/job/inner"):
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "fsdpmon" / "__init__.py").write_text("")
    found = packages(tmp_path)
    assert found == ["job", "job/inner", "newdoor"]
    assert unnamed("the job model (`fsdpmon/job/`), fsdpmon.job.inner", found) == ["newdoor"]
