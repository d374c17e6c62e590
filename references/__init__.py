"""Float64 oracles, one module per operator family.

Each oracle is written from the maths in ``shared/design/OPS.md`` with NumPy or
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

