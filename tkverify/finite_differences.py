"""Finite differences in float64, and how far they can be trusted: the numerical side of the gradient checks
(`tkverify.gradients`).

* `sketch`, `sketched`: random projections of a large Jacobian to SKETCH columns and rows, so that a check
  stays cheap while any error in the Jacobian shows with probability 1.
* `central_difference_float64`: one directional derivative against the hand backward's inner product, with
  its bound: twice the Richardson difference (N(2h) / 2 against N(h)), the float64 evaluation of the loss,
  and a floor relative to the derivative's scale.
* `beyond_resolution`: whether a Jacobian mismatch that torch.autograd.gradcheck reports exceeds the same
  kind of bound, entry by entry.
* `loss`, `inner`: the float64 inner products these compare, a masked zero never times an infinity.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

GRADCHECK_EPS = 1e-7
# Tighter than gradcheck's defaults (1e-5, 1e-3): on the re-parametrised, normalised problem a
# float64 central difference with step 1e-7 has rounding noise ~1e-9 and, where the op's kink
# margin keeps the step's relative effect on the kinked quantity below ~3e-4, truncation ~1e-8;
# a missing term of a backward is often only 1e-4 of the whole.
GRADCHECK_ATOL = 1e-7
GRADCHECK_RTOL = 1e-5
SKETCH = 8  # inputs and outputs beyond this many elements are checked through a random sketch
FD_STEP = 1e-6  # float64 central differences: step h along normal * fd_scale (and 2h for Richardson)
FLOAT64_EVAL = 2.0**-44  # relative evaluation error allowed to a float64 forward (512 float64 ULPs)
FLOAT64_FLOOR = 1e-9  # relative floor of the float64 consistency bound


def f64(t: Any) -> torch.Tensor:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float64)
    return torch.as_tensor(np.asarray(t, dtype=np.float64))


def loss(cots: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(sum over outputs of <c, f>, sum of |c| |f|), in float64."""
    total, size = 0.0, 0.0
    for o, c in cots.items():
        c64, v64 = f64(c), f64(values[o])
        prod = torch.where(c64 == 0, torch.zeros_like(v64), c64 * v64)  # a masked 0 times inf is no NaN
        total += float(prod.sum())
        size += float(prod.abs().sum())
    return total, size


def inner(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    a64, b64 = f64(a), f64(b)
    prod = torch.where(b64 == 0, torch.zeros_like(a64), a64 * b64)
    return float(prod.sum()), float(prod.abs().sum())


def sketch(rng: np.random.Generator, n: int, columns: bool) -> torch.Tensor | None:
    """A random normal (n, SKETCH) matrix (columns=True: entries of size 1, so that every
    element's step stays eps, well above its float64 rounding) or a (SKETCH, n) one with
    unit rows (outputs: their rounding noise does not add up); None where n is small
    enough to check every element."""
    if n <= SKETCH:
        return None
    m = rng.standard_normal((n, SKETCH) if columns else (SKETCH, n))
    if not columns:
        m /= np.linalg.norm(m, axis=1, keepdims=True)
    return torch.from_numpy(m)


def beyond_resolution(outputs: Callable[[torch.Tensor], torch.Tensor], sketch_out: torch.Tensor | None,
                       u0: torch.Tensor) -> str:
    """Whether a Jacobian mismatch that gradcheck reports exceeds the error of its own finite differences:
    "" where every entry is within it, else the worst entry.

    gradcheck's tolerance (GRADCHECK_ATOL + GRADCHECK_RTOL |N|) assumes that the normalised, re-parametrised
    problem has a Jacobian of order 1, so that the central difference N(h) (h = GRADCHECK_EPS) is within
    ~1e-8 of the derivative.  An op's fd_scale cannot promise that for every input: with outputs ~1e-44
    (every r of a SwiGLU row subnormal) and a step floor of 2^-6 on l and r, each u-step moves an input by
    ~1e34 times its own size, and the third-order term of silu(l) r (silu''(0) a^2 b / 2 for steps a, b)
    makes N(h) ~1e23 where the derivative is 0.02.  That is truncation, not a wrong backward, and it is
    measured rather than guessed: N(h) = J + c h^2 + O(h^4) + rounding, so N(2h) - N(h) = 3 c h^2 (+ its
    rounding), a third of which is the truncation of N(h).  An entry fails only where
        |N(h) - A| > GRADCHECK_ATOL + GRADCHECK_RTOL |N(h)| + 2 |N(2h) - N(h)| + rounding,
    rounding = FLOAT64_EVAL (|P| |y(u + h)| + |P| |y(u - h)|) / (2h) for the normalised outputs y (P the
    output sketch, identity where there is none): the bound of `central_difference_float64` (twice the
    Richardson difference, six times the truncation it estimates, plus the float64 evaluation of the
    outputs), per entry.  The allowance comes from the forward alone (N, never A), so a wrong backward still
    fails wherever its error exceeds what the differences resolve; where they resolve the Jacobian to
    gradcheck's own tolerance, the verdict is gradcheck's.
    """
    eps = GRADCHECK_EPS
    u = u0.detach()
    analytical = torch.autograd.functional.jacobian(lambda v: sketched(outputs(v), sketch_out), u)
    with torch.no_grad():
        columns = []
        for k in range(u.numel()):
            e = torch.zeros_like(u)
            e[k] = 1.0
            ends = {h: (outputs(u + h * e), outputs(u - h * e)) for h in (eps, 2 * eps)}
            n1, n2 = ((sketched(p, sketch_out) - sketched(m, sketch_out)) / (2 * h)
                      for h, (p, m) in ends.items())
            p, m = ends[eps]
            size = sketched(p.abs(), sketch_out, True) + sketched(m.abs(), sketch_out, True)
            rounding = FLOAT64_EVAL * size / (2 * eps)
            columns.append((n1, GRADCHECK_ATOL + GRADCHECK_RTOL * n1.abs() + 2.0 * (n2 - n1).abs() + rounding))
    numerical = torch.stack([c[0] for c in columns], 1)
    allowed = torch.stack([c[1] for c in columns], 1)
    analytical = analytical.reshape(numerical.shape)
    excess = (numerical - analytical).abs() - allowed
    excess = torch.where(torch.isfinite(excess), excess, torch.full_like(excess, math.inf))
    if not bool((excess > 0).any()):
        return ""
    j, k = np.unravel_index(int(excess.argmax()), tuple(excess.shape))
    return (f"beyond the finite differences' own error (Richardson + float64 rounding): entry ({j}, {k}) "
            f"analytical {float(analytical[j, k]):.6g}, numerical {float(numerical[j, k]):.6g}, "
            f"allowed {float(allowed[j, k]):.6g}")


def sketched(flat: torch.Tensor, sketch_out: torch.Tensor | None, magnitude: bool = False) -> torch.Tensor:
    """P flat (|P| flat with `magnitude`), or flat where the outputs are not sketched."""
    if sketch_out is None:
        return flat
    return (sketch_out.abs() if magnitude else sketch_out) @ flat


def central_difference_float64(forward: Callable[[dict], dict], inputs: dict[str, Any], name: str,
                                direction: torch.Tensor, cots: dict[str, torch.Tensor],
                                grad: torch.Tensor) -> tuple[float, float, float]:
    """(|ana - num(h)|, its bound, sum |grad_i Δ_i|) for Δ = FD_STEP * direction, all in float64."""

    def num(h: float) -> tuple[float, float]:
        plus = forward({**inputs, name: inputs[name] + h * direction})
        minus = forward({**inputs, name: inputs[name] - h * direction})
        lp, sp = loss(cots, plus)
        lm, sm = loss(cots, minus)
        return (lp - lm) / 2.0, FLOAT64_EVAL * (sp + sm) / 2.0

    h = FD_STEP
    n1, noise1 = num(h)
    n2, _ = num(2 * h)
    ana, scale = inner(grad, h * direction)
    # num(2h) is the difference over a step twice as long: halve it to compare per step h.
    richardson = abs(n2 / 2.0 - n1)
    bound = 2.0 * richardson + noise1 + FLOAT64_FLOOR * scale
    return abs(ana - n1), bound, scale
