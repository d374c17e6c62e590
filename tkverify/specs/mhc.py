"""mHC: the Sinkhorn normalisation (forward and backward) and the three mix operators
pre_split_mixes, pre_apply_mix and post, and how each is judged.

What each op computes, its edge semantics and the error analyses behind every bound here
are docs/contract/mhc.md; signatures and argument checks are kernels/torch/mhc.py's.
Sinkhorn's output is judged by `within` against a relative bound per matrix
(`forward_bound`, resting on an assumed gain K of the normalisation chain), its gradient
against a per-element bound from the exact intermediates (`gradient_bound`), with
finite-difference steps scaled by `fd_scale`.  pre_split_mixes is judged by `within`
against brackets of u (an fma or a product then a sum, `logit_bracket`) carried through
the sigmoid model (`given_split`); pre_apply_mix and post by `summation`, as reduce_fused
is (`_sum_bound`).  Their backward passes are sums of exact products too: each gradient is judged by
`within` a bracket of the same summation bound over the gradient's own terms (`_product_sum_bracket`),
unconstrained on tokens with a non-finite input.  The benchmark shapes are at the end.

Input classes (the differential suite tags each judged case ``class: <name>`` per class it is in,
computed from its tensors by `strategies.quant.case_classes`; ``<class>:<input>`` names the input; the
report counts them and tests/test_classes.py fails where one has no example under the ci profile):

* mhc.post: ``dtype_max:residual``, ``dtype_max:x``, ``empty``, ``neg_zero:comb``, ``neg_zero:residual``,
  ``neg_zero:x``, ``non_pow2``, ``signed_zero_tie:comb``, ``signed_zero_tie:residual``, ``signed_zero_tie:x``,
  ``single_row``, ``subnormal:residual``, ``subnormal:x``, ``zero_row:comb``.
* mhc.pre_apply_mix: ``empty``, ``neg_zero:mix``, ``non_pow2``, ``subnormal:x``, ``zero_row:mix``.
* mhc.pre_split_mixes: ``empty``, ``nan:mixes``, ``neg_inf:mixes``, ``neg_zero:base``, ``non_pow2``,
  ``pos_inf:mixes``, ``signed_zero_tie:base``, ``subnormal:base``, ``subnormal:mixes``.
* mhc.sinkhorn: ``empty``, ``non_pow2``.
"""

from __future__ import annotations

import dataclasses
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
K = 2.0  # the assumed gain of composed normalisations on a perturbation (docs/contract/mhc.md#mhc.sinkhorn)


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
    """B per matrix, shape (..., 1, 1): the relative bound of docs/contract/mhc.md#mhc.sinkhorn."""
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
    """The gradient bound of docs/contract/mhc.md#mhc.sinkhorn, per element of grad_x (x's shape)."""
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
            return Comparison.rejected(output, str(self.fmt), "within", f"dtype {got}, expected torch.float32")
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


FD_RELATIVE = 2.0**-3  # step per unit |x|: rounding noise against truncation (docs/contract/mhc.md#mhc.sinkhorn)


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
    """The fp32 sigmoid of any u in [u_lo, u_hi]: 3 RHO relative, TINY absolute (docs/contract/mhc.md)."""
    return ref.sigmoid(u_lo) * (1 - 3 * RHO) - TINY, ref.sigmoid(u_hi) * (1 + 3 * RHO) + TINY


def given_split(case: Case, actual: dict[str, Any]) -> dict[str, Bracket]:
    """Brackets of pre, post and comb (docs/contract/mhc.md#mhc.pre_split_mixes)."""
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
    """The summation bound of n exact products, each rounded once in fp32 (docs/contract/mhc.md#mhc.pre_apply_mix)."""
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
