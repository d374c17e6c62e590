"""Eager PyTorch mHC operators, in working precision (fp32): Sinkhorn and the three mix ops.

The contract, what every implementation computes and refuses, is
docs/contract/mhc.md.  The signatures below are every implementation's, the
TileLang kernels of ``kernels.mhc`` included (same tensors, same errors for
the same bad arguments: a TypeError or ValueError naming the argument):

``sinkhorn(x, repeat=10, eps=1e-6) -> P``
    x       fp32 (..., m, m), 2 <= m <= 8, contiguous; any number (>= 0) of
            leading batch dimensions, any of them 0
    repeat  int >= 1: one column normalisation, then repeat - 1 (row, column) sweeps
    eps     float, finite, > 0 (every entry stays >= a multiple of eps: no 0 / 0)
    P       fp32 (..., m, m), on x's device

``sinkhorn_bwd(grad_out, x, repeat=10, eps=1e-6) -> grad_x``
    grad_out fp32 with x's shape; grad_x fp32 with x's shape.  The forward's
    intermediates are recomputed from x (nothing is saved but x).

``Sinkhorn.apply(x, repeat, eps) -> P``: the autograd Function over the two.

Both Sinkhorn functions also accept x (and grad_out) in float64 and then
compute and return float64.  That is not part of the kernel contract: it lets
tkverify's gradient consistency check differentiate this implementation's own
formulas in float64.

Maths (docs/contract/mhc.md#mhc.sinkhorn): A = softmax(x) + eps; P = A / (column
sums + eps); repeat - 1 times P = P / (row sums + eps), P = P / (column sums +
eps).  Backward of P' = P / D along an axis: (G - sum_axis(G P')) / D; of the
softmax: s (G - sum_row(G s)).  NaN or +inf anywhere in a matrix (or a row
all -inf) makes the whole matrix NaN, as in the oracle.

``pre_split_mixes(mixes, scale, base, m, post_mult, pre_eps) -> (pre, post, comb)``
    mixes     fp32 (a, b, m (m + 2)), contiguous (a, b >= 0)
    scale     fp32 (3,), base fp32 (m (m + 2),): contiguous, on mixes' device
    m         int, 2 <= m <= 8, with mixes.shape[-1] == m (m + 2)
    post_mult float, finite and within fp32's range
    pre_eps   float, finite, >= 0 and within fp32's range
    u = mixes * s + base, s = scale[0] on entries [0, m), scale[1] on [m, 2m),
    scale[2] on [2m, m (m + 2)); then
    pre  fp32 (a, b, m, 1) = sigmoid(u[:m]) + pre_eps
    post fp32 (a, b, m, 1) = sigmoid(u[m:2m]) * post_mult
    comb fp32 (a, b, m, m) = u[2m:] viewed row-major as (m, m)
    u may round once (an fma) or twice (a product, then a sum); sigmoid(+inf)
    = 1, sigmoid(-inf) = 0, NaN propagates (the judged error model:
    docs/contract/mhc.md#mhc.pre_split_mixes).

``pre_apply_mix(x, mix) -> out``
    x   bf16 (a, b, m, H), 2 <= m <= 8, H >= 1, contiguous
    mix fp32 (a, b, m, 1), contiguous, on x's device
    out bf16 (a, b, H) = sum_i x[..., i, :] mix[..., i, 0], accumulated in fp32
        and rounded once to bf16

``post(x, residual, post, comb) -> out``
    x        bf16 (a, b, H), H >= 1
    residual bf16 (a, b, m, H), 2 <= m <= 8
    post     fp32 (a, b, m, 1); comb fp32 (a, b, m, m); all contiguous, on x's device
    out      bf16 (a, b, m, H), out[..., n, :] = x post[..., n, 0]
             + sum_i comb[..., i, n] residual[..., i, :], accumulated in fp32
             and rounded once to bf16

``pre_apply_mix_bwd(grad_out, x, mix) -> (grad_x, grad_mix)``
    grad_out bf16 (a, b, H), contiguous, on x's device; x and mix as for pre_apply_mix
    grad_x   bf16 (a, b, m, H) = grad_out[..., None, :] mix[..., i, 0], one fp32 product rounded to bf16
    grad_mix fp32 (a, b, m, 1) = sum_h grad_out[..., h] x[..., i, h], per token, accumulated in fp32

``post_bwd(grad_out, x, residual, post, comb) -> (grad_x, grad_residual, grad_post, grad_comb)``
    grad_out bf16 (a, b, m, H), contiguous, on x's device; the rest as for post
    grad_x        bf16 (a, b, H)    = sum_n grad_out[..., n, :] post[..., n, 0]
    grad_residual bf16 (a, b, m, H) = sum_n comb[..., i, n] grad_out[..., n, :]
    grad_post     fp32 (a, b, m, 1) = sum_h grad_out[..., n, h] x[..., h]
    grad_comb     fp32 (a, b, m, m) = sum_h residual[..., i, h] grad_out[..., n, h]
    every sum accumulated in fp32; the per-token sums over H are not reduced over tokens

``pre_split_mixes_bwd(grad_pre, grad_post, grad_comb, mixes, scale, base, m, post_mult, pre_eps)
-> (grad_mixes, grad_scale, grad_base)``
    grad_pre, grad_post fp32 (a, b, m, 1), grad_comb fp32 (a, b, m, m): contiguous, on mixes' device;
    the rest as for pre_split_mixes.  With t = dL/du per entry: grad_pre sigmoid'(u), grad_post
    post_mult sigmoid'(u) (exactly 0 for post_mult = 0), grad_comb itself, and sigmoid' = s (1 - s):
    grad_mixes fp32 (a, b, m (m + 2)) = t * s
    grad_scale fp32 (3,)             = per segment, the sum over tokens and its entries of t * mixes
    grad_base  fp32 (m (m + 2),)     = the sum over tokens of t
    the sums over tokens accumulated in fp32 (0 for an empty batch)

pre_apply_mix, post and their backward passes also accept every tensor in float64 and then compute
and return float64 (as Sinkhorn does; not part of the kernel contract: it lets the gradient
consistency check differentiate these formulas in float64).

The mix ops follow IEEE arithmetic on their values (NaN and infinities
propagate, inf * 0 is NaN) and do not flush subnormals.  Here they are
written term by term (m is at most 8), never as a matmul, so that no TF32 or
reduced-precision path can enter on CUDA.
"""

from __future__ import annotations

import math
import numbers

import torch

MIN_M, MAX_M = 2, 8
DEFAULT_REPEAT = 10
DEFAULT_EPS = 1e-6
ROWS, COLUMNS = -1, -2  # the axis summed by a row / a column normalisation


def _check_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], device: torch.device | None = None,
                  device_of: str = "x") -> torch.Tensor:
    """Type, dtype, device and contiguity of one tensor argument (its shape is the caller's)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {dtypes[0]}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} (where {device_of} is), got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    return t


def _check_m(name: str, m: int) -> None:
    if not MIN_M <= m <= MAX_M:
        raise ValueError(f"{name} must have {MIN_M} <= m <= {MAX_M}, got m = {m}")


def _check_x(name: str, x: object, dtype: torch.dtype | None = None, shape: tuple[int, ...] | None = None,
             device: torch.device | None = None) -> torch.dtype:
    if dtype is not None and isinstance(x, torch.Tensor) and x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (x's), got {x.dtype}")
    _check_tensor(name, x, (torch.float32, torch.float64) if dtype is None else (dtype,), device)
    if shape is None:
        if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"{name} must have shape (..., m, m), got {tuple(x.shape)}")
        _check_m(name, x.shape[-1])
    elif tuple(x.shape) != shape:
        raise ValueError(f"{name} must have x's shape {shape}, got {tuple(x.shape)}")
    return x.dtype


def _check_params(repeat: object, eps: object) -> tuple[int, float]:
    if isinstance(repeat, bool) or not isinstance(repeat, numbers.Integral):
        raise TypeError(f"repeat must be an int, got {type(repeat).__name__}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not (math.isfinite(eps) and eps > 0.0):
        raise ValueError(f"eps must be finite and > 0, got {eps}")
    return int(repeat), eps


def _axes(repeat: int, swapped: bool = False) -> list[int]:
    """The summed axis of each normalisation, in order (`swapped`: rows and columns exchanged)."""
    first, second = (ROWS, COLUMNS) if not swapped else (COLUMNS, ROWS)
    return [second] + [first, second] * (repeat - 1)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _forward(x: torch.Tensor, repeat: int, eps: float, swapped: bool = False):
    """(P, softmax s, [(axis, P', D)] per normalisation)."""
    s = _softmax(x)
    p = s + eps
    saved = []
    for axis in _axes(repeat, swapped):
        d = p.sum(axis, keepdim=True) + eps
        p = p / d
        saved.append((axis, p, d))
    return p, s, saved


def _backward(g: torch.Tensor, s: torch.Tensor, saved, skip: int | None = None) -> torch.Tensor:
    """Reverse sweep; `skip` (mutants only) leaves out the step of that index in reverse order."""
    for index, (axis, out, d) in enumerate(reversed(saved)):
        if index == skip:
            continue
        g = (g - (g * out).sum(axis, keepdim=True)) / d
    return s * (g - (g * s).sum(-1, keepdim=True))


def sinkhorn(x: torch.Tensor, repeat: int = DEFAULT_REPEAT, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """P (..., m, m), x's dtype; see the module docstring."""
    _check_x("x", x)
    repeat, eps = _check_params(repeat, eps)
    with torch.no_grad():
        return _forward(x, repeat, eps)[0]


def sinkhorn_bwd(grad_out: torch.Tensor, x: torch.Tensor, repeat: int = DEFAULT_REPEAT,
                 eps: float = DEFAULT_EPS) -> torch.Tensor:
    """grad_x (..., m, m), x's dtype; see the module docstring."""
    dtype = _check_x("x", x)
    _check_x("grad_out", grad_out, dtype, tuple(x.shape), x.device)
    repeat, eps = _check_params(repeat, eps)
    with torch.no_grad():
        _, s, saved = _forward(x, repeat, eps)
        return _backward(grad_out, s, saved)


def sinkhorn_function(forward, backward, name: str = "Sinkhorn") -> type[torch.autograd.Function]:
    """An autograd Function over a forward and a backward with this module's signatures (this
    module's own pair, or the TileLang kernels'): ``apply(x, repeat, eps) -> P``, differentiable
    in x; only x is saved."""

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, repeat=DEFAULT_REPEAT, eps=DEFAULT_EPS):
            p = forward(x, repeat, eps)
            ctx.save_for_backward(x)
            ctx.repeat, ctx.eps = repeat, eps
            return p

        @staticmethod
        def backward(ctx, grad_out):
            (x,) = ctx.saved_tensors
            return backward(grad_out.contiguous(), x, ctx.repeat, ctx.eps), None, None

    Function.__name__ = Function.__qualname__ = name
    return Function


# P = Sinkhorn.apply(x, repeat, eps), differentiable in x.
Sinkhorn = sinkhorn_function(sinkhorn, sinkhorn_bwd)


# -- the mix operators -----------------------------------------------------------------

FP32_MAX = 3.4028234663852886e38


def _check_int_m(m: object) -> int:
    if isinstance(m, bool) or not isinstance(m, numbers.Integral):
        raise TypeError(f"m must be an int, got {type(m).__name__}")
    if not MIN_M <= m <= MAX_M:
        raise ValueError(f"m must satisfy {MIN_M} <= m <= {MAX_M}, got {m}")
    return int(m)


def _check_float(name: str, value: object, nonnegative: bool = False) -> float:
    """A finite float within fp32's range (a kernel receives it as fp32); >= 0 if `nonnegative`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and abs(value) <= FP32_MAX):
        raise ValueError(f"{name} must be finite and within fp32's range, got {value}")
    if nonnegative and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {what} = {shape}, got {tuple(t.shape)}")


def _check_pre_split_mixes_args(mixes, scale, base, m, post_mult, pre_eps) -> tuple[int, float, float]:
    """pre_split_mixes' argument checks (every implementation's): (m, post_mult, pre_eps)."""
    m = _check_int_m(m)
    width = m * (m + 2)
    _check_tensor("mixes", mixes, (torch.float32,))
    if mixes.dim() != 3 or mixes.shape[-1] != width:
        raise ValueError(f"mixes must have shape (a, b, m (m + 2)) = (a, b, {width}) for m = {m}, "
                         f"got {tuple(mixes.shape)}")
    _check_tensor("scale", scale, (torch.float32,), mixes.device, "mixes")
    _check_shape("scale", scale, (3,), "(3,)")
    _check_tensor("base", base, (torch.float32,), mixes.device, "mixes")
    _check_shape("base", base, (width,), "(m (m + 2),)")
    post_mult = _check_float("post_mult", post_mult)
    pre_eps = _check_float("pre_eps", pre_eps, nonnegative=True)
    return m, post_mult, pre_eps


def _mix_dtypes(x: object, allow_float64: bool) -> tuple[tuple[torch.dtype, ...], tuple[torch.dtype, ...]]:
    """(x's dtypes, the fp32 weights' dtypes): bf16 and fp32, or all float64 where `allow_float64` and x is."""
    if allow_float64 and isinstance(x, torch.Tensor) and x.dtype == torch.float64:
        return (torch.float64,), (torch.float64,)
    return (torch.bfloat16,), (torch.float32,)


def _check_pre_apply_mix_args(x, mix, allow_float64: bool = False) -> None:
    """pre_apply_mix's argument checks (every implementation's; `allow_float64`: the eager code's)."""
    data, weights = _mix_dtypes(x, allow_float64)
    _check_tensor("x", x, data)
    if x.dim() != 4 or x.shape[-1] < 1:
        raise ValueError(f"x must have shape (a, b, m, H) with H >= 1, got {tuple(x.shape)}")
    _check_m("x", x.shape[2])
    _check_tensor("mix", mix, weights, x.device)
    _check_shape("mix", mix, tuple(x.shape[:3]) + (1,), "(a, b, m, 1)")


def _check_post_args(x, residual, post, comb, allow_float64: bool = False) -> int:
    """post's argument checks (every implementation's; `allow_float64`: the eager code's); returns m."""
    data, weights = _mix_dtypes(x, allow_float64)
    _check_tensor("x", x, data)
    if x.dim() != 3 or x.shape[-1] < 1:
        raise ValueError(f"x must have shape (a, b, H) with H >= 1, got {tuple(x.shape)}")
    _check_tensor("residual", residual, data, x.device)
    if residual.dim() != 4:
        raise ValueError(f"residual must have shape (a, b, m, H), got {tuple(residual.shape)}")
    _check_m("residual", residual.shape[2])
    a, b, m, hidden = residual.shape
    _check_shape("residual", residual, (*x.shape[:2], m, x.shape[2]), "(a, b, m, H) with x's a, b, H")
    _check_tensor("post", post, weights, x.device)
    _check_shape("post", post, (a, b, m, 1), "(a, b, m, 1)")
    _check_tensor("comb", comb, weights, x.device)
    _check_shape("comb", comb, (a, b, m, m), "(a, b, m, m)")
    return m


def pre_split_mixes(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, m: int, post_mult: float,
                    pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre (a, b, m, 1), post (a, b, m, 1), comb (a, b, m, m)), fp32; see the module docstring."""
    m, post_mult, pre_eps = _check_pre_split_mixes_args(mixes, scale, base, m, post_mult, pre_eps)
    with torch.no_grad():
        s = scale.repeat_interleave(torch.tensor([m, m, m * m], device=scale.device))
        u = mixes * s + base
        pre = torch.sigmoid(u[..., :m]) + pre_eps
        post_ = torch.sigmoid(u[..., m:2 * m]) * post_mult
        lead = tuple(mixes.shape[:2])
        return (pre.reshape(*lead, m, 1).contiguous(), post_.reshape(*lead, m, 1).contiguous(),
                u[..., 2 * m:].reshape(*lead, m, m).contiguous())


def pre_apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """out (a, b, H) bf16 = sum_i x[..., i, :] mix[..., i, 0] in fp32; see the module docstring."""
    _check_pre_apply_mix_args(x, mix, allow_float64=True)
    work, result = _precisions(x)
    with torch.no_grad():
        acc = x[..., 0, :].to(work) * mix[..., 0, :]
        for i in range(1, x.shape[2]):
            acc = acc + x[..., i, :].to(work) * mix[..., i, :]
        return acc.to(result)


def post(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """out (a, b, m, H) bf16 = x post[n] + sum_i comb[i, n] residual[i] in fp32; see the module docstring."""
    m = _check_post_args(x, residual, post, comb, allow_float64=True)
    work, result = _precisions(x)
    with torch.no_grad():
        acc = x.to(work)[..., None, :] * post
        for i in range(m):
            acc = acc + comb[..., i, :, None] * residual[..., i, None, :].to(work)
        return acc.to(result)


def _precisions(x: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(accumulation, bf16 results' dtype): fp32 and bf16, or float64 throughout for float64 inputs."""
    return (torch.float64, torch.float64) if x.dtype == torch.float64 else (torch.float32, torch.bfloat16)


def _check_grad_out(grad_out: object, x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    _check_tensor("grad_out", grad_out, (torch.bfloat16,) if x.dtype != torch.float64 else (torch.float64,), x.device)
    _check_shape("grad_out", grad_out, shape, what)


def pre_apply_mix_bwd(grad_out: torch.Tensor, x: torch.Tensor, mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x bf16 (a, b, m, H), grad_mix fp32 (a, b, m, 1)); see the module docstring."""
    _check_pre_apply_mix_args(x, mix, allow_float64=True)
    _check_grad_out(grad_out, x, tuple(x.shape[:2]) + (x.shape[3],), "(a, b, H)")
    work, result = _precisions(x)
    with torch.no_grad():
        g = grad_out.to(work)[..., None, :]
        grad_x = (g * mix).to(result)
        grad_mix = (g * x.to(work)).sum(-1, keepdim=True)
        return grad_x, grad_mix


def post_bwd(grad_out: torch.Tensor, x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor,
             comb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x bf16, grad_residual bf16, grad_post fp32, grad_comb fp32); see the module docstring."""
    m = _check_post_args(x, residual, post, comb, allow_float64=True)
    _check_grad_out(grad_out, x, tuple(residual.shape), "(a, b, m, H)")
    work, result = _precisions(x)
    with torch.no_grad():
        g = grad_out.to(work)
        grad_x = g[..., 0, :] * post[..., 0, :]
        grad_residual = comb[..., :, 0, None] * g[..., 0, None, :]
        for n in range(1, m):
            grad_x = grad_x + g[..., n, :] * post[..., n, :]
            grad_residual = grad_residual + comb[..., :, n, None] * g[..., n, None, :]
        grad_post = (g * x.to(work)[..., None, :]).sum(-1, keepdim=True)
        grad_comb = (residual.to(work)[..., :, None, :] * g[..., None, :, :]).sum(-1)
        return grad_x.to(result), grad_residual.to(result), grad_post, grad_comb


def _check_split_grads(grad_pre, grad_post, grad_comb, mixes: torch.Tensor, m: int) -> None:
    lead = tuple(mixes.shape[:2])
    for name, grad, shape, what in (("grad_pre", grad_pre, lead + (m, 1), "(a, b, m, 1)"),
                                    ("grad_post", grad_post, lead + (m, 1), "(a, b, m, 1)"),
                                    ("grad_comb", grad_comb, lead + (m, m), "(a, b, m, m)")):
        _check_tensor(name, grad, (torch.float32,), mixes.device, "mixes")
        _check_shape(name, grad, shape, what)


def _check_pre_split_mixes_bwd_args(grad_pre, grad_post, grad_comb, mixes, scale, base, m, post_mult,
                                    pre_eps) -> tuple[int, float]:
    """pre_split_mixes_bwd's argument checks (every implementation's): (m, post_mult)."""
    m, post_mult, _ = _check_pre_split_mixes_args(mixes, scale, base, m, post_mult, pre_eps)
    _check_split_grads(grad_pre, grad_post, grad_comb, mixes, m)
    return m, post_mult


def pre_split_mixes_bwd(grad_pre: torch.Tensor, grad_post: torch.Tensor, grad_comb: torch.Tensor,
                        mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, m: int, post_mult: float,
                        pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_mixes fp32 (a, b, m (m + 2)), grad_scale fp32 (3,), grad_base fp32 (m (m + 2),)); see the module
    docstring."""
    m, post_mult = _check_pre_split_mixes_bwd_args(grad_pre, grad_post, grad_comb, mixes, scale, base, m, post_mult,
                                                   pre_eps)
    width = m * (m + 2)
    with torch.no_grad():
        s = scale.repeat_interleave(torch.tensor([m, m, m * m], device=scale.device))
        u = mixes * s + base
        sg = torch.sigmoid(u[..., :2 * m])
        slope = sg * (1 - sg)
        lead = tuple(mixes.shape[:2])
        t = torch.cat([grad_pre.reshape(*lead, m) * slope[..., :m], grad_post.reshape(*lead, m) * post_mult
                       * slope[..., m:], grad_comb.reshape(*lead, m * m)], -1)
        products = (t * mixes).reshape(-1, width)
        grad_scale = torch.stack([products[:, :m].sum(), products[:, m:2 * m].sum(), products[:, 2 * m:].sum()])
        return (t * s).contiguous(), grad_scale, t.reshape(-1, width).sum(0)
