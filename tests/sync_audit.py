"""Whether a TileLang wrapper synchronises the host with the device: the calls and the measurement that
tests/test_sync_gpu.py (the GPU suite's check) and scripts/sync-audit.py (the printed list) share.

A call runs once to compile and warm up, then again under ``torch.cuda.set_sync_debug_mode("error")``,
which raises on every host-device synchronisation (an ``.item()``, a ``.tolist()``, a ``nonzero``, a copy
to the host).  The calls: each wrapper's valid call from the bad-argument tables (tests/test_bad_inputs.py:
every public kernel function has one), and the routed variants in `ROUTED_VARIANTS` (the routing arguments
are where a sync came from: reading an index's range back to the host).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

import test_bad_inputs as tables

# The wrappers whose contract returns a host value, so that they must synchronise; each with the reason.
ALLOWED_SYNC = {
    "moe.fused_mapping": "its contract returns a host value: N, the number of expanded rows, sizes its outputs",
}


def _without(*names: str) -> Callable[[dict[str, Any]], None]:
    return lambda args: args.update({name: None for name in names})


# Calls besides the valid one, per table key: (name, the change to the valid call's arguments).  The tables'
# valid calls of the four swiglu paths already pass topk_weights and pos_to_token_topk (the token-cast one
# also clamped_count), and the fused per-channel cast's passes pos_to_token (`ROUTING_ARGUMENTS` holds them
# to that); these add the routing without weights, where pos_to_token_topk marks padding rows alone.
ROUTED_VARIANTS = {
    "quant.swiglu_forward_and_per_token_cast": (("pos alone", _without("topk_weights")),),
    "quant_swiglu.swiglu": (("pos alone", _without("topk_weights")),),
    "quant_swiglu.swiglu_bwd": (("pos alone", _without("topk_weights")),),
    "quant_swiglu.swiglu_backward_and_per_token_cast": (("pos alone", _without("topk_weights")),),
}
# The routing arguments each routed wrapper's valid call must pass (the calls that synchronised before).
ROUTING_ARGUMENTS = {
    "quant.swiglu_forward_and_per_token_cast": ("topk_weights", "pos_to_token_topk", "clamped_count"),
    "quant_swiglu.swiglu": ("topk_weights", "pos_to_token_topk"),
    "quant_swiglu.swiglu_bwd": ("topk_weights", "pos_to_token_topk"),
    "quant_swiglu.swiglu_backward_and_per_token_cast": ("topk_weights", "pos_to_token_topk"),
    "quant_layout.per_channel_cast_fused": ("pos_to_token",),
}


def calls(key: str) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """(name, a maker of the arguments on the CPU) of every call audited for the table `key`."""
    base = tables.TABLES[key].base

    def variant(change):
        def make():
            args = base()
            change(args)
            return args
        return make

    return [("valid call", base)] + [(name, variant(change)) for name, change in ROUTED_VARIANTS.get(key, ())]


def _on_cuda(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def sync_of(key: str, make_args: Callable[[], dict[str, Any]]) -> str | None:
    """What synchronised in the TileLang wrapper's call (the first line of torch's error), or None.

    Raises what the wrapper raises otherwise, and pytest's skip where the family has no TileLang wrapper.
    The arguments are copied to the device before the debug mode is set (a copy from the host waits for
    it); the mode in force before is restored, whatever happens."""
    table = tables.TABLES[key]
    fn = tables._function("tilelang", key)
    tables._call(table, fn, _on_cuda(make_args()))  # compiles and warms up
    args = _on_cuda(make_args())
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tables._call(table, fn, args)
    except RuntimeError as e:
        if "synchronizing" not in str(e):
            raise
        return str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return None
