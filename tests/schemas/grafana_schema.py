"""Writes tests/schemas/grafana-<VERSION>.json: Grafana's own dashboard model for one release, as
JSON Schema, from its npm package @grafana/schema (Apache-2.0, the types Grafana's frontend and
its CUE kinds generate), for tests/test_dashboards.py. Run again for another release:

    python tests/schemas/grafana_schema.py 13.2.3      # needs node and npm (the npm registry)

The package holds TypeScript types, not JSON Schema; ts-json-schema-generator turns each type
into one: the dashboard (``Dashboard``: panels, rows, variables, links...) and, for each panel
type fsdpmon draws, its ``Options`` and its field config's ``custom`` part (``FieldConfig``),
which the dashboard's own type leaves open. TypeScript interfaces are closed, so an unknown key
is an error, as Grafana's schema has it. A key that Grafana gives a default (the package's
``defaultX`` objects: CUE's ``field: type | *default``) may be left out even where the
TypeScript type calls it required, since Grafana fills it in. Descriptions are dropped (the
package has them) to keep the file small.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PANEL_TYPES = ("bargauge", "heatmap", "stat", "table", "timeseries")
GENERATOR = "ts-json-schema-generator@2.9.0"
HERE = Path(__file__).resolve().parent

# Every default the package exports, by the type it completes (defaultOptions -> Options).
_DEFAULTS_JS = """
const [root, ...modules] = process.argv.slice(2);
const out = {};
for (const module of modules) {
  const exported = await import(`${root}/dist/esm/${module}.mjs`);
  out[module] = {};
  for (const [name, value] of Object.entries(exported)) {
    if (name.startsWith("default") && value && typeof value === "object")
      out[module][name.slice("default".length)] = Object.keys(value);
  }
}
console.log(JSON.stringify(out));
"""


def _run(args: list[str], cwd: Path) -> str:
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


_EXTENDS = re.compile(r"interface (\w+) extends ([\w., ]+) \{")


def _parents(declarations: str) -> dict[str, list[str]]:
    """Interface -> the interfaces it extends (``common.X`` and ``ui.X`` named ``X``)."""
    return {child: [name.strip().rsplit(".", 1)[-1] for name in parents.split(",")]
            for child, parents in _EXTENDS.findall(declarations)}


def _defaulted(name: str, defaults: dict[str, list[str]], parents: dict[str, list[str]]
               ) -> set[str]:
    """The keys of interface ``name`` that Grafana defaults, its parents' included."""
    keys = set(defaults.get(name, ()))
    for parent in parents.get(name, ()):
        keys |= _defaulted(parent, defaults, parents)
    return keys


def _schema(work: Path, types: Path, name: str, defaults: dict[str, list[str]],
            parents: dict[str, list[str]]) -> dict:
    """One type's JSON Schema, keys with a default optional, descriptions dropped."""
    out = work / f"{name}.json"
    _run(["npx", "--yes", GENERATOR, "--path", str(types), "--type", name, "--no-type-check",
          "--out", str(out)], work)
    schema = json.loads(out.read_text())
    for definition, body in schema.get("definitions", {}).items():
        optional = _defaulted(definition, defaults, parents)
        if "required" in body and optional:
            body["required"] = [key for key in body["required"] if key not in optional]
    return _without_descriptions(schema)


def _without_descriptions(value: object, names: bool = False) -> object:
    """The schema without its prose; ``names``: ``value`` maps property names to schemas
    (where a property may be called "description")."""
    if isinstance(value, dict):
        return {k: _without_descriptions(v, k in ("properties", "definitions") and not names)
                for k, v in value.items()
                if names or k not in ("description", "deprecated")}
    if isinstance(value, list):
        return [_without_descriptions(v) for v in value]
    return value


def main(version: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        _run(["npm", "init", "-y"], work)
        _run(["npm", "install", "--no-audit", "--no-fund", f"@grafana/schema@{version}"], work)
        root = work / "node_modules" / "@grafana" / "schema"
        package = json.loads((root / "package.json").read_text())
        integrity = json.loads(_run(["npm", "view", f"@grafana/schema@{version}",
                                     "dist.integrity", "--json"], work))
        modules = ["raw/dashboard/x/types.gen", "common/common.gen",
                   *(f"raw/composable/{t}/panelcfg/x/types.gen" for t in PANEL_TYPES)]
        script = work / "defaults.mjs"
        script.write_text(_DEFAULTS_JS)
        found = json.loads(_run(["node", str(script), str(root), *modules], work))
        common = found["common/common.gen"]
        types = root / "dist" / "types"
        common_types = (types / "common/common.gen.d.ts").read_text()
        dashboard_defaults = {**common, **found["raw/dashboard/x/types.gen"]}
        panels = {}
        for kind in PANEL_TYPES:  # each module has its own Options and FieldConfig
            module = f"raw/composable/{kind}/panelcfg/x/types.gen"
            defaults = {**common, **found[module]}
            path = types / f"{module}.d.ts"
            parents = _parents(common_types + path.read_text())
            panels[kind] = {"options": _schema(work, path, "Options", defaults, parents),
                            "custom": _schema(work, path, "FieldConfig", defaults, parents)}
        path = types / "raw/dashboard/x/types.gen.d.ts"
        dashboard = _schema(work, path, "Dashboard", dashboard_defaults,
                            _parents(common_types + path.read_text()))
        bundle = {
            "$comment": f"Generated by tests/schemas/grafana_schema.py from @grafana/schema "
                        f"{package['version']} ({integrity}), Apache-2.0, with {GENERATOR}.",
            "grafana": package["version"],
            "dashboard": dashboard,
            "panels": panels,
        }
    target = HERE / f"grafana-{version}.json"
    target.write_text(json.dumps(bundle, indent=1, sort_keys=True) + "\n")
    print(f"wrote {target.relative_to(HERE.parents[1])}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/schemas/grafana_schema.py VERSION (e.g. 13.2.3)")
    main(sys.argv[1])
