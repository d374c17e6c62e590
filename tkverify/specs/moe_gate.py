"""moe.topk_gate_scored: the sqrt-softplus scored top-k gate that tile-kernels 2.1 trains with
(``moe_topk_gate_forward`` / ``moe_topk_gate_backward``), and its backward.

What it computes and its edge semantics are docs/contract/moe_gate.md; signatures and argument checks are
kernels/torch/moe_gate.py's.  The outputs are judged as the contract says:

* scores: `summation` against the exact sqrt(softplus(x)) within 4 u relative plus 2^-63 absolute
  (`score_bound`);
* topk_idx: bitwise (int64 pinned) against the selection the implementation's own scores make: the float32
  sum scores + bias ranked in moe.topk_gate's order (`given_forward`);
* topk_weights: `summation` against routed_scaling_factor u_j / (sum u_j + 1e-20) computed exactly from the
  implementation's own scores at that selection, within gamma_{k+2} (`weights_bound`).

The backward's grad_logits is judged by `within` (a `Bracket`) against the hand-derived float64 gradient within the
tally of `grad_bound`, on rows away from ties among the first k + 1 keys and away from underflowed scores
(`references.moe_gate.near_kink_rows`).

Input classes (the differential suite tags each judged case ``class: <name>``; `strategies.moe_gate` computes
them from the case's tensors):

* moe.topk_gate_scored: ``empty``, ``non_pow2``, ``nan:logits``, ``pos_inf:logits``, ``neg_inf:logits``,
  ``k_equals_experts``, ``masked_expert``, ``saturated_high``, ``score_underflow``, ``key_tie``,
  ``bias_made_tie`` (and ``nan_key`` where drawn).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import references.moe_gate as ref
import strategies.moe_gate
from tkverify import benchshapes
from tkverify.policies import FP32_UNDERFLOW, Bracket, ErrorBound, bitwise, gamma, summation, summation_error, within
from tkverify.registry import Backward, BenchShape, OpSpec, register, tilelang_impl, torch_impl

# tile-kernels' training shape: T = 16384 tokens routed to k = 8 of E = 256 experts (DeepSeek-V3's router).
_T, _E, _K, _SCALING = 16384, 256, 8, 2.5
# Relative error of a float32 sqrt(log1p(exp(x))): expf within 2 ULP (4 u) shrinks through log1p by
# y / ((1 + y) log1p(y)) <= 1, log1pf adds 1 ULP (2 u), the square root halves the sum (3 u) and rounds (u).
SCORE_ROUNDINGS = 4
# Absolute error where e^x leaves the float32 normal range: e^x off by at most 2^-126 (flushed), its square
# root by at most 2^-63.
SCORE_FLOOR = 2.0**-63
# The backward is judged away from a relative gap of this much between two of the first k + 1 keys: a float32
# key is within 5 u of |u| + |bias| of the exact one (score 4 u, the addition u), so two keys 2^-20 > 10 u
# apart keep their order in every implementation.
KINK_MARGIN = 2.0**-20
FD_MARGIN = 1e-4


def score_bound(logits: torch.Tensor) -> ErrorBound:
    """The exact scores and what a float32 evaluation may add (SCORE_ROUNDINGS u relative, SCORE_FLOOR)."""
    exact = ref.sqrt_softplus(logits)
    with np.errstate(invalid="ignore"):
        error = gamma(SCORE_ROUNDINGS) * np.abs(exact) + SCORE_FLOOR
    return ErrorBound(exact, error, "fp32")


def weights_bound(scores: torch.Tensor, topk_idx: np.ndarray, routed_scaling_factor: float) -> ErrorBound:
    """routed_scaling_factor u_j / D for the given float32 scores and selection: D a float32 sum of k scores
    and 1e-20 (k additions), then a division and a product (two roundings), each possibly subnormal."""
    exact = ref.weights_given_selection(scores, topk_idx, routed_scaling_factor)
    k = exact.shape[1]
    with np.errstate(invalid="ignore"):
        error = summation_error(np.abs(exact), k + 1, roundings_per_term=2, absolute=2 * FP32_UNDERFLOW)
    return ErrorBound(exact, error, "fp32")


def _own_scores(case, actual: dict[str, Any], exact: np.ndarray) -> torch.Tensor:
    """The implementation's scores where well formed, else the float32 rounding of the exact ones."""
    scores = actual.get("scores")
    shape = tuple(case.inputs["logits"].shape)
    if isinstance(scores, torch.Tensor) and scores.dtype == torch.float32 and tuple(scores.shape) == shape:
        return scores.detach().cpu()
    return torch.from_numpy(np.ascontiguousarray(exact.astype(np.float32)))


def given_forward(case, actual: dict[str, Any]) -> dict[str, Any]:
    logits, bias = case.inputs["logits"], case.inputs["bias"]
    k, scaling = case.params["k"], case.params["routed_scaling_factor"]
    scores = score_bound(logits)
    own = _own_scores(case, actual, scores.exact)
    topk_idx = ref.selection_given_scores(own, bias, k)
    return {"topk_idx": topk_idx, "topk_weights": weights_bound(own, topk_idx, scaling), "scores": scores}


# -- backward --------------------------------------------------------------------------------------------


def mask(case, margin: float | None) -> dict[str, np.ndarray]:
    """The rows of topk_weights whose cotangent is zeroed: `references.moe_gate.near_kink_rows` at `margin`
    (None: exact ties only, where the gradient does not exist)."""
    rows = ref.near_kink_rows(case.inputs["logits"], case.inputs["bias"], case.params["k"],
                              0.0 if margin is None else margin)
    return {"topk_weights": rows[:, None]}


def fd_scale(case) -> dict[str, torch.Tensor]:
    """Finite-difference step scale of each logit: |x| + 2^-6 (relative for large logits, where the score is
    sqrt(x); absolute near 0), 0 in a row outside the judged domain (`near_kink_rows` at margin 0: a tie, a non-finite key, an
    underflowed selected score), where the forward is not differentiable or not finite.  Not the
    row's rms: one huge logit would then move every small one across the selection's kinks."""
    x = case.inputs["logits"].double()
    outside = torch.from_numpy(ref.near_kink_rows(x, case.inputs["bias"], case.params["k"], 0.0))[:, None]
    return {"logits": torch.where(outside | ~torch.isfinite(x), torch.zeros_like(x), x.abs() + 2.0**-6)}


def grad_bound(case, cotangents: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> dict[str, Bracket]:
    """grad_logits in [exact - e, exact + e], e = gamma_{3k+28} M (unconstrained in a row whose cotangent is 0),
    M = (rsf |g_j| + sum_i |g_i w_i|) / D * du/dx per selected expert,
    exactly 0 elsewhere.  The tally, in units u: a selected score 6 (4 evaluation, 2 for the 2^-63 floor at a
    score >= 2^-40); D = sum u_j + 1e-20: k additions and the scores' 6; <g, w>: k for its products and
    additions, k + 8 for the saved weights (gamma_{k+2} given the scores, and the scores' 6); the scaled
    cotangent and the subtraction 2; the division by D 1 + (k + 6); du/dx from the score 10 (expm1 2, the
    square and the division 2, the score's 6), the product by it 1.  Total (2k + 8) + 2 + (k + 7) + 11."""
    logits, bias = case.inputs["logits"], case.inputs["bias"]
    k, scaling = case.params["k"], case.params["routed_scaling_factor"]
    g = ref.as_float64(cotangents["topk_weights"])
    topk_idx, weights, scores = ref.topk_gate_scored(logits, bias, k, scaling)
    picked = np.take_along_axis(scores, topk_idx, axis=1)
    derivative = np.take_along_axis(ref.sqrt_softplus_derivative(logits), topk_idx, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        denom = picked.sum(axis=1, keepdims=True) + ref.NORMALIZE_EPS
        size = (abs(scaling) * np.abs(g) + np.abs(g * weights).sum(axis=1, keepdims=True)) / denom * derivative
    magnitude = np.zeros(scores.shape, dtype=np.float64)
    np.put_along_axis(magnitude, topk_idx, np.where(g == 0, 0.0, size), axis=1)
    error = gamma(3 * k + 28) * magnitude + np.where(magnitude > 0, 4 * FP32_UNDERFLOW, 0.0)
    exact_grad = ref.as_float64(exact["grad_logits"])
    # A row no cotangent reaches is not judged (its forward may be NaN, and 0 * NaN is NaN).
    free = ~(g != 0).any(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        low = np.where(free, -np.inf, exact_grad - error)
        high = np.where(free, np.inf, exact_grad + error)
    return {"grad_logits": Bracket(exact_grad, low, high)}


# -- bench --------------------------------------------------------------------------------------------


def _gate_inputs(device) -> dict[str, torch.Tensor]:
    return {"logits": benchshapes.randn((_T, _E), torch.float32, device),
            "bias": 0.1 * benchshapes.randn((_E,), torch.float32, device, seed=1)}


def _forward_shape(device):
    return _gate_inputs(device), {"k": _K, "routed_scaling_factor": _SCALING}


def _forward_bytes(i, p) -> int:
    # logits read, scores written, bias read, idx (int64) and weights (fp32) written
    return 2 * benchshapes.nbytes(i["logits"]) + benchshapes.nbytes(i["bias"]) + _T * p["k"] * 12


def _backward_shape(device):
    inputs = _gate_inputs(device)
    topk_idx, weights, scores = ref.topk_gate_scored(inputs["logits"], inputs["bias"], _K, _SCALING)
    return {"grad_topk_weights": benchshapes.randn((_T, _K), torch.float32, device, seed=2), **inputs,
            "topk_idx": torch.from_numpy(topk_idx).to(device),
            "topk_weights": torch.from_numpy(weights.astype(np.float32)).to(device),
            "scores": torch.from_numpy(scores.astype(np.float32)).to(device)}, \
        {"k": _K, "routed_scaling_factor": _SCALING}


def _backward_written(i, p) -> int:
    return benchshapes.nbytes(i["scores"])  # grad_logits, the shape of scores


def _backward_bytes(i, p) -> int:
    # grad_logits written; read: the (T, k) idx (int64), weights and cotangent, and the k picked scores of
    # each row (a backward needs no other element of scores)
    return _backward_written(i, p) + _T * p["k"] * (8 + 4 + 4 + 4)


# Memory-bound: the forward moves 8 bytes an element of the T x E matrices (the (T, k) outputs add 5% at
# k = 8, E = 256), the backward writes 4 (its (T, k) reads and gathered scores add 16% there).
FORWARD_BENCH = (BenchShape(f"T{_T} E{_E} k{_K} f32", _forward_shape, _forward_bytes, target=0.9),)
BACKWARD_BENCH = (BenchShape(f"T{_T} E{_E} k{_K} f32", _backward_shape, _backward_bytes, target=0.9,
                             written=_backward_written, unread=("logits", "bias")),)


register(OpSpec(
    name="moe.topk_gate_scored",
    oracle=ref.topk_gate_scored,
    strategy=strategies.moe_gate.topk_gate_scored_cases,
    outputs={"topk_idx": bitwise(torch.int64), "topk_weights": summation("fp32"), "scores": summation("fp32")},
    impls={"torch": torch_impl("kernels.torch.moe_gate:topk_gate_scored"),
           "tilelang": tilelang_impl("kernels.moe.gate_scored:topk_gate_scored")},
    given=given_forward,
    doc="scores = sqrt(softplus(x)); top-k of scores + bias (topk_gate's order); w = rsf u_j / (sum u_j + 1e-20).",
    backward=Backward(
        inputs=("logits",),
        grads={"grad_logits": within("fp32")},
        outputs=("topk_weights",),
        oracle=ref.topk_gate_scored_bwd,
        impls={"torch": torch_impl("kernels.torch.moe_gate:topk_gate_scored_bwd"),
               "tilelang": tilelang_impl("kernels.moe.gate_scored:topk_gate_scored_bwd")},
        saved=("topk_idx", "topk_weights", "scores"),
        mask=mask,
        fd_scale=fd_scale,
        fd_margin=FD_MARGIN,
        kink_margin=KINK_MARGIN,
        given=grad_bound,
        bench=BACKWARD_BENCH,
    ),
    bench=FORWARD_BENCH,
))
