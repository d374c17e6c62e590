"""mHC's fused pre-block pieces: mhc.norm_fn (the RMSNorm weight folded into the mix projection) and
mhc.reduce_partials_and_rmsnorm (the split-K partials reduced, the RMSNorm applied), each with its
backward, and mhc.multilayer_recompute (the residual stream recomputed across layers, forward only),
and how each output is judged.

What the ops compute, their edge semantics and the error analyses behind every bound here are
docs/contract/mhc_fused.md; signatures and argument checks are kernels/torch/mhc_fused.py's.
Correctly rounded products (out_fn, grad_fn) are judged by `ulp` 0.5; every output accumulated in
fp32 by `within` a bracket [exact - err, exact + err] rounded outward to fp32 (`_bracket`), err from
the summation bound of its terms and the error model of r = (sqrsum / size + eps)^(-1/2)
(`rms_factor_error`).  multilayer_recompute's outputs are judged by `summation` in bf16, layer by
layer, each layer from the residual the implementation itself wrote for it (`given_recompute`).
The benchmark shapes are at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import references.mhc as ref_mhc
import references.mhc_fused as ref
import strategies.mhc_fused
from tkverify.case import Case
from tkverify.policies import FP32_UNDERFLOW, Bracket, ErrorBound, gamma, summation, summation_error, ulp
from tkverify.registry import Backward, BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.mhc import RHO, U, Fp32Within, _np, _round_outward, _sum_bound

TINY = 2.0**-149  # fp32's subnormal spacing: the absolute error of a quotient rounded there


def _bracket(exact: np.ndarray, err: np.ndarray) -> Bracket:
    """Every fp32 value within err of exact (rounded outward); a non-finite exact value must be met exactly."""
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(exact) & np.isfinite(err)
        lo, hi = _round_outward(np.where(finite, exact - err, 0.0), np.where(finite, exact + err, 0.0))
    return Bracket(exact=exact, low=np.where(finite, lo, exact), high=np.where(finite, hi, exact))


# -- mhc.norm_fn -------------------------------------------------------------------------


def given_norm_fn_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict:
    """grad_fn: the exact product (ulp 0.5); grad_normw: within the summation bound of its M products."""
    g, fn = _np(cotangents["out_fn"]), _np(case.inputs["fn"])
    with np.errstate(invalid="ignore", over="ignore"):
        magnitude = np.abs(g * fn).sum(0)
    rows = fn.shape[0]
    err = summation_error(magnitude, rows, roundings_per_term=1, absolute=rows * FP32_UNDERFLOW)
    return {"grad_fn": exact["grad_fn"], "grad_normw": _bracket(_np(exact["grad_normw"]), err)}


# -- mhc.reduce_partials_and_rmsnorm ------------------------------------------------------


def rms_factor_error(sqrsum_splitted: np.ndarray, eps: float) -> np.ndarray:
    """The relative error bound of an fp32 r = (sqrsum / size + eps)^(-1/2), per (N, G).

    sqrsum sums S non-negative partials (relative gamma_{S-1}); / size and + eps round once each,
    eps itself is rounded to fp32, and 1 / size may be rounded first (4 u); a quotient in the
    subnormal range errs by TINY absolute, TINY / eps relative; the square root halves all that,
    and an approximate rsqrt adds RHO (or sqrt and a division, 2 u)."""
    splits = sqrsum_splitted.shape[0]
    return 0.5 * (gamma(max(splits - 1, 0)) + 4 * U + TINY / eps) + RHO


def _out_mul_magnitude(out_mul_splitted: np.ndarray) -> np.ndarray:
    """sum_s |P_s| (N, G, M): the magnitude that bounds out_mul's fp32 summation error."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.abs(out_mul_splitted).sum(0)


def given_reduce(case: Case, actual: dict[str, Any]) -> dict[str, Bracket]:
    """out_mul and sqrsum: the summation bound of S terms; out: of G terms out_mul_g r_g, each carrying
    out_mul's and r's errors (docs/contract/mhc_fused.md#mhc.reduce_partials_and_rmsnorm)."""
    p, q = _np(case.inputs["out_mul_splitted"]), _np(case.inputs["sqrsum_splitted"])
    size, eps = case.params["rms_group_size"], case.params["rms_eps"]
    out_mul, sqrsum, out = (_np(t) for t in ref.reduce_partials_and_rmsnorm(p, q, size, eps))
    splits, groups = p.shape[0], p.shape[2]
    magnitude_p = _out_mul_magnitude(p)
    with np.errstate(invalid="ignore", over="ignore"):
        magnitude_q = np.abs(q).sum(0)
        r = _np(ref.rms_factor(sqrsum, size, eps))
        magnitude_out = (magnitude_p * r[..., None]).sum(1)
    e_r = rms_factor_error(q, eps)
    term_error = (1 + gamma(max(splits - 1, 0))) * (1 + e_r) - 1
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 in the magnitudes of non-finite tokens
        return {
            "out_mul": _bracket(out_mul, summation_error(magnitude_p, splits, roundings_per_term=0)),
            "sqrsum": _bracket(sqrsum, summation_error(magnitude_q, splits, roundings_per_term=0)),
            "out": _bracket(out, summation_error(magnitude_out, groups, roundings_per_term=1, term_error=term_error,
                                                 absolute=groups * FP32_UNDERFLOW)),
        }


def given_reduce_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict:
    """grad_out_mul = G r (r's error and one rounding); grad_sqrsum = c sum_j G_j out_mul_j with
    c = -r^3 / (2 size): the summation bound of M products whose out_mul factor carries its own
    summation error, and the error of c and of the product by it (3 e_r and six roundings)."""
    p, q = _np(case.inputs["out_mul_splitted"]), _np(case.inputs["sqrsum_splitted"])
    size, eps = case.params["rms_group_size"], case.params["rms_eps"]
    g = _np(cotangents["out"])
    splits, width = p.shape[0], p.shape[-1]
    r = _np(ref.rms_factor(q.sum(0), size, eps))
    e_r = rms_factor_error(q, eps)
    with np.errstate(invalid="ignore", over="ignore"):
        err_out_mul = summation_error(np.abs(g[:, None, :]) * r[..., None], 1, roundings_per_term=1, term_error=e_r)
        c = np.abs(r**3 / (2 * size))
        magnitude = (np.abs(g[:, None, :]) * _out_mul_magnitude(p)).sum(-1)
    term_error = (1 + gamma(max(splits - 1, 0))) * (1 + 3 * e_r + 6 * U) - 1
    err_sqrsum = c * summation_error(magnitude, width, roundings_per_term=1, term_error=term_error,
                                     absolute=width * FP32_UNDERFLOW) + FP32_UNDERFLOW
    grad_p, grad_q = (_np(exact[k]) for k in ("grad_out_mul_splitted", "grad_sqrsum_splitted"))
    return {"grad_out_mul_splitted": _bracket(grad_p, np.broadcast_to(err_out_mul, grad_p.shape)),
            "grad_sqrsum_splitted": _bracket(grad_q, np.broadcast_to(err_sqrsum, grad_q.shape))}


def fd_scale_reduce(case: Case) -> dict[str, torch.Tensor]:
    """Finite-difference steps relative to each partial: 1/8 of |P_s| + 2^-6 of the largest partial of the
    token (so that zero partials move too), and 1/8 of Q_s (a relative step keeps sqrsum >= 0; a zero
    row's sqrsum stays at its kink-free 0 + eps)."""
    p, q = _np(case.inputs["out_mul_splitted"]), _np(case.inputs["sqrsum_splitted"])
    big = np.abs(p).max(axis=(0, 2, 3), keepdims=True) if p.size else 0.0
    return {"out_mul_splitted": torch.from_numpy(np.abs(p) / 8 + big * 2.0**-6),
            "sqrsum_splitted": torch.from_numpy(np.abs(q) / 8)}


# -- mhc.multilayer_recompute -------------------------------------------------------------


def _stacked(bounds: list[ErrorBound], shape: tuple[int, ...]) -> ErrorBound:
    """One ErrorBound of the layers' bounds stacked on a new first axis (shape: that of an empty stack)."""
    if not bounds:
        return ErrorBound(np.zeros(shape), np.zeros(shape), "bf16")
    reach = (np.stack([b.reach[0] for b in bounds]), np.stack([b.reach[1] for b in bounds]))
    return ErrorBound(np.stack([b.exact for b in bounds]), np.stack([b.error for b in bounds]), "bf16", reach)


def given_recompute(case: Case, actual: dict[str, Any]) -> dict[str, ErrorBound]:
    """Layer l's sums bounded as pre_apply_mix's and post's (docs/contract/mhc.md), from the residual
    the implementation wrote for layer l - 1 (the initial one for layer 0): a legitimate rounding of
    one layer is then never charged to the next.  Where the implementation's residual has the wrong
    shape, the oracle's stands in (the residual output fails on its own)."""
    inputs = {k: _np(v) for k, v in case.inputs.items()}
    pre, outputs, post, comb = (inputs[k] for k in ("pre_mix", "layer_output", "post_mix", "comb_mix"))
    layers, posts = pre.shape[0], outputs.shape[0]
    theirs = actual.get("residual")
    tokens, m, hidden = inputs["initial_residual"].shape
    if not isinstance(theirs, torch.Tensor) or tuple(theirs.shape) != (posts, tokens, m, hidden):
        theirs = ref.multilayer_recompute(**case.inputs)[1]  # the oracle's, only where theirs cannot stand in
    theirs = _np(theirs)
    residual = inputs["initial_residual"]
    applied, posted = [], []
    for layer in range(layers):
        x, mix = residual[None], pre[layer][None, ..., None]
        terms = [t[0] for t in ref_mhc.pre_apply_mix_terms(x, mix)]
        applied.append(_sum_bound(ref_mhc.pre_apply_mix(x, mix)[0], terms))
        if layer < posts:
            args = (outputs[layer][None], residual[None], post[layer][None, ..., None], comb[layer][None])
            posted.append(_sum_bound(ref_mhc.post(*args)[0], [t[0] for t in ref_mhc.post_terms(*args)]))
            residual = theirs[layer]
    return {"layer_input": _stacked(applied, (0, tokens, hidden)), "residual": _stacked(posted, (0, tokens, m, hidden))}


# -- benchmark shapes: a 1, b 16384 tokens, m 4, H 7168 (tile-kernels' defaults: 16 splits) ------

BENCH_TOKENS, BENCH_M, BENCH_HIDDEN, BENCH_SPLITS = 16384, 4, 7168, 16
BENCH_WIDTH, BENCH_K = BENCH_M * (BENCH_M + 2), BENCH_M * BENCH_HIDDEN


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _merge_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return {"fn": torch.randn(BENCH_WIDTH, BENCH_K, device=device),
            "normw": 1 + 0.1 * torch.randn(BENCH_K, device=device)}, {}


def _merge_bwd_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    inputs, params = _merge_inputs(device)
    return {"grad_out_fn": torch.randn_like(inputs["fn"]), **inputs}, params


def _reduce_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    partials = torch.randn(BENCH_SPLITS, BENCH_TOKENS, 1, BENCH_WIDTH, device=device)
    squares = torch.rand(BENCH_SPLITS, BENCH_TOKENS, 1, device=device) * BENCH_K / BENCH_SPLITS
    return ({"out_mul_splitted": partials, "sqrsum_splitted": squares},
            {"rms_group_size": BENCH_K, "rms_eps": 1e-6})


def _reduce_bwd_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    inputs, params = _reduce_inputs(device)
    out_mul, sqrsum, _ = ref.reduce_partials_and_rmsnorm(inputs["out_mul_splitted"].cpu(),
                                                         inputs["sqrsum_splitted"].cpu(), **params)
    return {"grad_out": torch.randn(BENCH_TOKENS, BENCH_WIDTH, device=device), **inputs,
            "out_mul": out_mul.float().to(device), "sqrsum": sqrsum.float().to(device)}, params


def _reduce_nbytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    splits, tokens, groups, width = inputs["out_mul_splitted"].shape
    return _nbytes(*inputs.values()) + tokens * (groups * width + groups + width) * 4


def _reduce_bwd_nbytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    """Every argument once (the bench counts what a call is handed; the partials' shapes only are used,
    so this overstates the traffic and the shape is judged by time) and the sums' gradients written."""
    return _nbytes(*inputs.values()) + _nbytes(inputs["out_mul"], inputs["sqrsum"])


RECOMPUTE_LAYERS = 2  # one transformer block: attention and FFN


def _recompute_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    lead, layers, m = (BENCH_TOKENS,), RECOMPUTE_LAYERS, BENCH_M
    return {"initial_residual": torch.randn(*lead, m, BENCH_HIDDEN, device=device, dtype=torch.bfloat16),
            "pre_mix": torch.rand(layers, *lead, m, device=device),
            "layer_output": torch.randn(layers, *lead, BENCH_HIDDEN, device=device, dtype=torch.bfloat16),
            "post_mix": torch.rand(layers, *lead, m, device=device) * 2,
            "comb_mix": torch.rand(layers, *lead, m, m, device=device) / m}, {}


def _recompute_nbytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    """The inputs and the outputs (layer_input (L, N, H), residual (P, N, m, H), bf16), each once."""
    layers = inputs["pre_mix"].shape[0]
    per_layer = inputs["layer_output"][0].numel() + inputs["initial_residual"].numel()
    return _nbytes(*inputs.values()) + layers * per_layer * 2


_SHAPE = f"fn f32 ({BENCH_WIDTH}, {BENCH_K}): m {BENCH_M}, H {BENCH_HIDDEN}"
_REDUCE_SHAPE = f"S {BENCH_SPLITS}, b {BENCH_TOKENS}, G 1, M {BENCH_WIDTH}, size {BENCH_K}"


def _impls(name: str) -> dict:
    return {"torch": torch_impl(f"kernels.torch.mhc_fused:{name}"),
            "tilelang": tilelang_impl(f"kernels.mhc.fused_norm:{name}")}


_EXACT_PRODUCT = ulp("fp32", 0.5)

register(OpSpec(
    name="mhc.norm_fn",
    oracle=ref.fn_normw_merge,
    strategy=strategies.mhc_fused.fn_normw_merge_cases,
    outputs={"out_fn": _EXACT_PRODUCT},
    impls=_impls("fn_normw_merge"),
    doc="mHC: the RMSNorm weight folded into the mix projection, out_fn[j, k] = fn[j, k] * normw[k].",
    # a few MB: the launch dominates, so it is judged by time
    bench=(BenchShape(_SHAPE, _merge_inputs, lambda inputs, params: 2 * _nbytes(inputs["fn"]), target=None),),
    backward=Backward(
        inputs=("fn", "normw"),
        grads={"grad_fn": _EXACT_PRODUCT, "grad_normw": Fp32Within("fp32", bound="the summation bound of M products")},
        outputs=("out_fn",),
        oracle=ref.fn_normw_merge_bwd,
        forward=ref.fn_normw_merge,
        impls=_impls("fn_normw_merge_bwd"),
        grad_dtype=torch.float32,
        given=given_norm_fn_backward,
        bench=(BenchShape(_SHAPE, _merge_bwd_inputs, lambda inputs, params: 4 * _nbytes(inputs["fn"]), target=None),),
    ),
))

_SUM_BOUND = Fp32Within("fp32", bound="the summation bound of the split partials (and r's error model)")

register(OpSpec(
    name="mhc.reduce_partials_and_rmsnorm",
    oracle=ref.reduce_partials_and_rmsnorm,
    strategy=strategies.mhc_fused.reduce_partials_and_rmsnorm_cases,
    outputs={"out_mul": _SUM_BOUND, "sqrsum": _SUM_BOUND, "out": _SUM_BOUND},
    impls=_impls("reduce_partials_and_rmsnorm"),
    given=given_reduce,
    doc="mHC: split-K partials summed, out = sum_g out_mul_g / sqrt(sqrsum_g / rms_group_size + rms_eps).",
    bench=(BenchShape(_REDUCE_SHAPE, _reduce_inputs, _reduce_nbytes, target=0.9, row_local=True,
                      token_axis=("out_mul_splitted", 1)),),
    backward=Backward(
        inputs=("out_mul_splitted", "sqrsum_splitted"),
        grads={"grad_out_mul_splitted": _SUM_BOUND, "grad_sqrsum_splitted": _SUM_BOUND},
        outputs=("out",),
        oracle=ref.reduce_partials_and_rmsnorm_bwd,
        forward=ref.reduce_partials_and_rmsnorm,
        impls=_impls("reduce_partials_and_rmsnorm_bwd"),
        saved=("out_mul", "sqrsum"),
        grad_dtype=torch.float32,
        fd_scale=fd_scale_reduce,
        given=given_reduce_backward,
        bench=(BenchShape(_REDUCE_SHAPE, _reduce_bwd_inputs, _reduce_bwd_nbytes, target=None),),
    ),
))

register(OpSpec(
    name="mhc.multilayer_recompute",
    oracle=ref.multilayer_recompute,
    strategy=strategies.mhc_fused.multilayer_recompute_cases,
    outputs={"layer_input": summation("bf16"), "residual": summation("bf16")},
    impls={"torch": torch_impl("kernels.torch.mhc_fused:multilayer_recompute"),
           "tilelang": tilelang_impl("kernels.mhc.fused_recompute:multilayer_recompute")},
    given=given_recompute,
    doc="mHC: per layer, layer_input = pre_apply_mix(residual, pre_mix), then residual = post(layer_output, "
        "residual, post_mix, comb_mix), the next layer's residual.",
    bench=(BenchShape(f"{RECOMPUTE_LAYERS} layers, b {BENCH_TOKENS}, m {BENCH_M}, H {BENCH_HIDDEN} bf16",
                      _recompute_inputs, _recompute_nbytes, target=0.9, row_local=True),),
))
