"""RMSNorm with a residual and an output scale (quant.norm): the forward, its backward, how both
are judged, and their bench shapes; and quant.norm_forward_and_per_token_cast, the norm followed by
quant.per_token_cast, whose data and sf go through that cast's judge (`given_norm_cast`).

What the op computes, its domain and the error analysis behind every bound here are
docs/contract/quant_norm.md; signatures and argument checks are kernels/torch/quant_norm.py's.
Every output and gradient is judged by `WithinTyped` against per-element intervals that
`analyse_forward` and `analyse_backward` compute by interval arithmetic in float64 (the `Iv` and
`product` of `tkverify.specs.engram`) from the exact inputs, for an fp32 implementation; the
interval ends are rounded to the output's dtype, which the policy also checks.  norm_input is a
single correctly rounded addition: its interval is the exact value (bitwise).
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import numpy as np
import torch

import references.quant_norm as ref
import strategies.quant_norm
from tkverify import formats
from tkverify.case import Case
from tkverify.policies import Bracket, Comparison, Within
from tkverify.registry import Backward, BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.engram import RHO, TINY, Iv, gamma, product
from tkverify.specs.quant_bounds import CAST_WINDOW
from tkverify.specs.quant_judge import Cast, Decided, _sf_flags

FP32_MAX = float(np.finfo(np.float32).max)
# The backward is judged on rows with max |s| <= 2^40: beyond it an fp32 evaluation of s rstd^3 D / H
# may overflow in some order of its products whatever the exact value.
BACKWARD_ROW_LIMIT = 2.0**40


@dataclasses.dataclass(frozen=True)
class TypedBracket(Bracket):
    """A `Bracket` that also names the dtype the output must have (x's, the weight's, or fp32)."""

    dtype: torch.dtype = torch.float32


@dataclasses.dataclass(frozen=True)
class WithinTyped(Within):
    """`within` the expected `TypedBracket`, after checking the output's dtype against the case's."""

    describe: str = ""

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        dtype = getattr(expected, "dtype", None)
        fmt = formats.of_dtype(dtype).name if dtype is not None else "?"
        if not isinstance(actual, torch.Tensor) or actual.dtype != dtype:
            got = actual.dtype if isinstance(actual, torch.Tensor) else type(actual).__name__
            return Comparison.rejected(output, fmt, "within", f"dtype {got}, expected {dtype}")
        return Within(fmt).compare(output, actual, expected)

    def __str__(self) -> str:
        return self.describe


def _np(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def _rounded(iv: Iv, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Both ends of an interval rounded (RNE) to the dtype: the range of RN(y) for y in it."""
    fmt = formats.of_dtype(dtype)
    return fmt.decode(fmt.encode(iv.lo)), fmt.decode(fmt.encode(iv.hi))


def _bracket(exact: np.ndarray, iv: Iv, dtype: torch.dtype) -> TypedBracket:
    lo, hi = _rounded(iv, dtype) if dtype != torch.float32 else (iv.lo, iv.hi)
    return TypedBracket(exact=exact, low=lo, high=hi, dtype=dtype)


# -- the forward's error analysis ----------------------------------------------------


@dataclasses.dataclass
class Forward:
    """Exact values and the intervals of an fp32 implementation's rstd and out (before rounding)."""

    s: np.ndarray  # norm_input, exact (x's dtype values)
    w: np.ndarray  # the weight (ones without one)
    scale: float
    rstd: np.ndarray
    out: np.ndarray
    rstd_iv: Iv
    out_iv: Iv
    free: np.ndarray  # (T,) rows whose fp32 evaluation may overflow: rstd and out unconstrained
    nonfinite: np.ndarray  # (T,) rows holding an infinity or a NaN: IEEE results, exactly


def analyse_forward(x: Any, weight: Any, residual: Any, eps: float, out_scale: float) -> Forward:
    s_t = ref.norm_input(x, residual)
    s = s_t.numpy()
    tokens, hidden = s.shape
    w = np.ones(hidden) if weight is None else _np(weight)
    c = float(out_scale)
    out_t, rstd_t, _ = ref.norm(x, weight, residual, eps, out_scale)
    out, rstd = out_t.detach().numpy(), rstd_t.detach().numpy()
    nonfinite = ~np.isfinite(s).all(-1)
    with np.errstate(over="ignore", invalid="ignore"):
        squares = (s * s).sum(-1)
        m = squares / hidden + eps
        # squares (1 rounding each), their sum (H - 1), the division by H and the addition of eps (1 each,
        # eps itself rounded to fp32: 1 more); squares below fp32's normal range flushed: TINY after the division
        err = gamma(hidden + 3) * m + 2 * TINY
        lo = np.maximum(m - err, np.finfo(np.float64).tiny)
        # rsqrt within 2^-20 (RHO) or 1 / sqrtf (two roundings): 2 RHO either side
        rstd_iv = Iv(1.0 / np.sqrt(m + err) * (1 - 2 * RHO), 1.0 / np.sqrt(lo) * (1 + 2 * RHO))
        out_iv = product(s, Iv(rstd_iv.lo[:, None], rstd_iv.hi[:, None]), w, c)
        # a partial product or the sum of squares past fp32's range: some fp32 order overflows
        big = np.maximum(1, np.abs(s)) * np.maximum(1, rstd_iv.hi[:, None]) * np.maximum(1, np.abs(w)) * max(1, abs(c))
        free = (squares * (1 + gamma(hidden + 1)) >= FP32_MAX) | (big >= FP32_MAX).any(-1)
    free &= ~nonfinite
    return Forward(s, w, c, rstd, out, rstd_iv, out_iv, free, nonfinite)


def _unconstrained(b: TypedBracket, rows: np.ndarray) -> TypedBracket:
    sel = rows.reshape(rows.shape + (1,) * (np.ndim(b.exact) - 1))
    return dataclasses.replace(b, low=np.where(sel, -np.inf, b.low), high=np.where(sel, np.inf, b.high))


def _ieee_rows(b: TypedBracket, rows: np.ndarray) -> TypedBracket:
    """Rows with a non-finite s: the float64 IEEE result exactly (NaN where it is NaN, a zero where 0)."""
    sel = rows.reshape(rows.shape + (1,) * (np.ndim(b.exact) - 1))
    return dataclasses.replace(b, low=np.where(sel, b.exact, b.low), high=np.where(sel, b.exact, b.high))


def _case_forward(case: Case) -> Forward:
    i, p = case.inputs, case.params
    return analyse_forward(i["x"], i.get("weight"), i.get("residual"), p.get("eps", 1e-6), p.get("out_scale", 1.0))


def given_forward(case: Case, actual: dict[str, Any]) -> dict[str, TypedBracket]:
    f = _case_forward(case)
    dtype = case.inputs["x"].dtype
    rstd = _ieee_rows(_unconstrained(_bracket(f.rstd, f.rstd_iv, torch.float32), f.free), f.nonfinite)
    out = _ieee_rows(_unconstrained(_bracket(f.out, f.out_iv, dtype), f.free), f.nonfinite)
    return {"out": out, "rstd": rstd, "norm_input": TypedBracket(exact=f.s, low=f.s, high=f.s, dtype=dtype)}


# -- the backward's error analysis ---------------------------------------------------


def analyse_backward(f: Forward, grad_out: Any, grad_norm_input: Any) -> dict[str, Iv]:
    """Intervals of grad_s (before its rounding to x's dtype) and grad_weight (before the weight's dtype)."""
    g = _np(grad_out)
    n = np.zeros_like(g) if grad_norm_input is None else _np(grad_norm_input)
    hidden = f.s.shape[1]
    r = Iv(f.rstd_iv.lo[:, None], f.rstd_iv.hi[:, None])
    gw = product(g, f.w, f.scale)
    dot = product(gw, f.s).sum(-1)
    t1 = product(gw, r)
    t2 = product(f.s, r, r, r, Iv(dot.lo[:, None], dot.hi[:, None]), 1.0 / hidden, rel=RHO)
    grad_s = (t1 - t2 + n).widen(gamma(2), 2 * TINY, t1.mag() + t2.mag() + np.abs(n))
    grad_weight = product(g, f.s, r, f.scale).sum(0)
    return {"grad_s": grad_s, "grad_weight": grad_weight}


def given_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict:
    i = case.inputs
    f = _case_forward(case)
    ivs = analyse_backward(f, cotangents["out"], cotangents.get("norm_input"))
    dtype, w_dtype = i["x"].dtype, i["weight"].dtype
    return {
        "grad_x": _bracket(_np(exact["grad_x"]), ivs["grad_s"], dtype),
        "grad_weight": _bracket(_np(exact["grad_weight"]), ivs["grad_weight"], w_dtype),
        "grad_residual": _bracket(_np(exact["grad_residual"]), ivs["grad_s"], dtype),
    }


# Finite differences step x and the residual by ~1e-7 .. 2e-6 of |x| and |residual|.  Where they cancel
# (s much smaller than x, down to s = 0), such a step moves s by a large share of its own curvature
# scale max(rms(s), sqrt(eps)), and the differences mislead: rows with that scale below FD_MARGIN
# times the rms of |x| + |residual| are left out of the finite-difference checks (the comparison with
# the float64 backward still judges them).
FD_MARGIN = 2.0**-8


def backward_mask(case: Case, margin: float | None) -> dict[str, np.ndarray]:
    """Rows whose cotangents are zeroed: outside the backward's judged domain (rows whose fp32 forward
    may overflow, rows with max |s| beyond BACKWARD_ROW_LIMIT), and, with a margin, rows where x and the
    residual cancel (see FD_MARGIN).  RMSNorm has no kinks (eps > 0)."""
    f = _case_forward(case)
    with np.errstate(invalid="ignore"):
        excluded = f.free | f.nonfinite | (np.abs(f.s).max(-1, initial=0.0) > BACKWARD_ROW_LIMIT)
        if margin is not None and f.s.size:
            i = case.inputs
            inputs = np.abs(_np(i["x"])) + (0.0 if i.get("residual") is None else np.abs(_np(i["residual"])))
            scale = np.maximum(np.sqrt((f.s * f.s).mean(-1)), np.sqrt(case.params.get("eps", 1e-6)))
            excluded |= scale < margin * np.sqrt((inputs * inputs).mean(-1))
    # norm_input's cotangent is zero whole in about a third of the cases (by their bytes): its gradient is then
    # passed as None (Backward.optional_outputs), the backward's call without a residual-stream gradient
    without_norm_input = excluded | _drops_norm_input_gradient(case)
    return {"out": excluded[:, None], "norm_input": without_norm_input[:, None]}


def _drops_norm_input_gradient(case: Case) -> bool:
    """Whether the gradient checks of `case` call the backward without norm_input's gradient: a third of the
    cases, by a hash of x's bytes (deterministic for a case, spread over the ci examples)."""
    x = case.inputs["x"]
    return zlib.crc32(x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()) % 3 == 0


def smooth(case: Case, outputs: dict[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The implementation's out and norm_input (float64) with how far they may lie from the smooth
    float64 function of the unrounded sum x + residual: the forward's bound (out) plus what the
    rounding of s to x's dtype moves, e = s - (x + residual), through s itself and through rstd."""
    i = case.inputs
    f = _case_forward(case)
    unrounded = _np(i["x"]) + (0.0 if i.get("residual") is None else _np(i["residual"]))
    e = np.abs(f.s - unrounded)
    hidden = f.s.shape[1]
    expected = given_forward(case, outputs)["out"]
    with np.errstate(invalid="ignore"):
        width = np.maximum(expected.high - expected.exact, expected.exact - expected.low)
        rstd = f.rstd_iv.hi[:, None]
        wc = np.abs(f.w * f.scale)
        moved = wc * rstd * e + np.abs(f.s) * wc * rstd**3 * (np.abs(f.s) * e).sum(-1, keepdims=True) / hidden
    return {"out": (_np(outputs["out"]), width + 2 * moved), "norm_input": (_np(outputs["norm_input"]), e)}


# -- bench shapes (tkverify bench): tile-kernels' mHC / Engram shape, 16384 tokens x 7168 -----------

BENCH_TOKENS, BENCH_HIDDEN = 16384, 7168
BENCH_NAME = f"T{BENCH_TOKENS} H{BENCH_HIDDEN} bf16 residual"


def _bench_forward(device: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    x, r = (torch.randn(BENCH_TOKENS, BENCH_HIDDEN, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    w = (1 + 0.1 * torch.randn(BENCH_HIDDEN, generator=gen)).to(device, torch.bfloat16)
    return {"x": x, "weight": w, "residual": r}, {"eps": 1e-6, "out_scale": 1.0}


def _forward_bytes(inputs: dict[str, Any], params: dict[str, Any]) -> int:
    x = inputs["x"]
    # read x, residual, weight; write out, norm_input and rstd
    return 4 * x.numel() * x.element_size() + inputs["weight"].numel() * 2 + x.shape[0] * 4


def _bench_backward(device: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(kwargs, params) of one backward call; rstd and norm_input as the float64 oracle's forward gives them."""
    inputs, params = _bench_forward(device)
    x = inputs["x"]
    _, rstd, s = ref.norm(inputs["x"].cpu(), inputs["weight"].cpu(), inputs["residual"].cpu(), **params)
    gen = torch.Generator(device="cpu").manual_seed(1)
    grad_out, grad_norm_input = (torch.randn(x.shape, generator=gen).to(device, x.dtype) for _ in range(2))
    return {"grad_out": grad_out, "grad_norm_input": grad_norm_input, **inputs,
            "rstd": rstd.to(device, torch.float32), "norm_input": s.to(device, x.dtype)}, params


def _backward_bytes(kwargs: dict[str, Any], params: dict[str, Any]) -> int:
    x = kwargs["x"]
    # read grad_out, grad_norm_input, norm_input, weight, rstd; write grad_x and grad_weight
    return 4 * x.numel() * x.element_size() + 2 * kwargs["weight"].numel() * 2 + x.shape[0] * 4


def _impls(name: str) -> dict:
    return {"torch": torch_impl(f"kernels.torch.quant_norm:{name}"),
            "tilelang": tilelang_impl(f"kernels.quant.norm:{name}")}


_SHAPE_POLICY = "within the fp32 error analysis of docs/contract/quant_norm.md, rounded to the output's dtype"

register(OpSpec(
    name="quant.norm",
    oracle=ref.norm,
    strategy=strategies.quant_norm.norm_cases,
    outputs={
        "out": WithinTyped(describe=f"out: {_SHAPE_POLICY}; rows whose fp32 sum of squares may overflow free"),
        "rstd": WithinTyped(describe="rstd: fp32 within gamma(H+3) of m and 2 RHO of the rsqrt"),
        "norm_input": WithinTyped(describe="norm_input: bitwise, the correctly rounded x + residual"),
    },
    impls=_impls("norm"),
    given=given_forward,
    doc="RMSNorm: s = x + residual (x's dtype), out = s rsqrt(mean s^2 + eps) w out_scale, rstd, norm_input.",
    backward=Backward(
        inputs=("x", "weight", "residual"),
        grads={
            "grad_x": WithinTyped(describe=f"grad_x: {_SHAPE_POLICY}"),
            "grad_weight": WithinTyped(describe=f"grad_weight: {_SHAPE_POLICY}"),
            "grad_residual": WithinTyped(describe=f"grad_residual: {_SHAPE_POLICY}"),
        },
        outputs=("out", "norm_input"),
        oracle=ref.norm_bwd,
        impls=_impls("norm_bwd"),
        saved=("rstd", "norm_input"),
        optional_outputs=("norm_input",),
        mask=backward_mask,
        given=given_backward,
        smooth=smooth,
        fd_margin=FD_MARGIN,
        bench=(BenchShape(BENCH_NAME, _bench_backward, _backward_bytes, target=0.9, unread=("x", "residual")),),
    ),
    bench=(BenchShape(BENCH_NAME, _bench_forward, _forward_bytes, target=0.9),),
))


# -- quant.norm_forward_and_per_token_cast: the norm, then quant.per_token_cast ----------------------


def _bench_cast(device: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    inputs, params = _bench_forward(device)
    return inputs, {**params, "fmt": "e4m3", "num_per_channels": 32}


def _cast_bytes(inputs: dict[str, Any], params: dict[str, Any]) -> int:
    x = inputs["x"]
    tokens, hidden = x.shape
    # read x, residual, weight; write norm_input, the e4m3 data, the fp32 sf and rstd
    return (3 * x.numel() * x.element_size() + x.numel() + tokens * (hidden // params["num_per_channels"]) * 4
            + inputs["weight"].numel() * 2 + tokens * 4)


def given_norm_cast(case: Case, actual: dict[str, Any]) -> dict[str, Any]:
    """data and sf through quant.per_token_cast's judge (`Cast`), given the exact normalised row y and
    its error bound: the half-width of out's bracket (which includes the rounding to x's dtype) plus the
    quotient's rounding; rows
    past the overflow threshold unconstrained; rows with an infinity or a NaN cast from their IEEE y.
    rstd and norm_input as quant.norm judges them."""
    p = case.params
    f = _case_forward(case)
    norm_judged = given_forward(case, actual)
    out = norm_judged["out"]
    with np.errstate(invalid="ignore"):
        # y's own error, and the quotient y / sf's fp32 rounding (CAST_WINDOW, as a cast of exact values has)
        error = np.maximum(out.high - out.exact, out.exact - out.low) + CAST_WINDOW * np.abs(out.exact)
    rows = (f.free | f.nonfinite)[:, None]
    cast = Cast(np.where(f.nonfinite[:, None], f.out, out.exact), p.get("fmt", "e4m3"),
                (1, p.get("num_per_channels", 128)), **_sf_flags(p),
                value_error=np.where(rows, 0.0, error),
                unconstrained=np.broadcast_to(f.free[:, None], f.out.shape))
    sf_judgement, sf_values = cast.judge_sf(actual["sf"])
    return {"data": cast.judge_data(actual["data"], sf_values), "sf": sf_judgement,
            "rstd": norm_judged["rstd"], "norm_input": norm_judged["norm_input"]}


register(OpSpec(
    name="quant.norm_forward_and_per_token_cast",
    oracle=ref.norm_forward_and_per_token_cast,
    strategy=strategies.quant_norm.norm_cast_cases,
    outputs={
        "data": Decided("quant.per_token_cast's data judgement of y = norm's out, within out's bracket "
                        "(docs/contract/quant_norm.md)"),
        "sf": Decided("quant.per_token_cast's sf judgement of an amax within out's bracket; layout checked"),
        "rstd": WithinTyped(describe="rstd: as quant.norm's"),
        "norm_input": WithinTyped(describe="norm_input: bitwise, as quant.norm's"),
    },
    impls=_impls("norm_forward_and_per_token_cast"),
    given=given_norm_cast,
    doc="quant.norm, then quant.per_token_cast of its out (x's dtype): (data, sf, rstd, norm_input).",
    bench=(BenchShape(f"{BENCH_NAME} e4m3/32", _bench_cast, _cast_bytes, target=0.9),),
))
