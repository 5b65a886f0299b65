"""What the documentation names exists in the code: files, commands and their flags, fault
specs, metric names, environment variables, causes, alerts and fault kinds.

A renamed flag, a deleted module or a cause added without its row fails here, in the fast suite,
instead of misleading the next reader. The pages checked are ours (README.md, CONTRIBUTING.md,
docs/, the package READMEs); tests/data holds upstream material.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import importlib
import io
import itertools
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from docs_text import ROOT, code_spans, lines, markdown_files, paragraphs

from fsdpmon import catalog, faultspec
from fsdpmon.cli import COMMANDS
from fsdpmon.conventions import ENV_PREFIX
from fsdpmon.dashboards.rules import alert_names, recorded_names
from fsdpmon.diagnose import CAUSES

PAGES = [p for p in markdown_files() if not p.is_relative_to(ROOT / "tests")]
TOP_DIRS = ("fsdpmon", "exporters", "dashboards", "trainer", "tests", "benchmarks", "scripts",
            "docs", ".ci")
CODE_DIRS = ("fsdpmon", "exporters", "dashboards", "trainer", "tests", "benchmarks", "scripts",
             ".ci")
SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
# Named by the documentation before the code that reads them is merged, each with where it comes
# from; test_pending_variables_are_still_pending fails once the code reads one: drop it then.
PENDING_VARIABLES: dict[str, str] = {}
# These files name variables and alerts as test data; they are not the code that reads them.
DOCS_TESTS = {"test_docs_claims.py", "test_docs_links.py", "docs_text.py"}
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b")  # NAME, SPEC, URL: words the reader fills in


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _spans(page: Path) -> Iterator[str]:
    for _, block in paragraphs(page.read_text()):
        yield from code_spans(block)


# --- files ------------------------------------------------------------------------------------

PATH_LIKE = re.compile(r"[\w.*/-]+")
SOURCE_SUFFIXES = (".py", ".c", ".h", ".sh")


@functools.cache
def _source_names() -> frozenset[str]:
    return frozenset(p.name for d in CODE_DIRS for p in (ROOT / d).rglob("*")
                     if ".venv" not in p.parts)


def _path_exists(span: str) -> bool | None:
    """Whether the path a code span names exists; None when the span is not a path of ours."""
    if not PATH_LIKE.fullmatch(span) or span.startswith("/"):
        return None
    if span.split("/")[0] in TOP_DIRS and "/" in span:
        return any(ROOT.glob(span.rstrip("/"))) if "*" in span else (ROOT / span).exists()
    if span.endswith(SOURCE_SUFFIXES):
        if "/" in span:  # written from inside the package (scrape/wanted.py)
            return (ROOT / span).exists() or (ROOT / "fsdpmon" / span).exists()
        return "*" in span or span in _source_names()
    return None


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_path_named_exists(page):
    missing = sorted({s for s in _spans(page) if _path_exists(s) is False})
    assert not missing, f"{_rel(page)} names {len(missing)} paths that do not exist: {missing}"


def test_the_path_check_tells_paths_from_other_code():
    assert _path_exists("fsdpmon/catalog.py") and _path_exists("fsdpmon/scrape/*.py")
    assert _path_exists("scrape/wanted.py") and _path_exists("celltable.py")
    assert _path_exists("fsdpmon/nope.py") is False and _path_exists("gone.py") is False
    assert _path_exists("tests/rules/*.nope") is False
    for not_a_path in ("/dev/shm", "fsdpmon top", "rank<R>.exit", "report.md", "k8s/"):
        assert _path_exists(not_a_path) is None, not_a_path


# --- commands and flags -----------------------------------------------------------------------

def _option_strings(parser: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(s for action in parser._actions for s in action.option_strings)


@functools.cache
def fsdpmon_flags(command: str) -> frozenset[str]:
    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command][0]).configure(parser)
    return _option_strings(parser) | {"-v", "--verbose"}


@functools.cache
def module_flags(module: str) -> frozenset[str] | None:
    """The flags of ``python -m module``, for the modules the documentation runs."""
    if module == "fsdpmon.trainer.train":
        from fsdpmon.trainer.config import build_parser
        return _option_strings(build_parser())
    if module == "fsdpmon.dashboards":
        from fsdpmon.dashboards.__main__ import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(["--help"])
        return frozenset(re.findall(r"(?<![\w-])--?[a-z][\w-]*", out.getvalue()))
    return None  # torch.distributed.run and the like: not ours to check


@functools.cache
def script_flags(path: Path) -> frozenset[str]:
    """The flags a script in benchmarks/ declares (``add_argument("--x", ...)``)."""
    tree = ast.parse(path.read_text())
    return frozenset({"-h", "--help"} | {
        arg.value for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
        for arg in node.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")})


def _segments(command_line: str) -> Iterator[list[str]]:
    """Shell words of each simple command (split at | ; & && ||), comments dropped."""
    try:
        lexer = shlex.shlex(command_line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words = list(lexer)
    except ValueError:  # an unbalanced quote in a sketch: words as written
        words = command_line.split("#")[0].split()
    segment: list[str] = []
    for word in [*words, ";"]:
        if set(word) <= set(";&|"):
            if segment:
                yield segment
            segment = []
        else:
            segment.append(word)


def _check_flags(words: list[str], known: frozenset[str] | None, what: str) -> list[str]:
    if known is None:
        return []
    flags = [w.split("=", 1)[0] for w in words if w.startswith("-") and w not in ("-", "--")]
    return [f"{what}: unknown flag {f}" for f in flags if f not in known]


def _check_faults(words: list[str], env: dict[str, str], what: str) -> list[str]:
    specs = [env[faultspec.ENV_VAR]] if faultspec.ENV_VAR in env else []
    specs += [b for a, b in itertools.pairwise(words) if a == "--fault"]
    specs += [w.split("=", 1)[1] for w in words if w.startswith("--fault=")]
    problems = []
    for spec in specs:
        if PLACEHOLDER.fullmatch(spec):
            continue
        try:
            faultspec.parse(spec)
        except Exception as exc:
            problems.append(f"{what}: fault spec {spec!r}: {exc}")
    return problems


def check_command(words: list[str]) -> list[str]:
    """What is wrong with one simple command of the documentation (nothing for commands that
    are not ours)."""
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        return []
    what, head = " ".join(words)[:80], words[0]
    problems = _check_faults(words, env, what)
    if head == "fsdpmon" or head.endswith("/fsdpmon"):
        rest = [w for w in words[1:] if w not in ("-v", "--verbose")]
        if rest and rest[0] in ("-h", "--help", "--version"):
            return problems
        if not rest or rest[0] not in COMMANDS:
            return [*problems, f"{what}: no such command"]
        return problems + _check_flags(rest[1:], fsdpmon_flags(rest[0]), what)
    if head == "bash" and len(words) > 1:
        script = ROOT / words[1]
        if not script.exists():
            return [*problems, f"{what}: no such script"]
        if words[1] == "scripts/demo.sh":  # its arguments go to `fsdpmon demo`
            return problems + _check_flags(words[2:], fsdpmon_flags("demo"), what)
        return problems
    if "-m" in words[:-1] and (head.endswith(("python", "python3", "torchrun"))):
        module = words[words.index("-m") + 1]
        return problems + _check_flags(words[words.index("-m") + 2:], module_flags(module), what)
    script = next((w for w in words[:2] if w.endswith(".py")), None)
    if script and PLACEHOLDER.fullmatch(Path(script).stem):
        return problems  # benchmarks/NAME.py
    if script and (head.endswith(("python", "python3")) or head == script):
        path = next((p for p in (ROOT / script, ROOT / "benchmarks" / script) if p.exists()), None)
        if path is None:
            return [*problems, f"{what}: no such script"]
        after = words[words.index(script) + 1:]
        return problems + _check_flags(after, script_flags(path), what)
    return problems


def command_lines(page: Path) -> Iterator[str]:
    """Shell command lines of a page: fenced shell blocks (``\\`` continuations joined) and
    inline code that starts with a command of ours."""
    pending = ""
    for line in lines(page.read_text()):
        if not (line.code and line.lang in SHELL_LANGS):
            continue
        text = pending + line.text.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        yield text
    for span in _spans(page):
        if re.match(r"(\S+/)?(fsdpmon|python3?|torchrun|bash) ", span):
            yield span


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_command_and_flag_exists(page):
    problems = [p for text in command_lines(page) for words in _segments(text)
                for p in check_command(words)]
    assert not problems, f"{_rel(page)}: {len(problems)} problems:\n" + "\n".join(problems)


def test_the_command_check_finds_bad_commands_flags_and_specs():
    bad = {
        "fsdpmon topp --once": "no such command",
        "fsdpmon top --onse": "unknown flag --onse",
        "FSDPMON_FAULT=hang:rank=x torchrun -m fsdpmon.trainer.train": "fault spec",
        "fsdpmon demo --fault 'gpu-throttle:gpu=1,reason=hot'": "fault spec",
        "bash scripts/demo.sh --fault-spec x": "unknown flag --fault-spec",
        "python -m fsdpmon.trainer.train --model tiny --max-step 3": "unknown flag --max-step",
        "python -m fsdpmon.dashboards --chek": "unknown flag --chek",
        "python benchmarks/bench_top.py --refresh 3": "unknown flag --refresh",
        "bash scripts/nope.sh": "no such script",
    }
    for text, expected in bad.items():
        problems = [p for words in _segments(text) for p in check_command(words)]
        assert any(expected in p for p in problems), (text, problems)
    fine = ("fsdpmon top --targets a:1 --once | head", "torchrun --nproc_per_node 2 -m "
            "fsdpmon.trainer.train --model tiny & fsdpmon -v exporter --simulate-gpus 2  # comment",
            "kubectl apply -k k8s/", "python -m fsdpmon.dashboards --check")
    for text in fine:
        assert not [p for w in _segments(text) for p in check_command(w)], text


# --- names ------------------------------------------------------------------------------------

METRIC = re.compile(r"(?<![\w-])fsdpmon_[a-z0-9_:]*[a-z0-9]")
VARIABLE = re.compile(r"\bFSDPMON_[A-Z0-9_]*[A-Z0-9]\b")
ALERT = re.compile(r"\bFsdpmon[A-Z]\w+")


def _all_text() -> str:
    return "\n".join(p.read_text() for p in PAGES)


def test_every_metric_name_is_catalogued():
    known = catalog.all_series_names() | recorded_names()
    named = set(METRIC.findall(_all_text()))
    assert len(named) > 20, f"only {len(named)} metric names found: is the pattern blind?"
    assert not named - known, f"names no catalog entry or rule defines: {sorted(named - known)}"


def _code_files() -> Iterator[Path]:
    for d in CODE_DIRS:
        for p in (ROOT / d).rglob("*"):
            if p.is_file() and (p.suffix in (".py", ".sh", ".c", ".h") or d == ".ci"):
                yield p


@functools.cache
def monitor_variables() -> tuple[str, ...]:
    """The variable of each MonitorConfig field (``FSDPMON_<FIELD>``, or its entry in
    ``_ENV_NAMES``), read from the source: importing fsdpmon.monitor would import torch."""
    tree = ast.parse((ROOT / "fsdpmon" / "monitor" / "config.py").read_text())
    config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MonitorConfig")
    fields = [n.target.id for n in config.body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and getattr(n.targets[0], "id", "") == "_ENV_NAMES")
    return tuple(ENV_PREFIX + names.get(f, f.upper()) for f in fields)


@functools.cache
def _variables_the_code_reads() -> frozenset[str]:
    fields = set(monitor_variables())
    texts = (p.read_text(errors="replace") for p in _code_files() if p.name not in DOCS_TESTS)
    return frozenset(fields | {v for text in texts for v in VARIABLE.findall(text)})


def test_every_variable_named_is_read_by_the_code():
    named = set(VARIABLE.findall(_all_text())) - set(PENDING_VARIABLES)
    unknown = sorted(named - _variables_the_code_reads())
    assert len(named) >= 10, f"only {len(named)} variables found"
    assert not unknown, f"the documentation names variables nothing reads: {unknown}"


def test_pending_variables_are_still_pending():
    merged = sorted(set(PENDING_VARIABLES) & _variables_the_code_reads())
    assert not merged, f"the code reads {merged} now: remove them from PENDING_VARIABLES"


def test_every_monitor_variable_is_documented():
    page = (ROOT / "docs" / "monitor.md").read_text()
    assert len(monitor_variables()) >= 12 and "FSDPMON_JSONL" in monitor_variables()
    missing = [v for v in monitor_variables() if f"`{v}`" not in page]
    assert not missing, f"docs/monitor.md does not document {missing}"


def test_every_alert_named_exists():
    """Fsdpmon... names are alerts, or classes of ours (FsdpmonCallback)."""
    classes = {m for p in _code_files() if p.suffix == ".py" and p.name not in DOCS_TESTS
               for m in re.findall(r"^class (Fsdpmon\w+)", p.read_text(), re.M)}
    unknown = set(ALERT.findall(_all_text())) - set(alert_names()) - classes
    assert not unknown, f"no such alerts (or classes): {sorted(unknown)}"


def _table_rows(path: Path) -> dict[str, str]:
    """First cell (its code span) -> the whole row, for the tables of a page."""
    rows = {}
    for line in lines(path.read_text()):
        match = re.match(r"\|\s*`([^`]+)`\s*\|(.*)", line.text)
        if match and not line.code:
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_causes_table_lists_exactly_the_causes():
    rows = {r for r in _table_rows(ROOT / "docs" / "diagnose.md") if re.fullmatch(r"[a-z_]+", r)}
    assert sorted(rows) == sorted(CAUSES), (
        f"docs/diagnose.md lacks {sorted(set(CAUSES) - rows)}, "
        f"names no such cause {sorted(rows - set(CAUSES))}")


def test_the_fault_tables_give_every_kind_its_keys_and_defaults():
    rows = {k: v for k, v in _table_rows(ROOT / "docs" / "faults.md").items()
            if re.fullmatch(r"[a-z-]+", k)}
    assert sorted(rows) == sorted(faultspec.KINDS), (sorted(rows), sorted(faultspec.KINDS))
    problems = []
    for kind, cls in faultspec.KINDS.items():
        keys_cell = re.split(r"(?<!\\)\|", rows[kind])[0]
        for field in dataclasses.fields(cls):
            shown = re.search(rf"`{field.name}`(?: \(([^)]*)\))?", keys_cell)
            if shown is None:
                problems.append(f"{kind}: key {field.name} missing")
            elif (shown.group(1) and re.fullmatch(r"-?[\d.]+", shown.group(1))
                  and float(shown.group(1)) != float(field.default)):
                problems.append(f"{kind}: {field.name} default shown {shown.group(1)}, "
                                f"is {field.default}")
    assert not problems, "\n".join(problems)


def test_the_exporter_flags_table_matches_the_command():
    rows = {k.split()[0] for k in _table_rows(ROOT / "docs" / "exporter.md") if k.startswith("--")}
    flags = {f for f in fsdpmon_flags("exporter") if f.startswith("--")} - {"--help", "--verbose"}
    assert rows == flags, (f"docs/exporter.md lacks {sorted(flags - rows)}, "
                           f"names no such flag {sorted(rows - flags)}")
