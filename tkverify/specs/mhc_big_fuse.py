"""mHC's fused pre-block forward, mhc.pre_big_fuse (the split-K partials reduced with the RMS factor,
the mixes split, Sinkhorn, the pre-mix applied, in one call; forward only), and how each output is
judged.

What the op computes and the error analysis behind every bound here are
docs/contract/mhc_big_fuse.md; the signature and argument checks are kernels/torch/mhc_big_fuse.py's.
Each output is judged by the policy of the stage that produces it, with the error of the stages
before it carried in as an interval of that stage's input:

* the mixes (not an output) lie in mhc.reduce_partials_and_rmsnorm's bracket of out (`given_reduce`),
  widened by 2 u for the order of the product of out_mul, r and the scale (`mixes_bracket`);
* u = mixes * s + base lies in the union of pre_split_mixes' u brackets (`logit_bracket`) at the two
  ends of the mixes' interval: u is monotone in mixes (`logit_interval`);
* post_mix: pre_split_mixes' post bracket from that u interval (`within`, fp32);
* comb_mix: Sinkhorn's relative bound per matrix (`forward_bound`) plus K times the log-perturbation
  2 max |du| that the u interval puts on the softmax (`within`, fp32);
* layer_input: pre_apply_mix's summation bound with the pre weights anywhere in their bracket: the
  spread of the weights times |residual| is added to the error (`summation`, bf16).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import references.mhc as ref_mhc
import references.mhc_big_fuse as ref
import strategies.mhc_big_fuse
from tkverify.case import Case
from tkverify.policies import FP32_UNDERFLOW, Bracket, ErrorBound, signed_reach, summation, summation_error
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.mhc import (K, U, Fp32Within, _both_roundings, _np, _round_outward, _sigmoid_bracket,
                                forward_bound, logit_bracket)
from tkverify.specs.mhc_fused import given_reduce

ORDER_SLACK = 2 * U  # r may meet the scale before the partials' sum: one more rounding of the product's order


def _reduce_case(case: Case) -> Case:
    """The case of mhc.reduce_partials_and_rmsnorm this op's first stage is: one RMS group of m H values."""
    _, m, hidden = case.inputs["residual"].shape
    return Case(params={"rms_group_size": m * hidden, "rms_eps": case.params["rms_eps"]},
                inputs={"out_mul_splitted": case.inputs["gemm_out_mul"][:, :, None],
                        "sqrsum_splitted": case.inputs["gemm_out_sqrsum"][:, :, None]})


def mixes_bracket(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) (N, M): the fp32 mixes an implementation may hold, the reduction's bracket of out widened
    by ORDER_SLACK; a non-finite exact value stays itself."""
    out = given_reduce(_reduce_case(case), {})["out"]
    low, high = _np(out.low), _np(out.high)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(low) & np.isfinite(high)
        lo, hi = _round_outward(low - np.abs(low) * ORDER_SLACK, high + np.abs(high) * ORDER_SLACK)
    return np.where(finite, lo, low), np.where(finite, hi, high)


def logit_interval(case: Case, exact_u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u_lo, u_hi) (N, M): every fp32 u of pre_split_mixes (an fma or a product and a sum) of any mixes in
    `mixes_bracket`.  NaN where u must be NaN; [-inf, inf] where the exact u is a number but an end of the
    interval is not (inf * 0 of a zero scale at an infinite end)."""
    m = case.inputs["residual"].shape[1]
    scale, base = case.inputs["scale"], case.inputs["base"]
    low, high = mixes_bracket(case)
    _, lo_a, hi_a = logit_bracket(low[None], scale, base, m)
    _, lo_b, hi_b = logit_bracket(high[None], scale, base, m)
    u_lo, u_hi = np.minimum(lo_a, lo_b)[0], np.maximum(hi_a, hi_b)[0]
    loose = ~np.isnan(exact_u) & (np.isnan(u_lo) | np.isnan(u_hi))
    return np.where(loose, -np.inf, u_lo), np.where(loose, np.inf, u_hi)


def _post_bracket(exact: np.ndarray, u_lo: np.ndarray, u_hi: np.ndarray, post_mult: float) -> Bracket:
    """pre_split_mixes' post: the fp32 sigmoid of any u in the interval, times post_mult (as given or in fp32)."""
    q_lo, q_hi = _sigmoid_bracket(u_lo, u_hi)
    with np.errstate(invalid="ignore"):
        corners = [q * k for q in (q_lo, q_hi) for k in _both_roundings(post_mult)]
    lo, hi = _round_outward(np.minimum.reduce(corners), np.maximum.reduce(corners))
    return Bracket(exact=exact, low=lo, high=hi)


def pre_interval(u_lo: np.ndarray, u_hi: np.ndarray, pre_eps: float) -> tuple[np.ndarray, np.ndarray]:
    """pre_split_mixes' pre bracket over the u interval: RN(sigmoid + pre_eps), pre_eps as given or in fp32."""
    s_lo, s_hi = _sigmoid_bracket(u_lo, u_hi)
    e_lo, e_hi = _both_roundings(pre_eps)
    return _round_outward(s_lo + e_lo, s_hi + e_hi)


def comb_bracket(exact: np.ndarray, logits: np.ndarray, u_lo: np.ndarray, u_hi: np.ndarray, repeat: int,
                 eps: float) -> Bracket:
    """Sinkhorn's bound B per matrix (`forward_bound`) plus K times 2 max |u_hat - u| over the matrix: a
    log-perturbation d of the logits moves the log of every softmax weight by at most 2 max |d| (its own
    d less the row's weighted mean), which + eps only damps; the normalisations carry it with the gain
    K, as they carry the softmax's own error.  The result lies in [P e^-B', P e^B'] (first order
    1 -+ B'); a matrix whose interval is not finite is unconstrained, and a NaN matrix must be NaN."""
    with np.errstate(invalid="ignore"):
        spread = np.where(u_lo == u_hi, 0.0, np.fmax(u_hi - logits, logits - u_lo))
    spread = np.where(np.isnan(spread) & ~np.isnan(logits), np.inf, np.nan_to_num(spread, nan=0.0))
    worst = spread.max(axis=(-1, -2), keepdims=True) if spread.size else np.zeros(spread.shape[:-2] + (1, 1))
    with np.errstate(invalid="ignore", over="ignore"):
        b = forward_bound(logits, repeat, eps) + K * 2 * worst
        low, high = exact * np.maximum(1 - b, 0.0), exact * np.exp(b)
    free = np.broadcast_to(~np.isfinite(b), exact.shape) & ~np.isnan(exact)
    nan = np.isnan(exact)
    return Bracket(exact=exact, low=np.where(nan, np.nan, np.where(free, -np.inf, low)),
                   high=np.where(nan, np.nan, np.where(free, np.inf, high)))


def layer_input_bound(exact: np.ndarray, residual: np.ndarray, pre: np.ndarray, pre_lo: np.ndarray,
                      pre_hi: np.ndarray) -> ErrorBound:
    """pre_apply_mix's summation bound (m products, each rounded once, any order) with weights anywhere in
    [pre_lo, pre_hi]: error = sum_i |x_i| max(pre_hi - pre, pre - pre_lo) (the weights' spread) + the
    summation error of the terms at the largest weights."""
    with np.errstate(invalid="ignore", over="ignore"):
        spread = np.fmax(pre_hi - pre, pre - pre_lo)[..., None]
        largest = np.fmax(np.abs(pre_lo), np.abs(pre_hi))[..., None]
        ax = np.abs(residual)
        m = residual.shape[1]
        error = (ax * spread).sum(1) + summation_error((ax * largest).sum(1), m, roundings_per_term=1,
                                                         absolute=m * FP32_UNDERFLOW)
        terms = np.moveaxis(residual * largest, 1, 0)
    error = np.where(np.isnan(error), np.inf, error)
    return ErrorBound(exact, error, "bf16", signed_reach(terms, m, roundings_per_term=1))


def given_big_fuse(case: Case, actual: dict[str, Any]) -> dict[str, Any]:
    """The three outputs' brackets, each stage's policy with the earlier stages' error carried in (module
    docstring; docs/contract/mhc_big_fuse.md#mhc.pre_big_fuse)."""
    params, m = case.params, case.inputs["residual"].shape[1]
    exact = ref.stages(**case.inputs, **params)
    u = ref_mhc.mix_logits(exact["mixes"][None], case.inputs["scale"], case.inputs["base"], m)[0]
    u_lo, u_hi = logit_interval(case, u)
    pre_lo, pre_hi = pre_interval(u_lo[:, :m], u_hi[:, :m], params["pre_eps"])
    comb_shape = exact["comb"].shape
    return {
        "post_mix": _post_bracket(exact["post"], u_lo[:, m:2 * m], u_hi[:, m:2 * m], params["post_mult"]),
        "comb_mix": comb_bracket(exact["comb"], exact["comb_logits"], u_lo[:, 2 * m:].reshape(comb_shape),
                                 u_hi[:, 2 * m:].reshape(comb_shape), params["sinkhorn_repeat"],
                                 params["sinkhorn_eps"]),
        "layer_input": layer_input_bound(exact["layer_input"], _np(case.inputs["residual"]), exact["pre"], pre_lo,
                                         pre_hi),
    }


# -- benchmark shape: tile-kernels' pre-block, b 16384 tokens, m 4, H 7168, 16 splits -----------

BENCH_TOKENS, BENCH_M, BENCH_HIDDEN, BENCH_SPLITS = 16384, 4, 7168, 16
BENCH_WIDTH = BENCH_M * (BENCH_M + 2)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _bench_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    k = BENCH_M * BENCH_HIDDEN
    residual = torch.randn(BENCH_TOKENS, BENCH_M, BENCH_HIDDEN, device=device, dtype=torch.bfloat16)
    inputs = {"gemm_out_mul": torch.randn(BENCH_SPLITS, BENCH_TOKENS, BENCH_WIDTH, device=device),
              "gemm_out_sqrsum": torch.rand(BENCH_SPLITS, BENCH_TOKENS, device=device) * k / BENCH_SPLITS,
              "scale": torch.rand(3, device=device), "base": torch.randn(BENCH_WIDTH, device=device),
              "residual": residual}
    return inputs, {"rms_eps": 1e-6, "pre_eps": 1e-6, "sinkhorn_eps": 1e-6, "post_mult": 2.0, "sinkhorn_repeat": 10}


def _bench_nbytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    """Every input once and the outputs (post_mix, comb_mix fp32, layer_input bf16) once."""
    tokens, m, hidden = inputs["residual"].shape
    return _nbytes(*inputs.values()) + tokens * ((m + m * m) * 4 + hidden * 2)


_POST_POLICY = Fp32Within("fp32", bound="pre_split_mixes' post bracket over the reduction's interval of the mixes")
_COMB_POLICY = Fp32Within("fp32", sums=True,
                          bound="Sinkhorn's per-matrix bound plus the logits' interval carried through the softmax")

register(OpSpec(
    name="mhc.pre_big_fuse",
    oracle=ref.pre_big_fuse,
    strategy=strategies.mhc_big_fuse.pre_big_fuse_cases,
    outputs={"post_mix": _POST_POLICY, "comb_mix": _COMB_POLICY, "layer_input": summation("bf16")},
    impls={"torch": torch_impl("kernels.torch.mhc_big_fuse:pre_big_fuse"),
           "tilelang": tilelang_impl("kernels.mhc.big_fuse:pre_big_fuse")},
    given=given_big_fuse,
    doc="mHC's pre-block forward in one call: mixes = RMS-normalised sum of the split partials; post_mix, and "
        "comb_mix = sinkhorn of the comb logits, from pre_split_mixes; layer_input = pre_apply_mix(residual, pre).",
    # The TileLang implementation composes the four stages' kernels (no fused kernel): judged by time.
    bench=(BenchShape(f"S {BENCH_SPLITS}, b {BENCH_TOKENS}, m {BENCH_M}, H {BENCH_HIDDEN} bf16, repeat 10",
                      _bench_inputs, _bench_nbytes, target=None, row_local=True, token_axis=("residual", 0)),),
))
