"""Float64 oracles, one module per operator family.

Each oracle is written from the contract (``docs/contract/<family>.md``) with NumPy or
torch on the CPU, never from a kernel and never with tilelang, so that a
kernel and its oracle cannot share a mistake.  Oracles are called like every
implementation, ``oracle(**case.inputs, **case.params)``.
"""

from typing import Any

import numpy as np
import torch


def as_float64(x: Any) -> np.ndarray:
    """A tensor (any dtype torch can widen: bf16, fp8, fp32) or array as float64 NumPy, exactly.

    Widening to float64 never rounds and keeps -0.0, +-inf and NaN.
    """
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def as_float64_tensor(t: Any) -> torch.Tensor:
    """A float64 CPU tensor of `t`, exactly; differentiable (no detach), for autograd."""
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    elif not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    return t.to(device="cpu", dtype=torch.float64)


def exact_sum(terms: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """sum(terms) in float64, compensated (Neumaier): within 2^-53 |S| + 2 (n 2^-53)^2 sum|p| of the exact sum.

    Far closer than any fp32 accumulation can get, even where the terms
    cancel; a plain float64 sum would lose n 2^-53 sum|p|.  Non-finite sums
    are IEEE's (the compensation is dropped where the running sum is not finite).
    """
    total = np.zeros(shape)
    compensation = np.zeros(shape)
    with np.errstate(invalid="ignore"):
        for term in terms:
            running = total + term
            compensation += np.where(np.abs(total) >= np.abs(term), (total - running) + term, (term - running) + total)
            total = running
        return np.where(np.isfinite(total), total + compensation, total)
