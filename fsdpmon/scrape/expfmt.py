"""A fast reader of the Prometheus text exposition format (0.0.4): only what `top` needs.

prometheus_client's parser builds full metric families and validates every line; for a 256-node
job that is seconds per refresh. `top` needs only (name, labels, value) of the series it shows,
so one compiled regular expression matches the canonical sample lines of the wanted names over
the bytes as received (the scanning happens in C; with names, an alternation with shared
prefixes factored out, tried only at line starts; label blocks are decoded and parsed once, then
cached). A line of a wanted name (any line, without names) that is not in that canonical form
is captured whole by the same pattern and read by expfmt_strict, which follows Prometheus's own
text parser, so odd spacing, quoted names or interleaved families lose nothing. A line either
reader rejects is dropped alone, and so is an unterminated last line (a cut-off body). It never
raises: what a pod serves is untrusted.
"""

from __future__ import annotations

import functools
import os
import re
import typing
from collections.abc import Iterable
from typing import NamedTuple

from fsdpmon.scrape.expfmt_strict import bounds_ok, labels_block, parse_line

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# A label block, greedy to the line's last '}' (label values may hold '}'); the block is then
# validated (and cached) by parse_labels. A tight greedy scan is twice as fast as matching the
# quoting in the line pattern. The value never starts with '{' (that is `name {a="1"} 2`, a form
# the strict reader takes); a timestamp is an integer; the line ends in a newline.
# The name and its label block are one group, the series as written: the key of a cache of
# parsed series, so a line seen before costs one lookup. A value holding '_' (which Python's
# float takes and Go's does not) is left to the strict reader, which rejects it.
_LABELS = rb"\{.*\}"
_TAIL = (rb"[ \t]+([^ \t\n\r\x0b\x0c{_][^ \t\n\r\x0b\x0c_]*)(?:[ \t]+[-+]?[0-9]+)?"
         rb"[ \t]*(?=\n)")


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


# A series as the parser caches it, by its text as written: (its name, its labels). A plain
# pair, unpacked where read: made once per series first seen, where a NamedTuple's own
# construction cost 6% of parsing a job's bodies with fresh caches.
Series = tuple[str, dict[str, str]]


# Lines are matched in the bytes as received (only label blocks seen for the first time are
# decoded), each from the newline before it: a literal the regex engine searches for quickly,
# where a multi-line ``^`` is tried at every character (~15% slower).
# A line not in that form is captured whole (last group), for the strict reader: any line but a
# comment or a blank one; with names, one that begins with a wanted name or with '{' (a name
# quoted inside, maybe escaped).
_ODD = rb"([^\n]*)(?=\n)"


@functools.lru_cache(maxsize=64)
def _line_pattern(names: frozenset[bytes] | None,
                  require: frozenset[tuple[bytes, bytes]] = frozenset()) -> re.Pattern[bytes]:
    # A line of a required name without its required text is skipped by the scan itself, in C:
    # most of a node's lines can be series top drops (one host CPU series per core).
    skip = b"|".join(re.escape(name) + rb"(?=[ \t{])(?![^\n]*" + re.escape(text) + b")"
                     for name, text in sorted(require))
    start = rb"\n(?![ \t]*(?:" + skip + b"))" if skip else rb"\n"
    if names is None:
        return re.compile(start + rb"(?:(" + _NAME.encode() + rb"(?:" + _LABELS + rb")?)" + _TAIL
                          + rb"|(?=[ \t]*[^ \t\n#])" + _ODD + rb")")
    wanted = alternation(names)
    return re.compile(start + rb"(?:(" + wanted + rb"(?:" + _LABELS + rb")?)" + _TAIL
                      + rb"|(?=[ \t]*(?:\{|(?:" + wanted + rb")[ \t{]))" + _ODD + rb")")


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
    """Fast path for blocks without escapes: split at the quotes instead of a scan."""
    body = block
    if not body.endswith('"'):  # trailing comma or blanks: allowed, rarely seen
        body = body.rstrip(" \t")
        body = body[:-1].rstrip(" \t") if body.endswith(",") else body
        if not body.endswith('"'):
            return None
    get = cache.get
    pairs = [get(piece) or _pair(piece, cache) for piece in body[:-1].split('",')]
    if None in pairs:
        return None
    labels = dict(pairs)  # type: ignore[arg-type]
    if len(labels) != len(pairs) or "__name__" in labels:  # Prometheus rejects both
        return None
    return labels if ("le" not in labels and "quantile" not in labels) or bounds_ok(labels) \
        else None


def parse_labels(block: str, cache: Pairs | None = None) -> dict[str, str] | None:
    """``a="1",b="x"`` → dict; None when Prometheus would reject the block.

    ``cache`` keeps pairs already seen (a Parser passes its own)."""
    if "\\" not in block:
        plain = _plain_labels(block, {} if cache is None else cache)
        if plain is not None:
            return plain
    return labels_block(block)


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


MISSING: typing.Any = object()  # a cache's "not seen yet"
_NAMES_LIMIT = 10_000


def alternation(words: Iterable[bytes]) -> bytes:
    """A regex matching exactly ``words``, shared prefixes factored out (``fsdpmon_(?:a|b)``):
    Python's engine tries alternatives one by one, so 40 names that share a prefix would
    otherwise each re-read it at every line start."""
    items = sorted(set(words))
    if not items:
        return rb"(?!)"
    prefix = os.path.commonprefix(items)  # noqa: RUF071 - bytes, not paths
    rest = [w[len(prefix):] for w in items]
    if len(items) == 1:
        return re.escape(prefix)
    if prefix:
        inner = alternation([r for r in rest if r])
        return re.escape(prefix) + b"(?:" + inner + (b")?" if b"" in rest else b")")
    groups: dict[int, list[bytes]] = {}
    for w in items:
        groups.setdefault(w[0], []).append(w)
    return b"(?:" + b"|".join(alternation(g) for g in groups.values()) + b")"


COUNT_SUFFIXES = ("_bucket", "_count")  # a histogram's series that cannot be negative
# A TYPE line declaring a histogram: its family's name (all up to the blanks before the type).
_HISTOGRAM_TYPE = re.compile(rb"\n[ \t]*#[ \t]+TYPE[ \t]+([^\n]+?)[ \t]+histogram[ \t]*(?=\n)")


class Histograms:
    """The families one body declares histograms, read from its TYPE lines at the first
    question (most bodies never ask: only a negative ``_bucket`` or ``_count`` value does), so
    that a body of such lines is scanned once, not once per line."""

    __slots__ = ("_data", "_names")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._names: frozenset[bytes] | None = None

    def declares(self, name: str) -> bool:
        """Whether the body declares ``name``'s family (the name less its suffix) a histogram."""
        if self._names is None:
            self._names = frozenset(_HISTOGRAM_TYPE.findall(self._data))
        return name.rsplit("_", 1)[0].encode("utf-8", "surrogatepass") in self._names


def terminated(payload: str | bytes) -> bytes:
    """``\n`` + the payload's bytes up to its last newline: an unterminated last line is
    dropped, as Prometheus's parser rejects it (and a body cut short ends in one)."""
    data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
    return b"\n" + data[: data.rfind(b"\n") + 1]


class Parser:
    """Parses expositions, keeping only samples whose name is in ``names`` (all when None).

    Label blocks repeat across a target's series (every metric of rank 3 carries the same
    ``job_name``/``rank``/``local_rank``), so parsed blocks are cached; the label dicts of
    returned samples may therefore be shared and must be treated as read-only.
    """

    _CACHE_LIMIT = 50_000  # label blocks
    _SERIES_LIMIT = 250_000  # ~90k series for 2048 ranks; each ~250 bytes

    def __init__(
        self, names: Iterable[str] | None = None, require: dict[str, str] | None = None
    ) -> None:
        """``require`` maps a name to text its lines must contain (e.g. the host CPU series
        only for ``cpu="all"``, not one per core): its other lines are skipped by the scan,
        before anything of them is built."""
        self._names = None if names is None else frozenset(names)
        self._require = {name.encode(): text.encode() for name, text in (require or {}).items()}
        # Sample names as matched → the str every sample of that name shares (the wanted ones;
        # with no ``names``, a cache of those seen).
        self._name_of = {name.encode(): name for name in self._names or ()}
        self._line = _line_pattern(None if self._names is None else frozenset(self._name_of),
                                   frozenset(self._require.items()))
        self._blocks: dict[bytes, dict[str, str] | None] = {b"": {}}
        self._series: dict[bytes, Series | None] = {}
        self._pairs: Pairs = {}

    def parse(self, payload: str | bytes) -> list[Sample]:
        """The wanted samples of one exposition, given as received (bytes) or as text."""
        out: list[Sample] = []
        append, new = out.append, tuple.__new__  # tuple.__new__ skips NamedTuple's slow __new__
        series_of = self._series
        self._bound()
        data = terminated(payload)
        histograms = Histograms(data)
        for series, raw, odd in self._line.findall(data):
            known = series_of.get(series, MISSING)
            if known is MISSING:
                known = self._first_seen(series, odd, histograms, out)
            if known is None:
                continue
            # _add_sample, inlined: this loop runs once per sample
            try:
                value = float(raw)
            except ValueError:
                continue
            name, labels = known
            if value != value and raw[:1] in b"+-":  # Go's float takes no signed NaN
                continue
            if value < 0 and name.endswith(COUNT_SUFFIXES) and histograms.declares(name):
                continue  # Prometheus rejects a negative bucket or count of a histogram
            append(new(Sample, (name, labels, value)))
        return out

    def _first_seen(self, series: bytes, odd: bytes, histograms: Histograms,
                    out: list[Sample]) -> Series | None:
        """A line whose series is not cached: a canonical one's series is parsed and cached
        ((name, labels), or None when unwanted or invalid); any other line's sample is read by
        the strict reader into ``out`` (None: nothing more to do with it)."""
        if odd:
            out.extend(self._strict(odd, histograms))
            return None
        known = self._series[series] = self._new_series(series)
        return known

    @staticmethod
    def _add_sample(out: list[Sample], known: Series, raw: bytes,
                    histograms: Histograms) -> None:
        """Appends the sample of a known series' line to ``out``, unless its value is one
        Prometheus rejects."""
        try:
            value = float(raw)
        except ValueError:
            return
        name, labels = known
        if value != value and raw[:1] in b"+-":  # Go's float takes no signed NaN
            return
        if value < 0 and name.endswith(COUNT_SUFFIXES) and histograms.declares(name):
            return  # Prometheus rejects a negative bucket or count of a histogram
        out.append(Sample(name, labels, value))

    def _bound(self) -> None:
        """Empties the caches once they pass their limits (against hostile label churn)."""
        if len(self._series) > self._SERIES_LIMIT or len(self._blocks) > self._CACHE_LIMIT:
            self._series.clear()
            self._blocks.clear()
            self._blocks[b""] = {}

    def _new_series(self, series: bytes) -> Series | None:
        """The name and labels of a series seen for the first time; None when unwanted or invalid.
        (The required text of a ``require`` name was checked by the scan.)"""
        brace = series.find(b"{")
        name_bytes, block = (series, b"") if brace < 0 else (series[:brace], series[brace + 1:-1])
        name = self._name_of.get(name_bytes)
        if name is None:
            if self._names is not None:
                return None
            name = self._learn_name(name_bytes)
        labels = self._blocks.get(block, MISSING)
        if labels is MISSING:
            labels = self._blocks[block] = self._new_block(block)
        return None if labels is None else (name, labels)

    def _strict(self, line: bytes, histograms: Histograms) -> list[Sample]:
        """The sample of a line not in the canonical form, read by the strict reader."""
        try:
            parsed = parse_line(line.decode("utf-8"))
        except UnicodeDecodeError:  # Prometheus rejects invalid UTF-8
            return []
        if parsed is None:
            return []
        name, labels, value = parsed
        raw_name = name.encode("utf-8", "surrogatepass")
        if self._names is not None and name not in self._names:
            return []
        if raw_name in self._require and self._require[raw_name] not in line:
            return []
        if value < 0 and name.endswith(COUNT_SUFFIXES) and histograms.declares(name):
            return []
        return [Sample(name, labels, value)]

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
            if base is not None and "le" not in base and b"\\" not in split[1]:
                labels = {**base, "le": split[1].decode("ascii", "replace")}
                return labels if bounds_ok(labels) else None
        try:
            text = block.decode("utf-8")
        except UnicodeDecodeError:  # Prometheus rejects invalid UTF-8 in a label value
            return None
        return parse_labels(text, self._pairs)


def parse(payload: str | bytes, names: Iterable[str] | None = None) -> list[Sample]:
    """Every well-formed sample line of ``payload`` (restricted to ``names`` when given)."""
    return Parser(names).parse(payload)
