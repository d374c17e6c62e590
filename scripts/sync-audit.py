"""Which TileLang wrappers synchronise the host with the device (issue: eager calls as fast as graph replays).

Each wrapper's valid call from the bad-argument tables (tests/test_bad_inputs.py: every public kernel
function has one), and the routed variants tests/sync_audit.py adds, runs once on CUDA to compile and warm
up, then again under ``torch.cuda.set_sync_debug_mode("error")``, which raises on every host-device
synchronisation (a ``.item()``, a ``nonzero``, a copy to the host).  Prints one line per call: ``no sync``,
``sync: <what raised>`` (with the reason where tests/sync_audit.py allows it), or why it did not run.  The
measurement behind tests/test_sync_gpu.py, which holds the wrappers to it; both use tests/sync_audit.py.

    python scripts/sync-audit.py > sync.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sync_audit  # noqa: E402  (the calls live with the tests)
import test_bad_inputs as tables  # noqa: E402


def audit(key: str, make) -> str:
    try:
        what = sync_audit.sync_of(key, make)
    except Exception as e:  # noqa: BLE001 - the call itself failed
        return f"not run: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    except BaseException as e:  # noqa: BLE001 - pytest.skip / fail: the family has no TileLang wrapper
        return f"not run: {str(e).splitlines()[0][:120]}"
    if what is None:
        return "no sync"
    allowed = sync_audit.ALLOWED_SYNC.get(key)
    return f"sync: {what[:160]}" + (f" (allowed: {allowed})" if allowed else "")


def main() -> int:
    if not torch.cuda.is_available():
        print("sync-audit: needs a CUDA device", file=sys.stderr)
        return 2
    for key in sorted(tables.TABLES):
        for name, make in sync_audit.calls(key):
            label = key if name == "valid call" else f"{key} ({name})"
            print(f"{label:55s} {audit(key, make)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
