"""A fast, tolerant reader of the Prometheus text exposition format: only what `top` needs.

prometheus_client's parser builds full metric families and validates every line; for a 256-node
job that is seconds per refresh. `top` needs only (name, labels, value) of the series it shows,
so this module first drops the families it does not read (whole ``# TYPE`` sections, found by
one scan), then matches sample lines with one compiled regular expression over the bytes as
received (the scanning happens in C; label blocks are decoded and parsed once, then cached),
and skips anything it does not understand. It never raises: what a pod serves is untrusted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import chain
from typing import NamedTuple

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# A label block, greedy to the line's last '}' (label values may hold '}'); the block is then
# validated (and cached) by parse_labels. A tight greedy scan is twice as fast as matching the
# quoting in the line pattern.
_LABELS = rb"\{(.*)\}"
_TAIL = rb"[ \t]+([^ \t\n]+)(?:[ \t]+[^ \t\n]+)?[ \t]*(?=\n|\Z)"
_LABEL_PAIR = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*,?'
)
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


# Lines are matched in the bytes as received (only label blocks seen for the first time are
# decoded), each from the newline before it: a literal the regex engine searches for quickly,
# where a multi-line ``^`` is tried at every character (~15% slower).
_ANY_LINE = re.compile(rb"\n(" + _NAME.encode() + rb")(?:" + _LABELS + rb")?" + _TAIL)


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


def _split_le(block: bytes) -> tuple[bytes, bytes] | None:
    """(the block without its ``le="..."`` pair, the le value) for histogram buckets."""
    start = block.find(b'le="')
    if start < 0 or (start > 0 and block[start - 1:start] != b","):
        return None
    end = block.find(b'"', start + 4)
    if end < 0:
        return None
    value, after = block[start + 4:end], block[end + 1:]
    if after.startswith(b","):
        return block[:start] + after[1:], value
    if after:
        return None
    return (block[:start - 1] if start else b""), value


_MISSING: dict[str, str] = {}
_NAMES_LIMIT = 10_000
_TYPE_SEP = b"\n# TYPE "  # a section per family: samples follow their TYPE line
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_info")


def _family_names(names: frozenset[str]) -> frozenset[bytes]:
    """Header names under which samples called ``names`` may appear (``x`` for ``x_total``)."""
    out = set(names)
    for name in names:
        out.update(name[: -len(s)] for s in _SUFFIXES if name.endswith(s))
    return frozenset(n.encode() for n in out)


def _lines_holding(section: bytes, start: bytes, text: bytes) -> list[bytes]:
    """The lines of ``section`` that begin with ``start`` and hold ``text`` (found in C)."""
    out, pos = [], section.find(text)
    while pos >= 0:
        begin = section.rfind(b"\n", 0, pos) + 1
        end = section.find(b"\n", pos)
        end = len(section) if end < 0 else end
        if section.startswith(start, begin):
            out.append(section[begin:end])
        pos = section.find(text, end)
    return out


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
        self._require = {name.encode(): text.encode() for name, text in (require or {}).items()}
        # Sample names as matched → the str every sample of that name shares (the wanted ones;
        # with no ``names``, a cache of those seen).
        self._name_of = {name.encode(): name for name in self._names or ()}
        # A required family's lines: (what they begin with, the text they must hold).
        self._narrow = {name: (name + b"{", text) for name, text in self._require.items()}
        # The TYPE lines of wanted families, found by one scan in C.
        families = b"|".join(re.escape(f) for f in sorted(
            _family_names(self._names or frozenset()), key=len, reverse=True))
        self._headers = re.compile(rb"\n# TYPE (" + families + rb")(?=[ \t\n])")
        self._first_header = re.compile(rb"# TYPE (" + families + rb")(?=[ \t\n])")
        self._blocks: dict[bytes, dict[str, str] | None] = {b"": {}}
        self._pairs: Pairs = {}

    def _wanted_payload(self, data: bytes) -> bytes:
        """Only the families (from one ``# TYPE`` line to the next) that hold wanted names.

        Expositions group each family's samples under its TYPE line, so whole sections of
        unwanted families are dropped without looking at their lines, and the line regex
        reads only what is kept: about a quarter of what pods serve. Lines before the first
        TYPE line, or an exposition without any, are filtered per line.
        """
        at_start = self._first_header.match(data)
        first = 0 if data.startswith(b"# TYPE ") else data.find(_TYPE_SEP)
        kept = [b"", self._wanted_lines(data if first < 0 else data[:first])]  # "\n" first
        narrow = self._narrow
        for header in chain((at_start,) if at_start else (), self._headers.finditer(data)):
            start = header.start(1) - 7  # where "# TYPE " begins
            end = data.find(_TYPE_SEP, header.end())
            section = data[start:end] if end >= 0 else data[start:]
            required = narrow.get(header.group(1))
            if required is not None:  # the TYPE line, then only the lines holding the text
                section = b"\n".join([section[: section.find(b"\n")],
                                      *_lines_holding(section, *required)])
            kept.append(section)
        return b"\n".join(kept)

    def _wanted_lines(self, data: bytes) -> bytes:
        names = self._name_of
        kept = []
        for line in data.split(b"\n"):
            brace, space = line.find(b"{"), line.find(b" ")
            end = brace if 0 <= brace < space or space < 0 else space
            if line[:end] in names:
                kept.append(line)
        return b"\n".join(kept)

    def parse(self, payload: str | bytes) -> list[Sample]:
        """The wanted samples of one exposition, given as received (bytes) or as text."""
        out: list[Sample] = []
        append, new = out.append, tuple.__new__  # tuple.__new__ skips NamedTuple's slow __new__
        blocks, name_of = self._blocks, self._name_of
        if len(blocks) > self._CACHE_LIMIT:  # bound memory against hostile label churn
            blocks.clear()
            blocks[b""] = {}
        data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
        every = self._names is None
        data = b"\n" + data if every else self._wanted_payload(data)
        require = self._require
        for name_bytes, block, raw in _ANY_LINE.findall(data):
            name = name_of.get(name_bytes)
            if name is None:
                if not every:
                    continue
                name = self._learn_name(name_bytes)
            if require and name_bytes in require and require[name_bytes] not in block:
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

    def _learn_name(self, name: bytes) -> str:
        if len(self._name_of) > _NAMES_LIMIT:  # bounded against hostile name churn
            self._name_of.clear()
        text = self._name_of[name] = name.decode("ascii")  # the name pattern is ASCII
        return text

    def _new_block(self, block: bytes) -> dict[str, str] | None:
        # Histogram buckets repeat a cached block plus one `le` pair: extend the cached dict.
        split = _split_le(block) if b'le="' in block else None
        if split is not None:
            base = self._blocks.get(split[0])
            if base and b"\\" not in split[1]:
                return {**base, "le": decode(split[1])}
        return parse_labels(decode(block), self._pairs)


def parse(payload: str | bytes, names: Iterable[str] | None = None) -> list[Sample]:
    """Every well-formed sample line of ``payload`` (restricted to ``names`` when given)."""
    return Parser(names).parse(payload)


def decode(payload: bytes) -> str:
    """Body bytes → text; undecodable bytes become U+FFFD rather than an error."""
    return payload.decode("utf-8", errors="replace")
