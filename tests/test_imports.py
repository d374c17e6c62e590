"""Importing the framework, the oracles, the strategies or the kernels package never imports
tilelang (so that CPU machines and tile-kernels' older tilelang are unaffected)."""

import subprocess
import sys

MODULES = ["tkverify", "tkverify.formats", "tkverify.plugin", "tkverify.cli", "references", "strategies",
           "kernels", "kernels.moe", "kernels.transpose"]


def test_imports_do_not_load_tilelang():
    code = "\n".join([
        "import sys",
        *(f"import {m}" for m in MODULES),
        "from tkverify import registry; registry.all_specs()",  # every spec, every oracle and strategy
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('tilelang', 'tvm'))",
        "assert not loaded, loaded",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
