"""Which TileLang wrappers synchronise the host with the device (issue: eager calls as fast as graph replays).

Each wrapper's valid call from the bad-argument tables (tests/test_bad_inputs.py: every public kernel
function has one) runs once on CUDA to compile and warm up, then again under
``torch.cuda.set_sync_debug_mode("error")``, which raises on every host-device synchronisation (a
``.item()``, a ``nonzero``, a copy to the host).  Prints one line per wrapper: ``no sync``, ``sync: <what
raised>``, or why it did not run.  A measurement, not a test: the test that holds the wrappers to no
synchronisation follows once the list is known.

    python scripts/sync-audit.py > sync.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_bad_inputs as tables  # noqa: E402  (the tables live with the tests)


def _on_cuda(value):
    return value.cuda() if isinstance(value, torch.Tensor) else value


def audit(key: str, table) -> str:
    try:
        fn = tables._function("tilelang", key)
    except BaseException as e:  # noqa: BLE001 - pytest.skip / fail: the family has no TileLang wrapper
        return f"not run: {str(e).splitlines()[0][:120]}"
    try:
        tables._call(table, fn, {k: _on_cuda(v) for k, v in table.base().items()})
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return f"not run: the warm-up call raised {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    args = {k: _on_cuda(v) for k, v in table.base().items()}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tables._call(table, fn, args)
    except RuntimeError as e:
        return f"sync: {str(e).splitlines()[0][:160]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return "no sync"


def main() -> int:
    if not torch.cuda.is_available():
        print("sync-audit: needs a CUDA device", file=sys.stderr)
        return 2
    for key, table in sorted(tables.TABLES.items()):
        print(f"{key:55s} {audit(key, table)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
