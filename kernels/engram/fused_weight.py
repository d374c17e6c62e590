"""fused_weight (engram.fused_weight): weight_hidden * weight_embed, bf16 in, fp32 out.

Contract: ``docs/contract/engram.md#engram.fused_weight``.  Each element is one IEEE product
(``__fmul_rn``: no fused or flushed arithmetic) of the two bf16 widened exactly to fp32, so the result
is the correctly rounded product, NaN and infinities as IEEE makes them.

The (hc, H) weights are taken as one flat run of n = hc H elements.  Vectorised configuration (n a
multiple of 8, every tensor 16-byte aligned): a thread reads 8 bf16 of each weight (one 16-byte load
each) and writes 8 fp32 (two 16-byte stores).  Scalar configuration (any n): one element a thread, the
same arithmetic.  n is a run-time size.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

from .. import _tilelang
from .._tilelang import KernelDef
from .configs import PASS_CONFIGS

FUSED_THREADS = 256
FUSED_VECTOR = 8  # bf16 a 16-byte load


class FusedWeightConfig(NamedTuple):
    vectorized: bool  # n % 8 == 0 and every tensor 16-byte aligned


FUSED_WEIGHT_CONFIGS = (FusedWeightConfig(True), FusedWeightConfig(False))


def build_fused_weight(config: FusedWeightConfig):
    """prim_func(weight_hidden bf16 (n,), weight_embed bf16 (n,), out fp32 (n,)), n = vec * num_vecs."""
    T = _tilelang.T()
    vec = FUSED_VECTOR if config.vectorized else 1
    num_vecs = T.dynamic("num_vecs")

    @T.prim_func
    def engram_fused_weight(
        weight_hidden: T.Tensor((num_vecs * vec,), "bfloat16"),
        weight_embed: T.Tensor((num_vecs * vec,), "bfloat16"),
        out: T.Tensor((num_vecs * vec,), "float32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_vecs, FUSED_THREADS), threads=FUSED_THREADS) as block:
            tx = T.get_thread_binding()
            v = T.alloc_var("int32", init=block * FUSED_THREADS + tx)
            a = T.alloc_local((vec,), "bfloat16")
            b = T.alloc_local((vec,), "bfloat16")
            product = T.alloc_local((vec,), "float32")
            if v < num_vecs:
                for e in T.vectorized(vec):
                    a[e] = weight_hidden[v * vec + e]
                for e in T.vectorized(vec):
                    b[e] = weight_embed[v * vec + e]
                for e in T.unroll(vec):
                    product[e] = T.ieee_mul(T.Cast("float32", a[e]), T.Cast("float32", b[e]))
                for e in T.vectorized(vec):
                    out[v * vec + e] = product[e]

    return engram_fused_weight


FUSED_WEIGHT = KernelDef("engram.fused_weight", build_fused_weight, FUSED_WEIGHT_CONFIGS)
