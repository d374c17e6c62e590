"""The plain SwiGLU (quant.swiglu, with its backward), its backward fused with a per-token cast
(quant.swiglu_backward_and_per_token_cast) and its forward fused with a transposed per-channel cast
(quant.swiglu_forward_and_per_channel_cast_and_transpose): registrations, error analysis, judges.  What each
op computes: docs/contract/quant_swiglu.md.

Error analysis (every bound is an absolute allowance on the value before its one rounding to
the output format; the result must be a rounding of some value within it):

forward y = l' s r' w
    quant.swiglu_forward_and_per_token_cast's bound on an fp32 y (`swiglu_value_error`):
    2^-18 |y| plus 2^-125 (1 + |l|)(1 + |r|)(1 + |w|) below the normal range.

backward dl = g w r' s f, f = 1 + l' (1 - s); dr = g w l' s
    The same relative 2^-18 covers the products, exp and the reciprocal.  f cancels where
    l' (1 - s) is near -1 (l' ~ -1.28): 1 - s carries an absolute error of a few 2^-24, so f an
    absolute 2^-18 (1 + |l'|), not a relative one.  x dequantised in fp32 (codes * x_sf, one
    rounding unless x_sf is a power of two) moves l by 2^-24 |l|: the slopes of s f and of l s
    times that.  Below the normal range, floor = 2^-125 (1 + |g|)(1 + |w|)(1 + |l|)^2, times
    (1 + |r|) for dl (dr has no r factor: a NaN r leaves dr finite).

    dl error = 2^-18 |g w r'| (|s f| + s (1 + |l'|) + s (1 - s)(2 + |l'|) |l'|) + floor (1 + |r'|)
    dr error = 2^-18 |g w| (|l' s| + s |f| |l'|) + floor

Unconstrained elements (any value, NaN included): those whose l' or r' is infinite (the
derivative there depends on the formula: inf * 0), and those whose fp32 evaluation may overflow
in some order of the products (`may_overflow_fp32`, with the cotangent as one more factor).
Where x is dequantised with an sf that is not a power of two, an element within one fp32
rounding of the clamp may fall on either side of it: unconstrained too.

Input classes (the differential suite tags each judged case ``class: <name>``, computed from its
tensors by `strategies.quant_swiglu.named_classes` and `strategies.classes.case_classes`):

* quant.swiglu: ``empty``, ``nan:x``, ``neg_inf:x``, ``non_pow2``, ``padding``, ``pos_inf:x``,
  ``saturated_l``, ``single_row``, ``subnormal:x``.
* quant.swiglu_backward_and_per_token_cast: ``empty``, ``non_pow2``, ``padding``, ``pow2_x_sf``,
  ``saturated_l``, ``single_row``, ``zero_grad_row``.
* quant.swiglu_forward_and_per_channel_cast_and_transpose: ``empty``, ``nan:x``, ``non_pow2``,
  ``saturated_l``, ``single_row``.

The classes tests/test_classes.py holds each strategy to (``strategy.classes``) are those the quant
family's docstring (tkverify/specs/quant.py) lists; the named ones (``padding``, ``pow2_x_sf``,
``saturated_l``, ``zero_row``, ``zero_grad_row``) are tagged and counted besides.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import references.quant as qref
import references.quant_swiglu as ref
import strategies.quant_swiglu
from tkverify import benchshapes, formats
from tkverify.case import Case
from tkverify.policies import Bracket, Comparison, Within
from tkverify.registry import Backward, BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.quant_bench import SWIGLU_HIDDEN, TOKENS
from tkverify.specs.quant_bounds import SWIGLU_ABSOLUTE, SWIGLU_WINDOW, may_overflow_fp32, swiglu_value_error
from tkverify.specs.quant_judge import Cast, Decided, _sf_flags, malformed
from strategies.layouts import LAYOUTS

_FORMATS = {"bf16": formats.BF16, "fp32": formats.FP32}
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# An fp32 dequantisation codes * x_sf is off by at most this much, relative (one rounding).
DEQUANT_ROUNDING = 2.0**-24


# -- a bracket in a format the case decides -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FormatBracket(Bracket):
    """A `Bracket` whose output must have the format `fmt` (the case's fmt parameter)."""

    fmt: str = ""


@dataclasses.dataclass(frozen=True)
class WithinFormat(Within):
    """`Within`, in the format the `FormatBracket` names; an output of another dtype fails."""

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        fmt = expected.fmt
        if not isinstance(actual, torch.Tensor) or actual.dtype != _DTYPES[fmt]:
            return Comparison.rejected(output, fmt, "within",
                                       f"{output} must be a {_DTYPES[fmt]} tensor, got "
                                       f"{getattr(actual, 'dtype', type(actual).__name__)}")
        return Within(fmt).compare(output, actual, expected)


def rounded_bracket(exact: np.ndarray, error: np.ndarray, fmt: str, free: np.ndarray) -> FormatBracket:
    """Every rounding to fmt of a value within `error` of `exact`; NaN where exact is NaN (must be NaN);
    [-inf, inf] where `free` (unconstrained)."""
    f = _FORMATS[fmt]
    with np.errstate(invalid="ignore", over="ignore"):
        low = f.decode(f.encode(exact - error))
        high = f.decode(f.encode(exact + error))
    nan = np.isnan(exact)
    low = np.where(free, -np.inf, np.where(nan, np.nan, low))
    high = np.where(free, np.inf, np.where(nan, np.nan, high))
    return FormatBracket(exact, low, high, fmt)


# -- the error analysis -----------------------------------------------------------------------------


def _terms(case: Case) -> ref.SwigluTerms:
    inputs = case.inputs
    x64 = ref.dequantised_x(inputs["x"], inputs.get("x_sf"))
    return ref.SwigluTerms(x64, inputs.get("topk_weights"), inputs.get("pos_to_token_topk"), case.params.get("clamp"))


def backward_error(t: ref.SwigluTerms, grad_out: Any) -> np.ndarray:
    """Absolute error bound (N, 2H) of an fp32 evaluation of (dl | dr) (module docstring)."""
    g = np.abs(qref.as_float64(grad_out))
    w = np.abs(t.w)[:, None]
    l, r, s = np.abs(t.l), np.abs(t.r), t.s
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        slope = np.abs(t.silu_slope())
        floor = SWIGLU_ABSOLUTE * (1 + g) * (1 + w) * (1 + l) ** 2  # dr has no r factor: a NaN r leaves it finite
        dl = SWIGLU_WINDOW * g * w * r * (slope + s * (1 + l) + s * (1 - s) * (2 + l) * l) + floor * (1 + r)
        dr = SWIGLU_WINDOW * g * w * (l * s + slope * l) + floor
    # past the clamp the gradient is an exact 0 (a NaN in the other half changes nothing there)
    return np.concatenate([np.where(t.l_passes, dl, 0.0), np.where(t.r_passes, dr, 0.0)], axis=1)


def free_elements(t: ref.SwigluTerms, grad_out: Any = None, dequantised: bool = False) -> np.ndarray:
    """Unconstrained elements (N, H) of the live rows: infinite l' or r'; finite factors whose product
    may overflow fp32 in some order (every partial product is at most the product of max(1, |factor|)
    over l', r', w and the cotangent g); a zero cotangent at a non-finite l or r (the oracle's 0, an fp32
    kernel's 0 * NaN); and, x dequantised with an sf that may round, a raw l or r
    within two roundings of the clamp."""
    with np.errstate(over="ignore", invalid="ignore"):
        biggest = np.maximum(1, np.abs(t.l)) * np.maximum(1, np.abs(t.r)) * np.maximum(1, np.abs(t.w))[:, None]
        if grad_out is not None:
            biggest = biggest * np.maximum(1, np.abs(qref.as_float64(grad_out)))
        overflow = np.isfinite(t.l) & np.isfinite(t.r) & ~(biggest <= formats.FP32.max_finite)
        free = np.isinf(t.l) | np.isinf(t.r) | overflow
        free &= ~np.isnan(t.l) & ~np.isnan(t.r)
        if grad_out is not None:  # a zero cotangent at a non-finite input: 0 exactly, or an fp32 0 * NaN
            nonfinite = ~np.isfinite(t.l_raw) | ~np.isfinite(t.r_raw)
            free |= nonfinite & (qref.as_float64(grad_out) == 0)
        if dequantised and t.clamp is not None:
            c = t.clamp
            for raw, edge in ((t.l_raw, c), (t.r_raw, c), (t.r_raw, -c)):
                free |= np.abs(raw - edge) <= 2 * DEQUANT_ROUNDING * np.abs(raw)
    return free & t.live


# -- quant.swiglu: forward ------------------------------------------------------------------------


def given_forward(case: Case, actual: dict[str, Any]) -> dict[str, FormatBracket]:
    t = _terms(case)
    y = qref.fp32_range(t.forward())
    error = np.where(t.live, swiglu_value_error(y, t.l, t.r, t.w), 0.0)
    return {"out": rounded_bracket(y, error, case.params.get("fmt", "bf16"), free_elements(t))}


# -- quant.swiglu: backward -----------------------------------------------------------------------


def given_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, Any]) -> dict[str, FormatBracket]:
    t = _terms(case)
    g = cotangents["out"]
    grad = qref.fp32_range(qref.as_float64(exact["grad_x"]))
    error = np.where(t.live, backward_error(t, g), 0.0)
    free = free_elements(t, g)
    return {"grad_x": rounded_bracket(grad, error, case.params.get("fmt", "bf16"), np.concatenate([free, free], 1))}


def backward_mask(case: Case, margin: float | None) -> dict[str, np.ndarray]:
    """Outputs whose derivative is not checked: a non-finite l or r (outside the domain), an fp32
    overflow; with a margin, l or r within margin (relative to |x| + 1) of the clamp."""
    t = _terms(case)
    masked = ~np.isfinite(t.l_raw) | ~np.isfinite(t.r_raw) | may_overflow_fp32(t.l, t.r, t.w)
    if margin is not None and t.clamp is not None:
        c = t.clamp
        with np.errstate(invalid="ignore"):
            masked |= np.abs(t.l_raw - c) <= margin * (np.abs(t.l_raw) + 1)
            masked |= np.minimum(np.abs(t.r_raw - c), np.abs(t.r_raw + c)) <= margin * (np.abs(t.r_raw) + 1)
    return {"out": masked}


def fd_scale(case: Case) -> dict[str, torch.Tensor]:
    """l and r: |x| + 2^-6 (sigmoid bends on a unit scale; y is linear in r, and a floor taken from r's row
    would let a huge neighbour inflate a small r's step past the clamp).  No step on either half of an
    element whose l or r is not finite: its gradient may be NaN (0 * NaN), which a zero step keeps out of
    every inner product."""
    x = qref.as_float64(case.inputs["x"])
    hidden = x.shape[1] // 2
    finite = np.isfinite(x[:, :hidden]) & np.isfinite(x[:, hidden:])
    xf = np.where(np.isfinite(x), x, 0.0)
    floor = 2.0**-6
    return {"x": torch.from_numpy(np.where(np.concatenate([finite, finite], axis=1), np.abs(xf) + floor, 0.0))}


# -- quant.swiglu_backward_and_per_token_cast ------------------------------------------------------


def given_backward_cast(case: Case, actual: dict[str, Any]) -> dict[str, Any]:
    params, inputs = case.params, case.inputs
    t = _terms(case)
    g = inputs["grad_out"]
    grad = qref.fp32_range(t.backward(g))
    error = np.where(t.live, backward_error(t, g), 0.0)
    free = free_elements(t, g, dequantised=True)
    free = np.concatenate([free, free], axis=1)
    cast = Cast(grad, params.get("fmt", "e4m3"), (1, params.get("num_per_channels", 128)), **_sf_flags(params),
                value_error=error, padding=t.padding, unconstrained=free)
    sf_judgement, sf_values = cast.judge_sf(actual["sf"])
    return {"x_grad": rounded_bracket(grad, error, "bf16", free),
            "data": cast.judge_data(actual["data"], sf_values), "sf": sf_judgement}


# -- quant.swiglu_forward_and_per_channel_cast_and_transpose ---------------------------------------


def given_per_channel_transpose(case: Case, actual: dict[str, Any]) -> dict[str, Any]:
    """The per-channel cast of y judged as quant.swiglu_forward_and_per_token_cast's cast is (y's bound as the
    value error), on the data transposed back when the case asks for the transposed layout."""
    params = case.params
    t = _terms(case)
    y = qref.fp32_range(t.forward())
    cast = Cast(y, "e4m3", (params.get("num_per_tokens", 128), 1), **_sf_flags(params),
                value_error=swiglu_value_error(y, t.l, t.r, t.w), unconstrained=free_elements(t))
    sf_judgement, sf_values = cast.judge_sf(actual["sf"])
    data = actual["data"]
    if params.get("transpose", True) and isinstance(data, torch.Tensor):
        expected = (y.shape[1], y.shape[0])
        if tuple(data.shape) != expected or not data.is_contiguous():
            return {"sf": sf_judgement, "data": malformed(
                f"transposed data must be contiguous with shape (H, N) = {expected}, got shape "
                f"{tuple(data.shape)}, strides {data.stride()}", "e4m3")}
        data = data.t().contiguous()
    return {"sf": sf_judgement, "data": cast.judge_data(data, sf_values)}


# -- bench shapes ------------------------------------------------------------------------------------


def _forward_shape(device) -> tuple[dict, dict]:
    return {"x": benchshapes.randn((TOKENS, 2 * SWIGLU_HIDDEN), torch.bfloat16, device)}, {"fmt": "bf16"}


def _backward_shape(device) -> tuple[dict, dict]:
    inputs, params = _forward_shape(device)
    return {"grad_out": benchshapes.randn((TOKENS, SWIGLU_HIDDEN), torch.bfloat16, device), **inputs}, params


def _backward_cast_shape(device) -> tuple[dict, dict]:
    x = benchshapes.randn((TOKENS, 2 * SWIGLU_HIDDEN), torch.bfloat16, device).to(torch.float8_e4m3fn)
    sf = torch.ones(TOKENS, 2 * SWIGLU_HIDDEN // 128, dtype=torch.float32, device=device)
    grad = benchshapes.randn((TOKENS, SWIGLU_HIDDEN), torch.bfloat16, device)
    return {"x": x, "x_sf": sf, "grad_out": grad}, {"fmt": "e4m3", "num_per_channels": 128}


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(benchshapes.nbytes(t) for t in ts)


_SHAPE = f"N{TOKENS} 2x{SWIGLU_HIDDEN} bf16"
FORWARD_BENCH = (BenchShape(f"{_SHAPE} -> bf16", _forward_shape, lambda i, p: _nbytes(i["x"]) * 3 // 2,
                            written=lambda i, p: _nbytes(i["x"]) // 2),)
BACKWARD_BENCH = (BenchShape(f"{_SHAPE} -> bf16", _backward_shape,
                             lambda i, p: _nbytes(i["grad_out"]) + 2 * _nbytes(i["x"]),
                             written=lambda i, p: _nbytes(i["x"])),)
BACKWARD_CAST_BENCH = (BenchShape(
    f"N{TOKENS} 2x{SWIGLU_HIDDEN} e4m3/128 in, bf16 grad, e4m3/128 out", _backward_cast_shape,
    # x and x_sf, grad_out read; x_grad (bf16), its e4m3 data and fp32 sf written
    lambda i, p: _nbytes(i["x"], i["x_sf"], i["grad_out"]) + 3 * i["x"].numel() + _nbytes(i["x_sf"]),
    written=lambda i, p: 3 * i["x"].numel() + _nbytes(i["x_sf"])),)


def _per_channel_shape(device) -> tuple[dict, dict]:
    inputs, _ = _forward_shape(device)
    return inputs, {"fmt": "e4m3", "num_per_tokens": 128}


PER_CHANNEL_BENCH = (BenchShape(
    f"{_SHAPE} e4m3/128 per channel, transposed", _per_channel_shape,
    # x read; e4m3 data and an fp32 sf per 128-token block written
    lambda i, p: _nbytes(i["x"]) + i["x"].numel() // 2 + i["x"].numel() // 2 // 128 * 4,
    written=lambda i, p: i["x"].numel() // 2 + i["x"].numel() // 2 // 128 * 4),)


# -- the registry entries ------------------------------------------------------------------------------

_WITHIN = WithinFormat()

register(OpSpec(
    name="quant.swiglu",
    oracle=ref.swiglu,
    strategy=strategies.quant_swiglu.swiglu_cases,
    outputs={"out": _WITHIN},
    impls={"torch": torch_impl("kernels.torch.quant_swiglu:swiglu", layouts={"x": LAYOUTS}),
           "tilelang": tilelang_impl("kernels.quant.swiglu_plain:swiglu")},
    given=given_forward,
    doc="y = min(l, c) sigmoid(min(l, c)) clamp(r, -c, c) w, bf16 or fp32; backward: the SwiGLU derivative, "
        "zero past the clamp.",
    bench=FORWARD_BENCH,
    backward=Backward(
        inputs=("x",),
        grads={"grad_x": _WITHIN},
        outputs=("out",),
        oracle=ref.swiglu_bwd,
        forward=ref.swiglu_fwd_torch,
        impls={"torch": torch_impl("kernels.torch.quant_swiglu:swiglu_bwd"),
               "tilelang": tilelang_impl("kernels.quant.swiglu_plain:swiglu_bwd")},
        grad_dtype=(torch.bfloat16, torch.float32),  # grad_out in either dtype, whatever fmt is
        mask=backward_mask,
        fd_scale=fd_scale,
        given=given_backward,
        bench=BACKWARD_BENCH,
        examples_factor=3,  # 16 kernel configurations (x, cotangent, out dtype, vector), each single-row and routed
    ),
))

register(OpSpec(
    name="quant.swiglu_backward_and_per_token_cast",
    oracle=ref.swiglu_backward_and_per_token_cast,
    strategy=strategies.quant_swiglu.backward_cast_cases,
    outputs={
        "x_grad": _WITHIN,
        "data": Decided("given sf_impl, the code of some value within the fp32 error bound of the gradient "
                        "divided by sf_impl; padding rows +0"),
        "sf": Decided("the sf of an amax within the gradient's error bound (plain: 1.5 ULP either side); padding "
                      "rows the sf of a zero block; layout checked"),
    },
    impls={"torch": torch_impl("kernels.torch.quant_swiglu:swiglu_backward_and_per_token_cast"),
           "tilelang": tilelang_impl("kernels.quant.swiglu_plain:swiglu_backward_and_per_token_cast")},
    given=given_backward_cast,
    doc="The SwiGLU gradient of an e4m3 x (codes * x_sf) in bf16, and its per-token cast.",
    bench=BACKWARD_CAST_BENCH,
))

register(OpSpec(
    name="quant.swiglu_forward_and_per_channel_cast_and_transpose",
    oracle=ref.swiglu_forward_and_per_channel_cast_and_transpose,
    strategy=strategies.quant_swiglu.per_channel_transpose_cases,
    outputs={
        "data": Decided("given sf_impl, the code of some value within y's fp32 error bound divided by sf_impl, "
                        "in (H, N) when transposed"),
        "sf": Decided("the sf of an amax within y's error bound (plain: 1.5 ULP either side); layout checked"),
    },
    impls={"torch": torch_impl("kernels.torch.quant_swiglu:swiglu_forward_and_per_channel_cast_and_transpose",
                               layouts={"x": LAYOUTS}),
           "tilelang": tilelang_impl("kernels.quant.swiglu_plain:swiglu_forward_and_per_channel_cast_and_transpose")},
    given=given_per_channel_transpose,
    doc="y = min(l, c) sigmoid(min(l, c)) clamp(r, -c, c) cast to e4m3 in num_per_tokens x 1 blocks, data (H, N).",
    bench=PER_CHANNEL_BENCH,
))
