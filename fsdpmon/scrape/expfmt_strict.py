"""One sample line read by the rules of Prometheus's text format 0.0.4, strictly; slow, rare.

expfmt's fast path matches the canonical form exporters emit (``name{a="1"} 2``); the lines it
does not match come here, one at a time: blanks before ``{`` or none after ``}``, leading blanks,
quoted (UTF-8) names, odd label spacing. The rules are those of prometheus/common's text parser
and Prometheus's scrape parser where they are stricter than prometheus_client: a value is a float
in ASCII without ``_`` or hex; a timestamp is an integer; label names are unique and not
``__name__``; every label value is quoted; ``le`` and ``quantile`` are floats; no exemplars
(OpenMetrics only).
Anything else makes the line None.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_TIMESTAMP = re.compile(r"[-+]?[0-9]+(?![^ \t])")
_TOKEN = re.compile(r"[^ \t]+")
_BLANKS = " \t"


class _Bad(Exception):
    """The line breaks a rule; the reader drops it."""


def unescape(text: str) -> str:
    """A quoted string's escapes resolved; an unknown one stays as written (``\\z``), as both
    prometheus_client and Prometheus's scrape parser keep it."""
    if "\\" not in text:
        return text
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


def number(text: str) -> float | None:
    """A sample value or ``le``/``quantile`` bound: Go's ParseFloat without ``_`` or hex."""
    if not text.isascii() or "_" in text or text != text.strip() or (
            text[:1] in "+-" and text[1:2] in "nN"):
        # Python's float takes other scripts' digits ("١", "１"), "1_2", blanks around and a
        # signed NaN; Go's takes none of them
        return None
    try:
        return float(text)
    except ValueError:
        return None


class _Line:
    """A cursor over one line."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def blanks(self) -> int:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _BLANKS:
            self.pos += 1
        return self.pos - start

    def peek(self) -> str:
        return self.text[self.pos:self.pos + 1]

    def take(self, pattern: re.Pattern[str]) -> re.Match[str]:
        m = pattern.match(self.text, self.pos)
        if m is None:
            raise _Bad
        self.pos = m.end()
        return m

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise _Bad
        self.pos += 1


def _labels(line: _Line, name: str | None) -> tuple[str | None, dict[str, str]]:
    """Reads after ``{`` up to and including ``}``: (the metric name if quoted inside, labels)."""
    labels: dict[str, str] = {}
    line.blanks()
    if line.peek() == ",":  # `{,}`: an empty set with a lone comma, which prometheus_client reads
        line.pos += 1
        line.blanks()
        line.expect("}")
        return name, labels
    while True:
        line.blanks()
        if line.peek() == "}":  # also after a trailing comma
            line.pos += 1
            return name, labels
        if line.peek() == '"':
            key = unescape(line.take(_QUOTED).group(1))
            line.blanks()
            if line.peek() != "=":  # a quoted metric name, when none came before
                if name is not None:
                    raise _Bad
                name, key = key, ""
        else:
            key = line.take(_LABEL).group()
        if key:
            line.blanks()
            line.expect("=")
            line.blanks()
            value = unescape(line.take(_QUOTED).group(1))
            if key in labels or key == "__name__":
                raise _Bad
            labels[key] = value
        line.blanks()
        if line.peek() == ",":
            line.pos += 1
            line.blanks()
            if line.peek() == ",":
                raise _Bad
        elif line.peek() != "}":
            raise _Bad


def bounds_ok(labels: dict[str, str]) -> bool:
    """``le`` and ``quantile`` hold floats (Prometheus rejects the line otherwise)."""
    return all(number(labels[k]) is not None for k in ("le", "quantile") if k in labels)


def parse_line(text: str) -> tuple[str, dict[str, str], float] | None:
    """(name, labels, value) of one sample line, or None: blank, comment or malformed."""
    line = _Line(text)
    line.blanks()
    if line.peek() in ("", "#"):
        return None
    try:
        name = None if line.peek() == "{" else line.take(_NAME).group()
        blank = line.blanks()
        labels: dict[str, str] = {}
        if line.peek() == "{":
            line.pos += 1
            name, labels = _labels(line, name)
            line.blanks()
        elif not blank:
            raise _Bad
        value = number(line.take(_TOKEN).group())
        line.blanks()
        if line.pos < len(line.text):
            line.take(_TIMESTAMP)
            line.blanks()
    except _Bad:
        return None
    if name is None or value is None or line.pos != len(line.text) or not bounds_ok(labels):
        return None
    return name, labels, value


def labels_block(block: str) -> dict[str, str] | None:
    """The labels between the braces after a plain metric name, or None when malformed."""
    line = _Line(block + "}")
    try:
        _, labels = _labels(line, "")  # a name already: a quoted one inside is refused
    except _Bad:
        return None
    return labels if line.pos == len(line.text) and bounds_ok(labels) else None
