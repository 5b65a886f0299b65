"""The documentation holds together: every relative link and anchor resolves, every page of the
user guide can be reached from the front page, and the front page stays a front page.

Links are read as GitHub renders them: nothing inside code (fenced blocks, inline spans) is a
link, and an anchor is a heading's GitHub slug (``## `fsdpmon top` `` is ``#fsdpmon-top``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_text import ROOT, anchors, broken_links, github_slug, markdown_files, reachable

README_MAX_LINES = 300
PAGES = markdown_files()


def test_the_pages_are_found():
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    expected = {"README.md", "CONTRIBUTING.md", "docs/architecture.md", "docs/runbook.md"}
    assert expected <= names, f"missing {sorted(expected - names)} among {sorted(names)}"
    assert not any(".venv" in p.parts for p in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    problems = broken_links(page)
    assert not problems, f"{len(problems)} broken links:\n" + "\n".join(problems)


def test_the_readme_is_a_front_page():
    count = len((ROOT / "README.md").read_text().splitlines())
    assert count <= README_MAX_LINES, (
        f"README.md has {count} lines, {count - README_MAX_LINES} over {README_MAX_LINES}: "
        f"move the detail into a page of docs/ and link it")


def test_every_page_of_the_guide_is_reachable_from_the_readme():
    guide = {p.resolve() for p in PAGES if p.is_relative_to(ROOT / "docs")}
    unreached = sorted(str(p.relative_to(ROOT)) for p in guide - reachable(ROOT / "README.md"))
    assert len(guide) >= 10, f"only {len(guide)} pages in docs/"
    assert not unreached, (f"{len(unreached)} pages no link leads to from README.md: "
                           f"{unreached}; link each from the README or a page it links to")


# --- the checker itself -------------------------------------------------------------------------

def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    for name, text in pages.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_slugs_follow_github():
    assert github_slug("`fsdpmon top`") == "fsdpmon-top"
    assert github_slug("4. Watch it") == "4-watch-it"
    assert github_slug("One endpoint per pod, and what it costs") == (
        "one-endpoint-per-pod-and-what-it-costs")
    assert github_slug("`bench_top.py`") == "bench_toppy"
    assert github_slug("`fsdpmon diagnose`: which rank, pod, node, GPU, and why") == (
        "fsdpmon-diagnose-which-rank-pod-node-gpu-and-why")
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## A #\n") == {"a", "a-1", "a-2"}


def test_the_checker_finds_each_kind_of_broken_link(tmp_path):
    root = _site(tmp_path, {
        "README.md": ("[ok](docs/a.md#first) [gone](docs/missing.md) [bad](docs/a.md#nope)\n"
                      "[self](#top) [up](../outside.md) [abs](/docs/a.md) "
                      "[web](https://example.com/x.md#y)\n\n"
                      "`[in code](docs/missing.md)`\n```\n[in a block](docs/missing.md)\n```\n"
                      "[over a\nline break](docs/also-missing.md)\n[ref]: docs/ref-missing.md\n"),
        "docs/a.md": "# First\n![img](img/missing.png)\n[back](../README.md#top-1)\n",
    })
    (tmp_path.parent / "outside.md").write_text("# x\n")
    found = broken_links(root / "README.md", root) + broken_links(root / "docs/a.md", root)
    text = "\n".join(found)
    for bad in ("docs/missing.md: no such file", "#nope", "#top", "../outside.md: leaves",
                "/docs/a.md: absolute", "README.md:8: docs/also-missing.md",
                "docs/ref-missing.md", "img/missing.png", "#top-1"):
        assert bad in text, f"{bad!r} not reported in:\n{text}"
    assert len(found) == 9, f"{len(found)} problems, expected 9:\n{text}"


def test_reachability_follows_links_through_pages(tmp_path):
    root = _site(tmp_path, {"README.md": "[a](docs/a.md)\n", "docs/a.md": "[b](b.md#x)\n",
                            "docs/b.md": "# X\n", "docs/lonely.md": "[a](a.md)\n"})
    names = {p.name for p in reachable(root / "README.md")}
    assert names == {"README.md", "a.md", "b.md"}, names
