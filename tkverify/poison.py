"""Poisoned outputs: what an implementation allocates without writing never looks right by chance.

`poisoned()` is a context manager that `tkverify.check.run_impl` (and the gradient checks, around
an implementation's backward) put around each implementation call.  Inside it every tensor that
torch allocates without initialising - ``torch.empty``, ``empty_like``, ``Tensor.new_empty``,
``empty_strided`` and the ``out=`` resizes of torch ops, on the CPU and on CUDA - comes back filled
with a sentinel instead of whatever the allocator's recycled memory held:

- floating dtypes (fp32, bf16, fp16, fp64): NaN;
- fp8 (``float8_e4m3fn``, ``float8_e5m2``): the byte 0x7F, a NaN in both formats;
- signed integers: the largest value (int8 127, int32 2^31 - 1, int64 2^63 - 1);
- unsigned integers: all bits set (uint8 255);
- bool: True.

A kernel that skips a row, a tail or a padding block then fails on the first case that reaches
it: a float or fp8 output holds a NaN where the contract wants a number, an index output an index
no shape has.  The largest signed integer, not -1, is the right sentinel here: -1 is a value our
contracts give meaning to (padding marks of fused_mapping, masked slots), so an unwritten -1 would
look right.

How: torch's own switch.  ``torch.utils.deterministic.fill_uninitialized_memory`` fills
uninitialised memory with those sentinels, but only while deterministic algorithms are on, so
the context also sets ``torch.use_deterministic_algorithms(True, warn_only=True)``: with
``warn_only`` an op without a deterministic implementation still runs (it warns, and those
warnings are silenced inside the context).  Both settings are restored on exit, also when the
call raises.  The fill covers every dtype on the CPU and on CUDA (checked in torch 2.13 for all
the dtypes above, on the CPU; on CUDA per torch's documentation of the switch), so nothing is
added on top of it.

What it does not cover:

- memory a kernel gets without a torch factory: a TileLang kernel's own workspace, or an output
  that a wrapper receives from the caller (an in-place buffer such as ``clamped_count`` is an
  input, and its contents are the caller's);
- the padding of a strided layout that nobody reads (a TMA-aligned column-major sf's rows past
  the logical ones are poisoned too, but the contract does not judge them);
- side effects on the implementation: with deterministic algorithms on, a few CUDA ops (scatter
  and index_put with accumulation, some cuBLAS paths) take their deterministic variant inside the
  call, so a torch implementation on CUDA is judged in that mode.

Cost: about 3 ms per example on the CPU (2 shared cores, torch 2.13).  The moe and quant
differential tests in the ci profile (``CI=true python -m pytest -q tests/test_differential.py -k
"moe or quant" -p no:cacheprovider``: 14 tests of 30 examples) take 6.4-6.7 s with poisoning and
5.2-5.3 s without (pytest's own figure, two runs each): the fill of every uninitialised allocation
of the call, intermediates included, and the deterministic variants of the ops that have one.

``TKVERIFY_POISON=0`` (or false, no, off) turns it off, for a run that wants the allocator's
memory as it is (to see what a bug does without the sentinel).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator

import torch

ENV = "TKVERIFY_POISON"
OFF = ("0", "false", "no", "off")

# torch's warning when an op without a deterministic implementation runs under warn_only.
_NONDETERMINISTIC = r".*deterministic"


def enabled() -> bool:
    """Whether poisoning is on: unless TKVERIFY_POISON says 0, false, no or off."""
    return os.environ.get(ENV, "1").strip().lower() not in OFF


@contextlib.contextmanager
def poisoned(on: bool | None = None) -> Iterator[bool]:
    """Fill what torch allocates uninitialised with the sentinels while the block runs.

    `on` None follows TKVERIFY_POISON (`enabled`); the block gets whether poisoning is active.
    The previous deterministic-algorithms settings are restored on exit, so nesting is harmless.
    """
    active = enabled() if on is None else on
    if not active:
        yield False
        return
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NONDETERMINISTIC, category=UserWarning)
            yield True
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = was_filling
        torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)
