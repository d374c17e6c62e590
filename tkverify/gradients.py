"""Gradient checks for ops that declare a backward (`tkverify.registry.Backward`).

Three checks, each reported per (op, differentiable input, implementation):

``gradcheck`` (implementation "oracle")
    The float64 backward *derived by hand* is checked against finite
    differences of the float64 forward with ``torch.autograd.gradcheck``.  The
    hand-written backward is wrapped in a ``torch.autograd.Function`` whose
    forward is the op's float64 forward and whose backward calls the oracle's
    backward, so what gradcheck compares is that formula (not torch's autograd
    of the forward) against the numerical Jacobian.  Each input is checked on
    its own, re-parametrised as ``x0 + s * u`` with the per-element step scale
    ``s`` (the op's `fd_scale`; by default |x0| + 2^-6 rms of its row), so that
    one gradcheck step (``GRADCHECK_EPS`` in u) is a small *relative* change of
    every element whatever its magnitude; outputs are divided by their largest
    magnitude.  Output elements within the op's kink margin (`Backward.mask`
    with `fd_margin`) are left out of the function, so that finite differences
    never straddle a kink.  Inputs of more than ``SKETCH`` elements are
    checked through a random sketch: u has ``SKETCH`` coordinates mapped onto
    the input by a random normal matrix Q (each element still moves by about
    GRADCHECK_EPS of its scale, as in a full check), and the kept outputs are
    mapped onto ``SKETCH`` values by a random P (unit rows), so that gradcheck
    (full mode) compares P J diag(s) Q, numerically and through the hand
    backward.  That is fast mode's v^T J u with a few vectors on each side:
    any error in J shows with probability 1, and a failure stays cheap
    (fast mode itself re-runs the full Jacobian in slow mode when it fails,
    which large inputs cannot afford).  Tolerances: ``GRADCHECK_ATOL`` and
    ``GRADCHECK_RTOL``; a Jacobian mismatch stands only where it also exceeds
    the finite differences' own error, measured per entry by Richardson
    extrapolation (`tkverify.finite_differences.beyond_resolution`: steps far larger than the inputs,
    as a step floor gives subnormal inputs, leave a truncation error no
    tolerance on the derivative covers).  The check also compares one directional derivative,
    hand backward against a central difference with a Richardson bound (as
    ``consistency`` does in float64), which is the row's figure ("max error")
    and must hold too.

``vs_oracle``
    Every implementation's backward, fed the cotangents, the inputs and its own
    forward's saved outputs, is judged against the float64 backward on the same
    inputs and cotangents, per gradient, by the policies the op declares
    (through `Backward.given`, e.g. per-element brackets from an error
    analysis).  Cotangents are standard normal values in the cotangent dtype,
    zero where `Backward.mask(case, kink_margin)` says the gradient is not
    judged (outside the domain, or where the implementation's precision
    cannot tell on which side of a kink an element lies).

``consistency``
    An implementation's backward must be the derivative of its own forward:
    for a random direction Δ in one input and a cotangent c (zero within the
    kink margin at every point the difference visits),
        ana = <grad_impl, Δ>   against   num = (L(x + Δ) - L(x - Δ)) / 2,
        L(x) = sum over differentiated outputs of <c, f_impl(x)>.
    * In float64 where the implementation accepts float64 inputs (tried first:
      a TypeError or ValueError from its validation means it does not).
      Δ = h δ with h = ``FD_STEP`` and δ = normal * fd_scale.  Bound:
      2 |num(2Δ) / 2 - num(Δ)| (Richardson: the truncation error of num(Δ) is
      a third of that difference) + FLOAT64_EVAL sum |c| (|f(x+Δ)| + |f(x-Δ)|)
      / 2 (the float64 evaluation of the outputs: 2^-44, 512 float64 ULPs, is
      well above the error of sums of up to 2^13 terms) + FLOAT64_FLOOR sum
      |grad_i Δ_i|.
    * Otherwise in working precision: Δ_i = RN(x_i + t_i) - x_i with t_i =
      ``WORKING_STEP`` * normal * fd_scale, kept only where x_i - Δ_i is also
      representable (so the difference is exactly central).  Bound:
      2 T + Q + N (+ FLOAT64_EVAL sum |c| |f|), where T = |num_oracle - <grad_oracle, Δ>|
      is the truncation error of this very step measured on the float64 oracle;
      Q = sum |Δ_i| halfwidth_i, the implementation's allowed gradient error
      (the half-width of the op's bracket for that gradient, or one ULP of the
      gradient's format); and N = sum |c_j| (noise_j(x+Δ) + noise_j(x-Δ)) / 2,
      the forward's evaluation noise (`Backward.smooth` rebuilds the outputs
      from higher-precision ones with a noise bound; otherwise the half-width
      of the forward's bracket, or half an ULP).  T is an estimate from the
      oracle, not a bound: the implementation's forward is within its
      declared bounds of the oracle's, so its curvature is the oracle's.
      This mode is coarse: its resolution is a few % of the directional
      derivative where rigorous fp32 noise bounds and a bf16 gradient's
      rounding meet a step of 2^-4; it catches gross inconsistencies, and
      leaves subtle ones to ``vs_oracle`` (and to float64, where available).
    The figure is |ana - num| / sum |grad_i Δ_i| against the bound on the same scale.
    Where that relative bound exceeds ``INFORMATIVE`` (the outputs' rounding or
    the function's curvature swamps the step's effect: a saturated gate, a
    term far below the output's magnitude) the direction is still judged but
    leaves the figures alone (count 0).

Kinks: every finite-difference check zeroes the cotangent of output elements
that the op's `mask` places within max(fd_margin, FD_MARGIN_PER_STEP * 2h) of a
kink at the base point or at either end of the longest step (gradcheck's own
steps, GRADCHECK_EPS in u, are smaller still).

Failures save the case (with the cotangent seed) beside the forward's case
files; ``tkverify replay`` runs the gradient checks again on it.

Coverage: with ``record_coverage``, `verify` records per judged example the
kernels the implementation's backward launched (every call of the example's
checks) and the example's input classes, as the differential suite does for a
forward (`tkverify.coverage`), under the row ``<op> (backward)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd.gradcheck import GradcheckError

from tkverify import coverage, formats
from tkverify.case import Case, save_case
from tkverify.check import UnsupportedTally, VerificationError, excuse_known, replay_command, run_impl
from tkverify.finite_differences import (FD_STEP, FLOAT64_EVAL, GRADCHECK_ATOL, GRADCHECK_EPS,
                                         GRADCHECK_RTOL, SKETCH, beyond_resolution, central_difference_float64, f64,
                                         inner, loss, sketch, sketched)
from tkverify.poison import poisoned
from tkverify.policies import Bracket, ErrorBound
from tkverify.registry import Backward, Failure, Impl, OpSpec

ORACLE = "oracle"  # the pseudo-implementation under which the oracle's gradcheck is reported
CHECKS = ("gradcheck", "vs_oracle", "consistency")

FD_MARGIN_PER_STEP = 50.0  # kink margin per unit of step: mask(case, max(fd_margin, 50 * 2h))
WORKING_STEP = 2.0**-4  # working-precision consistency: relative size of the rounded step
INFORMATIVE = 0.5  # a direction whose relative bound exceeds this says little: judged, not in the figures


@dataclasses.dataclass
class GradientCheck:
    """One verdict: one check of one input's gradient, for one implementation, on one case."""

    op: str
    input: str
    impl: str
    check: str
    error: float  # in `unit`: ULP (vs_oracle) or relative (gradcheck, consistency)
    unit: str
    passed: bool
    count: int = 1  # elements judged (vs_oracle) or directions (finite-difference checks)
    bound: float | None = None  # the bound `error` was held to, where it varies per case
    policy: str = ""
    message: str = ""
    worst: dict[str, Any] | None = None
    exact: int = 0
    sum_error: float = 0.0


class GradientError(VerificationError):
    """A backward disagreed with the float64 backward or with its own forward."""


# -- plumbing ----------------------------------------------------------------------


def _named(result: Any, names: list[str], who: str) -> dict[str, Any]:
    if isinstance(result, dict):
        return {n: result[n] for n in names}
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) != len(names):
        raise TypeError(f"{who} returned {len(result)} values, expected {len(names)}: {names}")
    return dict(zip(names, result))


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def _float64_inputs(case: Case) -> dict[str, torch.Tensor]:
    return {n: (f64(t) if _is_float(t) else t) for n, t in case.inputs.items()}


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def _masks(bw: Backward, case: Case, margin: float | None, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Per differentiated output, a bool array of its shape: True where the cotangent is zeroed."""
    declared = bw.mask(case, margin) if bw.mask is not None else {}
    return {o: np.broadcast_to(np.asarray(declared[o], dtype=bool), shapes[o]) if o in declared
            else np.zeros(shapes[o], dtype=bool) for o in bw.outputs}


def _union(*masks: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {o: np.logical_or.reduce([m[o] for m in masks]) for o in masks[0]}


def fd_scales(spec: OpSpec, case: Case) -> dict[str, torch.Tensor]:
    """Per-element finite-difference step scale of each differentiable input (float64)."""
    bw = spec.backward
    if bw.fd_scale is not None:
        return {n: f64(s) for n, s in bw.fd_scale(case).items()}
    out = {}
    for name in bw.inputs:
        x = f64(case.inputs[name])
        if x.dim() == 0 or x.numel() == 0:
            out[name] = x.abs() + (x.abs().max() if x.numel() else 0.0) * 2.0**-6
            continue
        rms = x.square().mean(-1, keepdim=True).sqrt()
        out[name] = x.abs() + 2.0**-6 * rms
    return out


def cotangents(spec: OpSpec, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, torch.dtype], seed: int,
               masks: dict[str, np.ndarray] | None = None) -> dict[str, torch.Tensor]:
    """Standard normal cotangents rounded to their dtype (CPU), zero where masked."""
    out = {}
    for i, o in enumerate(spec.backward.outputs):
        values = _rng(seed, 1, i).standard_normal(shapes[o])
        if masks is not None:
            values = np.where(masks[o], 0.0, values)
        out[o] = torch.from_numpy(np.ascontiguousarray(values)).to(dtypes[o])
    return out


def _grad_kwargs(bw: Backward, cots: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"grad_{o}": c for o, c in cots.items()}


def _oracle_backward(spec: OpSpec, cots: dict[str, torch.Tensor], inputs: dict[str, Any],
                     params: dict[str, Any]) -> dict[str, torch.Tensor]:
    bw = spec.backward
    res = bw.oracle(**_grad_kwargs(bw, cots), **inputs, **params)
    return {g: f64(t) for g, t in _named(res, list(bw.grads), "the float64 backward").items()}


def _forward64(spec: OpSpec) -> Callable[..., Any]:
    return spec.backward.forward or spec.oracle


def _figure(err: float, bound: float, scale: float) -> tuple[float, float | None, int]:
    """(error, bound) relative to the scale of the directional derivative, and the count
    (0, with no figures, where the direction is not informative)."""
    if scale > 0 and math.isfinite(scale) and bound / scale <= INFORMATIVE:
        return err / scale, bound / scale, 1
    return 0.0, None, 0


def _fd_masks(spec: OpSpec, case: Case, inputs64: dict[str, Any], name: str, direction: torch.Tensor,
              shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Where a central difference along `direction` (steps up to 2 FD_STEP) zeroes the cotangent."""
    bw = spec.backward
    margin = max(bw.fd_margin, FD_MARGIN_PER_STEP * 2 * FD_STEP)
    ends = [dataclasses.replace(case, inputs={**inputs64, name: inputs64[name] + t * FD_STEP * direction})
            for t in (-2, 2)]
    return _union(_masks(bw, case, None, shapes), _masks(bw, case, margin, shapes),
                  *[_masks(bw, c, margin, shapes) for c in ends])


# -- check 1: the float64 backward against finite differences ------------------------


class _HandWritten(torch.autograd.Function):
    """Forward: the op's float64 forward; backward: the hand-derived float64 backward."""

    @staticmethod
    def forward(ctx, plan, *tensors):
        ctx.plan = plan
        ctx.save_for_backward(*tensors)
        return plan.forward(tensors)

    @staticmethod
    def backward(ctx, *cots):
        return (None, *ctx.plan.backward(ctx.saved_tensors, cots))


@dataclasses.dataclass
class _Plan:
    spec: OpSpec
    fixed: dict[str, Any]
    params: dict[str, Any]

    def inputs(self, tensors) -> dict[str, Any]:
        return {**self.fixed, **dict(zip(self.spec.backward.inputs, tensors))}

    def forward(self, tensors):
        outs = _named(_forward64(self.spec)(**self.inputs(tensors), **self.params), list(self.spec.outputs),
                      "the float64 forward")
        return tuple(f64(outs[o]).clone() for o in self.spec.backward.outputs)

    def backward(self, tensors, cots):
        grads = _oracle_backward(self.spec, dict(zip(self.spec.backward.outputs, cots)), self.inputs(tensors),
                                 self.params)
        return tuple(grads[g] for g in self.spec.backward.grads)


def within_bound(err: float, bound: float) -> bool:
    """A directional check's verdict: err <= bound, a NaN error failing, except that an infinite bound claims
    nothing and passes any error.  The bound is infinite where the contract leaves the gradient (or the forward)
    free somewhere along the step, e.g. an fp32 sum that may overflow: vs_oracle takes any value there, NaN
    included, and a NaN directional derivative is no inconsistency
    (tests/regressions/mhc.head_compute_mix-free-gradient-nan)."""
    return bool(err <= bound) or bound == math.inf


def oracle_gradcheck(spec: OpSpec, case: Case, seed: int) -> list[GradientCheck]:
    """gradcheck of the hand-derived float64 backward, one input at a time."""
    bw = spec.backward
    inputs64 = _float64_inputs(case)
    outs = _named(_forward64(spec)(**inputs64, **case.params), list(spec.outputs), "the float64 forward")
    shapes = {o: tuple(outs[o].shape) for o in bw.outputs}
    keep = {o: torch.from_numpy(~m.copy()) for o, m in _masks(bw, case, bw.fd_margin, shapes).items()}
    norm = {}
    for o in bw.outputs:
        kept = f64(outs[o])[keep[o]]
        top = float(kept.abs().max()) if kept.numel() else 0.0
        norm[o] = top if top > 0 and math.isfinite(top) else 1.0
    scales = fd_scales(spec, case)
    plan = _Plan(spec, {n: t for n, t in inputs64.items() if n not in bw.inputs}, dict(case.params))
    results = []
    for j, name in enumerate(bw.inputs):
        x0, s = inputs64[name], scales[name]
        if x0.numel() == 0 or not any(bool(keep[o].any()) for o in bw.outputs) or not bool((s > 0).any()):
            continue  # nothing this input could be checked on

        rng = _rng(seed, 4, j)
        sketch_in = sketch(rng, x0.numel(), columns=True)
        kept = sum(int(keep[o].sum()) for o in bw.outputs)
        sketch_out = sketch(rng, kept, columns=False)

        def outputs(u, name=name, x0=x0, s=s, sketch_in=sketch_in):
            """The kept outputs at x0 + s * step(u), each divided by its output's `norm`."""
            step = (u if sketch_in is None else sketch_in @ u).reshape(x0.shape)
            tensors = [x0 + s * step if n == name else inputs64[n] for n in bw.inputs]
            res = _HandWritten.apply(plan, *tensors)
            return torch.cat([(r[keep[o]] / norm[o]).reshape(-1) for r, o in zip(res, bw.outputs)])

        def f(u, outputs=outputs, sketch_out=sketch_out):
            return sketched(outputs(u), sketch_out)

        u0 = torch.zeros(x0.numel() if sketch_in is None else SKETCH, dtype=torch.float64, requires_grad=True)
        message = ""
        try:
            passed = bool(torch.autograd.gradcheck(f, (u0,), eps=GRADCHECK_EPS, atol=GRADCHECK_ATOL,
                                                   rtol=GRADCHECK_RTOL, raise_exception=True,
                                                   check_undefined_grad=False))
        except GradcheckError as e:
            beyond = beyond_resolution(outputs, sketch_out, u0) if "Jacobian mismatch" in str(e) else "raised"
            passed = not beyond
            if beyond:
                message = (f"gradcheck of the float64 backward w.r.t. {name!r} failed: {str(e).strip()[:2000]}"
                           + ("" if beyond == "raised" else f"\n{beyond}"))
        # The row's figure: one directional derivative, hand backward against a central difference.
        direction = torch.from_numpy(_rng(seed, 2, j).standard_normal(tuple(x0.shape))) * s
        masks = _fd_masks(spec, case, inputs64, name, direction, shapes)
        cots = cotangents(spec, shapes, {o: torch.float64 for o in bw.outputs}, seed, masks)
        grads = _oracle_backward(spec, cots, inputs64, case.params)
        err, bound, scale = central_difference_float64(
            lambda xs: _named(_forward64(spec)(**xs, **case.params), list(spec.outputs), "the float64 forward"),
            inputs64, name, direction, cots, grads[bw.grad_of(name)])
        rel, rel_bound, count = _figure(err, bound, scale)
        if not within_bound(err, bound):
            passed = False
            message = (message + "; " if message else "") + (
                f"the float64 backward w.r.t. {name!r} misses a central difference: directional derivative "
                f"off by {err:.6g} (sum |grad Δ| = {scale:.6g}), bound {bound:.6g}")
        results.append(GradientCheck(
            spec.name, name, ORACLE, "gradcheck", rel, "rel", passed, count, rel_bound,
            f"gradcheck ({'sketched' if sketch_in is not None or sketch_out is not None else 'full'} Jacobian, "
            f"eps {GRADCHECK_EPS:g} relative, atol {GRADCHECK_ATOL:g}, rtol {GRADCHECK_RTOL:g})", message,
        ))
    return results


# -- check 2: implementations against the float64 backward ---------------------------


def _backward_impl(spec: OpSpec, impl_name: str) -> Impl:
    try:
        return spec.backward.impls[impl_name]
    except KeyError:
        raise KeyError(f"{spec.name} declares no backward for implementation {impl_name!r} "
                       f"(it has: {', '.join(spec.backward.impls)})") from None


def _cot_dtypes(bw: Backward, outs: dict[str, Any], case: Case, seed: int) -> dict[str, torch.dtype]:
    return {o: bw.cotangent_dtype(case, seed) or outs[o].dtype for o in bw.outputs}


def _run_backward(spec: OpSpec, impl_name: str, cots: dict[str, torch.Tensor], inputs: dict[str, Any],
                  fwd: dict[str, Any], params: dict[str, Any], device: torch.device) -> dict[str, Any]:
    bw = spec.backward
    # an optional output's cotangent that is zero everywhere goes as None: the call without that gradient
    absent = {o for o, c in cots.items() if o in bw.optional_outputs and not bool(c.any())}
    args = {**_grad_kwargs(bw, {o: (None if o in absent else c.to(device)) for o, c in cots.items()}),
            **{n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in inputs.items()},
            **{s: fwd[s] for s in bw.saved}}
    with poisoned():  # a gradient element the backward leaves unwritten holds NaN, never a plausible value
        result = _backward_impl(spec, impl_name).function()(**args, **params)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return _named(result, list(bw.grads), f"the backward of implementation {impl_name!r}")


def _halfwidth(expected: Any, actual: torch.Tensor) -> torch.Tensor:
    """How far an implementation's gradient may lie from the exact one, per element."""
    if isinstance(expected, Bracket):
        exact = np.asarray(expected.exact, dtype=np.float64)
        low = np.broadcast_to(np.asarray(expected.low, dtype=np.float64), exact.shape)
        high = np.broadcast_to(np.asarray(expected.high, dtype=np.float64), exact.shape)
        with np.errstate(invalid="ignore"):  # an infinite exact value at an infinite end: inf - inf, unbounded
            width = np.maximum(high - exact, exact - low)
        return torch.from_numpy(np.where(np.isfinite(width), width, np.inf))
    if isinstance(expected, ErrorBound):
        # the working-precision error, then one rounding to the gradient's format (a whole ULP: either way)
        exact = np.asarray(expected.exact, dtype=np.float64)
        error = np.broadcast_to(np.asarray(expected.error, dtype=np.float64), exact.shape)
        fmt = formats.of_dtype(actual.dtype) if isinstance(actual, torch.Tensor) and actual.is_floating_point() \
            else formats.get(expected.fmt or "fp32")
        with np.errstate(invalid="ignore", over="ignore"):
            width = error + fmt.ulp(np.abs(exact) + error)
        return torch.from_numpy(np.where(np.isfinite(width), width, np.inf))
    if isinstance(actual, torch.Tensor) and actual.dtype in (torch.float32, torch.bfloat16, torch.float16):
        fmt = formats.of_dtype(actual.dtype)
        return torch.from_numpy(fmt.ulp(f64(expected).numpy()))
    return torch.zeros(tuple(actual.shape), dtype=torch.float64)


def impl_vs_oracle(spec: OpSpec, impl_name: str, case: Case, seed: int) -> list[GradientCheck]:
    """Judge the implementation's backward against the float64 backward, per gradient."""
    bw = spec.backward
    impl = spec.impls[impl_name]
    device = impl.resolve_device()
    fwd = run_impl(spec, impl, case)
    shapes = {o: tuple(fwd[o].shape) for o in bw.outputs}
    masks = _masks(bw, case, bw.kink_margin, shapes)
    cots = cotangents(spec, shapes, _cot_dtypes(bw, fwd, case, seed), seed, masks)
    actual = _run_backward(spec, impl_name, cots, case.inputs, fwd, case.params, device)
    exact = _oracle_backward(spec, cots, case.inputs, case.params)
    expected = bw.given(case, cots, exact) if bw.given is not None else exact
    results = []
    for name, (grad, policy) in zip(bw.inputs, bw.grads.items()):
        c = policy.compare(grad, actual[grad], expected[grad])
        results.append(GradientCheck(
            spec.name, name, impl_name, "vs_oracle", c.max_ulp, "ULP", c.passed, c.count, None,
            f"{grad}: {policy}", c.message, c.worst, c.exact, c.sum_ulp,
        ))
    return results


# -- check 3: an implementation's backward against its own forward ---------------------


def _impl_forward(spec: OpSpec, impl: Impl, inputs: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    device = impl.resolve_device()
    moved = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in inputs.items()}
    result = impl.function()(**moved, **params)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return _named(result, list(spec.outputs), f"implementation {impl.name!r}")


def _float64_capable(spec: OpSpec, impl: Impl, case: Case) -> dict[str, Any] | None:
    """The implementation's forward outputs on the float64 inputs, or None where it refuses them."""
    try:
        fwd = _impl_forward(spec, impl, _float64_inputs(case), case.params)
    except (TypeError, ValueError):
        return None
    if not all(isinstance(fwd[o], torch.Tensor) and fwd[o].dtype == torch.float64 for o in spec.backward.outputs):
        return None
    return fwd


def _representable_step(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Δ with x + Δ and x - Δ both exactly representable in x's dtype (0 where that fails)."""
    x64 = f64(x)
    plus = f64((x64 + target).to(x.dtype))
    delta = plus - x64
    minus = x64 - delta
    ok = torch.isfinite(delta) & torch.isfinite(plus) & (f64(minus.to(x.dtype)) == minus)
    return torch.where(ok, delta, torch.zeros_like(delta))


def _forward_values(spec: OpSpec, case: Case, outs: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(values, noise) of the differentiated outputs of an implementation's forward, float64."""
    bw = spec.backward
    if bw.smooth is not None:
        smooth = bw.smooth(case, outs)
        return {o: f64(smooth[o][0]) for o in bw.outputs}, {o: f64(smooth[o][1]) for o in bw.outputs}
    values, noise = {}, {}
    expected = None
    if spec.given is not None:
        from tkverify.check import run_oracle

        expected = run_oracle(spec, case, outs)
    for o in bw.outputs:
        values[o] = f64(outs[o])
        exp = expected[o] if expected is not None else None
        if isinstance(exp, Bracket):
            noise[o] = _halfwidth(exp, outs[o])
        elif outs[o].dtype in (torch.float32, torch.bfloat16, torch.float16):
            noise[o] = torch.from_numpy(formats.of_dtype(outs[o].dtype).ulp(values[o].numpy())) / 2
        else:
            noise[o] = torch.zeros_like(values[o])
    return values, noise


def consistency(spec: OpSpec, impl_name: str, case: Case, seed: int, precision: str = "auto") -> list[GradientCheck]:
    """The implementation's backward against central differences of its own forward, per input.

    ``precision``: "auto" (float64 where the implementation accepts it, else
    working precision), "float64" or "working".
    """
    bw = spec.backward
    impl = spec.impls[impl_name]
    device = impl.resolve_device()
    fwd64 = _float64_capable(spec, impl, case) if precision in ("auto", "float64") else None
    if precision == "float64" and fwd64 is None:
        raise TypeError(f"implementation {impl_name!r} of {spec.name} does not run in float64")
    scales = fd_scales(spec, case)
    inputs64 = _float64_inputs(case)
    results = []
    for j, name in enumerate(bw.inputs):
        if case.inputs[name].numel() == 0:
            continue
        direction = torch.from_numpy(_rng(seed, 3, j).standard_normal(tuple(case.inputs[name].shape))) * scales[name]
        if fwd64 is not None:
            results.append(_consistency_float64(spec, impl, case, seed, name, direction, fwd64, inputs64, device))
        else:
            results.append(_consistency_working(spec, impl, case, seed, name, direction, device))
    return [r for r in results if r is not None]


def _case_with(case: Case, name: str, value: torch.Tensor) -> Case:
    return dataclasses.replace(case, inputs={**case.inputs, name: value})


def _consistency_float64(spec, impl, case, seed, name, direction, fwd64, inputs64, device) -> GradientCheck | None:
    bw = spec.backward
    shapes = {o: tuple(fwd64[o].shape) for o in bw.outputs}
    masks = _fd_masks(spec, case, inputs64, name, direction, shapes)
    if all(m.all() for m in masks.values()):
        return None
    # The same cotangent values an implementation gets in working precision, widened to float64.
    cots = cotangents(spec, shapes, {o: bw.cotangent_dtype(case, seed) or torch.float64 for o in bw.outputs}, seed,
                     masks)
    cots = {o: f64(c) for o, c in cots.items()}
    grads = _run_backward(spec, impl.name, cots, inputs64, fwd64, case.params, device)

    def forward(xs):
        return _impl_forward(spec, impl, xs, case.params)

    err, bound, scale = central_difference_float64(forward, inputs64, name, direction, cots,
                                                    f64(grads[bw.grad_of(name)]))
    rel, rel_bound, count = _figure(err, bound, scale)
    passed = bool(err <= bound)
    return GradientCheck(
        spec.name, name, impl.name, "consistency", rel, "rel", passed, count, rel_bound,
        "float64: central difference, Richardson bound", "" if passed else
        f"the float64 backward of {impl.name!r} w.r.t. {name!r} is not the derivative of its forward: "
        f"directional derivative off by {err:.6g} (sum |grad Δ| = {scale:.6g}), bound {bound:.6g}",
    )


def _consistency_working(spec, impl, case, seed, name, direction, device) -> GradientCheck | None:
    bw = spec.backward
    x = case.inputs[name]
    delta = _representable_step(x, WORKING_STEP * direction)
    x64 = f64(x)
    plus_case = _case_with(case, name, (x64 + delta).to(x.dtype))
    minus_case = _case_with(case, name, (x64 - delta).to(x.dtype))
    fwd = run_impl(spec, impl, case)
    shapes = {o: tuple(fwd[o].shape) for o in bw.outputs}
    masks = _union(*[_masks(bw, c, bw.fd_margin, shapes) for c in (case, plus_case, minus_case)],
                   _masks(bw, case, None, shapes))
    if all(m.all() for m in masks.values()):
        return None
    cots = cotangents(spec, shapes, _cot_dtypes(bw, fwd, case, seed), seed, masks)
    grads = _run_backward(spec, impl.name, cots, case.inputs, fwd, case.params, device)
    grad = grads[bw.grad_of(name)]

    values_p, noise_p = _forward_values(spec, plus_case, run_impl(spec, impl, plus_case))
    values_m, noise_m = _forward_values(spec, minus_case, run_impl(spec, impl, minus_case))
    lp, sp = loss(cots, values_p)
    lm, sm = loss(cots, values_m)
    num = (lp - lm) / 2.0
    ana, scale = inner(grad, delta)
    # An element with a zero step or a zero cotangent adds nothing, also where its allowance or noise is
    # infinite (a token outside the gradient's domain): 0 * inf would make the bound NaN.
    noise = sum(float(_zero_where_unused(f64(cots[o]), noise_p[o] + noise_m[o]).sum()) for o in bw.outputs) / 2.0

    # The truncation error of this very step, measured on the float64 oracle.
    forward64 = _forward64(spec)
    oracle_p = _named(forward64(**_float64_inputs(plus_case), **case.params), list(spec.outputs), "oracle")
    oracle_m = _named(forward64(**_float64_inputs(minus_case), **case.params), list(spec.outputs), "oracle")
    olp, _ = loss(cots, oracle_p)
    olm, _ = loss(cots, oracle_m)
    exact = _oracle_backward(spec, cots, case.inputs, case.params)
    oracle_ana, _ = inner(exact[bw.grad_of(name)], delta)
    truncation = abs((olp - olm) / 2.0 - oracle_ana)

    expected = bw.given(case, cots, exact) if bw.given is not None else exact
    allowed = float(_zero_where_unused(delta, _halfwidth(expected[bw.grad_of(name)], grad)).sum())
    bound = 2.0 * truncation + allowed + noise + FLOAT64_EVAL * (sp + sm) / 2.0
    err = abs(ana - num)
    rel, rel_bound, count = _figure(err, bound, scale)
    passed = within_bound(err, bound)
    return GradientCheck(
        spec.name, name, impl.name, "consistency", rel, "rel", passed, count, rel_bound,
        "working precision: rounded central difference; bound = truncation (oracle) + allowed gradient error "
        "+ forward noise",
        "" if passed else
        f"the backward of {impl.name!r} w.r.t. {name!r} is not the derivative of its forward (working precision): "
        f"directional derivative off by {err:.6g} (sum |grad Δ| = {scale:.6g}), bound {bound:.6g}",
    )


def _zero_where_unused(weight: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
    """|weight| * width, 0 where weight is 0 (whatever width is there)."""
    weight = f64(weight)
    return torch.where(weight == 0, torch.zeros((), dtype=torch.float64), weight.abs() * f64(width))


# -- running, recording, replaying -----------------------------------------------------


def backward_row(op: str) -> str:
    """The report row (op name) under which the gradient checks of `op` count refusals and coverage."""
    return f"{op} (backward)"


@dataclasses.dataclass(frozen=True)
class Recording:
    """A `record` for `check_gradients` that also hears each example: called as ``verdict(check, case
    description)`` per verdict, and ``example(case)`` is the context of the example's checks (entered
    before they run, left normally once they ran to verdicts)."""

    verdict: Callable[[GradientCheck, str], None] | None
    example: Callable[[Case], contextlib.AbstractContextManager]

    def __call__(self, check: GradientCheck, case_desc: str) -> None:
        if self.verdict is not None:
            self.verdict(check, case_desc)


def _example_context(record, case: Case) -> contextlib.AbstractContextManager:
    return record.example(case) if isinstance(record, Recording) else contextlib.nullcontext()


def covering(spec: OpSpec, impl_name: str, record, record_coverage) -> tuple[OpSpec, Recording]:
    """(`spec` whose backward of `impl_name` records the kernels it launches, a `Recording` that passes
    verdicts to `record` and each judged example's input classes and launched kernel paths to
    ``record_coverage(backward_row(op), impl, classes, paths)``, as `tkverify.suite.covering` does).

    The launches of every backward call of one example add up (vs_oracle and each consistency
    direction call it); an example whose checks raise (a refusal, a crash) records nothing."""
    listener = coverage.Listener()
    bw = spec.backward
    listened = coverage.listening(_backward_impl(spec, impl_name), listener, accumulate=True)
    spec = dataclasses.replace(spec, backward=dataclasses.replace(bw, impls={**bw.impls, impl_name: listened}))
    classify = getattr(spec.strategy, "classify", None)  # the input classes of the op's own strategy

    @contextlib.contextmanager
    def example(case: Case):
        listener.take()  # what an earlier example left when its checks raised
        yield
        classes, paths = coverage.example_labels(case, listener, classify)
        record_coverage(backward_row(spec.name), impl_name, classes, paths)

    return spec, Recording(record, example)


def run_checks(spec: OpSpec, impl_name: str, case: Case, seed: int, precision: str = "auto") -> list[GradientCheck]:
    """Every gradient check of `impl_name` ("oracle": the gradcheck of the float64 backward) on one case."""
    if spec.backward is None:
        raise ValueError(f"{spec.name} declares no backward")
    if impl_name == ORACLE:
        return oracle_gradcheck(spec, case, seed)
    return impl_vs_oracle(spec, impl_name, case, seed) + consistency(spec, impl_name, case, seed, precision)


def case_file_for(spec: OpSpec, impl_name: str, case_dir: Path) -> Path:
    return case_dir / f"{spec.name}-{impl_name}-gradients"


def check_gradients(spec: OpSpec, impl_name: str, case: Case, seed: int, *, case_dir: Path | None = None,
                    record: Callable[[GradientCheck, str], None] | None = None,
                    precision: str = "auto", excuse: bool = True) -> list[GradientCheck]:
    """Run the checks; record every verdict; on failure save the case and raise `GradientError`
    (or, with `excuse`, `KnownDiscrepancy` where the implementation knows the failure)."""
    header = f"{spec.name}[{impl_name}] gradients on {case.describe()} (cotangent seed {seed})"

    def save(failures: list[str]) -> Path | None:
        if case_dir is None:
            return None
        return save_case(case_file_for(spec, impl_name, case_dir), case, op=spec.name, impl=impl_name,
                         extra={"gradient": {"seed": seed, "precision": precision}, "failures": failures})

    impl = spec.impls.get(impl_name) if excuse else None  # None for the oracle's own gradcheck
    try:
        with _example_context(record, case):
            results = run_checks(spec, impl_name, case, seed, precision)
    except Exception as e:
        if impl is not None:
            excuse_known(impl, case, Failure(spec.name, True, None, f"{type(e).__name__}: {e}"))
        path = save([f"{type(e).__name__}: {e}"])
        replay = f"\n  replay: {replay_command(path)}" if path else ""
        raise GradientError(f"{header}: raised {type(e).__name__}: {e}{replay}", case_file=path) from e
    if record is not None:
        for r in results:
            record(r, case.describe())
    failed = [r for r in results if not r.passed]
    if not failed:
        return results
    if impl is not None:
        excuse_known(impl, case, Failure(spec.name, True, frozenset(r.input for r in failed),
                                         "\n".join(r.message for r in failed)))
    lines = [f"{header}: {len(failed)} of {len(results)} gradient checks fail"]
    lines += [f"  [{r.check}] {r.input}: {r.message}" for r in failed]
    path = save([r.message for r in failed])
    if path is not None:
        lines.append(f"  replay: {replay_command(path)}")
    raise GradientError("\n".join(lines), case_file=path)


def verify(spec: OpSpec, impl_name: str, *, case_dir: Path | None = None,
           record: Callable[[GradientCheck, str], None] | None = None, precision: str = "auto",
           record_unsupported: Callable[[str, str, str, float], None] | None = None,
           record_coverage: Callable[[str, str, list[str], list[str]], None] | None = None) -> None:
    """Let hypothesis hunt for a case (and cotangent seed) where a gradient check fails.

    Cases the implementation refuses (`Unsupported`) are counted as in `tkverify.suite.verify`.
    With `record_coverage` (and an implementation, not the oracle's gradcheck), each judged example's
    input classes and the kernel paths its backward launched go to it (`covering`)."""
    tally = UnsupportedTally(backward_row(spec.name), impl_name, record_unsupported)
    if record_coverage is not None and impl_name != ORACLE:
        spec, record = covering(spec, impl_name, record, record_coverage)

    # Under a derandomised profile (ci) hypothesis seeds the search from this function's source (its
    # decorator included): what varies (recording, coverage) lives in `record` and in `spec`.

    @given(case=spec.strategy(), seed=st.integers(0, 2**32 - 1))
    def run(case, seed):
        tally.run(lambda: check_gradients(spec, impl_name, case, seed, case_dir=case_dir, record=record,
                                          precision=precision))

    if spec.backward.examples_factor != 1:  # outside `run`: its source seeds the derandomised search
        run = settings(max_examples=settings().max_examples * spec.backward.examples_factor)(run)
    run()
    tally.finish()


def replay(spec: OpSpec, impl_name: str, case: Case, about: dict[str, Any]) -> list[GradientCheck]:
    """Re-run the gradient checks of a saved case (raises `GradientError` on failure)."""
    return check_gradients(spec, impl_name, case, int(about["seed"]), case_dir=None,
                           precision=about.get("precision", "auto"), excuse=False)
