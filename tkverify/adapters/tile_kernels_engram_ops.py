"""DeepSeek's tile-kernels as the implementation "tile_kernels" of engram.fused_weight, engram.grad_w_reduce
and engram.hash.

The same conventions as ``tkverify/adapters/tile_kernels.py`` (whose helpers this module calls): tile-kernels
is called through its public functions only, an assert or ValueError of its own code becomes `Unsupported`,
and the installed release picks the API.  Both releases export ``tile_kernels.engram.fused_weight``,
``grad_w_reduce`` and ``engram_hash`` with the signatures of our contract (the argument order and dtypes
match ours), so the mapping is direct:

* fused_weight(weight_hidden, weight_embed) -> fp32 (hc, H): returned as is.
* grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None,
  updating both accumulators in place: the adapter returns the two accumulators after the call (the
  case's inputs reach it as copies, so the oracle still sees the values before the call).
* engram_hash(...) -> int32 (L, T, (N - 1) K).  2.x takes ``image_token_mask``; 1.0 has no such argument,
  so a case with an image token is `Unsupported` there, and a mask with none set is left out of the call
  (the same indices by the contract).
"""

from __future__ import annotations

import torch

from tkverify.adapters.tile_kernels import _call, _gen, _tk, _v
from tkverify.registry import Unsupported


def fused_weight(weight_hidden, weight_embed):
    return _call(_tk("engram").fused_weight, weight_hidden, weight_embed)


def grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed):
    _call(_tk("engram").grad_w_reduce, grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden,
          grad_weight_embed)
    return grad_weight_hidden, grad_weight_embed


def engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask=None):
    engram = _tk("engram")
    if _gen() >= 2:
        return _call(engram.engram_hash, ngram_token_ids, multipliers, vocab_sizes, offsets, image_token_mask)
    if isinstance(image_token_mask, torch.Tensor) and bool(image_token_mask.any()):
        raise Unsupported(f"{_v()} engram_hash has no image_token_mask argument (2.x added it)")
    return _call(engram.engram_hash, ngram_token_ids, multipliers, vocab_sizes, offsets)


# Registered by tkverify.adapters.tile_kernels.register_all.
FORWARD = {
    "engram.fused_weight": fused_weight,
    "engram.grad_w_reduce": grad_w_reduce,
    "engram.hash": engram_hash,
}
