"""normalize_weight: the routing weights divided by their sum, one thread a token.

denom = __fadd_rn over the slots from +0, then __fadd_rn(denom, 1e-20f) (the
float nearest 1e-20, as torch rounds the python scalar), weights =
__fdiv_rn(w, denom): IEEE division, whatever nvcc's -prec-div setting.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
import struct
from typing import NamedTuple

import torch

from kernels.torch import moe as eager  # the argument checks are the eager module's

from .. import _tilelang
from .._tilelang import KernelDef
from .common import PASS_CONFIGS

NORMALIZE_EPS = 1e-20  # added to the sum of the weights, as kernels/torch/moe.py does
NORMALIZE_THREADS = 128
# 1e-20 rounded to float32 (round to nearest, as torch converts the python scalar), by its bits:
# no decimal or hex-float literal left for a compiler to round.
NORMALIZE_EPS_BITS = struct.unpack("<I", struct.pack("<f", NORMALIZE_EPS))[0]


class NormalizeConfig(NamedTuple):
    pass


NORMALIZE_CONFIGS = (NormalizeConfig(),)


def build_normalize(config: NormalizeConfig):
    """prim_func(topk_weights (T, K), denom (T,), weights (T, K))."""
    T = _tilelang.T()
    threads = NORMALIZE_THREADS
    num_tokens, num_slots = T.dynamic("num_tokens, num_slots")

    @T.prim_func
    def normalize_weight(
        topk_weights: T.Tensor((num_tokens, num_slots), "float32"),
        denom: T.Tensor((num_tokens,), "float32"),
        weights: T.Tensor((num_tokens, num_slots), "float32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_tokens, threads), threads=threads) as block:
            tx = T.get_thread_binding()
            token = T.alloc_var("int64", init=T.Cast("int64", block) * threads + tx)
            total = T.alloc_var("float32", init=T.float32(0))
            if token < num_tokens:
                for k in T.serial(num_slots):
                    total = T.ieee_add(total, topk_weights[token, k])
                total = T.ieee_add(total, T.reinterpret(T.uint32(NORMALIZE_EPS_BITS), "float32"))
                denom[token] = total
                for k in T.serial(num_slots):
                    weights[token, k] = T.ieee_fdiv(topk_weights[token, k], total)

    return normalize_weight


NORMALIZE_WEIGHT = KernelDef("moe.normalize_weight", build_normalize, NORMALIZE_CONFIGS)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(denom, topk_weights / denom): denom = sum_k w[t, k] in fp32 slot order, plus 1e-20 as fp32.

    IEEE sums and division (__fadd_rn, __fdiv_rn): bitwise equal to the eager
    PyTorch implementation.  No host sync.
    """
    eager._check_normalize_args(topk_weights)
    _tilelang.require_cuda("topk_weights", topk_weights)
    num_tokens, k = topk_weights.shape
    denom = torch.empty(num_tokens, dtype=torch.float32, device=topk_weights.device)
    weights = torch.empty_like(topk_weights)
    if num_tokens == 0:
        return denom, weights
    kernel = _tilelang.kernel_for(NORMALIZE_WEIGHT, NORMALIZE_CONFIGS[0], topk_weights.device)
    with _tilelang.device_guard(topk_weights.device):
        kernel(topk_weights, denom, weights)
    return denom, weights
