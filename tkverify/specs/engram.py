"""Engram gating: the forward, its backward, and how both are judged.

What the op computes, its domain and the error analysis behind every bound here are
docs/contract/engram.md#engram.gate; signatures and argument checks are
kernels/torch/engram.py's.  Each output and gradient is judged by `within` (`WithinAs`:
with its dtype checked) against per-element intervals that `analyse_forward` and
`analyse_backward` compute by interval arithmetic in float64 (`Iv`, `product`) from the
exact inputs, modelling an fp32 implementation (U, RHO, TINY, `gamma`).  The gradient
checks leave out rows near the gate's kinks (`kink_distance`, FD_MARGIN, KINK_MARGIN)
and rows outside the judged domain (`mask`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import torch

import references.engram as ref
import strategies.engram
from tkverify import formats
from tkverify.case import Case
from tkverify.policies import Bracket, Comparison, Within
from tkverify.registry import Backward, BenchShape, OpSpec, register, tilelang_impl, torch_impl

U = 2.0**-24
RHO = 2.0**-20
TINY = 2.0**-126

# The backward is judged where gg = sum G v cannot overflow fp32 (|G| < 2^4).
V_ROW_LIMIT = 2.0**100


def gamma(n: Any) -> Any:
    n = np.asarray(n, dtype=np.float64)
    return n * U / (1.0 - n * U)


# -- interval arithmetic on float64 arrays ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Iv:
    """Closed intervals [lo, hi], elementwise over float64 arrays (broadcasting)."""

    lo: np.ndarray
    hi: np.ndarray

    @staticmethod
    def point(x: Any) -> "Iv":
        x = np.asarray(x, dtype=np.float64)
        return Iv(x, x)

    def mag(self) -> np.ndarray:
        return np.maximum(np.abs(self.lo), np.abs(self.hi))

    def __add__(self, o: Any) -> "Iv":
        o = o if isinstance(o, Iv) else Iv.point(o)
        return Iv(self.lo + o.lo, self.hi + o.hi)

    def __sub__(self, o: Any) -> "Iv":
        o = o if isinstance(o, Iv) else Iv.point(o)
        return Iv(self.lo - o.hi, self.hi - o.lo)

    def __mul__(self, o: Any) -> "Iv":
        o = o if isinstance(o, Iv) else Iv.point(o)
        c = (self.lo * o.lo, self.lo * o.hi, self.hi * o.lo, self.hi * o.hi)
        return Iv(np.minimum.reduce(c), np.maximum.reduce(c))

    def __getitem__(self, key: Any) -> "Iv":
        return Iv(self.lo[key], self.hi[key])

    def widen(self, rel: Any = 0.0, absolute: Any = 0.0, mag: Any = None) -> "Iv":
        """+- (rel * magnitude + absolute); `mag` replaces the magnitude (a sum of |terms|)."""
        e = np.asarray(rel) * (self.mag() if mag is None else mag) + absolute
        return Iv(self.lo - e, self.hi + e)

    def hull(self, o: "Iv") -> "Iv":
        return Iv(np.minimum(self.lo, o.lo), np.maximum(self.hi, o.hi))

    def sum(self, axis: int) -> "Iv":
        """The sum over `axis` in any order: interval sum, + gamma(n-1) sum of magnitudes + n TINY."""
        n = self.lo.shape[axis]
        total = Iv(self.lo.sum(axis), self.hi.sum(axis))
        return total.widen(gamma(max(n - 1, 0)), n * TINY, self.mag().sum(axis))

    def contains(self, x: Any) -> np.ndarray:
        return (self.lo <= x) & (x <= self.hi)


def product(*factors: Any, rel: float = 0.0) -> Iv:
    """The product of n factors (intervals or arrays) as fp32 computes it in any order:
    the interval product, widened by gamma(n - 1) + `rel` (extra roundings, e.g. RHO of a
    division) and by the underflow allowance TINY prod(1 + |f_i|): a partial product that
    falls below the normal range loses up to TINY, which the remaining factors then scale
    (summed over the n - 1 steps and any order, that stays within this bound)."""
    ivs = [f if isinstance(f, Iv) else Iv.point(f) for f in factors]
    out = ivs[0]
    for f in ivs[1:]:
        out = out * f
    n = len(ivs)
    if n == 2:
        absolute = TINY
    else:
        absolute = TINY * functools.reduce(np.multiply, [1.0 + f.mag() for f in ivs])
    return out.widen(gamma(n - 1) + rel, absolute)


def _np(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64).numpy()
    return np.asarray(t, dtype=np.float64)


def _sigmoid(a: np.ndarray) -> np.ndarray:
    # np.where evaluates both branches: the unused one may overflow (inf / inf), harmlessly
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(a >= 0, 1.0 / (1.0 + np.exp(-a)), np.exp(a) / (1.0 + np.exp(a)))


def _gate_arg_bounds(z: np.ndarray, c_small: float, c_large: float, low: bool) -> np.ndarray:
    """The smallest (low=True) or largest value a = sign(z) sqrt(max(|z|, c)) (1 +- RHO)
    may take at this z for c in [c_small, c_large]: a is non-decreasing in z, increasing
    in c for z > 0 and decreasing for z < 0."""
    with np.errstate(invalid="ignore"):
        if low:
            pos = np.sqrt(np.maximum(z, c_small)) * (1 - RHO)
            neg = -np.sqrt(np.maximum(-z, c_large)) * (1 + RHO)
        else:
            pos = np.sqrt(np.maximum(z, c_large)) * (1 + RHO)
            neg = -np.sqrt(np.maximum(-z, c_small)) * (1 - RHO)
    return np.where(z > 0, pos, np.where(z < 0, neg, 0.0))


@dataclasses.dataclass
class Analysis:
    """Exact float64 values and the intervals an fp32 implementation's results lie in."""

    hidden: int
    clamp: float
    exact: dict[str, np.ndarray]  # out, d, g, rx, rk, z, zeta
    d: Iv
    rx: Iv
    rk: Iv
    z: Iv
    g: Iv
    out: Iv  # before the final rounding to bf16


def analyse_forward(x: Any, k: Any, v: Any, w: Any, eps: float, clamp: float) -> Analysis:
    x, k, v, w = _np(x), _np(k), _np(v), _np(w)
    hidden = x.shape[-1]
    s = 1.0 / math.sqrt(hidden)

    def inv_rms(a: np.ndarray) -> tuple[np.ndarray, Iv]:
        m = (a * a).sum(-1) / hidden + eps
        err = gamma(hidden + 4) * m + TINY
        lo = np.maximum(m - err, np.finfo(np.float64).tiny)
        return 1.0 / np.sqrt(m), Iv(1.0 / np.sqrt(m + err) * (1 - 2 * RHO), 1.0 / np.sqrt(lo) * (1 + 2 * RHO))

    rx0, rx = inv_rms(x)
    rk0, rk = inv_rms(k)
    terms = x * w * k
    d0 = terms.sum(-1)
    e_d = gamma(hidden + 1) * np.abs(terms).sum(-1) + TINY * (np.abs(x) + np.abs(w) + np.abs(k) + 2.0).sum(-1)
    d = Iv(d0 - e_d, d0 + e_d)
    z0 = d0 * rx0 * rk0 * s
    zeta = np.abs(terms).sum(-1) * rx0 * rk0 * s
    z = product(d, rx, rk, s, rel=2 * RHO)

    c_small, c_large = clamp * (1 - U), clamp * (1 + U)
    g0 = _np(ref.gate(torch.from_numpy(z0), clamp))
    g = Iv(_sigmoid(_gate_arg_bounds(z.lo, c_small, c_large, low=True)) * (1 - 3 * RHO) - TINY,
           _sigmoid(_gate_arg_bounds(z.hi, c_small, c_large, low=False)) * (1 + 3 * RHO) + TINY)

    gv = product(g[..., None], v[:, None, :])
    out = (gv + x).widen(U, TINY, np.abs(x) + gv.mag())
    out0 = x + g0[..., None] * v[:, None, :]
    return Analysis(hidden, clamp, {"out": out0, "d": d0, "g": g0, "rx": rx0, "rk": rk0, "z": z0, "zeta": zeta},
                    d, rx, rk, z, g, out)


def _rounded(iv: Iv, fmt: formats.Format) -> tuple[np.ndarray, np.ndarray]:
    """Both ends of an interval rounded (RNE) to `fmt`: the range of RN(y) for y in it."""
    return (fmt.decode(fmt.encode(iv.lo)), fmt.decode(fmt.encode(iv.hi)))


def _dadz(z: Iv, c_small: float, c_large: float) -> Iv:
    """da/dz = 1/(2 sqrt|z|) on |z| >= c, 0 below, over the interval z (RHO-widened)."""
    straddles = (z.lo <= 0) & (z.hi >= 0)
    min_mag = np.where(straddles, 0.0, np.minimum(np.abs(z.lo), np.abs(z.hi)))
    max_mag = z.mag()
    may_live = max_mag >= c_small
    may_die = min_mag < c_large
    hi = np.where(may_live, 0.5 / np.sqrt(np.maximum(min_mag, c_small)), 0.0)
    lo = np.where(may_die, 0.0, 0.5 / np.sqrt(np.maximum(max_mag, c_small)))
    return Iv(lo * (1 - 3 * RHO), hi * (1 + 3 * RHO))


def analyse_backward(a: Analysis, grad_out: Any, x: Any, k: Any, v: Any, w: Any) -> dict[str, Iv]:
    """Intervals of grad_x, grad_k, grad_v (before their bf16 rounding) and grad_w."""
    grad, x, k, v, w = _np(grad_out), _np(x), _np(k), _np(v), _np(w)
    tokens, heads, hidden = x.shape
    s = 1.0 / math.sqrt(hidden)
    c_small, c_large = a.clamp * (1 - U), a.clamp * (1 + U)

    gv_terms = grad * v[:, None, :]
    gg = Iv.point(gv_terms.sum(-1)).widen(gamma(hidden), hidden * TINY, np.abs(gv_terms).sum(-1))
    dadz = _dadz(a.z, c_small, c_large)
    glo, ghi = np.clip(a.g.lo, 0.0, 1.0), np.clip(a.g.hi, 0.0, 1.0)
    f_lo, f_hi = glo * (1 - glo), ghi * (1 - ghi)
    half_inside = (glo <= 0.5) & (ghi >= 0.5)
    # Clipping g to [0, 1] is not the implementation's value: keep the slack of g's own interval.
    slack = np.maximum(a.g.hi - ghi, glo - a.g.lo)
    sig = Iv(np.minimum(f_lo, f_hi) - slack, np.where(half_inside, 0.25, np.maximum(f_lo, f_hi)) + slack)
    sig = sig.widen(gamma(2), TINY)
    gz = product(gg, sig, dadz)
    gd = product(gz, a.rx, a.rk, s, rel=2 * RHO)
    big_a = product(gd, a.d).hull(product(gz, a.z))

    def two_terms(first: Iv | None, gd_term: Iv, a_term: Iv) -> Iv:
        total = gd_term - a_term
        mag = gd_term.mag() + a_term.mag()
        if first is not None:
            total = total + first
            mag = mag + first.mag()
        return total.widen(gamma(2), 2 * TINY, mag)

    gd3 = gd[..., None]
    inv_h = 1.0 / hidden  # a division by H: one more rounding (RHO)
    t1x = product(gd3, w, k)
    t2x = product(big_a[..., None], a.rx[..., None], a.rx[..., None], inv_h, x, rel=RHO)
    grad_x = two_terms(Iv.point(grad), t1x, t2x)
    t1k = product(gd3, w, x)
    t2k = product(big_a[..., None], a.rk[..., None], a.rk[..., None], inv_h, k, rel=RHO)
    grad_k = two_terms(None, t1k, t2k)
    grad_v = product(a.g[..., None], grad).sum(1)
    grad_w = product(gd3, x, k).sum(0)
    return {"grad_x": grad_x, "grad_k": grad_k, "grad_v": grad_v, "grad_w": grad_w}


# -- the policies ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class WithinAs(Within):
    """`within`, after checking the output's dtype (a bf16 output returned as fp32 is wrong)."""

    dtype: torch.dtype | None = None

    def compare(self, output: str, actual: Any, expected: Any) -> Comparison:
        if self.dtype is not None and (not isinstance(actual, torch.Tensor) or actual.dtype != self.dtype):
            got = actual.dtype if isinstance(actual, torch.Tensor) else type(actual).__name__
            return Comparison.rejected(output, str(self.fmt), "within", f"dtype {got}, expected {self.dtype}")
        return super().compare(output, actual, expected)

    def __str__(self) -> str:
        return f"within the fp32 error analysis ({self.fmt})"


def within_as(fmt: str, dtype: torch.dtype) -> WithinAs:
    return WithinAs(fmt, dtype)


def _bracket(exact: np.ndarray, iv: Iv, fmt: formats.Format | None = None) -> Bracket:
    lo, hi = (iv.lo, iv.hi) if fmt is None else _rounded(iv, fmt)
    return Bracket(exact=exact, low=lo, high=hi)


def _analysis_of(case: Case) -> Analysis:
    i = case.inputs
    return analyse_forward(i["x"], i["k"], i["v"], i["w"], case.params["eps"], case.params["clamp"])


def given_forward(case: Case, actual: dict[str, Any]) -> dict[str, Bracket]:
    a = _analysis_of(case)
    return {
        "out": _bracket(a.exact["out"], a.out, formats.BF16),
        "d": _bracket(a.exact["d"], a.d),
        "g": _bracket(a.exact["g"], a.g),
        "rx": _bracket(a.exact["rx"], a.rx),
        "rk": _bracket(a.exact["rk"], a.rk),
    }


def given_backward(case: Case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict:
    i = case.inputs
    a = _analysis_of(case)
    ivs = analyse_backward(a, cotangents["out"], i["x"], i["k"], i["v"], i["w"])
    return {
        "grad_x": _bracket(_np(exact["grad_x"]), ivs["grad_x"], formats.BF16),
        "grad_k": _bracket(_np(exact["grad_k"]), ivs["grad_k"], formats.BF16),
        "grad_v": _bracket(_np(exact["grad_v"]), ivs["grad_v"], formats.BF16),
        "grad_w": _bracket(_np(exact["grad_w"]), ivs["grad_w"]),
    }


FD_FLOOR = 2.0**-6
# Finite differences skip rows whose |z| is within 1e-3 of its scale from 0 or the clamp: a step
# of 1e-7 (gradcheck) or 2e-6 (central differences) in every element then moves z by at most
# 3e-4 of its distance to a kink, and by as little relative to |z| (the curvature of sqrt|z|).
FD_MARGIN = 1e-3
# Rows this close to a kink (relative to z's scale) are left out of the comparison of an
# implementation's gradients: its fp32 z errs by up to 2 gamma(H+4) + 4 RHO of that scale
# (< 2^-10 for H <= 7168), so it may legitimately put them on either side.
KINK_MARGIN = 2.0**-9


def _row_floor(a: np.ndarray, eps: float | None) -> np.ndarray:
    """2^-6 of the row's scale: its rms, or sqrt(eps) where eps dominates (rx's own scale)."""
    rms = np.sqrt((a * a).mean(-1, keepdims=True)) if a.size else np.zeros(a.shape[:-1] + (1,))
    return FD_FLOOR * (np.maximum(rms, math.sqrt(eps)) if eps is not None else rms)


def fd_scale(case: Case) -> dict[str, torch.Tensor]:
    """Finite-difference step scales: |a| + 2^-6 of the row's scale, sqrt(eps) at least for x and k,
    so that a step in a tiny row (|x| << sqrt(eps)) still moves rx and out measurably."""
    i, eps = case.inputs, case.params["eps"]
    out = {}
    for name, row_eps in (("x", eps), ("k", eps), ("v", None), ("w", None)):
        a = _np(i[name])
        out[name] = torch.from_numpy(np.abs(a) + _row_floor(a, row_eps))
    return out


def kink_distance(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Per row (T, hc): (distance of z to the nearest kink, 0 or +-clamp; z's scale).

    The scale bounds how far a finite-difference step of unit size in every
    element (`fd_scale`) moves z: zeta + 3 |z|, zeta = sum_i sx_i sw_i sk_i rx rk
    / sqrt(H) with the step scales s of x, w, k (their relative changes move d
    by at most zeta, and rx, rk by at most about |z| each).
    """
    i = case.inputs
    x, k, w = _np(i["x"]), _np(i["k"]), _np(i["w"])
    eps, clamp = case.params["eps"], case.params["clamp"]
    hidden = x.shape[-1]
    rx = 1.0 / np.sqrt((x * x).mean(-1) + eps)
    rk = 1.0 / np.sqrt((k * k).mean(-1) + eps)
    z = (x * w * k).sum(-1) * rx * rk / math.sqrt(hidden)
    sx, sk = np.abs(x) + _row_floor(x, eps), np.abs(k) + _row_floor(k, eps)
    sw = np.abs(w) + _row_floor(w, None)
    zeta = (sx * sw * sk).sum(-1) * rx * rk / math.sqrt(hidden)
    return np.minimum(np.abs(z), np.abs(np.abs(z) - clamp)), zeta + 3 * np.abs(z)


def mask(case: Case, margin: float | None) -> dict[str, np.ndarray]:
    """Rows (t, h) whose cotangent is zeroed: outside the judged domain, or (margin given)
    with |z| within margin * (zeta + |z|) of 0 or of the clamp."""
    i = case.inputs
    v = _np(i["v"])
    x = _np(i["x"])
    excluded = np.broadcast_to((np.abs(v).sum(-1) >= V_ROW_LIMIT)[:, None], x.shape[:2]).copy()
    if margin is not None:
        dist, scale = kink_distance(case)
        excluded |= dist <= margin * scale
    return {"out": excluded[..., None]}


def smooth(case: Case, outputs: dict[str, Any]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """out rebuilt from the implementation's fp32 g as x + g v (float64), with noise |v| width(g)."""
    i = case.inputs
    x, v = _np(i["x"]), _np(i["v"])[:, None, :]
    g = _np(outputs["g"])[..., None]
    a = _analysis_of(case)
    width = (a.g.hi - a.g.lo)[..., None]
    return {"out": (x + g * v, np.abs(v) * width + 2.0**-50 * (np.abs(x) + np.abs(g * v)))}


# -- benchmark shapes (tkverify bench) ---------------------------------------------------

BENCH_TOKENS, BENCH_HEADS, BENCH_HIDDEN = 4096, 4, 4096
BENCH_NAME = f"T{BENCH_TOKENS} hc{BENCH_HEADS} H{BENCH_HIDDEN} bf16"


def bench_forward_inputs(device: Any, tokens: int = BENCH_TOKENS, heads: int = BENCH_HEADS,
                         hidden: int = BENCH_HIDDEN) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(inputs, params) of one forward call: normal x, k, v (bf16), w = wh * we around 1 (fp32)."""
    gen = torch.Generator(device=device).manual_seed(0)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)

    w = torch.rand((heads, hidden), generator=gen, device=device) + 0.5
    return ({"x": normal(tokens, heads, hidden), "k": normal(tokens, heads, hidden), "v": normal(tokens, hidden),
             "w": w}, {"eps": 1e-6, "clamp": 1e-6})


def bench_backward_inputs(device: Any, tokens: int = BENCH_TOKENS, heads: int = BENCH_HEADS,
                          hidden: int = BENCH_HIDDEN) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(kwargs, params) of one backward call: the saved d, g, rx, rk of the float64 oracle's forward,
    rounded to fp32 (what a forward saves; tkverify depends on no implementation)."""
    inputs, params = bench_forward_inputs(device, tokens, heads, hidden)
    _, d, g, rx, rk = (t.to(device=device, dtype=torch.float32) for t in ref.engram_gate_fwd(**inputs, **params))
    gen = torch.Generator(device=device).manual_seed(1)
    grad_out = torch.randn(inputs["x"].shape, generator=gen, device=device).to(torch.bfloat16)
    return {"grad_out": grad_out, **inputs, "d": d, "g": g, "rx": rx, "rk": rk}, params


def bench_forward_written(inputs: dict[str, torch.Tensor], params: dict[str, float]) -> int:
    """out and d, g, rx, rk, each written once."""
    x = inputs["x"]
    return x.nbytes + 4 * x.shape[0] * x.shape[1] * 4


def bench_forward_bytes(inputs: dict[str, torch.Tensor], params: dict[str, float]) -> int:
    """x, k, v, w read once; what bench_forward_written writes."""
    x = inputs["x"]
    return 2 * x.nbytes + inputs["v"].nbytes + inputs["w"].nbytes + bench_forward_written(inputs, params)


def bench_backward_written(inputs: dict[str, torch.Tensor], params: dict[str, float]) -> int:
    """grad_x, grad_k, grad_v, grad_w, each written once."""
    return 2 * inputs["x"].nbytes + inputs["v"].nbytes + inputs["w"].nbytes


def bench_backward_bytes(inputs: dict[str, torch.Tensor], params: dict[str, float]) -> int:
    """grad_out, x, k, v, w, d, g, rx, rk read once; what bench_backward_written writes."""
    x = inputs["x"]
    read = 3 * x.nbytes + inputs["v"].nbytes + inputs["w"].nbytes + 4 * x.shape[0] * x.shape[1] * 4
    return read + bench_backward_written(inputs, params)


FORWARD_BENCH = (BenchShape(BENCH_NAME, bench_forward_inputs, bench_forward_bytes, target=0.9,
                            written=bench_forward_written),)
BACKWARD_BENCH = (BenchShape(BENCH_NAME, bench_backward_inputs, bench_backward_bytes, target=0.8,
                             written=bench_backward_written),)


register(OpSpec(
    name="engram.gate",
    oracle=ref.engram_gate_fwd,
    strategy=strategies.engram.engram_gate_cases,
    outputs={
        "out": within_as("bf16", torch.bfloat16),
        "d": within_as("fp32", torch.float32),
        "g": within_as("fp32", torch.float32),
        "rx": within_as("fp32", torch.float32),
        "rk": within_as("fp32", torch.float32),
    },
    impls={
        "torch": torch_impl("kernels.torch.engram:engram_gate_fwd"),
        "tilelang": tilelang_impl("kernels.engram:engram_gate_fwd"),
    },
    given=given_forward,
    doc="Engram gating: out = x + sigmoid(sign(z) sqrt(max(|z|, c))) v, z = <x w, k> rx rk / sqrt(H).",
    backward=Backward(
        inputs=("x", "k", "v", "w"),
        grads={
            "grad_x": within_as("bf16", torch.bfloat16),
            "grad_k": within_as("bf16", torch.bfloat16),
            "grad_v": within_as("bf16", torch.bfloat16),
            "grad_w": within_as("fp32", torch.float32),
        },
        outputs=("out",),
        oracle=ref.engram_gate_bwd,
        forward=ref.engram_gate_fwd,
        impls={
            "torch": torch_impl("kernels.torch.engram:engram_gate_bwd"),
            "tilelang": tilelang_impl("kernels.engram:engram_gate_bwd"),
        },
        saved=("d", "g", "rx", "rk"),
        grad_dtype=torch.bfloat16,
        mask=mask,
        fd_scale=fd_scale,
        fd_margin=FD_MARGIN,
        kink_margin=KINK_MARGIN,
        given=given_backward,
        smooth=smooth,
        bench=BACKWARD_BENCH,
    ),
    bench=FORWARD_BENCH,
))
