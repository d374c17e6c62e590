"""The public API: `tkverify.__all__` is what a user's spec or implementation needs, and nothing else;
the data model (registry, case, policies, formats, the built-in specs) imports without pytest."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tkverify

ROOT = Path(__file__).resolve().parent.parent

PUBLIC = [
    "Backward", "BenchShape", "Bracket", "Case", "Failure", "Impl", "OpSpec", "Unsupported", "bitwise", "codes",
    "load_case", "load_plugins", "register", "register_backward_impl", "register_impl", "relative", "save_case",
    "ulp", "within",
]


def test_the_public_names_are_pinned():
    assert sorted(tkverify.__all__) == PUBLIC


def test_every_public_name_resolves():
    missing = [name for name in tkverify.__all__ if getattr(tkverify, name, None) is None]
    assert missing == []


def test_star_import_gives_the_public_names():
    namespace: dict = {}
    exec("from tkverify import *", namespace)
    assert sorted(k for k in namespace if not k.startswith("__")) == PUBLIC


def test_unsupported_is_raised_past_an_implementations_error_handler():
    assert issubclass(tkverify.Unsupported, BaseException) and not issubclass(tkverify.Unsupported, Exception)


def _tkverify_names_used(path: Path) -> list[str]:
    """Every name a module takes from tkverify: `from tkverify import X`, `tkverify.X`, and any
    import of a tkverify submodule (as "tkverify.sub")."""
    used = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tkverify":
            used += [alias.name for alias in node.names] if node.module == "tkverify" else [node.module]
        elif isinstance(node, ast.Import):
            used += [alias.name for alias in node.names if alias.name.startswith("tkverify.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tkverify":
            used.append(node.attr)
    return used


def test_the_example_uses_public_names_only():
    used = _tkverify_names_used(ROOT / "examples" / "my_kernel.py")
    assert used and [name for name in used if name not in tkverify.__all__] == []


def test_the_data_model_imports_without_pytest():
    code = ("import sys\n"
            "import tkverify, tkverify.registry, tkverify.case, tkverify.policies, tkverify.formats, tkverify.specs\n"
            "assert 'pytest' not in sys.modules, 'the data model imports pytest'\n"
            "tkverify.load_plugins()\n"
            "assert 'pytest' not in sys.modules, 'a built-in spec or adapter imports pytest'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
