"""The public API: `tkverify.__all__` is what a user's spec or implementation needs, and nothing else;
the data model (registry, case, policies, formats, the built-in specs) imports without pytest."""

from __future__ import annotations

import ast
import os
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


# Run in a fresh interpreter: records each import of pytest whose importing frame lies in this repository's
# packages.  A third-party library may import pytest on its own (hypothesis does when trio is installed, as
# selenium brings it): that is not the data model depending on pytest, so only our own frames count.
_OWN_PYTEST_IMPORTS = """
import builtins, os, sys
ROOTS = tuple(os.path.join(os.getcwd(), p) + os.sep for p in ("tkverify", "kernels", "references", "strategies"))
seen = []
real_import = builtins.__import__
def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and name.split(".")[0] in ("pytest", "_pytest"):
        caller = sys._getframe(1).f_code.co_filename
        if caller.startswith(ROOTS):
            seen.append(f"{os.path.relpath(caller)} imports {name}")
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = recording_import
import tkverify, tkverify.registry, tkverify.case, tkverify.policies, tkverify.formats, tkverify.specs
assert not seen, f"the data model imports pytest: {seen}"
tkverify.load_plugins()
assert not seen, f"a built-in spec or adapter imports pytest: {seen}"
"""


def test_the_data_model_imports_without_pytest():
    result = subprocess.run([sys.executable, "-c", _OWN_PYTEST_IMPORTS], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_import_recorder_sees_our_own_pytest_imports(tmp_path):
    """The check above would notice a module of ours that imports pytest."""
    (tmp_path / "strategies").mkdir()
    (tmp_path / "strategies" / "__init__.py").write_text("")
    (tmp_path / "strategies" / "leaky.py").write_text("import pytest\n")
    code = _OWN_PYTEST_IMPORTS.replace("import tkverify, tkverify.registry", "import strategies.leaky\nimport tkverify, tkverify.registry")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode != 0 and "strategies/leaky.py imports pytest" in result.stderr, result.stderr
