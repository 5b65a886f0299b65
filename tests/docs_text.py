"""Reading the project's Markdown as a renderer does: what is prose, what is code, what links
where, and which anchors a page has (GitHub's rules). Shared by the documentation tests."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Build outputs and environments, never documentation of ours.
SKIPPED_DIRS = {".venv", ".git", "build", "dist", "runs", "out", "gpu-check", "node_modules"}

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)  # a span may go on over a line break
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def markdown_files(root: Path = ROOT) -> list[Path]:
    """Every Markdown file of the project, outside build outputs and environments."""
    return sorted(p for p in root.rglob("*.md")
                  if not SKIPPED_DIRS & set(p.relative_to(root).parts[:-1])
                  and not any(part.endswith(".egg-info") for part in p.parts))


@dataclass(frozen=True)
class Line:
    number: int
    text: str
    code: bool  # inside a fenced code block
    lang: str = ""  # the fence's info string, for code lines


def lines(text: str) -> Iterator[Line]:
    """Each line, marked as prose or fenced code (fence lines themselves are neither)."""
    fence, lang = "", ""
    for number, raw in enumerate(text.splitlines(), 1):
        match = FENCE.match(raw)
        if match and (not fence or match.group(1) == fence):
            if fence:
                fence, lang = "", ""
            else:
                fence, lang = match.group(1), raw.strip()[3:].strip().lower()
            continue
        yield Line(number, raw, bool(fence), lang)


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each run of prose lines: links and code spans may go on
    over a line break, never over a blank line or a code block."""
    block: list[Line] = []
    for line in [*lines(text), Line(0, "", True)]:
        if line.code or not line.text.strip():
            if block:
                yield block[0].number, "\n".join(b.text for b in block)
            block = []
        else:
            block.append(line)


def code_spans(text: str) -> list[str]:
    """The inline code spans of prose, as written (line breaks as spaces, ends trimmed)."""
    return [" ".join(m.group(2).split()) for m in CODE_SPAN.finditer(text)]


def _blank_code(match: re.Match[str]) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))  # keeps the line breaks, so numbers stay right


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline, image and reference link outside code."""
    found = []
    for first, block in paragraphs(text):
        prose = CODE_SPAN.sub(_blank_code, block)
        found += [(first + prose.count("\n", 0, m.start()), m.group(1))
                  for m in INLINE_LINK.finditer(prose)]
        found += [(first + n, m.group(1)) for n, row in enumerate(prose.split("\n"))
                  if (m := REFERENCE_LINK.match(row))]
    return found


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, characters other than letters, digits,
    spaces, ``-`` and ``_`` dropped (code backticks and emphasis included), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a page offers: one per heading (a repeated one gets ``-1``, ``-2``, ... as
    GitHub numbers them) and explicit ``<a name/id>`` ones."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in lines(text):
        if line.code:
            continue
        out |= set(HTML_ANCHOR.findall(line.text))
        match = HEADING.match(line.text)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I))


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of ``page`` whose file or anchor does not exist, as one line each."""
    problems = []
    text = page.read_text()
    for number, target in links(text):
        where = f"{page.relative_to(root)}:{number}: {target}"
        if is_external(target):
            continue
        path_part, _, fragment = target.partition("#")
        path_part = urllib.parse.unquote(path_part)
        if path_part.startswith("/"):
            problems.append(f"{where}: absolute path (GitHub resolves it from the site root; "
                            f"use a relative link)")
            continue
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{where}: leaves the repository")
        elif not dest.exists():
            problems.append(f"{where}: no such file")
        elif fragment and dest.suffix != ".md":
            problems.append(f"{where}: an anchor into a file that is not Markdown")
        elif fragment and urllib.parse.unquote(fragment) not in anchors(dest.read_text()):
            problems.append(f"{where}: no heading makes the anchor #{fragment}")
    return problems


def linked_pages(page: Path) -> set[Path]:
    """The Markdown files ``page`` links to (relative links only)."""
    out = set()
    for _, target in links(page.read_text()):
        path_part = urllib.parse.unquote(target.partition("#")[0])
        if path_part and not is_external(target) and not path_part.startswith("/"):
            dest = (page.parent / path_part).resolve()
            if dest.suffix == ".md" and dest.exists():
                out.add(dest)
    return out


def reachable(start: Path) -> set[Path]:
    """The Markdown files reachable from ``start`` by following relative links."""
    seen, todo = {start.resolve()}, [start.resolve()]
    while todo:
        for nxt in linked_pages(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen
