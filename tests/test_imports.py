"""Importing the framework, the oracles, the strategies or the kernels package never imports
tilelang (so that CPU machines and tile-kernels' older tilelang are unaffected)."""

import subprocess
import sys

MODULES = ["tkverify", "tkverify.formats", "tkverify.plugin", "tkverify.cli", "references", "strategies", "kernels"]


def test_imports_do_not_load_tilelang():
    code = "\n".join([
        "import sys",
        *(f"import {m}" for m in MODULES),
        "import importlib, pkgutil",  # every module of every kernel family, packages' modules included
        "for m in pkgutil.walk_packages(kernels.__path__, 'kernels.'): importlib.import_module(m.name)",
        "from tkverify import registry; registry.all_specs()",  # every spec, every oracle and strategy
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm'))",
        "assert not loaded, loaded",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


FRAMEWORK = ["tkverify", "tkverify.plugin", "tkverify.cli", "tkverify.suite", "tkverify.adapters",
             "tkverify.adapters.tile_kernels", "references", "strategies"]


def test_framework_and_adapters_never_import_our_kernels_or_the_libraries_under_test():
    """Under tile-kernels 1.0's bundle (tilelang 0.1.11) our kernels package may not import, so
    nothing the differential suite loads for --tk-impl tile_kernels may import it; the adapter
    imports tile-kernels only when one of its implementations runs, and reads its version from
    package metadata for the availability checks."""
    code = "\n".join([
        "import sys",
        *(f"import {m}" for m in FRAMEWORK),
        "from tkverify import registry",
        "for spec in registry.all_specs():",
        "    for impl in spec.impls.values():",
        "        if impl.name == 'tile_kernels': impl.unavailable_reason()",
        "assert registry.get('moe.topk_gate').impls['tile_kernels'], 'the adapter registered nothing'",
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('kernels', 'tile_kernels', 'tilelang', 'tvm'))",
        "assert not loaded, loaded",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_no_framework_oracle_or_strategy_source_imports_our_kernels():
    """Also the lazy imports inside functions (benchmark shapes, saved tensors): tkverify judges
    any implementation, and must work where our kernels cannot be imported (tile-kernels 1.0.0's
    environment). Only the mutation catalogue wraps our eager implementations, tkverify/coverage.py reads
    our kernels' launch recorder and registry (lazily, and only once one of our kernels has launched), and
    tkverify/dry_run.py stubs that launch path to measure the kernels' reach without a GPU, by design."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    offenders = []
    for folder in ("tkverify", "references", "strategies"):
        for path in (root / folder).rglob("*.py"):
            if "mutants" in path.parts or path in (root / "tkverify" / "coverage.py", root / "tkverify" / "dry_run.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                offenders += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names
                              if n == "kernels" or n.startswith("kernels.")]
    assert not offenders, offenders
