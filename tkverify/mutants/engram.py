"""Mutants of Engram gating (forward and backward).

The forward mutants are parametrised copies of the eager forward with its
normalisation step changed (kernels/torch/engram.py, `eager_normalisation`);
there is no input/output model of them for other implementations.  One of
them (1 / sqrt for rsqrt) stays inside the contract and is caught only by the
torch claims.  The two backward mutants are models: the implementation's
own backward on perturbed arguments, exact for any backward that follows the
contract (it takes d, g, rx, rk saved from the forward and reads x only in the
terms that multiply it).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from tkverify.mutants import Mutant


def eager_normalisation(reciprocal_rms: Callable[[torch.Tensor, float], torch.Tensor]) -> Callable[..., Any]:
    """Factory: the eager forward with rx = reciprocal_rms(x, eps) (and rk alike) in place of
    rsqrt(mean x^2 + eps); everything after the normalisation is the eager code's."""

    def factory(fn: Callable[..., Any]) -> Callable[..., Any]:
        return _forward_with(reciprocal_rms)

    return factory


def _forward_with(reciprocal_rms: Callable[[torch.Tensor, float], torch.Tensor]) -> Callable[..., Any]:
    import kernels.torch.engram as eager

    def broken(x, k, v, w, eps=1e-6, clamp=1e-6):
        (act, acc), eps, clamp = eager._check_inputs(x, k, v, w, eps, clamp)
        hidden = x.shape[-1]
        xf, kf, vf = x.to(acc), k.to(acc), v.to(acc)
        rx, rk = reciprocal_rms(xf, eps), reciprocal_rms(kf, eps)
        d = (xf * w * kf).sum(-1)
        z = eager._gate_argument(d, rx, rk, hidden)
        g = torch.sigmoid(torch.sign(z) * torch.sqrt(torch.clamp(z.abs(), min=clamp)))
        out = (xf + g[..., None] * vf[:, None, :]).to(act)
        return out, d, g, rx, rk

    return broken


def eps_outside_sqrt(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / (sqrt(mean x^2) + eps): the bug puts eps outside the square root."""
    return 1.0 / (torch.sqrt(xf.square().mean(-1)) + eps)


def reciprocal_of_sqrt(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean x^2 + eps): the square root and the division each rounded, one rounding more than
    rsqrt, inside the contract's window, beyond the torch claim."""
    return 1.0 / torch.sqrt(xf.square().mean(-1) + eps)


def grad_x_without_norm_term(backward: Callable[..., Any]) -> Callable[..., Any]:
    """grad_x without its last term, - (gz z) rx^2 x / H (the rms normalisation's own gradient).

    Modelled by taking grad_x from the implementation's backward called with x = 0: x enters
    the backward only multiplied into that term, grad_k and grad_w (which come from the call
    as given), so grad_x is then exactly G + gd w k.
    """

    def broken(**kwargs: Any) -> Any:
        grad_x, grad_k, grad_v, grad_w = backward(**kwargs)
        missing, _, _, _ = backward(**{**kwargs, "x": torch.zeros_like(kwargs["x"])})
        return missing, grad_k, grad_v, grad_w

    return broken


def gate_gradient_below_clamp(backward: Callable[..., Any]) -> Callable[..., Any]:
    """The gate's gradient through z not switched off where |z| < clamp.

    Modelled by the implementation's backward called with clamp = 1e-30 (the forward keeps the
    real clamp): da/dz = 1 / (2 sqrt|z|) also below the clamp, the derivative of the
    unclamped gate; only z = 0 exactly stays dead.
    """

    def broken(**kwargs: Any) -> Any:
        return backward(**{**kwargs, "clamp": 1e-30})

    return broken


MUTANTS = [
    Mutant("engram_eps_outside_sqrt", "engram.gate",
           "rx = 1 / (sqrt(mean x^2) + eps) instead of 1 / sqrt(mean x^2 + eps) (and rk alike)",
           eager=eager_normalisation(eps_outside_sqrt),
           note="the normalisation happens inside the kernel; no input/output model reproduces it"),
    Mutant("engram_grad_x_missing_term", "engram.gate",
           "grad_x lacks the term - (gz z) rx^2 x / H", model=grad_x_without_norm_term, backward=True),
    Mutant("engram_gate_grad_below_clamp", "engram.gate",
           "the gate's gradient through d is not switched off where |z| < clamp",
           model=gate_gradient_below_clamp, backward=True),
    Mutant("engram_rms_reciprocal_of_sqrt", "engram.gate",
           "rx and rk are 1 / sqrt(mean x^2 + eps), two roundings where rsqrt rounds once (inside the "
           "contract, beyond the torch claim)",
           eager=eager_normalisation(reciprocal_of_sqrt), claim_regression=True,
           note="the normalisation happens inside the kernel; no input/output model reproduces it"),
]
