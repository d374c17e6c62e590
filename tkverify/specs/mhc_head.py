"""The two ends of the mHC stack, forward and backward, and how each is judged:
mhc.expand_to_mhc (x copied into m residual streams) and mhc.head_compute_mix (the output
head's mix weights).

What each op computes, its edge semantics and the error analyses behind every bound here are
docs/contract/mhc.md (sections mhc.expand_to_mhc and mhc.head_compute_mix); signatures and
argument checks are kernels/torch/mhc_head.py's.  expand_to_mhc's output is judged bitwise, its
gradient (a sum of m bf16 values in fp32, rounded once) by `summation`.  head_compute_mix's
output is judged by `within` against the brackets of u and of the fp32 sigmoid that
mhc.pre_split_mixes uses (`given_head`); its gradients by `within` against per-element bounds
from the fp32 error model of the slope t = grad * sigmoid'(u) (`slope_error`), the sums over
tokens with the summation bound (`summation_error`).

Input classes (the differential suite tags each judged case ``class: <name>``, computed from its
tensors by `strategies.classes.case_classes`; ``<class>:<input>`` names the input), those each strategy
reaches under the ci profile (tests/test_classes.py):

* mhc.expand_to_mhc: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``signed_zero_tie:x``, ``subnormal:x``.
* mhc.head_compute_mix: ``empty``, ``neg_zero:base``, ``neg_zero:scale``, ``non_pow2``, ``single_row``,
  ``zero_row:scale``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import references.mhc_head as ref
import strategies.mhc_head
from tkverify import formats
from tkverify.case import Case
from tkverify.policies import (FP32_UNDERFLOW, Bracket, ErrorBound, bitwise, gamma, signed_reach, summation,
                               summation_error)
from tkverify.registry import Backward, BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.mhc import (BENCH_HIDDEN, BENCH_M, BENCH_TOKENS, U, Fp32Within, _both_roundings,
                                _nbytes, _np, _round_outward, _sigmoid_bracket, slope_bound)


def _impls(module: str, name: str) -> dict:
    return {"torch": torch_impl(f"kernels.torch.mhc_head:{name}"),
            "tilelang": tilelang_impl(f"kernels.mhc.{module}:{name}")}


# -- expand_to_mhc -----------------------------------------------------------------------------


def given_expand_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict:
    """grad_x: m bf16 terms (exact in fp32, r = 0) summed in fp32 in any order, rounded once to bf16."""
    terms = ref.expand_to_mhc_terms(cotangents["out"])
    m = len(terms)
    magnitude = np.sum([np.abs(t) for t in terms], axis=0)
    error = summation_error(magnitude, m, roundings_per_term=0)
    return {"grad_x": ErrorBound(_np(exact["grad_x"]), error, "bf16", signed_reach(terms, m, roundings_per_term=0))}


def expand_mask(case: Case, margin: float | None) -> dict[str, np.ndarray]:
    """The streams of a non-finite x element (outside the gradient's domain); the op has no kinks."""
    x = _np(case.inputs["x"])
    return {"out": ~np.isfinite(x)[..., None, :]}


def expand_fd_scale(case: Case) -> dict[str, torch.Tensor]:
    """The op is linear: a unit step of 1 + |x| per finite element, none on a non-finite one."""
    x = _np(case.inputs["x"])
    return {"x": torch.from_numpy(np.where(np.isfinite(x), 1.0 + np.abs(x), 0.0))}


def _expand_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    x = torch.randn(1, BENCH_TOKENS, BENCH_HIDDEN, device=device, dtype=torch.bfloat16)
    return {"x": x}, {"m": BENCH_M}


def _expand_bwd_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    inputs, params = _expand_inputs(device)
    grad_out = torch.randn(1, BENCH_TOKENS, BENCH_M, BENCH_HIDDEN, device=device, dtype=torch.bfloat16)
    return {"grad_out": grad_out, **inputs}, params


_EXPAND_SHAPE = f"a 1, b {BENCH_TOKENS}, m {BENCH_M}, H {BENCH_HIDDEN} bf16"

register(OpSpec(
    name="mhc.expand_to_mhc",
    oracle=ref.expand_to_mhc,
    strategy=strategies.mhc_head.expand_to_mhc_cases,
    outputs={"out": bitwise(torch.bfloat16)},
    impls=_impls("expand", "expand_to_mhc"),
    doc="mHC entry: out[..., k, :] = x for k < m (bf16 copied); backward: the sum of the m streams, fp32 "
        "accumulation, bf16 output.",
    bench=(BenchShape(_EXPAND_SHAPE, _expand_inputs,
                      lambda inputs, params: _nbytes(inputs["x"]) * (1 + params["m"]),
                      written=lambda inputs, params: _nbytes(inputs["x"]) * params["m"], target=0.9,
                      row_local=True),),
    backward=Backward(
        inputs=("x",),
        grads={"grad_x": summation("bf16")},
        outputs=("out",),
        oracle=ref.expand_to_mhc_bwd,
        impls=_impls("expand", "expand_to_mhc_bwd"),
        grad_dtype=torch.bfloat16,
        mask=expand_mask,
        fd_scale=expand_fd_scale,
        given=given_expand_backward,
        bench=(BenchShape(_EXPAND_SHAPE, _expand_bwd_inputs,
                          lambda inputs, params: _nbytes(inputs["grad_out"], inputs["x"]),  # grad_x: x's size
                          written=lambda inputs, params: _nbytes(inputs["x"]), target=0.9),),
    ),
))


# -- head_compute_mix ----------------------------------------------------------------------------


def head_logit_bracket(mixes: Any, scale: Any, base: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exact u, lowest, highest fp32 u): an fma RN(p + base) or a product and a sum RN(RN(p) + base),
    p = mixes * scale[0] exact in float64 (docs/contract/mhc.md#mhc.pre_split_mixes, "u")."""
    u = ref.head_logits(mixes, scale, base)
    with np.errstate(over="ignore", invalid="ignore"):
        p = _np(mixes) * _np(scale)[0]
        two_step = p.astype(np.float32).astype(np.float64) + _np(base)
    nan = np.isnan(u) | np.isnan(two_step)
    lo, hi = _round_outward(np.fmin(u, two_step), np.fmax(u, two_step))
    return u, np.where(nan, np.nan, lo), np.where(nan, np.nan, hi)


def _sigmoid_range(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exact u, lowest, highest fp32 sigmoid of the fp32 u): the sigmoid model, clipped to [0, 1]."""
    u, lo, hi = head_logit_bracket(case.inputs["mixes"], case.inputs["scale"], case.inputs["base"])
    s_lo, s_hi = _sigmoid_bracket(lo, hi)
    return u, np.clip(s_lo, 0.0, 1.0), np.clip(s_hi, 0.0, 1.0)


def given_head(case: Case, actual: dict[str, Any]) -> dict[str, Bracket]:
    """mix = RN(sigmoid + pre_eps), pre_eps as given or rounded to fp32 (docs/contract/mhc.md#mhc.head_compute_mix)."""
    exact = ref.head_compute_mix(**case.inputs, **case.params)
    u, s_lo, s_hi = _sigmoid_range(case)
    e_lo, e_hi = _both_roundings(case.params["pre_eps"])
    lo, hi = _round_outward(s_lo + e_lo, s_hi + e_hi)
    nan = np.isnan(u)
    return {"mix": Bracket(exact=exact, low=np.where(nan, np.nan, lo), high=np.where(nan, np.nan, hi))}


def slope_error(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """(exact sigmoid'(u), the most an fp32 slope may be off it), per element: `slope_bound` over the
    fp32 sigmoid's range (`_sigmoid_range`)."""
    return slope_bound(*_sigmoid_range(case))


def given_head_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict:
    """Brackets of the three gradients (docs/contract/mhc.md#mhc.head_compute_mix, "Backward").

    t = RN(g D): |t_hat - g D| <= e_t = |g| e_D (1 + u) + u |g| D + 2^-150.  grad_mixes = RN(t s)
    (or RN(RN(g s) D)): |g s| (e_D (1 + gamma_2) + gamma_2 D) + 2^-150 (1 + |s|).  grad_base: the
    summation bound of the exact terms g D with the absolute term errors e_t; grad_scale likewise of
    g D x, each product rounded once more (r = 1), term errors |x| e_t (1 + u)."""
    g = _np(cotangents["mix"])
    x, s = _np(case.inputs["mixes"]), float(_np(case.inputs["scale"])[0])
    d, e_d = slope_error(case)
    m = x.shape[-1]
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.abs(g * d)
        e_t = np.abs(g) * e_d * (1 + U) + U * t + FP32_UNDERFLOW
        e_x = np.abs(g * s) * (e_d * (1 + gamma(2)) + gamma(2) * d) + FP32_UNDERFLOW * (1 + abs(s))
        tokens = t.size // m if m else 0
        e_base = summation_error(t.reshape(-1, m).sum(0), tokens, roundings_per_term=0,
                                 absolute=e_t.reshape(-1, m).sum(0))
        e_scale = summation_error(np.array([(t * np.abs(x)).sum()]), t.size, roundings_per_term=1,
                                  absolute=np.array([(np.abs(x) * e_t * (1 + U)).sum() + t.size * FP32_UNDERFLOW]))

        # The sums over tokens, by sign: a partial sum of one sign's terms may overflow fp32 (to that
        # infinity) although the exact sum is finite (`signed_reach`).
        signed = g * d
        reach_base = signed_reach(signed.reshape(-1, m), tokens, roundings_per_term=0)
        reach_scale = signed_reach((signed * x).reshape(-1, 1), t.size, roundings_per_term=1)

    def bracket(name: str, error: np.ndarray, reach: tuple[np.ndarray, np.ndarray] | None = None) -> Bracket:
        value = _np(exact[name])
        nan = np.isnan(value)
        error = np.where(np.isfinite(error), error, np.inf)
        low, high = value - error, value + error
        if reach is not None:
            threshold = formats.FP32.overflow_threshold
            high = np.where(np.broadcast_to(reach[0], value.shape) >= threshold, np.inf, high)
            low = np.where(np.broadcast_to(reach[1], value.shape) >= threshold, -np.inf, low)
        return Bracket(exact=value, low=np.where(nan, np.nan, low), high=np.where(nan, np.nan, high))

    return {"grad_mixes": bracket("grad_mixes", e_x), "grad_scale": bracket("grad_scale", e_scale, reach_scale),
            "grad_base": bracket("grad_base", e_base, reach_base)}


MOVE = 2.0**-7  # a unit finite-difference step moves u by at most 1 + MOVE (|mixes scale| + |base|)


def head_fd_scale(case: Case) -> dict[str, torch.Tensor]:
    """Per-element unit steps, |v| + 2^-6 each on its own (a row may mix saturated mixes with ordinary
    ones), capped so that no u moves by more than w = 1 + MOVE (|mixes scale| + |base|): where u is
    the small difference of large parts (base ~ -mixes scale) a step relative to the parts would cross
    the sigmoid's curvature, and one much below w would drown in the float64 rounding of those parts."""
    x, s, b = (_np(case.inputs[name]) for name in ("mixes", "scale", "base"))
    m = b.shape[0]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        w = 1.0 + MOVE * (np.abs(x * s[0]) + np.abs(b))
        step_x = np.fmin(np.abs(x) + 2.0**-6, w / np.abs(s[0]))
        step_s = np.fmin(np.abs(s) + 2.0**-6, (w / np.abs(x)).min() if x.size else np.inf)
        step_b = np.fmin(np.abs(b) + 2.0**-6, w.reshape(-1, m).min(0) if x.size else np.inf)
    return {"mixes": torch.from_numpy(step_x), "scale": torch.from_numpy(step_s), "base": torch.from_numpy(step_b)}


UNRESOLVED = 2.0**16  # a unit step w beyond this: float64 differences cannot resolve an unsaturated u
SATURATED = 64.0  # |u| beyond this: sigmoid' < 2^-92, flat to every finite difference


def head_mask(case: Case, margin: float | None) -> dict[str, np.ndarray]:
    """No kinks and no domain limits (the op's strategy draws finite inputs), so nothing for the
    comparison with the float64 backward (margin None).  For finite differences: the elements whose
    u is the small difference of huge parts (w > UNRESOLVED) and not saturated, e.g. base = -RN(mixes
    scale) at 1e38: the float64 rounding of the parts swamps any step that stays on the sigmoid."""
    x = _np(case.inputs["mixes"])
    if margin is None:
        return {"mix": np.zeros(x.shape, dtype=bool)}
    s, b = _np(case.inputs["scale"]), _np(case.inputs["base"])
    with np.errstate(invalid="ignore", over="ignore"):
        w = 1.0 + MOVE * (np.abs(x * s[0]) + np.abs(b))
        u = ref.head_logits(x, s, b)
    return {"mix": (w > UNRESOLVED) & (np.abs(u) < SATURATED)}


def _head_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    inputs = {"mixes": torch.randn(1, BENCH_TOKENS, BENCH_M, device=device),
              "scale": torch.rand(1, device=device), "base": torch.randn(BENCH_M, device=device)}
    return inputs, {"pre_eps": 1e-6}


def _head_bwd_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    inputs, params = _head_inputs(device)
    return {"grad_mix": torch.randn_like(inputs["mixes"]), **inputs}, params


_HEAD_SHAPE = f"a 1, b {BENCH_TOKENS}, m {BENCH_M} fp32 (launch-bound: judged by time)"
_HEAD_POLICY = Fp32Within("fp32", bound="the fma-or-two-step bracket of u and the sigmoid model")
_HEAD_GRAD_POLICY = Fp32Within("fp32", bound="the fp32 slope model and the summation bound over tokens")

register(OpSpec(
    name="mhc.head_compute_mix",
    oracle=ref.head_compute_mix,
    strategy=strategies.mhc_head.head_compute_mix_cases,
    outputs={"mix": _HEAD_POLICY},
    impls=_impls("head_mix", "head_compute_mix"),
    given=given_head,
    doc="mHC output head: mix = sigmoid(mixes * scale + base) + pre_eps; backward: grad_mixes, and the scale "
        "and base gradients summed over tokens in fp32.",
    bench=(BenchShape(_HEAD_SHAPE, _head_inputs,
                      lambda inputs, params: 2 * _nbytes(inputs["mixes"]) + _nbytes(inputs["scale"], inputs["base"]),
                      target=None),),
    backward=Backward(
        inputs=("mixes", "scale", "base"),
        grads={"grad_mixes": _HEAD_GRAD_POLICY, "grad_scale": _HEAD_GRAD_POLICY, "grad_base": _HEAD_GRAD_POLICY},
        outputs=("mix",),
        oracle=ref.head_compute_mix_bwd,
        impls=_impls("head_mix", "head_compute_mix_bwd"),
        grad_dtype=torch.float32,
        mask=head_mask,
        fd_scale=head_fd_scale,
        given=given_head_backward,
        bench=(BenchShape(_HEAD_SHAPE, _head_bwd_inputs,
                          lambda inputs, params: 3 * _nbytes(inputs["mixes"])
                          + 2 * _nbytes(inputs["scale"], inputs["base"]), target=None),),
    ),
))
