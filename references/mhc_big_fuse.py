"""Float64 oracle of mHC's fused pre-block forward, `pre_big_fuse`: the composition of the float64
oracles of its four stages, with no formula of its own (docs/contract/mhc_big_fuse.md).

Per token n, with K = m H the RMS group (one group of all m streams):

    mixes      = reduce_partials_and_rmsnorm(gemm_out_mul, gemm_out_sqrsum, m H, rms_eps).out
    pre, post, comb_logits = pre_split_mixes(mixes, scale, base, m, post_mult, pre_eps)
    comb       = sinkhorn(comb_logits, sinkhorn_repeat, sinkhorn_eps)
    layer_input = pre_apply_mix(residual, pre)

and the op returns (post_mix (N, m), comb_mix (N, m, m), layer_input (N, H)).  `stages` returns the
intermediates too, for the judges of tkverify/specs/mhc_big_fuse.py.  Everything is float64 from the
exactly widened inputs; non-finite values follow the stages' IEEE semantics.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import references.mhc as mhc
import references.mhc_fused as fused
from references import as_float64


def _check(gemm_out_mul: np.ndarray, gemm_out_sqrsum: np.ndarray, residual: np.ndarray) -> tuple[int, int]:
    if residual.ndim != 3:
        raise ValueError(f"residual must be (N, m, H), got {residual.shape}")
    tokens, m, hidden = residual.shape
    if gemm_out_mul.ndim != 3 or gemm_out_mul.shape[1:] != (tokens, m * (m + 2)):
        raise ValueError(f"gemm_out_mul must be (S, N, m (m + 2)) = (S, {tokens}, {m * (m + 2)}), "
                         f"got {gemm_out_mul.shape}")
    if gemm_out_sqrsum.shape != gemm_out_mul.shape[:2]:
        raise ValueError(f"gemm_out_sqrsum must be (S, N) = {gemm_out_mul.shape[:2]}, got {gemm_out_sqrsum.shape}")
    return m, hidden


def stages(gemm_out_mul: Any, gemm_out_sqrsum: Any, scale: Any, base: Any, residual: Any, rms_eps: float,
           pre_eps: float, sinkhorn_eps: float, post_mult: float, sinkhorn_repeat: int) -> dict[str, np.ndarray]:
    """Every stage's float64 result: mixes (N, M), pre (N, m), post (N, m), comb_logits (N, m, m),
    comb (N, m, m), layer_input (N, H)."""
    p, q, x = as_float64(gemm_out_mul), as_float64(gemm_out_sqrsum), as_float64(residual)
    m, hidden = _check(p, q, x)
    _, _, mixes = fused.reduce_partials_and_rmsnorm(p[:, :, None, :], q[:, :, None], m * hidden, rms_eps)
    mixes = mixes.numpy()
    pre, post, logits = mhc.pre_split_mixes(mixes[None], scale, base, m, post_mult, pre_eps)
    comb = mhc.sinkhorn(logits[0], sinkhorn_repeat, sinkhorn_eps).numpy()
    layer_input = mhc.pre_apply_mix(x[None], pre)[0]
    return {"mixes": mixes, "pre": pre[0, :, :, 0], "post": post[0, :, :, 0], "comb_logits": logits[0],
            "comb": comb, "layer_input": layer_input}


def pre_big_fuse(gemm_out_mul: Any, gemm_out_sqrsum: Any, scale: Any, base: Any, residual: Any, rms_eps: float,
                 pre_eps: float, sinkhorn_eps: float, post_mult: float,
                 sinkhorn_repeat: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(post_mix (N, m), comb_mix (N, m, m), layer_input (N, H)) in float64; see the module docstring."""
    s = stages(gemm_out_mul, gemm_out_sqrsum, scale, base, residual, rms_eps, pre_eps, sinkhorn_eps, post_mult,
               sinkhorn_repeat)
    return s["post"], s["comb"], s["layer_input"]
