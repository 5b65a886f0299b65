"""One judge (issue 48): no module outside fsdpmon/diagnose/ decides a cause.

A cause is one of the diagnosis' names (fsdpmon.diagnose.findings.CAUSES). Code *decides* one
when a literal cause name appears, outside fsdpmon/diagnose/, as:
- the cause of a verdict it builds: an argument of a call (``Finding("hang", ...)``,
  ``_incident(run, a, b, "hang", ...)``, ``cause="hang"``) or the value of a ``"cause"`` key;
- what a function returns (``return "hang", rank``, ``return (None, "hang")``);
- a value bound to a name that says cause (``cause = "crash_loop" if n > 1 else ...``);
- an operand of a comparison (``f.cause == "hang"``, ``cause in ("hang", ...)``): a door that
  branches on the judge's word re-decides what it means.
Naming a cause is not deciding it: the runbook's and the catalog's text, a CLI's help, a
docstring, a comment. The few places that must spell a cause out for a consumer that cannot
call the judge are listed in ALLOWED, each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fsdpmon.diagnose.findings import CAUSES

REPO = Path(__file__).resolve().parents[1]
# Where code lives: the package, and the top-level trees an import rename may still leave.
ROOTS = ("fsdpmon", "exporters", "dashboards", "trainer")
JUDGE = Path("fsdpmon/diagnose")
# path (relative to the repo) -> why it may spell causes out
ALLOWED = {
    # One severity table for the judge and the rules: a lookup by cause name (with its XID
    # code, throttle reason or target kind), not a verdict on what the cause is.
    "fsdpmon/conventions.py": "the severity table, looked up by cause",
    # The culprit rules run in Prometheus, not Python: each names the judge's cause it pages
    # for as its `cause` label, rank_unresponsive or hang as engine.progress_culprits would.
    "dashboards/culprits.py": "the culprit rules' cause labels (PromQL cannot call the judge)",
    "fsdpmon/dashboards/culprits.py": "the same module after the package move",
}


def _cause(node: ast.AST | None) -> str | None:
    """The cause a node spells out as a literal, searching inside tuples and conditional
    expressions (``"a" if x else "b"``), not inside calls or f-strings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in CAUSES:
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return next((c for e in node.elts if (c := _cause(e))), None)
    if isinstance(node, ast.IfExp):
        return _cause(node.body) or _cause(node.orelse)
    return None


# Calls that read a field of that name from a record or a dict (``rec.get("loss_nonfinite")``,
# where a row's field and a cause share a name): reading evidence, not giving a verdict.
READS = {"get", "pop", "setdefault"}


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else "")


def _names_cause(target: ast.AST) -> bool:
    name = target.id if isinstance(target, ast.Name) else (
        target.attr if isinstance(target, ast.Attribute) else "")
    return "cause" in name.lower()


def decisions(source: str) -> list[tuple[int, str, str]]:
    """(line, cause, how) of each place ``source`` decides a cause (see the module's text)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        found: list[tuple[ast.AST | None, str]] = []
        if isinstance(node, ast.Call) and _called(node) not in READS:
            found += [(a, "a verdict's argument") for a in node.args]
            found += [(k.value, "a verdict's argument") for k in node.keywords]
        elif isinstance(node, ast.Dict):
            found += [(v, 'a "cause" value') for k, v in zip(node.keys, node.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value == "cause"]
        elif isinstance(node, ast.Return):
            found.append((node.value, "returned"))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if any(_names_cause(t) for t in flat):
                found.append((node.value, "bound to a cause"))
        elif isinstance(node, ast.Compare):
            found += [(o, "compared") for o in (node.left, *node.comparators)]
        out += [(node.lineno, c, how) for value, how in found if (c := _cause(value))]
    return sorted(set(out))


def violations(repo: Path) -> list[str]:
    """Each decision outside the judge in the code under ``repo``, but in ALLOWED's modules."""
    found = []
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")) if (repo / root).is_dir() else []:
            rel = path.relative_to(repo)
            if rel.is_relative_to(JUDGE) or rel.as_posix() in ALLOWED:
                continue
            found += [f"{rel.as_posix()}:{line}: {cause!r} {how}"
                      for line, cause, how in decisions(path.read_text())]
    return found


def test_no_cause_is_decided_outside_the_judge():
    found = violations(REPO)
    assert not found, "causes decided outside fsdpmon/diagnose/:\n" + "\n".join(found)


def test_every_allowed_module_exists_in_one_of_its_spellings():
    """An allowance for a module that is gone (under either spelling of the package move)
    would hide a new one of the same name: each names a module that is there."""
    here = {rel for rel in ALLOWED if (REPO / rel).is_file()}
    stems = {rel.removeprefix("fsdpmon/") for rel in here}
    missing = [rel for rel in ALLOWED if rel.removeprefix("fsdpmon/") not in stems]
    assert not missing, missing


@pytest.mark.parametrize(("source", "how"), [
    ('Finding("hang", "critical", "x")', "a verdict's argument"),
    ('_incident(run, 1.0, 2.0, "checkpoint_slow", 0, [], 0.0)', "a verdict's argument"),
    ('Incident(cause="rank_missing")', "a verdict's argument"),
    ('x = {"cause": "gpu_xid"}', 'a "cause" value'),
    ('def f():\n    return (odd[0], "hang") if odd else (None, "hang")', "returned"),
    ('def f():\n    return "straggler_data", why', "returned"),
    ('cause = "crash_loop" if n >= 2 else "rank_missing"', "bound to a cause"),
    ('if f.cause == "hang":\n    pass', "compared"),
    ('ok = i.cause in ("hang", "rank_unresponsive")', "compared"),
])
def test_each_way_of_deciding_is_found(source, how):
    (found,) = {h for _, _, h in decisions(source)}
    assert found == how, decisions(source)


@pytest.mark.parametrize("source", [
    'HELP = "hang: the ranks stopped"',  # a cause inside text is not a cause
    'x = CAUSES.index(f.cause)',
    'f"{cause}: hang"',
    'name = "hang"',  # bound, but not to a name that says cause
    'if f.cause in SLOWDOWN_CAUSES:\n    pass',
    'Incident(cause=f.cause)',
    'flag = get("loss_nonfinite") == 1.0',  # a row's field of a cause's name
    'rec.get("hang", 0)',
])
def test_naming_is_not_deciding(source):
    assert decisions(source) == []


def test_a_planted_decision_outside_the_judge_fails_and_inside_passes(tmp_path):
    rule = 'def verdict(score):\n    return "straggler_compute" if score < 0.75 else None\n'
    for where in ("fsdpmon/diagnose/new_rule.py", "fsdpmon/incidents/new_door.py"):
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text(rule)
    assert violations(tmp_path) == [
        "fsdpmon/incidents/new_door.py:2: 'straggler_compute' returned"]
