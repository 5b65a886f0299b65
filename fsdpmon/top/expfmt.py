"""A fast, tolerant reader of the Prometheus text exposition format: only what `top` needs.

prometheus_client's parser builds full metric families and validates every line; for a 256-node
job that is seconds per refresh. `top` needs only (name, labels, value) of the series it shows,
so this module matches sample lines with one compiled regular expression over the whole text
(the scanning happens in C), optionally only for a set of wanted names, and skips anything it
does not understand. It never raises: what a pod serves is untrusted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# A label block, greedy to the line's last '}' (label values may hold '}'); the block is then
# validated (and cached) by parse_labels. A tight greedy scan is twice as fast as matching the
# quoting in the line pattern.
_LABELS = r"\{(.*)\}"
_TAIL = r"[ \t]+([^ \t\n]+)(?:[ \t]+[^ \t\n]+)?[ \t]*$"
_LABEL_PAIR = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*,?'
)
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


_ANY_LINE = re.compile(rf"^({_NAME})(?:{_LABELS})?{_TAIL}", re.MULTILINE)


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


Pairs = dict[str, tuple[str, str]]  # 'key="value' → (key, value): pairs repeat across blocks
_PAIRS_LIMIT = 100_000


def _pair(piece: str, cache: Pairs) -> tuple[str, str] | None:
    key, sep, value = piece.partition('="')
    key = key.strip(" \t")
    if not sep or '"' in value or not (key.isascii() and key.isidentifier()):
        return None
    if len(cache) > _PAIRS_LIMIT:  # bounded against hostile label churn
        cache.clear()
    cache[piece] = (key, value)
    return key, value


def _plain_labels(block: str, cache: Pairs) -> dict[str, str] | None:
    """Fast path for blocks without escapes: split at the quotes instead of a regex scan."""
    body = block
    if not body.endswith('"'):  # trailing comma or blanks: allowed, rarely seen
        body = body.rstrip(" \t")
        body = body[:-1].rstrip(" \t") if body.endswith(",") else body
        if not body.endswith('"'):
            return None
    get = cache.get
    pairs = [get(piece) or _pair(piece, cache) for piece in body[:-1].split('",')]
    return None if None in pairs else dict(pairs)  # type: ignore[arg-type]


def parse_labels(block: str, cache: Pairs | None = None) -> dict[str, str] | None:
    """``a="1",b="x"`` → dict; None when the block is malformed (pairs must be contiguous).

    ``cache`` keeps pairs already seen (a Parser passes its own)."""
    if "\\" not in block:
        plain = _plain_labels(block, {} if cache is None else cache)
        if plain is not None:
            return plain
    labels: dict[str, str] = {}
    pos = 0
    for m in _LABEL_PAIR.finditer(block):
        if m.start() != pos:
            return None
        key, value = m.groups()
        labels[key] = _unescape(value) if "\\" in value else value
        pos = m.end()
    if pos != len(block) and block[pos:].strip(" \t"):
        return None
    return labels


def _split_le(block: str) -> tuple[str, str] | None:
    """(the block without its ``le="..."`` pair, the le value) for histogram buckets."""
    start = block.find('le="')
    if start < 0 or (start > 0 and block[start - 1] != ","):
        return None
    end = block.find('"', start + 4)
    if end < 0:
        return None
    value, after = block[start + 4:end], block[end + 1:]
    if after.startswith(","):
        return block[:start] + after[1:], value
    if after:
        return None
    return (block[:start - 1] if start else ""), value


_MISSING: dict[str, str] = {}
_TYPE = "# TYPE "
_NAME_AT = re.compile(_NAME)
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info")


def _type_lines(text: str) -> list[tuple[int, str]]:
    """(offset, family name) of every ``# TYPE`` line."""
    out, pos = [], text.find(_TYPE)
    while pos >= 0:
        if pos == 0 or text[pos - 1] == "\n":
            name = _NAME_AT.match(text, pos + len(_TYPE))
            out.append((pos, name.group() if name else ""))
        pos = text.find(_TYPE, pos + 1)
    return out


def _family_names(names: frozenset[str]) -> frozenset[str]:
    """Header names under which samples called ``names`` may appear (``x`` for ``x_total``)."""
    out = set(names)
    for name in names:
        out.update(name[: -len(s)] for s in _SUFFIXES if name.endswith(s))
    return frozenset(out)


class Parser:
    """Parses expositions, keeping only samples whose name is in ``names`` (all when None).

    Label blocks repeat across a target's series (every metric of rank 3 carries the same
    ``job_name``/``rank``/``local_rank``), so parsed blocks are cached; the label dicts of
    returned samples may therefore be shared and must be treated as read-only.
    """

    _CACHE_LIMIT = 50_000

    def __init__(
        self, names: Iterable[str] | None = None, require: dict[str, str] | None = None
    ) -> None:
        """``require`` maps a name to text its label block must contain (e.g. the host CPU
        series only for ``cpu="all"``, not one per core): other series of it are skipped
        before their labels are parsed."""
        self._names = None if names is None else frozenset(names)
        self._require = require or {}
        # Lines of a required family that hold the required text, found in C, not per line.
        self._narrow = {name: re.compile(rf"^{re.escape(name)}\{{[^\n]*{re.escape(text)}[^\n]*$",
                                         re.MULTILINE)
                        for name, text in self._require.items()}
        self._families = None if self._names is None else _family_names(self._names)
        self._blocks: dict[str, dict[str, str] | None] = {"": {}}
        self._pairs: Pairs = {}

    def _wanted_text(self, text: str) -> str:
        """Only the families (from one ``# TYPE`` line to the next) that hold wanted names.

        Expositions group each family's samples under its TYPE line, so whole sections of
        unwanted families are skipped without looking at their lines (str.find runs in C).
        Lines before the first TYPE line, or an exposition without any, are filtered per line.
        """
        headers = _type_lines(text)
        if not headers:
            return self._wanted_lines(text)
        kept = [self._wanted_lines(text[: headers[0][0]])]
        families = self._families
        for i, (start, family) in enumerate(headers):
            if family in families:  # type: ignore[operator]
                end = headers[i + 1][0] if i + 1 < len(headers) else len(text)
                narrow = self._narrow.get(family)
                section = text[start:end]
                kept.append("\n".join(narrow.findall(section)) if narrow else section)
        return "\n".join(kept)

    def _wanted_lines(self, text: str) -> str:
        names = self._names
        kept = []
        for line in text.split("\n"):
            brace, space = line.find("{"), line.find(" ")
            end = brace if 0 <= brace < space or space < 0 else space
            if line[:end] in names:  # type: ignore[operator]
                kept.append(line)
        return "\n".join(kept)

    def parse(self, text: str) -> list[Sample]:
        out: list[Sample] = []
        append, new = out.append, tuple.__new__  # tuple.__new__ skips NamedTuple's slow __new__
        blocks = self._blocks
        if len(blocks) > self._CACHE_LIMIT:  # bound memory against hostile label churn
            blocks.clear()
            blocks[""] = {}
        names = self._names
        if names is not None:
            text = self._wanted_text(text)
        require = self._require
        for name, block, raw in _ANY_LINE.findall(text):
            if names is not None and name not in names:
                continue
            if require and name in require and require[name] not in block:
                continue
            try:
                value = float(raw)
            except ValueError:
                continue
            labels = blocks.get(block, _MISSING)
            if labels is _MISSING:
                labels = blocks[block] = self._new_block(block)
            if labels is not None:
                append(new(Sample, (name, labels, value)))
        return out

    def _new_block(self, block: str) -> dict[str, str] | None:
        # Histogram buckets repeat a cached block plus one `le` pair: extend the cached dict.
        split = _split_le(block) if 'le="' in block else None
        if split is not None:
            base = self._blocks.get(split[0])
            if base and "\\" not in split[1]:
                return {**base, "le": split[1]}
        return parse_labels(block, self._pairs)


def parse(text: str, names: Iterable[str] | None = None) -> list[Sample]:
    """Every well-formed sample line of ``text`` (restricted to ``names`` when given)."""
    return Parser(names).parse(text)


def decode(payload: bytes) -> str:
    """Body bytes → text; undecodable bytes become U+FFFD rather than an error."""
    return payload.decode("utf-8", errors="replace")
