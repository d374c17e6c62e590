"""DeepSeek's tile-kernels as the implementation "tile_kernels" of moe.topk_gate_scored and its backward
(contract: docs/contract/moe_gate.md).

The same conventions as ``tkverify/adapters/tile_kernels.py`` (whose helpers this module calls): tile-kernels
is called through its public functions only, an assert of its own code becomes `Unsupported`, and the
installed release picks the API.  Only 2.1 exports the scored gate; 1.0 has the plain ``topk_gate`` alone,
which `MISSING` names.

* ``moe_topk_gate_forward(logits, num_topk, use_shared_as_routed, num_shared_experts, routed_scaling_factor,
  ep_rank, scoring_func='sqrtsoftplus', bias=..., scores=...)`` -> (topk_idx, topk_weights), writing the
  scores into the float32 (T, E) buffer it is handed.  The op is the routed part alone: no shared expert
  used as routed (use_shared_as_routed=False, num_shared_experts=0), expert-parallel rank 0, no token mask,
  no fixed routing, no logical-to-physical map, no image bias and no force_random (whose output is random
  by design, docs/contract/moe_gate.md#what-is-not-judged).  The adapter allocates the scores buffer and
  returns (topk_idx, topk_weights, scores).
* ``moe_topk_gate_backward(scores, topk_idx, topk_weights, grad_topk_weights, routed_scaling_factor)`` ->
  grad_logits, fed the forward's saved outputs; its aux-loss term (mask, grad_scores_sum) is left out.
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk, installed_version
from tkverify.registry import Unsupported

SCORING = "sqrtsoftplus"  # the one scoring function 2.1.0's gate takes

_NOT_IN_1 = "tile-kernels 1.x has no scored MoE gate (moe_topk_gate_forward / moe_topk_gate_backward): only topk_gate"
# What each API generation lacks, per op, in the shape of tile_kernels.MISSING.
MISSING: dict[int, dict[str, str]] = {
    1: {"moe.topk_gate_scored": _NOT_IN_1},
    2: {},
}


def _require_release() -> None:
    """Refuse a direct call on a release without the scored gate (the registry reports it unavailable first)."""
    why = MISSING.get(_gen(), {}).get("moe.topk_gate_scored")
    if why:
        raise Unsupported(f"tile-kernels {installed_version()} lacks moe.topk_gate_scored: {why}")


def _refuse_non_finite_logits(logits) -> None:
    """2.1.0's gate device-asserts on a NaN or infinite logit (seen in its fuzz run of 2026-12-02: cases with one
    inf logit; the same guard as its topk_gate's and top2_sum_gate's), which would end the CUDA context."""
    if isinstance(logits, torch.Tensor) and logits.dtype.is_floating_point and not bool(torch.isfinite(logits).all()):
        raise Unsupported(f"tile-kernels {installed_version()} moe_topk_gate_forward device-asserts on a NaN or infinite logit")


def topk_gate_scored(logits, bias, k, routed_scaling_factor):
    _require_release()
    _refuse_non_finite_logits(logits)
    scores = torch.empty_like(logits) if isinstance(logits, torch.Tensor) else None
    topk_idx, topk_weights = _call(_tk("moe").moe_topk_gate_forward, logits, k, False, 0, routed_scaling_factor, 0,
                                   scoring_func=SCORING, bias=bias, scores=scores)
    return topk_idx, topk_weights, scores


def topk_gate_scored_bwd(grad_topk_weights, logits, bias, topk_idx, topk_weights, scores, k,
                         routed_scaling_factor):
    _require_release()
    _refuse_non_finite_logits(logits)
    return _call(_tk("moe").moe_topk_gate_backward, scores, topk_idx, topk_weights, grad_topk_weights,
                 routed_scaling_factor, scoring_func=SCORING)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {"moe.topk_gate_scored": topk_gate_scored}
BACKWARD = {"moe.topk_gate_scored": topk_gate_scored_bwd}
