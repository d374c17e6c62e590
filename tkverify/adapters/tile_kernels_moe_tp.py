"""DeepSeek's tile-kernels as the implementation "tile_kernels" of moe.top2_sum_gate and moe.mask_indices_by_tp.

The same conventions as ``tkverify/adapters/tile_kernels.py`` (whose helpers this module calls): tile-kernels
is called through its public functions only, an assert or ValueError of its own code becomes `Unsupported`,
and the installed release picks the API.

top2_sum_gate: only 1.0 exports it (``tile_kernels.moe.top2_sum_gate``; 2.x's gate is moe_topk_gate_forward, a
different op), which `MISSING` names.  It is called with our arguments and the options our op leaves out at
their neutral values: no shared experts (use_shared_as_routed False, num_shared_experts 0), one expert-
and one tensor-parallel rank (ep_rank 0 of 1, tp_rank 0 of 1: every index kept as is), no fixed routing and
no logical-to-physical map.  Two kinds of case are refused (`Unsupported`) before the call, because the
kernel would stop on a device assert, which leaves the CUDA context unusable for every later case:

* a NaN or infinite logit (its kernel asserts "top2_sum_gate input contains nan or inf");
* a bias under which its top-k could have to pick a key no larger than -inf (a NaN or -inf bias makes one):
  some choice of num_topk_groups groups holding fewer than num_topk other biases, or, with grouping, fewer
  than num_topk_groups groups holding two; there it can find no candidate and asserts on the index.

mask_indices_by_tp: both releases export it, with our signature (indices, n, num_ep_ranks, tp_rank,
num_tp_ranks) -> a new tensor of indices's shape and dtype:

* 1.0: ``tile_kernels.moe.mask_indices_by_tp``, a TileLang kernel;
* 2.x: ``tile_kernels.torch.mask_indices_by_tp``, its eager PyTorch form (2.x has no kernel of it).

Neither release refuses anything: the arguments are passed as they are and the result returned as is.
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk, _v, installed_version
from tkverify.registry import Unsupported

# What each API generation lacks, per op, in the shape of tile_kernels.MISSING (merged there).
MISSING: dict[int, dict[str, str]] = {
    1: {},
    2: {"moe.top2_sum_gate": "tile-kernels 2.x dropped top2_sum_gate from tile_kernels.moe (its gate is "
                             "moe_topk_gate_forward)"},
}
# Where each generation exports it.
MASK_INDICES_BY_TP_MODULE = {1: "moe", 2: "torch"}


def _require_release(op: str) -> None:
    why = MISSING.get(_gen(), {}).get(op)
    if why:
        raise Unsupported(f"tile-kernels {installed_version()} lacks {op}: {why}")


def too_few_finite_biases(bias: torch.Tensor, num_topk: int, num_topk_groups: int, num_groups: int) -> bool:
    """Whether tile-kernels 1.0's gate could have to pick a key or a group key no larger than -inf: some choice
    of num_topk_groups groups holds fewer than num_topk experts with a finite (or +inf) bias, or, with grouping,
    fewer than num_topk_groups groups hold two (a group's key is the sum of its two largest keys)."""
    usable = ~torch.isnan(bias) & (bias != float("-inf"))
    per_group = usable.reshape(num_groups, -1).sum(dim=1)
    if int(per_group.sort().values[:num_topk_groups].sum()) < num_topk:
        return True
    return num_topk_groups < num_groups and int((per_group >= 2).sum()) < num_topk_groups


def top2_sum_gate(logits, bias, num_topk, num_topk_groups, num_groups, routed_scaling_factor, scoring_func,
                  mask=None):
    _require_release("moe.top2_sum_gate")
    tensors = isinstance(logits, torch.Tensor) and isinstance(bias, torch.Tensor)
    if tensors and logits.dtype.is_floating_point and not bool(torch.isfinite(logits).all()):
        raise Unsupported(f"{_v()} top2_sum_gate device-asserts on a NaN or infinite logit")
    if tensors and bias.dtype.is_floating_point and bias.dim() == 1 and isinstance(num_groups, int) \
            and num_groups > 0 and bias.numel() % num_groups == 0 \
            and too_few_finite_biases(bias, num_topk, num_topk_groups, num_groups):
        raise Unsupported(f"{_v()} top2_sum_gate device-asserts where its top-k finds no key above -inf "
                          f"(fewer than {num_topk} finite biases in some {num_topk_groups} groups)")
    return _call(_tk("moe").top2_sum_gate, logits, bias, num_topk, num_topk_groups, num_groups,
                 False, 0, routed_scaling_factor, 0, 1, 0, 1, scoring_func, mask=mask)


def mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks):
    module = _tk(MASK_INDICES_BY_TP_MODULE[_gen()])
    return _call(module.mask_indices_by_tp, indices, n, num_ep_ranks, tp_rank, num_tp_ranks)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {
    "moe.top2_sum_gate": top2_sum_gate,
    "moe.mask_indices_by_tp": mask_indices_by_tp,
}
