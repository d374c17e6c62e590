"""No TileLang wrapper synchronises the host with the device (skipped without CUDA).

Every wrapper's valid call from the bad-argument tables, and the routed variants of tests/sync_audit.py,
runs once to warm up and then under ``torch.cuda.set_sync_debug_mode("error")``: it must not raise.  A
sync stalls the host until the device is idle, so the eager call costs its device time plus its host
time instead of the larger of the two, and the call cannot be captured in a CUDA graph.  The wrappers
that may synchronise, each with its reason, are `sync_audit.ALLOWED_SYNC`.  The checks of the call list
itself run without CUDA too.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import sync_audit
import test_bad_inputs as tables

CALLS = [pytest.param(key, name, make, id=f"{key}-{name}") for key in sorted(tables.TABLES)
         for name, make in sync_audit.calls(key)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("key, name, make", CALLS)
def test_tilelang_wrapper_does_not_synchronise(key, name, make):
    if importlib.util.find_spec("tilelang") is None:
        pytest.skip("the TileLang kernels need the module 'tilelang', which is not installed")
    if key in sync_audit.ALLOWED_SYNC:
        pytest.skip(f"allowed to synchronise: {sync_audit.ALLOWED_SYNC[key]}")
    what = sync_audit.sync_of(key, make)
    assert what is None, f"{key} ({name}) synchronises with the device: {what}"


@pytest.mark.parametrize("key", sorted(sync_audit.ROUTING_ARGUMENTS))
def test_routed_calls_pass_their_routing(key):
    """The valid calls above include the routing arguments that made these wrappers synchronise."""
    args = tables.TABLES[key].base()
    missing = [name for name in sync_audit.ROUTING_ARGUMENTS[key] if args.get(name) is None]
    assert not missing, f"{key}'s valid call lacks {missing}"


def test_allowed_and_routed_keys_are_tables():
    assert set(sync_audit.ALLOWED_SYNC) | set(sync_audit.ROUTING_ARGUMENTS) | set(sync_audit.ROUTED_VARIANTS) \
        <= set(tables.TABLES)
