"""Read the `.env` file of the aws-do-fsdp workflow: `export KEY=value` / `KEY=value` lines.

The file is meant to be `source`d by a shell, so the parser accepts what such files hold in
practice: comments, blank lines, an optional `export`, single quotes (literal), double quotes
(with `\\"` escapes and `$VAR` / `${VAR}` expansion), unquoted values with trailing `# comments`,
and references to keys defined earlier in the file or in the process environment. It never runs
the file: command substitution `$(...)` is kept as literal text.

Error messages name the file and line, never a value (a value may be a token).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from fsdpmon.errors import InputError

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def parse_env_text(text: str, source: str = "env file",
                   environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Parse env-file text into an ordered dict; later assignments win, as in a shell."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        exported = line.startswith(("export ", "export\t"))
        if exported:
            line = line[len("export"):].lstrip()
        key, sep, rest = line.partition("=")
        key = key.strip()
        if exported and not sep and all(_KEY.fullmatch(k) for k in key.split()):
            continue  # `export A B`: marks existing variables, assigns nothing
        if not sep or not _KEY.fullmatch(key):
            raise InputError(f"{where}: expected KEY=value (optionally after 'export')")
        lookup = {**environ, **values}
        values[key] = _parse_value(rest.strip(), where, key, lookup)
    return values


def read_env_file(path: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"--env-file: {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--env-file: cannot read {p}: {type(exc).__name__}") from None
    return parse_env_text(text, source=str(p), environ=environ)


def _parse_value(rest: str, where: str, key: str, lookup: Mapping[str, str]) -> str:
    if rest.startswith("'"):
        end = rest.find("'", 1)
        if end < 0:
            raise InputError(f"{where}: {key}: unterminated single quote")
        _only_comment_after(rest[end + 1:], where, key)
        return rest[1:end]
    if rest.startswith('"'):
        body, tail = _split_double_quoted(rest, where, key)
        _only_comment_after(tail, where, key)
        return _expand(body, lookup)
    # Unquoted: a '#' preceded by whitespace starts a comment, as in a shell.
    value = re.split(r"\s+#", rest, maxsplit=1)[0].strip()
    return _expand(value, lookup)


def _split_double_quoted(rest: str, where: str, key: str) -> tuple[str, str]:
    out: list[str] = []
    i = 1
    while i < len(rest):
        ch = rest[i]
        if ch == "\\" and i + 1 < len(rest) and rest[i + 1] in '"\\$`':
            # Keep an escaped '$' escaped (as '\0') so expansion leaves it alone.
            out.append("\0" if rest[i + 1] == "$" else rest[i + 1])
            i += 2
            continue
        if ch == '"':
            return "".join(out), rest[i + 1:]
        out.append(ch)
        i += 1
    raise InputError(f"{where}: {key}: unterminated double quote")


def _only_comment_after(tail: str, where: str, key: str) -> None:
    tail = tail.strip()
    if tail and not tail.startswith("#"):
        raise InputError(f"{where}: {key}: unexpected text after the closing quote")


def _expand(value: str, lookup: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return lookup.get(name, "")

    return _REFERENCE.sub(substitute, value).replace("\0", "$")
