"""A fast, tolerant reader of the Prometheus text exposition format: only what `top` needs.

prometheus_client's parser builds full metric families and validates every line; for a 256-node
job that is seconds per refresh. `top` needs only (name, labels, value) of the series it shows,
so this module matches sample lines with one compiled regular expression over the whole text
(the scanning happens in C), optionally only for a set of wanted names, and skips anything it
does not understand. It never raises: what a pod serves is untrusted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import NamedTuple

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
# A label block: quoted strings may hold '}' and escaped quotes.
_LABELS = r'\{([^"}\n]*(?:"[^"\\\n]*(?:\\.[^"\\\n]*)*"[^"}\n]*)*)\}'
_TAIL = r"[ \t]+([^ \t\n]+)(?:[ \t]+[^ \t\n]+)?[ \t]*$"
_LABEL_PAIR = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*,?'
)
_LABEL_BLOCK = re.compile(f"(?:{_LABEL_PAIR.pattern})*[ \t]*")
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


_ANY_LINE = re.compile(rf"^({_NAME})(?:{_LABELS})?{_TAIL}", re.MULTILINE)


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def parse_labels(block: str) -> dict[str, str] | None:
    """``a="1",b="x"`` → dict; None when the block is malformed."""
    if _LABEL_BLOCK.fullmatch(block) is None:
        return None
    labels = dict(_LABEL_PAIR.findall(block))
    if "\\" in block:
        labels = {k: _unescape(v) for k, v in labels.items()}
    return labels


_MISSING: dict[str, str] = {}


class Parser:
    """Parses expositions, keeping only samples whose name is in ``names`` (all when None).

    Label blocks repeat across a target's series (every metric of rank 3 carries the same
    ``job_name``/``rank``/``local_rank``), so parsed blocks are cached; the label dicts of
    returned samples may therefore be shared and must be treated as read-only.
    """

    _CACHE_LIMIT = 50_000

    def __init__(self, names: Iterable[str] | None = None) -> None:
        self._names = None if names is None else frozenset(names)
        self._blocks: dict[str, dict[str, str] | None] = {"": {}}

    def _wanted_lines(self, text: str) -> str:
        """Only the lines whose metric name is wanted: a cheap pre-filter before the regex."""
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
        append = out.append
        blocks = self._blocks
        if len(blocks) > self._CACHE_LIMIT:  # bound memory against hostile label churn
            blocks.clear()
            blocks[""] = {}
        if self._names is not None:
            text = self._wanted_lines(text)
        for name, block, raw in _ANY_LINE.findall(text):
            try:
                value = float(raw)
            except ValueError:
                continue
            labels = blocks.get(block, _MISSING)
            if labels is _MISSING:
                labels = blocks[block] = self._new_block(block)
            if labels is not None:
                append(Sample(name, labels, value))
        return out

    def _new_block(self, block: str) -> dict[str, str] | None:
        # Histogram buckets repeat a cached block plus one `le` pair: extend the cached dict.
        head, comma, tail = block.rpartition(",")
        base = self._blocks.get(head) if comma else None
        if base:
            pair = _LABEL_PAIR.fullmatch(tail)
            if pair is not None:
                key, value = pair.groups()
                return {**base, key: _unescape(value) if "\\" in value else value}
        return parse_labels(block)


def parse(text: str, names: Iterable[str] | None = None) -> list[Sample]:
    """Every well-formed sample line of ``text`` (restricted to ``names`` when given)."""
    return Parser(names).parse(text)


def decode(payload: bytes) -> str:
    """Body bytes → text; undecodable bytes become U+FFFD rather than an error."""
    return payload.decode("utf-8", errors="replace")


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
