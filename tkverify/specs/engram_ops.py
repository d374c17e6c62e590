"""Engram's kernels around the gate: fused_weight, grad_w_reduce and the n-gram hash, and how each is judged.

What each op computes, its domain and the bounds here are docs/contract/engram.md#engram.fused_weight,
#engram.grad_w_reduce and #engram.hash; signatures and argument checks are kernels/torch/engram.py's.

- engram.fused_weight: bitwise against the correctly rounded fp32 product (the exact float64 product
  rounded once; NaN as NaN).
- engram.grad_w_reduce: each updated accumulator by the summation bound of its P + 1 exact terms (the
  accumulator and the P products p_b w), each reaching the result through at most P + 1 roundings
  whatever the order (the P - 1 additions of the partials, the product, the final addition).
- engram.hash: bitwise (integers).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import references.engram as ref
import references.engram_hash as ref_hash
import strategies.engram
import strategies.engram_hash
from references import exact_sum
from tkverify.case import Case
from tkverify.policies import FP32_UNDERFLOW, ErrorBound, bitwise, summation, summation_error
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl


def _impls(name: str) -> dict:
    return {"torch": torch_impl(f"kernels.torch.engram:{name}"), "tilelang": tilelang_impl(f"kernels.engram:{name}")}


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# -- engram.fused_weight ------------------------------------------------------------------------


def fused_weight_oracle(weight_hidden: Any, weight_embed: Any) -> np.ndarray:
    """The exact products as float64 numpy: the bitwise policy rounds them once to the output's fp32."""
    return ref.fused_weight(weight_hidden, weight_embed).numpy()


# -- engram.grad_w_reduce -----------------------------------------------------------------------


def accumulation_bound(terms: list[np.ndarray]) -> ErrorBound:
    """The fp32 result of accumulator + sum of the P products: exact sum and the bound of n = P + 1 terms,
    one rounding each (the product), any order; up to P products rounded in the subnormal range."""
    shape = terms[0].shape
    magnitude = np.sum([np.abs(t) for t in terms], axis=0)
    error = summation_error(magnitude, len(terms), roundings_per_term=1, absolute=(len(terms) - 1) * FP32_UNDERFLOW)
    return ErrorBound(exact_sum(terms, shape), error, "fp32")


def given_grad_w_reduce(case: Case, actual: dict[str, Any]) -> dict[str, ErrorBound]:
    hidden_terms, embed_terms = ref.grad_w_reduce_terms(**case.inputs)
    return {"grad_weight_hidden": accumulation_bound(hidden_terms),
            "grad_weight_embed": accumulation_bound(embed_terms)}


# -- benchmark shapes ---------------------------------------------------------------------------
# DeepSeek's sizes, as the rest of the Engram and mHC bench: hc 4, H 7168, 16384 tokens; the backward's
# 128 persistent blocks (kernels/engram/configs.py's BWD_BLOCKS) for grad_w_reduce; Engram's hash
# layout (2 layers, 3-grams, 8 tables an order).

BENCH_HEADS, BENCH_HIDDEN, BENCH_BLOCKS, BENCH_TOKENS = 4, 7168, 128, 16384
BENCH_LAYERS, BENCH_NGRAM, BENCH_TABLES = 2, 3, 8


def _weights(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    return tuple(torch.rand((BENCH_HEADS, BENCH_HIDDEN), generator=gen, device=device).add_(0.5).to(torch.bfloat16)
                 for _ in range(2))


def bench_fused_weight_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    wh, we = _weights(device)
    return {"weight_hidden": wh, "weight_embed": we}, {}


def bench_grad_w_reduce_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    wh, we = _weights(device)
    gen = torch.Generator(device=device).manual_seed(1)
    partial = torch.randn((BENCH_BLOCKS, BENCH_HEADS, BENCH_HIDDEN), generator=gen, device=device)
    acc = [torch.zeros((BENCH_HEADS, BENCH_HIDDEN), device=device) for _ in range(2)]
    return {"grad_w_partial": partial, "weight_hidden": wh, "weight_embed": we, "grad_weight_hidden": acc[0],
            "grad_weight_embed": acc[1]}, {}


def bench_hash_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    gen = torch.Generator(device=device).manual_seed(2)
    ids = torch.randint(0, 129280, (BENCH_TOKENS, BENCH_NGRAM), generator=gen, device=device, dtype=torch.int32)
    mult = torch.randint(0, 2**40, (BENCH_LAYERS, BENCH_NGRAM), generator=gen, device=device) * 2 + 1
    vocab = torch.randint(600_000, 700_000, (BENCH_LAYERS, BENCH_NGRAM - 1, BENCH_TABLES), generator=gen,
                          device=device, dtype=torch.int32)
    flat = vocab.view(BENCH_LAYERS, -1).long()
    offsets = (flat.cumsum(1) - flat).to(torch.int32)
    return {"ngram_token_ids": ids, "multipliers": mult, "vocab_sizes": vocab, "offsets": offsets,
            "image_token_mask": torch.zeros(BENCH_TOKENS, dtype=torch.bool, device=device)}, {}


def _fused_weight_bytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    """Both bf16 weights read, the fp32 product written."""
    return _nbytes(*inputs.values()) + inputs["weight_hidden"].numel() * 4


def _grad_w_reduce_bytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    """Every input read once; both accumulators written."""
    return _nbytes(*inputs.values()) + 2 * inputs["grad_weight_hidden"].nbytes


def _grad_w_reduce_written(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    return 2 * inputs["grad_weight_hidden"].nbytes


def _hash_bytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    """The inputs read once; the int32 (L, T, (N - 1) K) indices written."""
    return _nbytes(*inputs.values()) + _hash_written(inputs, params)


def _hash_written(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    layers = inputs["multipliers"].shape[0]
    return layers * inputs["ngram_token_ids"].shape[0] * inputs["offsets"].shape[1] * 4


_WEIGHTS = f"hc {BENCH_HEADS}, H {BENCH_HIDDEN}"

register(OpSpec(
    name="engram.fused_weight",
    oracle=fused_weight_oracle,
    strategy=strategies.engram.fused_weight_cases,
    outputs={"weight_fused": bitwise(torch.float32)},
    impls=_impls("fused_weight"),
    doc="Engram: weight_fused = weight_hidden * weight_embed, bf16 in, the correctly rounded fp32 product out.",
    # 170 KiB moved: a launch's latency, not bandwidth, so judged by time alone.
    bench=(BenchShape(f"{_WEIGHTS} bf16 -> fp32", bench_fused_weight_inputs, _fused_weight_bytes, target=None),),
))

register(OpSpec(
    name="engram.grad_w_reduce",
    oracle=ref.grad_w_reduce,
    strategy=strategies.engram.grad_w_reduce_cases,
    outputs={"grad_weight_hidden": summation("fp32"), "grad_weight_embed": summation("fp32")},
    impls=_impls("grad_w_reduce"),
    given=given_grad_w_reduce,
    doc="Engram: S = sum_b grad_w_partial[b] (fp32); grad_weight_hidden += S * weight_embed, "
        "grad_weight_embed += S * weight_hidden, in place.",
    bench=(BenchShape(f"P {BENCH_BLOCKS}, {_WEIGHTS} fp32", bench_grad_w_reduce_inputs, _grad_w_reduce_bytes,
                      target=0.9, written=_grad_w_reduce_written),),
))

register(OpSpec(
    name="engram.hash",
    oracle=ref_hash.engram_hash,
    strategy=strategies.engram_hash.engram_hash_cases,
    outputs={"indices": bitwise(torch.int32)},
    impls=_impls("engram_hash"),
    doc="Engram: n-gram hash indices (xor of id * multiplier products) mod table size + offset, int32; "
        "-1 for image tokens.",
    # 2.2 MiB moved: a few microseconds of launch latency dominate, so judged by time alone.
    bench=(BenchShape(f"T {BENCH_TOKENS}, L {BENCH_LAYERS}, N {BENCH_NGRAM}, K {BENCH_TABLES}", bench_hash_inputs,
                      _hash_bytes, target=None, written=_hash_written),),
))
