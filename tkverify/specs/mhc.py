"""mHC (OPS.md, "mhc"): the Sinkhorn normalisation (forward and backward) and the three mix
operators pre_split_mixes, pre_apply_mix and post, and how each is judged.  The mix operators'
section follows Sinkhorn's; the benchmark shapes are at the end.

Sinkhorn
========

Signatures (every implementation; the eager one is kernels/torch/mhc.py):
``sinkhorn(x, repeat=10, eps=1e-6) -> out`` with x, out fp32 (..., m, m),
2 <= m <= 8, and ``sinkhorn_bwd(grad_out, x, repeat=10, eps=1e-6) -> grad_x``
(fp32, x's shape; the backward recomputes the forward's intermediates).

Non-finite inputs (decided here, tested in tests/test_mhc.py)
------------------------------------------------------------
A NaN or +inf anywhere in a matrix, or a row of it that is entirely -inf,
makes that *whole matrix* NaN: its softmax row is NaN (x - max is NaN), and
the first column normalisation spreads the NaN to every column, hence every
element.  A -inf entry in a row whose maximum is finite is a softmax weight of
exactly 0 (then eps): an ordinary value.  Other matrices of the batch are
unaffected.  The oracle does exactly this; the forward bracket of a NaN
element is [NaN, NaN] (must be NaN).  The op's strategy draws only finite
logits; non-finite cases come from `strategies.mhc.sinkhorn_nonfinite_cases`
and are judged by the forward checks only (the gradient of a NaN matrix is
NaN and has nothing to compare; they are kept out of the gradient checks).

How the output is judged: a relative bound per matrix
-----------------------------------------------------
Model of an fp32 implementation: +, -, * correctly rounded (u = 2^-24); exp
and a division or reciprocal within RHO = 2^-20 relative; a sum of n
positive terms in any order within gamma(n-1) relative (Higham); eps rounded
to fp32 (relative u).  Every element of every intermediate is positive (>= a
multiple of eps > 0), so errors are best tracked as relative (log-domain)
perturbations delta_ij of each element.

Local errors.  Softmax element s_ij = exp(d_ij) / S, d = x - max: the
subtraction errs by u |d| (Sterbenz makes it exact near the max), which exp
turns into a relative u |d|; exp RHO, the sum gamma(m-1), the division RHO;
these scale by s / (s + eps) in A = s + eps, which adds u (and u for eps
itself), and an underflowed exp (absolute <= 2^-126) adds TINY / eps.  Call
the largest over the matrix e0.  Each normalisation P' = P / (sum + eps) adds
gamma(m) (sum of m positive terms plus eps) + RHO (division): e_step.

Propagation.  A normalisation maps a log-perturbation delta to delta - (its
weighted mean along the summed axis), weights P'/(sum) along that axis: it
annihilates perturbations of diagonal-scaling form (constant along the axis)
and passes the rest on, with inf-norm gain <= 2 for one step.  A composition
of such maps is *not* provably bounded by 2 (inf-norm gains could in principle
compound); the bound below assumes the composition's gain K <= 2, which is
what the stress cases show (the largest observed error is ~0.12 of the bound,
over m = 2..8, repeat 1..30, saturated, dominant-column, near-permutation and
eps-comparable inputs, tests/test_mhc.py::test_forward_bound_has_margin).  So,
per matrix, to first order in u and RHO:

    |out_impl - out| <= B |out|,   B = 2 (e0 + (2 repeat - 1) e_step)

For the default repeat = 10, m = 4, moderate logits: B ~ 2 (2 RHO + gamma(3) +
2u + 19 (gamma(4) + RHO)) ~ 5.0e-5 (~830 fp32 ULPs) - loose against a typical fp32 result
(tens of ULPs), yet one sweep fewer, rows and columns swapped, or any
formula error moves elements by 1e-3 and more of their value (mutants).  This
is a carefully justified relative bound, not a rigorous one: it rests on K <=
2 and on first-order error analysis.  A NaN element must be NaN.

Report extra (forward): ``max_sum_deviation``, the largest |row sum - 1| or
|column sum - 1| of the implementation's output (over its finite matrices),
and ``oracle_max_sum_deviation``, the same of the float64 oracle's output
(eps and a finite repeat keep both away from 0; the difference is the
implementation's).

How the gradient is judged: a bound per element, from the exact intermediates
-----------------------------------------------------------------------------
The backward replays the 2 repeat - 1 normalisations in reverse, g <- (g -
sum_axis(g P')) / D, then the softmax, g <- s (g - sum_row(g s)).  Each
reverse step errs locally by (gamma(m + 1) + 2 RHO) of its terms' magnitude
(|g| + sum_axis |g| P') / D, plus 2 B of it for using the implementation's
own recomputed P' and D (each within B of the oracle's: first order).
`gradient_bound` accumulates, in float64 from the exact intermediates and
cotangent:
* over all reverse steps but the last, a normwise error E per matrix: E <-
  E max(1, 1 / min D) + local * max magnitude (D, sums of normalised
  matrices, is near 1 there);
* the last reverse step (the first normalisation, over columns, whose sums
  may be as small as m eps, so that 1/D reaches 1e5 and more) elementwise:
  E_ij = E (1 + sum_k P'_kj) / D_j + local (|g| + sum |g| P')_ij / D_j;
* the softmax elementwise: s_ij (E_ij + sum_k E_ik s_ik) + (gamma(m + 1) + 2
  u + 2 B) s_ij (|g| + sum_k |g| s)_ij, plus 2 TINY times the same
  magnitudes (an fp32 exp that underflows errs by up to TINY absolute);
and multiplies by K = 2, the same assumed gain as above for the compounding
of the normwise steps.  The elementwise end matters: the huge 1/D of a
near-eps column is multiplied back by its tiny softmax weights.  Observed
error: <= ~0.03 of this bound on the stress cases
(tests/test_mhc.py::test_gradient_bound_has_margin holds it to 1/4); a
missing reverse step or a wrong sign changes the gradient by the order of
|g| itself, far beyond it.  Matrices with a non-finite entry get [-inf, inf].

Gradient checks: no kinks (the op is smooth in finite x), so ``mask`` only
zeroes the cotangent of matrices with a non-finite input (outside the
domain; the op's strategy draws none).  Finite-difference step scales
(`fd_scale`): 1 + |x| FD_RELATIVE per element, FD_RELATIVE = 2^-3.  Logits
are unitless and the softmax's curvature is on the scale of 1 in x; the step
must also stay far above float64's resolution of |x| (<= 2^11 in the
strategy).  gradcheck steps u by GRADCHECK_EPS = 1e-7, so element x_ij moves
by about 1e-7 s_ij, while x_ij + that step is itself rounded by up to 2^-53
|x_ij|: a noise of 2^-53 / (1e-7 FD_RELATIVE) ~ 1.1e-9 / FD_RELATIVE of the
derivative, against gradcheck's atol 1e-7 on Jacobian entries of order 1.
The truncation error grows as (1e-7 FD_RELATIVE |x| |q|)^2 / 6 (|q| <= ~4,
the sketch's normal entries), ~1.1e-7 FD_RELATIVE^2 at |x| = 2^11.  2^-3
keeps both below 1e-8.

Finding (issue 9): with the earlier FD_RELATIVE = 2^-8 the noise term is
2.8e-7, above atol, and under the dev profile gradcheck failed on a correct
backward: repeat 1, eps 1e-6, a matrix whose rows are each constant at
|x| ~ 16..996 (equal_rows + large: a uniform softmax, so every element has
weight 1/8 and every element's rounding shows).  The hand backward was right:
the numerical Jacobian approached it as 1/step when the step grew (max
|N - J| 3.8e-7, 4.4e-8, 6.6e-9 at steps 1e-7, 1e-6, 1e-5, then truncation
took over), and the directional check beside gradcheck passed.  Over 700
strategy draws the worst |N - J| / (atol + rtol |J|) was 1.8 with 2^-8 and
0.075 with 2^-3.  The shrunk case (one matrix, cotangent seed 1) is
tests/regressions/mhc.sinkhorn-gradcheck-rounding-noise.  The cost: the
working-precision consistency check (2^-4 fd_scale steps, for kernels that
take no float64) now steps further at large |x|, so its bound is a little
looser: 77 of 126 directions informative on 150 ci draws, 81 with 2^-8.

The mix operators
=================
Signatures: the docstring of kernels/torch/mhc.py (every implementation's contract).

Non-finite values (decided here): IEEE arithmetic on the exact values.  In
pre_split_mixes a NaN in mixes, scale or base, or inf * 0 (an infinite mix
with a zero scale), makes u NaN, and NaN propagates to that entry's output;
u = +inf gives sigmoid 1 (pre = 1 + pre_eps, post = post_mult), u = -inf
gives 0 (pre = pre_eps, post = 0 * post_mult = +-0), comb = u itself.  In
pre_apply_mix and post an infinite input gives an infinite sum or, against
an opposite infinity or a zero weight, NaN.  The oracle computes exactly
this, and a NaN expected element must be NaN, an infinite one the same
infinity.  Subnormals are values like any other: no flush to zero.

pre_split_mixes: brackets from an error model (policy `within`, fp32)
---------------------------------------------------------------------
u.  The product p = mixes * s is exact in float64 (24 + 24 bits).  An fp32
implementation forms u either with one fused multiply-add, RN(p + base), or
with a product and a sum, RN(RN(p) + base); any implementation may use either
(CUDA compilers contract a * b + c into an fma by default, eager CPU torch
does not), so both are allowed everywhere.  Both candidates are computed in
float64 (RN(p) exactly, the sums within 2^-53 relative); the bracket of u is
[RN(min - slack), RN(max + slack)] over the two, slack = 2^-52 of the
magnitude, so it holds one fp32 value or two neighbouring ranges (where the
product's rounding matters: base ~ -p, the ``cancel`` feature, the fma keeps
the product's rounding error and the two-step form loses it).  An fp32
product that overflows while u does not (``huge``) makes the two-step form
infinite: the bracket then reaches that infinity.  comb is u: judged by
this bracket, so against the exact value with the allowance of those two
evaluation orders, and nothing else.
sigmoid.  sigma is increasing, so the sigmoid of any u in [u_lo, u_hi] lies in
[sigma(u_lo), sigma(u_hi)]: the rounding of u is propagated through sigma
exactly, amplified by its derivative (up to 1/4 |u| u at u ~ 0, nothing in
saturation, where a relative error of u moves sigma by sigma (1 - sigma) |u|
u).  The fp32 sigmoid itself, 1 / (1 + e^-v) or e^v / (1 + e^v), is modelled
like Engram's: exp, the addition and the division (or reciprocal) within
RHO = 2^-20 relative each (8 ULP: expf is 2 ULP, approximate division 2), so
3 RHO in all, plus an absolute TINY = 2^-126 for results below fp32's normal
range (e^-v overflowing to inf gives 0 where the exact value is a
subnormal, a flushed reciprocal likewise).  A fast __expf (2 + 1.16 |v| ULP)
leaves this model for |v| beyond about 5 and is meant to be reported there;
so is 0.5 + 0.5 tanh(v / 2), whose absolute error ~2^-25 is no relative bound
for v << 0.
pre = RN(sigma + eps): eps is pre_eps or its fp32 rounding (a kernel receives
an fp32 scalar; torch rounds a Python float to the tensor's dtype), and the
one addition rounds: bracket [RN(sigma_lo + eps_lo), RN(sigma_hi + eps_hi)]
(rounding is monotone).  post = RN(sigma * post_mult) likewise, with the
interval product over post_mult and its fp32 rounding (either sign); a
kernel that computes post_mult / (1 + e^-v) in one division lands inside.
The report measures ULPs of all three against the exact float64 values.

pre_apply_mix and post: the summation bound (policy `summation`, bf16)
--------------------------------------------------------------------
As reduce_fused's (tkverify/specs/moe.py): every term is a product of an
fp32 weight and a bf16 value, exact in float64 (32 bits), summed exactly
(compensated); an fp32 implementation rounds each product once (r = 1) and
adds the n terms in any order (n = m for pre_apply_mix, m + 1 for post: x
post[n] is one more term), an fma folding a product into a sum where it
likes.  Per element
    |y - S| <= e + 0.5 ulp_bf16(|S| + e),
    e = gamma(n - 1 + 1) sum |p_k| + (1 + gamma(n - 1)) n 2^-150,
the last term for products rounded into fp32's subnormal range.  Where terms
cancel (the ``cancel`` feature: equal rows with opposite weights, S = 0) the
bound is set by sum |p_k| and the bf16 result may be many ULPs from S.  The
strategies keep every exact sum short of bf16's overflow (the bound does not
cover a finite S that rounds to infinity).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

import references.mhc as ref
import strategies.mhc
from tkverify.case import Case
from tkverify.policies import (
    FP32_UNDERFLOW,
    Bracket,
    Comparison,
    ErrorBound,
    Within,
    signed_reach,
    summation,
    summation_error,
)
from tkverify.registry import Backward, BenchShape, OpSpec, register, tilelang_impl, torch_impl

U = 2.0**-24
RHO = 2.0**-20
TINY = 2.0**-126
K = 2.0  # the assumed gain of composed normalisations on a perturbation (see the docstring)


def gamma(n: Any) -> Any:
    n = np.asarray(n, dtype=np.float64)
    return n * U / (1.0 - n * U)


def _np(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def _matrices(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-2], a.shape[-1])


def _softmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", over="ignore"):
        d = x - x.max(-1, keepdims=True)
        e = np.exp(d)
        return d, e / e.sum(-1, keepdims=True)


def forward_bound(x: Any, repeat: int, eps: float) -> np.ndarray:
    """B per matrix, shape (..., 1, 1): the relative bound of the docstring."""
    x = _np(x)
    m = x.shape[-1]
    d, s = _softmax(x)
    with np.errstate(invalid="ignore"):
        local = np.where(s > 0, (np.abs(d) * U + 2 * RHO + gamma(m - 1)) * s / (s + eps), 0.0)
    local = np.where(np.isfinite(local), local, 0.0)
    e0 = (local.max(axis=(-1, -2), keepdims=True) if x.size else np.zeros(x.shape[:-2] + (1, 1))) \
        + 2 * U + TINY / eps
    e_step = gamma(m) + RHO
    return K * (e0 + (2 * int(repeat) - 1) * e_step)


def _forward_steps(x: np.ndarray, repeat: int, eps: float):
    _, s = _softmax(x)
    p = s + eps
    saved = []
    for axis in ref.steps(repeat):
        dd = p.sum(axis, keepdims=True) + eps
        p = p / dd
        saved.append((axis, p, dd))
    return s, saved


def gradient_bound(x: Any, grad_out: Any, repeat: int, eps: float) -> np.ndarray:
    """The bound of the docstring, per element of grad_x (x's shape)."""
    x, g = _np(x), _np(grad_out)
    if x.size == 0:
        return np.zeros(x.shape)
    m = x.shape[-1]
    b = forward_bound(x, repeat, eps)
    local = gamma(m + 1) + 2 * RHO + 2 * b
    with np.errstate(invalid="ignore", over="ignore"):
        s, saved = _forward_steps(x, repeat, eps)
        steps = list(reversed(saved))
        total = np.zeros(x.shape[:-2] + (1, 1))  # the normwise error bound so far, per matrix
        for axis, out, dd in steps[:-1]:
            mag = ((np.abs(g) + (np.abs(g) * out).sum(axis, keepdims=True)) / dd).max(axis=(-1, -2), keepdims=True)
            total = total * np.maximum(1.0, 1.0 / dd.min(axis=(-1, -2), keepdims=True)) + local * mag
            g = (g - (g * out).sum(axis, keepdims=True)) / dd
        # The first normalisation (columns, whose sums may be as small as m eps) elementwise, then
        # the softmax, whose factor s is small exactly where those columns amplify.
        axis, out, dd = steps[-1]
        err = (total + total * out.sum(axis, keepdims=True)) / dd \
            + local * (np.abs(g) + (np.abs(g) * out).sum(axis, keepdims=True)) / dd
        g = (g - (g * out).sum(axis, keepdims=True)) / dd
        inner = np.abs(g) + (np.abs(g) * s).sum(-1, keepdims=True)
        err = s * (err + (err * s).sum(-1, keepdims=True)) + (gamma(m + 1) + 2 * U + 2 * b) * s * inner \
            + 2 * TINY * (inner + err + (err * s).sum(-1, keepdims=True))  # s underflowed in fp32
    return K * err


def _nonfinite_matrices(x: np.ndarray) -> np.ndarray:
    """(..., 1, 1) True where the matrix has a non-finite entry."""
    if x.size == 0:
        return np.zeros(x.shape[:-2] + (1, 1), dtype=bool)
    return (~np.isfinite(x)).any(axis=(-1, -2), keepdims=True)


# -- the policies ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fp32Within(Within):
    """`within` for fp32 outputs (any other dtype fails); with `sums`, Sinkhorn's row/column-sum
    figures as report extras."""

    sums: bool = False
    bound: str = "the per-matrix bound of the fp32 error analysis"

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if not isinstance(actual, torch.Tensor) or actual.dtype != torch.float32:
            got = actual.dtype if isinstance(actual, torch.Tensor) else type(actual).__name__
            return Comparison(output, str(self.fmt), "within", 0, 0, math.inf, 0.0, {}, False,
                              message=f"output {output!r}: dtype {got}, expected torch.float32")
        comp = super().compare(output, actual, expected)
        if self.sums:
            comp.extra["max_sum_deviation"] = ref.sum_deviation(_np(actual))
            comp.extra["oracle_max_sum_deviation"] = ref.sum_deviation(expected.exact)
        return comp

    def __str__(self) -> str:
        return f"within {self.bound}" + (" (+ row/column sums)" if self.sums else "")


def given_forward(case: Case, actual: dict[str, Any]) -> dict[str, Bracket]:
    x = case.inputs["x"]
    repeat, eps = case.params["repeat"], case.params["eps"]
    exact = _np(ref.sinkhorn(x, repeat, eps))
    b = forward_bound(x, repeat, eps)
    nan = np.isnan(exact)
    low = np.where(nan, np.nan, exact * (1 - b))
    high = np.where(nan, np.nan, exact * (1 + b))
    return {"out": Bracket(exact=exact, low=low, high=high)}


def given_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict:
    x = case.inputs["x"]
    g = _np(exact["grad_x"])
    bound = gradient_bound(x, cotangents["out"], case.params["repeat"], case.params["eps"])
    bound = np.where(_nonfinite_matrices(_np(x)), np.inf, bound)
    return {"grad_x": Bracket(exact=g, low=g - bound, high=g + bound)}


def mask(case: Case, margin: float | None) -> dict[str, np.ndarray]:
    """No kinks: only matrices with a non-finite entry (outside the gradient's domain) are zeroed."""
    return {"out": _nonfinite_matrices(_np(case.inputs["x"]))}


FD_RELATIVE = 2.0**-3  # finite-difference step per unit |x|: rounding noise against truncation (docstring)


def fd_scale(case: Case) -> dict[str, torch.Tensor]:
    x = _np(case.inputs["x"])
    return {"x": torch.from_numpy(np.where(np.isfinite(x), 1.0 + np.abs(x) * FD_RELATIVE, 0.0))}


# -- the mix operators ------------------------------------------------------------------

SLACK = 2.0**-52  # float64's error in the bracket ends (sums of two exact values), widened away


def _round_outward(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[RN32(lo - slack), RN32(hi + slack)] as float64: every fp32 rounding of a value in [lo, hi]."""
    with np.errstate(over="ignore", invalid="ignore"):
        lo = np.where(np.isinf(lo), lo, lo - np.abs(lo) * SLACK)  # inf - inf would be NaN
        hi = np.where(np.isinf(hi), hi, hi + np.abs(hi) * SLACK)
        return lo.astype(np.float32).astype(np.float64), hi.astype(np.float32).astype(np.float64)


def _both_roundings(value: float) -> tuple[float, float]:
    """A float parameter and its fp32 rounding, the smaller first (an implementation may use either)."""
    rounded = float(np.float32(value))
    return min(value, rounded), max(value, rounded)


def logit_bracket(mixes: Any, scale: Any, base: Any, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(exact u, lowest, highest fp32 u): an fma RN(p + base) or a product and a sum RN(RN(p) + base)."""
    u = ref.mix_logits(mixes, scale, base, m)
    with np.errstate(over="ignore", invalid="ignore"):
        p = _np(mixes) * ref.mix_scales(scale, m)  # exact
        two_step = p.astype(np.float32).astype(np.float64) + _np(base)
    nan = np.isnan(u) | np.isnan(two_step)
    lo, hi = _round_outward(np.fmin(u, two_step), np.fmax(u, two_step))
    return u, np.where(nan, np.nan, lo), np.where(nan, np.nan, hi)


def _sigmoid_bracket(u_lo: np.ndarray, u_hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fp32 sigmoid of any u in [u_lo, u_hi] (docstring: 3 RHO relative, TINY absolute)."""
    return ref.sigmoid(u_lo) * (1 - 3 * RHO) - TINY, ref.sigmoid(u_hi) * (1 + 3 * RHO) + TINY


def given_split(case: Case, actual: dict[str, Any]) -> dict[str, Bracket]:
    """Brackets of pre, post and comb (module docstring)."""
    inputs, params = case.inputs, case.params
    m = params["m"]
    u, lo, hi = logit_bracket(inputs["mixes"], inputs["scale"], inputs["base"], m)
    lead = u.shape[:-1]
    pre, post, comb = ref.pre_split_mixes(**inputs, **params)
    s_lo, s_hi = _sigmoid_bracket(lo[..., :m], hi[..., :m])
    e_lo, e_hi = _both_roundings(params["pre_eps"])
    pre_lo, pre_hi = _round_outward(s_lo + e_lo, s_hi + e_hi)
    q_lo, q_hi = _sigmoid_bracket(lo[..., m:2 * m], hi[..., m:2 * m])
    with np.errstate(invalid="ignore"):
        corners = [q * k for q in (q_lo, q_hi) for k in _both_roundings(params["post_mult"])]
    post_lo, post_hi = _round_outward(np.minimum.reduce(corners), np.maximum.reduce(corners))

    def bracket(exact, low, high, shape):
        return Bracket(exact=exact, low=low.reshape(shape), high=high.reshape(shape))

    return {"pre": bracket(pre, pre_lo, pre_hi, (*lead, m, 1)), "post": bracket(post, post_lo, post_hi, (*lead, m, 1)),
            "comb": bracket(comb, lo[..., 2 * m:], hi[..., 2 * m:], (*lead, m, m))}


def _sum_bound(exact: np.ndarray, terms: list[np.ndarray]) -> ErrorBound:
    """The summation bound of n exact products, each rounded once in fp32 (module docstring)."""
    with np.errstate(invalid="ignore"):
        magnitude = np.sum([np.abs(t) for t in terms], axis=0) if terms else np.zeros(exact.shape)
    n = len(terms)
    reach = signed_reach(terms, n, roundings_per_term=1) if terms else None
    return ErrorBound(exact, summation_error(magnitude, n, roundings_per_term=1, absolute=n * FP32_UNDERFLOW), "bf16",
                      reach)


def given_apply(case: Case, actual: dict[str, Any]) -> dict[str, ErrorBound]:
    terms = ref.pre_apply_mix_terms(**case.inputs)
    return {"out": _sum_bound(ref.pre_apply_mix(**case.inputs), terms)}


def given_post(case: Case, actual: dict[str, Any]) -> dict[str, ErrorBound]:
    terms = ref.post_terms(**case.inputs)
    return {"out": _sum_bound(ref.post(**case.inputs), terms)}


# -- benchmark shapes (target: the share of copy bandwidth; None: judged by time) ---------

BENCH_TOKENS, BENCH_M, BENCH_HIDDEN = 16384, 4, 7168


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _sinkhorn_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return {"x": torch.randn(65536, 4, 4, device=device)}, {"repeat": 10, "eps": 1e-6}


def _sinkhorn_bwd_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    inputs, params = _sinkhorn_inputs(device)
    return {"grad_out": torch.randn_like(inputs["x"]), **inputs}, params


def _split_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    width = BENCH_M * (BENCH_M + 2)
    inputs = {"mixes": torch.randn(1, BENCH_TOKENS, width, device=device),
              "scale": torch.rand(3, device=device), "base": torch.randn(width, device=device)}
    return inputs, {"m": BENCH_M, "post_mult": 2.0, "pre_eps": 1e-6}


def _split_nbytes(inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> int:
    a, b, _ = inputs["mixes"].shape
    m = params["m"]
    return _nbytes(*inputs.values()) + a * b * (2 * m + m * m) * 4  # pre, post, comb written


def _apply_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    x = torch.randn(1, BENCH_TOKENS, BENCH_M, BENCH_HIDDEN, device=device, dtype=torch.bfloat16)
    return {"x": x, "mix": torch.rand(1, BENCH_TOKENS, BENCH_M, 1, device=device)}, {}


def _post_inputs(device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    lead = (1, BENCH_TOKENS)
    return {"x": torch.randn(*lead, BENCH_HIDDEN, device=device, dtype=torch.bfloat16),
            "residual": torch.randn(*lead, BENCH_M, BENCH_HIDDEN, device=device, dtype=torch.bfloat16),
            "post": torch.rand(*lead, BENCH_M, 1, device=device) * 2,
            "comb": torch.rand(*lead, BENCH_M, BENCH_M, device=device)}, {}


_SHAPE = f"a 1, b {BENCH_TOKENS}, m {BENCH_M}"


def _impls(name: str) -> dict:
    return {"torch": torch_impl(f"kernels.torch.mhc:{name}"), "tilelang": tilelang_impl(f"kernels.mhc:{name}")}


_SPLIT_POLICY = Fp32Within("fp32", bound="the fma-or-two-step bracket of u and the sigmoid model")

register(OpSpec(
    name="mhc.pre_split_mixes",
    oracle=ref.pre_split_mixes,
    strategy=strategies.mhc.pre_split_mixes_cases,
    outputs={name: _SPLIT_POLICY for name in ("pre", "post", "comb")},
    impls=_impls("pre_split_mixes"),
    given=given_split,
    doc="mHC: u = mixes * scale + base; pre = sigmoid(u[:m]) + pre_eps, post = sigmoid(u[m:2m]) * post_mult, "
        "comb = u[2m:] as (m, m).",
    bench=(BenchShape(_SHAPE, _split_inputs, _split_nbytes, target=None),),
))

def _register_sum(op: str, doc: str, given: Any, make: Any) -> None:
    """An op that is an fp32 sum rounded once to bf16, judged by the summation bound."""
    register(OpSpec(
        name=f"mhc.{op}",
        oracle=getattr(ref, op),
        strategy=getattr(strategies.mhc, f"{op}_cases"),
        outputs={"out": summation("bf16")},
        impls=_impls(op),
        given=given,
        doc=doc,
        bench=(BenchShape(f"{_SHAPE}, H {BENCH_HIDDEN} bf16", make,
                          lambda inputs, params: _nbytes(*inputs.values()) + _output_bytes(op, inputs),
                          target=0.9),),
    ))


def _output_bytes(op: str, inputs: dict[str, torch.Tensor]) -> int:
    """bf16 (a, b, H) for pre_apply_mix, (a, b, m, H) for post."""
    return (inputs["x"][:, :, 0] if op == "pre_apply_mix" else inputs["residual"]).numel() * 2


_register_sum("pre_apply_mix", "mHC: out = sum_i x[i] * mix[i], fp32 accumulation, bf16 output.", given_apply,
              _apply_inputs)
_register_sum("post", "mHC: out[n] = x * post[n] + sum_i comb[i, n] * residual[i], fp32 accumulation, bf16 output.",
              given_post, _post_inputs)


register(OpSpec(
    name="mhc.sinkhorn",
    oracle=ref.sinkhorn,
    strategy=strategies.mhc.sinkhorn_cases,
    outputs={"out": Fp32Within("fp32", sums=True)},
    impls={
        "torch": torch_impl("kernels.torch.mhc:sinkhorn"),
        "tilelang": tilelang_impl("kernels.mhc:sinkhorn"),
    },
    given=given_forward,
    doc="mHC Sinkhorn: softmax + eps, then column / (row, column)* normalisations with + eps.",
    bench=(BenchShape("x f32 (65536, 4, 4), repeat 10 (target 15 us)", _sinkhorn_inputs,
                      lambda inputs, params: 2 * _nbytes(inputs["x"]), target=None),),
    backward=Backward(
        inputs=("x",),
        grads={"grad_x": Fp32Within("fp32")},
        outputs=("out",),
        oracle=ref.sinkhorn_bwd,
        forward=ref.sinkhorn,
        impls={
            "torch": torch_impl("kernels.torch.mhc:sinkhorn_bwd"),
            "tilelang": tilelang_impl("kernels.mhc:sinkhorn_bwd"),
        },
        grad_dtype=torch.float32,
        mask=mask,
        fd_scale=fd_scale,
        given=given_backward,
        bench=(BenchShape("x f32 (65536, 4, 4), repeat 10 (target 15 us)", _sinkhorn_bwd_inputs,
                          lambda inputs, params: 3 * _nbytes(inputs["x"]), target=None),),
    ),
))
