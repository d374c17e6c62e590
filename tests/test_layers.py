"""The layers of the four import packages: no import runs from a lower layer to a higher one.

Every module of tkverify/, kernels/, references/ and strategies/ is parsed with `ast`
(nothing is imported), and every import statement in it, at module level or inside a
function, becomes an edge of the import graph.  Each module takes its layer from
`LAYERS`; an import of a module in a higher layer fails the test unless the import
statement carries a comment ``# layer: <reason>`` on one of its lines.  The same holds for
the packages of `SEPARATE`, which share a layer.  docs/ARCHITECTURE.md prints the same table.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tkverify", "kernels", "references", "strategies")

# Lowest first.  "pkg.*" names a package and every module under it; any other entry names one module.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base types", ("tkverify.formats", "tkverify.case", "tkverify.policies")),
    ("oracles and implementations", ("references.*", "kernels.*")),
    ("strategies", ("strategies.*",)),
    ("registry", ("tkverify.registry", "tkverify")),
    ("specs", ("tkverify.specs.*", "tkverify.benchshapes")),
    ("tools", ("tkverify.check", "tkverify.gradients", "tkverify.finite_differences", "tkverify.report.*",
               "tkverify.bench", "tkverify.ncu", "tkverify.profiles", "tkverify.plugin", "tkverify.cli", "tkverify.suite", "tkverify.mutants.*",
               "tkverify.adapters.*", "tkverify.diff", "tkverify.sweep.*", "tkverify.claims", "tkverify.poison",
               "tkverify.coverage", "tkverify.dry_run")),
)

# Packages that share a layer but never import each other: an oracle is written from the maths and
# a strategy aims at the contract's edges, neither from a kernel; a kernel does not lean on the oracle
# that judges it.  (importer, imported)
SEPARATE = (("references", "kernels"), ("kernels", "references"), ("strategies", "kernels"))

EXCUSE = re.compile(r"#\s*layer:\s*\S")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> source file, for every module of the four packages (a package is its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _matches(module: str, entry: str) -> bool:
    if entry.endswith(".*"):
        package = entry[:-2]
        return module == package or module.startswith(package + ".")
    return module == entry


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer whose entry names `module` (the longest entry wins)."""
    found = [(len(entry), index) for index, (_, entries) in enumerate(LAYERS) for entry in entries
             if _matches(module, entry)]
    return max(found)[1] if found else None


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest module of the graph that an imported dotted name refers to (None: outside it)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, ast.stmt]]:
    """(imported module, the import statement) for every import in `path` that reaches a module of the graph."""
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(module, path).split(".")
                anchor = ".".join(package[:len(package) - (node.level - 1)])
                base = f"{anchor}.{base}" if base else anchor
            # `from package import name`: name is a submodule when the graph has one by that name
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                edges.append((resolved, node))
    return edges


def _excused(lines: list[str], node: ast.stmt) -> bool:
    return any(EXCUSE.search(lines[i - 1]) for i in range(node.lineno, node.end_lineno + 1))


def forbidden_imports(root: Path = ROOT) -> list[str]:
    """Every import from a lower layer to a higher one, or between SEPARATE packages, that carries no
    `# layer:` reason."""
    modules = module_files(root)
    found = []
    for module, path in modules.items():
        lines = path.read_text().splitlines()
        for target, node in imports_of(module, path, modules):
            if layer_of(module) is None or layer_of(target) is None:
                continue  # test_every_module_has_a_layer names it
            upward = layer_of(target) > layer_of(module)
            across = (module.split(".")[0], target.split(".")[0]) in SEPARATE
            if (upward or across) and not _excused(lines, node):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {module} ({LAYERS[layer_of(module)][0]}) "
                             f"imports {target} ({LAYERS[layer_of(target)][0]})")
    return found


def test_every_module_has_a_layer():
    assert [m for m in module_files() if layer_of(m) is None] == []


def test_every_entry_of_the_table_names_a_module():
    modules = module_files()
    stale = [entry for _, entries in LAYERS for entry in entries if not any(_matches(m, entry) for m in modules)]
    assert stale == []


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    found = forbidden_imports()
    assert not found, "imports against the layers (fix them, or say why beside them with '# layer: <reason>'):\n" \
        + "\n".join(found)


def test_the_architecture_document_prints_the_same_table():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for name, entries in LAYERS:
        row = next((line for line in text.splitlines() if line.startswith(f"| {name} |")), None)
        assert row is not None, f"docs/ARCHITECTURE.md has no row for the layer {name!r}"
        assert sorted(re.findall(r"`([\w.*]+)`", row)) == sorted(entries), row


@pytest.mark.parametrize(("source", "expected"), [
    ("import tkverify.specs\n", ["tkverify.specs"]),
    ("from tkverify import formats, registry\n", ["tkverify.formats", "tkverify.registry"]),
    ("from tkverify.registry import Impl\n", ["tkverify.registry"]),
    ("def f():\n    from . import quant\n", ["tkverify.specs.quant"]),
    ("from .quant import ReturningClampedCount\n", ["tkverify.specs.quant"]),
    ("import numpy\nimport references.quant as ref\n", ["references.quant"]),
])
def test_the_graph_sees_every_form_of_import(tmp_path, source, expected):
    modules = module_files()
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert [target for target, _ in imports_of("tkverify.specs.probe", path, modules)] == expected


def test_an_import_against_the_layers_is_found_unless_it_says_why(tmp_path):
    sources = {
        "tkverify/__init__.py": "",
        "tkverify/cli.py": "from tkverify import formats\n",
        "tkverify/formats.py": "from tkverify import cli\n",
        "tkverify/case.py": "def load():\n    from tkverify import (  # layer: a reason\n        cli,\n    )\n",
        "kernels/__init__.py": "",
        "kernels/gate.py": "from references import gate\n",
        "references/__init__.py": "",
        "references/gate.py": "",
        "strategies/__init__.py": "import references.gate\n",
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = [line.split(": ")[0] for line in forbidden_imports(tmp_path)]
    assert found == ["tkverify/formats.py:1", "kernels/gate.py:1"]
