"""DeepSeek's tile-kernels as the implementation "tile_kernels" of moe.topk_sum_and_topk_group_idx,
moe.unique_group_indices and moe.aux_fi.

The same conventions as ``tkverify/adapters/tile_kernels.py`` (whose helpers this module calls): tile-kernels
is called through its public functions only, an assert or ValueError of its own code becomes `Unsupported`,
and the installed release picks the API.  Only 1.0 exports these helpers (``tile_kernels.moe``); 2.x dropped
them, which `MISSING` names per op:

* topk_sum_and_topk_group_idx(scores, num_topk_sum, num_topk_groups) -> int64 (T, num_topk_groups): our
  signature; returned as is.
* inplace_unique_group_indices(group_indices, num_groups) -> None, writing the deduplicated indices into
  group_indices: the adapter hands it a copy of the case's indices and returns that copy.  Its docstring
  takes num_groups <= 128 only; a larger one is `Unsupported`.
* aux_fi(topk_idx, num_experts, num_aux_topk) -> fp32 (num_experts,): our signature; returned as is.
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk, _v, installed_version
from tkverify.registry import Unsupported

# tile-kernels 1.0's inplace_unique_group_indices takes num_groups <= 128 (its docstring).
MAX_UNIQUE_GROUPS = 128

_GONE_IN_2 = ("tile-kernels 2.x dropped aux_fi, topk_sum_and_topk_group_idx and inplace_unique_group_indices "
              "from tile_kernels.moe")
# What each API generation lacks, per op, in the shape of tile_kernels.MISSING (merged there to name the
# release that lacks them).
MISSING: dict[int, dict[str, str]] = {
    1: {},
    2: {
        "moe.topk_sum_and_topk_group_idx": _GONE_IN_2,
        "moe.unique_group_indices": _GONE_IN_2,
        "moe.aux_fi": _GONE_IN_2,
    },
}


def _require_release(op: str) -> None:
    """Refuse a call on a release that lacks `op` (the registry reports it unavailable before any call
    once `MISSING` is merged into the adapter's; this keeps a direct call from failing obscurely)."""
    why = MISSING.get(_gen(), {}).get(op)
    if why:
        raise Unsupported(f"tile-kernels {installed_version()} lacks {op}: {why}")


def topk_sum_and_topk_group_idx(scores, num_topk_sum, num_topk_groups):
    _require_release("moe.topk_sum_and_topk_group_idx")
    return _call(_tk("moe").topk_sum_and_topk_group_idx, scores, num_topk_sum, num_topk_groups)


def unique_group_indices(group_indices, num_groups):
    _require_release("moe.unique_group_indices")
    if isinstance(num_groups, int) and num_groups > MAX_UNIQUE_GROUPS:
        raise Unsupported(f"{_v()} inplace_unique_group_indices takes num_groups <= {MAX_UNIQUE_GROUPS}, "
                          f"got {num_groups}")
    out = group_indices.clone() if isinstance(group_indices, torch.Tensor) else group_indices
    _call(_tk("moe").inplace_unique_group_indices, out, num_groups)
    return out


def aux_fi(topk_idx, num_experts, num_aux_topk):
    _require_release("moe.aux_fi")
    return _call(_tk("moe").aux_fi, topk_idx, num_experts, num_aux_topk)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {
    "moe.topk_sum_and_topk_group_idx": topk_sum_and_topk_group_idx,
    "moe.unique_group_indices": unique_group_indices,
    "moe.aux_fi": aux_fi,
}
