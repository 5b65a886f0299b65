"""The mutants of one Python module: small changes of the kind a slip makes, each one edit of
the source text (so line numbers, comments and the rest of the file stay as they are).

- comparisons: ``<`` to ``<=`` and to ``>=`` (boundary and negation; likewise each order),
  ``==``/``!=``, ``is``/``is not``, ``in``/``not in``;
- constants: 0 to 1, 1 to 0 and 2, other numbers n to n + 1 and, from 10 up (units: 1024,
  1e9, 100, 60), to 1; True/False swapped;
- boolean operators: ``and``/``or`` swapped, ``not`` dropped;
- arithmetic: ``+``/``-`` and ``*``/``/`` swapped (``//`` to ``*``), in ``+=`` and the like too.

Left alone: strings, docstrings, annotations, decorators, ``if TYPE_CHECKING`` blocks and any
line marked ``# pragma: no mutate``. Each mutant has a key that names it without a line number
(``path::function: before -> after``, ``#2`` for a second alike), so lists of equivalent
mutants survive edits elsewhere in the file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

COMPARE = {ast.Lt: ("<", ("<=", ">=")), ast.LtE: ("<=", ("<", ">")),
           ast.Gt: (">", (">=", "<=")), ast.GtE: (">=", (">", "<")),
           ast.Eq: ("==", ("!=",)), ast.NotEq: ("!=", ("==",)),
           ast.Is: ("is", ("is not",)), ast.IsNot: ("is not", ("is",)),
           ast.In: ("in", ("not in",)), ast.NotIn: ("not in", ("in",))}
ARITHMETIC = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"),
              ast.Div: ("/", "*"), ast.FloorDiv: ("//", "*")}
_COMPARE_TOKEN = re.compile(rb"is\s+not|not\s+in|<=|>=|==|!=|<|>|\bis\b|\bin\b")
_ARITH_TOKEN = re.compile(rb"\*\*|//|[-+*/%@]")
_BOOL_TOKEN = re.compile(rb"\band\b|\bor\b")
_COMMENT = re.compile(rb"#[^\n]*")
SHORT = 70  # a key quotes the largest enclosing expression up to this long


@dataclass(frozen=True)
class Mutant:
    path: str  # relative to the repository root
    key: str  # path::scope: before -> after
    line: int
    lines: tuple[int, int]  # the lines the mutated expression spans
    in_function: bool
    kind: str  # compare, constant, boolean, arithmetic
    edits: tuple[tuple[int, int, bytes], ...]  # (start, end, replacement) byte offsets

    def apply(self, source: bytes) -> bytes:
        out = source
        for start, end, text in sorted(self.edits, reverse=True):
            out = out[:start] + text + out[end:]
        return out


@dataclass
class _Scan:
    path: str
    source: bytes
    offsets: list[int]  # byte offset of each line's start
    skip_lines: set[int]
    found: list[Mutant] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)

    def at(self, line: int, col: int) -> int:
        return self.offsets[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.at(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.at(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]


def mutants(path: str, source: bytes) -> list[Mutant]:
    tree = ast.parse(source)
    offsets, total = [], 0
    for line in source.splitlines(keepends=True):
        offsets.append(total)
        total += len(line)
    offsets.append(total)
    skip = {i + 1 for i, line in enumerate(source.splitlines()) if b"pragma: no mutate" in line}
    scan = _Scan(path, source, offsets, skip)
    _walk(scan, tree, [], "<module>", False)
    return scan.found


def _walk(scan: _Scan, node: ast.AST, parents: list[ast.AST], scope: str,
          in_function: bool) -> None:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        scope = node.name if scope == "<module>" else f"{scope}.{node.name}"
        in_function = in_function or not isinstance(node, ast.ClassDef)
    for edit in _edits(scan, node):
        _add(scan, node, parents, scope, in_function, *edit)
    for child in _children(node):
        _walk(scan, child, [*parents, node], scope, in_function)


def _children(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes to look into: not annotations, decorators, docstrings, TYPE_CHECKING blocks."""
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        return
    for name, value in ast.iter_fields(node):
        if name in ("annotation", "returns", "decorator_list", "type_comment"):
            continue
        values = value if isinstance(value, list) else [value]
        for i, child in enumerate(values):
            if not isinstance(child, ast.AST):
                continue
            if (name == "body" and i == 0 and isinstance(child, ast.Expr)
                    and isinstance(child.value, ast.Constant)
                    and isinstance(child.value.value, str)):
                continue  # a docstring
            yield child


Edit = tuple[str, str, tuple[tuple[int, int, bytes], ...]]  # kind, after text, edits


def _edits(scan: _Scan, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.Compare):
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            hit = _token(scan, left, right, _COMPARE_TOKEN)
            if hit is not None and type(op) in COMPARE:
                for new in COMPARE[type(op)][1]:
                    yield "compare", new, ((*hit, new.encode()),)
            left = right
    elif isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        hit = _token(scan, node.left, node.right, _ARITH_TOKEN)
        if hit is not None:
            yield "arithmetic", ARITHMETIC[type(node.op)][1], (
                (*hit, ARITHMETIC[type(node.op)][1].encode()),)
    elif isinstance(node, ast.AugAssign) and type(node.op) in ARITHMETIC:
        hit = _token(scan, node.target, node.value, re.compile(rb"(\*\*|//|[-+*/%@])="))
        if hit is not None:
            new = ARITHMETIC[type(node.op)][1] + "="
            yield "arithmetic", new, ((*hit, new.encode()),)
    elif isinstance(node, ast.BoolOp):
        pairs = zip(node.values, node.values[1:], strict=False)
        hits = [_token(scan, a, b, _BOOL_TOKEN) for a, b in pairs]
        if all(h is not None for h in hits):
            new = "or" if isinstance(node.op, ast.And) else "and"
            yield "boolean", new, tuple((*h, new.encode()) for h in hits)  # type: ignore[misc]
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        start, _ = scan.span(node)
        yield "boolean", "", ((start, scan.span(node.operand)[0], b""),)
    elif isinstance(node, ast.Constant) and not isinstance(node.value, (str, bytes)):
        start, end = scan.span(node)
        if not _spells(scan.source[start:end], node.value):
            return  # positions inside an f-string can be off before Python 3.12
        for new in _numbers(node.value):
            yield "constant", new, ((start, end, new.encode()),)


def _numbers(value: object) -> list[str]:
    if isinstance(value, bool):
        return [repr(not value)]
    if isinstance(value, int):
        out = {0: [1], 1: [0, 2]}.get(value, [value + 1] + ([1] if abs(value) >= 10 else []))
        return [repr(v) for v in out]
    if isinstance(value, float):
        if value in (0.0, 1.0):
            return [repr(1.0 - value)] + (["2.0"] if value == 1.0 else [])
        return [repr(value + 1.0)] + (["1.0"] if abs(value) >= 10 else [])
    return []  # None, bytes, Ellipsis


def _spells(text: bytes, value: object) -> bool:
    try:
        read = ast.literal_eval(text.decode())
    except (ValueError, SyntaxError, UnicodeDecodeError):
        return False
    return type(read) is type(value) and read == value


def _token(scan: _Scan, left: ast.AST, right: ast.AST,
           pattern: re.Pattern[bytes]) -> tuple[int, int] | None:
    """The byte span of the one operator token between two operands (None when not one)."""
    start, end = scan.span(left)[1], scan.span(right)[0]
    gap = _COMMENT.sub(lambda m: b" " * len(m.group()), scan.source[start:end])
    hits = list(pattern.finditer(gap))
    if len(hits) != 1:
        return None
    return start + hits[0].start(), start + hits[0].end()


def _add(scan: _Scan, node: ast.AST, parents: list[ast.AST], scope: str, in_function: bool,
         kind: str, _after: str, edits: tuple[tuple[int, int, bytes], ...]) -> None:
    line, end_line = node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]
    if scan.skip_lines & set(range(line, end_line + 1)):
        return
    shown = _context(scan, node, parents)
    s0, s1 = scan.span(shown)
    before = scan.source[s0:s1]
    after = before
    for start, end, text in sorted(edits, reverse=True):
        after = after[:start - s0] + text + after[end - s0:]
    key = f"{scan.path}::{scope}: {_one_line(before)} -> {_one_line(after)}"
    scan.seen[key] = scan.seen.get(key, 0) + 1
    if scan.seen[key] > 1:
        key += f" #{scan.seen[key]}"
    scan.found.append(Mutant(scan.path, key, line, (line, end_line), in_function, kind, edits))


def _context(scan: _Scan, node: ast.AST, parents: list[ast.AST]) -> ast.AST:
    """The largest expression around ``node`` (within its statement) that reads short."""
    shown = node
    for parent in reversed(parents):
        if isinstance(parent, ast.stmt) and not isinstance(parent, (ast.Assign, ast.AugAssign,
                                                                    ast.Return)):
            break
        if not hasattr(parent, "end_col_offset"):
            break
        s0, s1 = scan.span(parent)
        if len(_one_line(scan.source[s0:s1])) > SHORT:
            break
        shown = parent
        if isinstance(parent, ast.stmt):
            break
    return shown


def _one_line(text: bytes) -> str:
    return " ".join(text.decode("utf-8", "replace").split())
