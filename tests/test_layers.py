"""The code's layout holds: names come from the catalog by symbol, imports only go down, and no
two files import each other, however indirectly.

Floors, bottom first. A module may import its own unit and any unit on a lower floor; units that
share a floor stay apart. docs/architecture.md says what each floor is for.

0. the bottom layer: ``fsdpmon`` (the package root), ``catalog``, ``conventions``, ``errors``,
   ``validate``, ``faultspec``, ``families``, ``distenv``, and the endpoint both servers share
   (``httpserve``, ``webconfig``, ``basicauth``); it imports nothing else of ours.
1. ``fsdpmon.exporters`` and ``fsdpmon.dashboards`` (the repository's exporters/ and dashboards/
   folders). Above them only the modules that run an exporter or ship the dashboards
   (``RUNNERS``) may import them.
2. ``fsdpmon.job``: the job model (snapshots, job states, the ``--json`` contract).
3. the cores fed by it: ``fsdpmon.monitor`` (in the trainer), ``fsdpmon.scrape`` (reading
   endpoints into snapshots), ``fsdpmon.diagnose`` (the one judge: snapshots in, findings out).
4. the edges and commands over them: ``diagnose``'s command and its ``/stacks`` I/O, ``report``.
5. ``fsdpmon.top``: the terminal UI.
6. ``fsdpmon.demo`` and ``fsdpmon.manifests``.
7. ``fsdpmon.cli``, the command dispatch, and ``fsdpmon.trainer`` (the trainer/ folder), the
   training code instrumented with the monitor: side by side, so neither imports the other (the
   trainer formats its help and its errors with the bottom layer's ``helpformat`` and
   ``errors``). Nothing imports the trainer, except that the manifests check the trainer command
   they generate (``--train-arg`` included) with its own torch-free parser (``TRAINER_CLI``).

Only ``fsdpmon`` is installed (pyproject.toml's package-dir), so nothing imports a folder by its
repository name (``trainer``, ``exporters``, ``dashboards``).

Parsed with ``ast`` (nothing is imported), so these checks see every function body, including
lazy imports and code no other test runs.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from fsdpmon import catalog

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fsdpmon", "exporters", "dashboards", "trainer")  # folders of the repository
# The folders installed under fsdpmon (pyproject.toml's package-dir): trainer/ is fsdpmon.trainer.
MAPPED = frozenset(PACKAGES) - {"fsdpmon"}


@functools.cache
def _tree(path: Path) -> ast.Module:
    """Each file parsed once for all the checks here."""
    return ast.parse(path.read_text(), str(path))


def _sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


BOTTOM = ("fsdpmon", "fsdpmon.catalog", "fsdpmon.conventions", "fsdpmon.errors",
          "fsdpmon.validate", "fsdpmon.faultspec", "fsdpmon.families", "fsdpmon.distenv",
          # the one HTTP endpoint both the exporter and the monitor serve through
          "fsdpmon.httpserve", "fsdpmon.webconfig", "fsdpmon.basicauth")
DIAGNOSE_EDGES = ("fsdpmon.diagnose.cli", "fsdpmon.diagnose.evidence")
# Each floor's units; a unit is a module or a package (with everything below it, unless a
# longer unit claims part of it: the diagnose package's core and its edges).
FLOORS: tuple[tuple[str, ...], ...] = (
    BOTTOM,
    ("fsdpmon.exporters", "fsdpmon.dashboards"),
    ("fsdpmon.job",),
    ("fsdpmon.monitor", "fsdpmon.scrape", "fsdpmon.diagnose"),
    (*DIAGNOSE_EDGES, "fsdpmon.report", "fsdpmon.incidents"),
    ("fsdpmon.top",),
    ("fsdpmon.demo", "fsdpmon.manifests"),
    ("fsdpmon.cli", "fsdpmon.trainer"),
)
# fsdpmon modules that run an exporter (the demo) or wrap the dashboards (the manifests).
RUNNERS = ("fsdpmon.demo", "fsdpmon.manifests")
# The trainer's command line and model shapes (no torch), and the one module that may read them.
TRAINER_CLI = frozenset({"fsdpmon.trainer.config", "fsdpmon.trainer.shapes"})
TRAINER_CLI_USER = "fsdpmon.manifests.training"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = ["fsdpmon", *parts] if parts[0] in MAPPED else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, known: set[str], module: str = "") -> set[str]:
    """Our modules a file imports (``from a import b`` is module ``a.b`` where that exists);
    relative imports are resolved against ``module``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:len(module.split(".")) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known
                    else base for a in node.names}
    return {name for name in out if name.split(".")[0] in PACKAGES}


def test_nothing_imports_a_folder_by_its_repository_name():
    """``import trainer`` only works from the repository root: installed, it is fsdpmon.trainer."""
    paths = _sources(*PACKAGES, "tests", "benchmarks", "examples")
    known = {_module(p) for p in paths}
    found = [f"{p.relative_to(ROOT)}: {name}" for p in paths
             for name in _imports(_tree(p), known, _module(p)) if name.split(".")[0] in MAPPED]
    assert not found, "imports of a folder by its repository name:\n" + "\n".join(found)


def _unit(module: str) -> tuple[int, str]:
    """The floor and unit a module belongs to: the longest unit that is it or contains it."""
    best: tuple[int, str] | None = None
    for floor, units in enumerate(FLOORS):
        for unit in units:
            if (module == unit or module.startswith(unit + ".")) and (
                    best is None or len(unit) > len(best[1])):
                best = (floor, unit)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS")
    if best[1] in DIAGNOSE_EDGES:  # the command and its I/O are one unit
        return best[0], "fsdpmon.diagnose edges"
    return best


def _upward(source: str, target: str) -> bool:
    """Whether ``source`` importing ``target`` breaks the floors."""
    if source == TRAINER_CLI_USER and target in TRAINER_CLI:
        return False
    (floor, unit), (target_floor, target_unit) = _unit(source), _unit(target)
    if unit == target_unit or (floor == 0 and target_floor == 0):
        return False
    if target_floor == 1 and floor > 1 and not source.startswith(RUNNERS):
        return True
    return target_floor >= floor


def _edges() -> set[tuple[str, str]]:
    paths = _sources(*PACKAGES)
    known = {_module(p) for p in paths}
    return {(_module(p), t) for p in paths
            for t in _imports(_tree(p), known, _module(p)) if t != _module(p)}


def test_imports_only_point_down():
    edges = _edges()
    assert len(edges) > 100, f"only {len(edges)} import edges found: is the parser blind?"
    up = sorted(f"{a} -> {b}" for a, b in edges if _upward(a, b))
    assert not up, f"{len(up)} imports point up a floor or across one:\n" + "\n".join(up)


def test_every_module_is_on_a_floor():
    modules = {_module(p) for p in _sources(*PACKAGES)}
    assert len(modules) > 100, f"only {len(modules)} modules found"
    for module in sorted(modules):
        _unit(module)  # raises for a module no floor holds


def _cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_files_import_each_other():
    """A package's __init__ re-exporting its modules is not a cycle of files: only edges
    between modules that are files of their own count, lazy imports included."""
    packages = {_module(p) for p in _sources(*PACKAGES) if p.name == "__init__.py"}
    edges = {(a, b) for a, b in _edges() if a not in packages and b not in packages}
    cycles = _cycles(edges)
    assert not cycles, f"{len(cycles)} import cycles:\n" + "\n".join(map(" <-> ".join, cycles))


def test_the_checks_see_a_cycle_and_an_upward_import():
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert _upward("fsdpmon.job.snapshot", "fsdpmon.top.views")
    assert _upward("fsdpmon.diagnose.engine", "fsdpmon.diagnose.evidence")
    assert _upward("fsdpmon.scrape.rows", "fsdpmon.diagnose.engine")  # same floor, apart
    assert _upward("fsdpmon.top.views", "fsdpmon.exporters.sample")  # not a runner
    assert not _upward("fsdpmon.diagnose.cli", "fsdpmon.scrape.options")
    assert not _upward("fsdpmon.demo.session", "fsdpmon.exporters.sample")
    assert _upward("fsdpmon.trainer.config", "fsdpmon.cli")  # side by side
    assert _upward("fsdpmon.cli", "fsdpmon.trainer.train")
    assert not _upward("fsdpmon.trainer.config", "fsdpmon.helpformat")
    assert not _upward("fsdpmon.trainer.loop", "fsdpmon.monitor")


def _catalog_aliases(tree: ast.Module) -> set[str]:
    """Local names bound to the catalog module (``from fsdpmon import catalog [as x]``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "fsdpmon":
            names |= {a.asname or a.name for a in node.names if a.name == "catalog"}
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "fsdpmon.catalog" and a.asname}
    return names


def test_every_catalog_attribute_used_exists():
    """``catalog.TRAIN_LOS`` in a function body would only fail when called: fail here."""
    missing = []
    for path in _sources(*PACKAGES, "tests", "benchmarks"):
        tree = _tree(path)
        aliases = _catalog_aliases(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and not hasattr(catalog, node.attr)):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: catalog.{node.attr}")
    assert not missing, f"{len(missing)} unknown catalog symbols:\n" + "\n".join(missing)


# A metric or recorded-series name inside a string literal: fsdpmon_ then lower case, digits,
# underscores and colons (FSDPMON_ environment variables and file names with dots do not match).
QUOTED_NAME = re.compile(r"(?<![A-Za-z0-9_])fsdpmon_[a-z0-9_:]*[a-z0-9_]")


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def _quoted_names(path: Path) -> list[str]:
    tree = _tree(path)
    prose = _docstrings(tree)
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in prose:
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            if isinstance(text, str):
                found += [f"{where}:{node.lineno}: {name}"
                          for name in QUOTED_NAME.findall(text)]
    return found


def test_no_metric_name_is_retyped_outside_the_catalog():
    """Every metric and recorded-series name is spelt once, in fsdpmon/catalog.py.

    Scope: all code in the packages and benchmarks, and the helpers in tests/ that produce or
    read metrics (the synthetic job, the fakes). The test files themselves (tests/test_*.py)
    may spell names out where they assert on what Prometheus and users see (exposition text,
    generated dashboards and rules): there the literal is the contract, and a rename should
    make them fail. Docstrings and comments are prose and are not checked.
    """
    helpers = [p for p in _sources("tests") if not p.name.startswith("test_")]
    paths = [p for p in _sources(*PACKAGES, "benchmarks") + helpers
             if p != ROOT / "fsdpmon" / "catalog.py"]
    assert len(paths) > 100, f"only {len(paths)} files checked"
    retyped = [hit for p in paths for hit in _quoted_names(p)]
    assert not retyped, (f"{len(retyped)} retyped metric names (use catalog.SYMBOL):\n"
                         + "\n".join(retyped))


def test_the_retyped_name_check_sees_names_in_strings_bytes_and_f_strings(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""fsdpmon_in_docstring is prose."""\n'
                      'A = "fsdpmon_train_loss"\nB = b"fsdpmon_gpu_up{"\n'
                      'C = f"rate(fsdpmon_job:loss:avg[{A}])"\nD = "FSDPMON_PORT"\n')
    names = [hit.split(": ")[1] for hit in _quoted_names(sample)]
    assert names == ["fsdpmon_train_loss", "fsdpmon_gpu_up", "fsdpmon_job:loss:avg"], names


def _private_uses(tree: ast.Module, module: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each private name (``_x``, not ``__x__``) of another of our modules that
    a file imports or reads as a module's attribute (``from a import _x``, ``a._x``)."""
    def private(name: str) -> bool:
        return name.startswith("_") and not name.endswith("__")

    modules: set[str] = set()  # local names bound to one of our modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[:len(module.split(".")) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    modules.add(alias.asname or alias.name)
                elif private(alias.name):
                    found.append((node.lineno, f"{base}.{alias.name}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES and alias.asname:
                    modules.add(alias.asname)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and private(node.attr)):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return found


def test_no_private_name_is_used_across_modules():
    """A name starting with ``_`` is its module's own: another module that needs it needs a
    public name (tests may reach in; the code may not)."""
    paths = _sources(*PACKAGES)
    known = {_module(p) for p in paths}
    used = [f"{p.relative_to(ROOT)}:{line}: {name}" for p in paths
            for line, name in _private_uses(_tree(p), _module(p), known)]
    assert not used, f"{len(used)} private names used across modules:\n" + "\n".join(used)


def test_the_private_name_check_sees_imports_and_attributes():
    tree = ast.parse("from fsdpmon.scrape.expfmt import _x, Parser\n"
                     "from fsdpmon.scrape import layout\n"
                     "from fsdpmon.scrape import filing as f\nimport torch\n"
                     "f._y, layout._z, layout.__doc__, torch._C, f.row_of\n")
    known = {"fsdpmon.scrape.layout", "fsdpmon.scrape.filing", "fsdpmon.scrape.expfmt"}
    found = _private_uses(tree, "fsdpmon.scrape.fused", known)
    assert sorted(found) == [(1, "fsdpmon.scrape.expfmt._x"), (5, "f._y"), (5, "layout._z")], \
        found

