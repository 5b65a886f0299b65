"""Rebuilds cases.json from the upstream test sources (see README.md here); not run by the suite.

Usage: python tests/data/expfmt_refs/extract.py CLIENT_PYTHON_GIT COMMON_GIT OPENMETRICS_GIT
(git directories of prometheus/client_python, prometheus/common and prometheus/OpenMetrics).
Each case keeps its input, whether its own suite expects it to parse, the line its error names
(prometheus/common's errors say "in line N"), and the samples a line-by-line reader must return:
those of every line prometheus_client's line reader accepts, but the line the case's error
names.
"""

from __future__ import annotations

import ast
import codecs
import json
import re
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import _parse_sample

HERE = Path(__file__).parent


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True,
                          text=True, errors="surrogateescape").stdout


def _head(repo: str) -> str:
    return _git(repo, "rev-parse", "HEAD").strip()


def client_python(repo: str) -> list[dict]:
    tree = ast.parse(_git(repo, "show", "HEAD:tests/test_parser.py"))
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
            continue
        rejects = "assertRaises" in ast.unparse(fn)
        texts = _inputs(fn)
        for i, text in enumerate(texts):
            out.append({"source": "client_python", "case": f"{fn.name}#{i}", "input": text,
                        "parses": not rejects, "error_line": None})
    return out


def _inputs(fn: ast.FunctionDef) -> list[str]:
    """The texts a test hands to the parser: literal arguments, or ``text = "..."``."""
    out = []
    for n in ast.walk(fn):
        called = getattr(getattr(n, "func", None), "id", "")
        if isinstance(n, ast.Call) and called == "text_string_to_metric_families":
            arg = n.args[0]
            if isinstance(arg, ast.BinOp):  # "..." % value, inside a loop: expand the loop
                return _formatted(fn)
            if isinstance(arg, ast.Constant):
                out.append(arg.value)
        elif (isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "text"
              and isinstance(n.value, ast.Constant)):
            out.append(n.value.value)
    return out


def _formatted(fn: ast.FunctionDef) -> list[str]:
    loop = next(n for n in ast.walk(fn) if isinstance(n, ast.For))
    pairs = ast.literal_eval(loop.iter)
    template = next(n.left.value for n in ast.walk(fn) if isinstance(n, ast.BinOp)
                    and isinstance(n.op, ast.Mod))
    return [template % escaped for escaped, _ in pairs]


_GO_STR = r'(`[^`]*`|"(?:[^"\\]|\\.)*")'
_GO_CASE = re.compile(r"in:\s*" + _GO_STR + r"(?:\s*,\s*(?:errUTF8|err):\s*" + _GO_STR + ")?")


def _go_string(lit: str) -> str:
    if lit.startswith("`"):
        return lit[1:-1]
    raw = codecs.escape_decode(lit[1:-1].encode())[0]
    return raw.decode("utf-8", "surrogateescape")


def common(repo: str) -> list[dict]:
    source = _git(repo, "show", "HEAD:expfmt/text_parse_test.go")
    good, bad = source.split("func testTextParseError", 1)
    out = []
    for part, kind in ((good, "parse"), (bad, "parse_error")):
        for i, m in enumerate(_GO_CASE.finditer(part)):
            err = _go_string(m.group(2)) if m.group(2) else ""
            line = re.search(r"in line (\d+)", err)
            out.append({"source": "common", "case": f"{kind}#{i}", "input": _go_string(m.group(1)),
                        "parses": kind == "parse" or not err,
                        "error_line": int(line.group(1)) if line else None})
    return out


def openmetrics(repo: str) -> list[dict]:
    out = []
    names = _git(repo, "ls-tree", "--name-only", "HEAD", "tests/testdata/parsers/").split()
    for path in names:
        meta = json.loads(_git(repo, "show", f"HEAD:{path}/test.json"))
        text = _git(repo, "show", f"HEAD:{path}/{meta['file']}")
        out.append({"source": "openmetrics", "case": path.rsplit("/", 1)[1], "input": text,
                    "parses": meta["shouldParse"], "error_line": None})
    return out


def _value(v: float) -> float | str:
    return v if v == v and abs(v) != float("inf") else repr(v)  # JSON has no nan/inf


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def _histogram_count(name: str, text: str) -> bool:
    """A bucket or count of a family the input declares a histogram (never negative)."""
    base, _, suffix = name.rpartition("_")
    return suffix in ("bucket", "count") and re.search(
        rf"^\s*#\s+TYPE\s+{re.escape(base)}\s+histogram\s*$", text, re.M) is not None


def _line_samples(line: str, text: str) -> list[list]:
    """What prometheus_client reads on one line (its per-line reader: sample names as written,
    where its families rename a counter's ``a`` to ``a_total``), less what Prometheus's own
    text parser rejects and prometheus_client's line reader lets through (see README.md)."""
    try:
        s = _parse_sample(line.strip())
    except Exception:  # the reference rejects the line
        return []
    if not _prometheus_reads(line, s.labels) or (s.value < 0 and _histogram_count(s.name, text)):
        return []
    return [[s.name, s.labels, _value(s.value)]]


def _prometheus_reads(line: str, labels: dict[str, str]) -> bool:
    unquoted = _QUOTED.sub('""', line)
    if "#" in unquoted:  # an exemplar: OpenMetrics only, text 0.0.4 has none
        return False
    if re.search(r"=\s*[^\s\"]", unquoted) or re.search(r"=\s*[,}]", unquoted):
        return False  # a label without a quoted value
    tokens = re.match(r"\s*[^{\s]*\s*(\{.*\})?(.*)$", unquoted).group(2).split()
    if len(tokens) not in (1, 2):
        return False  # a value, then maybe a timestamp
    if len(tokens) == 2 and not re.fullmatch(r"[-+]?[0-9]+", tokens[1]):
        return False  # a value, then maybe a timestamp: an integer (milliseconds)
    if any(k in labels and _float(labels[k]) is None for k in ("le", "quantile")):
        return False
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # invalid UTF-8 in the input (kept as surrogates here)
        return False
    return True


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def expected(case: dict) -> list[list]:
    """The samples of every line but the one the case's error names; a last line without its
    newline counts as rejected (Prometheus's parser: "unexpected end of input stream")."""
    text = case["input"]
    lines = text.split("\n")[:-1]  # the part after the last newline is unterminated
    return [s for number, line in enumerate(lines, 1)
            if number != case["error_line"] and line.strip() and not line.strip().startswith("#")
            for s in _line_samples(line, text)]


def main() -> None:
    cp, co, om = sys.argv[1:4]
    cases = client_python(cp) + common(co) + openmetrics(om)
    for case in cases:
        case["expected"] = expected(case)
    doc = {"sources": {"client_python": _head(cp), "common": _head(co), "openmetrics": _head(om)},
           "cases": cases}
    (HERE / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
