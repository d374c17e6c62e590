"""What the mHC kernels share: the contract's limits, the pass configuration, the CUDA prelude, and
the checks, layout choices and launch of the bf16 per-token vector kernels."""

import torch

from .. import _tilelang
from ..torch import mhc as eager_mhc

# The contract's limits and defaults are the eager module's (kernels/torch/mhc.py).
MIN_M, MAX_M = eager_mhc.MIN_M, eager_mhc.MAX_M
DEFAULT_REPEAT, DEFAULT_EPS = eager_mhc.DEFAULT_REPEAT, eager_mhc.DEFAULT_EPS
# Every global access is guarded by hand: tilelang's safe-memory legalisation would add per-lane checks
# that block vectorisation.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}

MIX_THREADS = 128
MIX_VECTOR = 8  # bf16 per 16 bytes

PRELUDE = r"""
#ifndef TKM_PRELUDE
#define TKM_PRELUDE
// 1 / x within 1 ulp (rcp.approx.ftz): x is a sum + eps >= eps >= 2^-64 here, never subnormal.
__device__ __forceinline__ float tkm_rcp(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.0f / x;
#endif
}
#endif
""" + _tilelang.STORE16_STREAM_PRELUDE


def _padded(m: int) -> int:
    return 4 if m <= 4 else 8


def _check_tokens_fit(name: str, t: torch.Tensor, per_token: int) -> None:
    # a token's elements are indexed with int32 in the kernels
    if per_token > _tilelang.MAX_DIM:
        raise ValueError(f"{name}: at most {_tilelang.MAX_DIM} elements per token, got shape {tuple(t.shape)}")


def _vectorizable(hidden: int, tensors: tuple) -> bool:
    """16-byte accesses: H % 8 == 0 and every bf16 tensor starts on a 16-byte boundary."""
    return hidden % MIX_VECTOR == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)


def _launch_token_vectors(kernel_def: _tilelang.KernelDef, config_type, tokens: int, hidden: int, aligned: tuple,
                          *args) -> None:
    """Launch a kernel whose thread owns one vector of a token's hidden row, MIX_THREADS vectors a block:
    config_type(vectorized), vectorised (MIX_VECTOR bf16 a vector) when H % 8 == 0 and every bf16 tensor
    of `aligned` is 16-byte aligned, otherwise one element a vector."""
    vectorized = _vectorizable(hidden, aligned)
    vec = MIX_VECTOR if vectorized else 1
    device = aligned[0].device
    kernel = _tilelang.kernel_for(kernel_def, config_type(vectorized), device)
    with _tilelang.device_guard(device):
        _tilelang.launch_in_pieces(kernel, tokens * -(-(hidden // vec) // MIX_THREADS), *args)
