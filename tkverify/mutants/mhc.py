"""Mutants of the mHC operators (docs/contract/mhc.md): Sinkhorn, post and pre_split_mixes, and the
backward passes of pre_apply_mix and post (models: row i's grad_mix written to row i + 1; post's
backward called with comb transposed).

The two mix-op mutants are models (any implementation, on perturbed inputs):
"comb transposed" is post called with comb's (m, m) blocks transposed, which
is exactly an implementation that reads comb[n, i] for comb[i, n]; "scale[1]
on comb" is pre_split_mixes called with scale = (scale[0], scale[1],
scale[1]), exactly one that scales the comb block by the post block's scale.

Sinkhorn (``sinkhorn(x, repeat=10, eps=1e-6)``) has three mutants.  Where
"mhc.sinkhorn" is not registered they are reported as "not applicable (op not
registered)" and do not count.  "One iteration fewer" is a model of the
contract (the implementation called with repeat - 1) and works for every
implementation.  The other two are eager factories over the
steps of kernels/torch/mhc.py (``_forward`` with ``swapped=True``: every row
normalisation done over columns and vice versa; ``_backward`` with ``skip``:
one step of the reverse sweep left out); they have no model for compiled
kernels (a TileLang kernel's sweep cannot be edited from Python) and are
reported as not applicable there, with that note.
"""

from __future__ import annotations

from typing import Any, Callable

from tkverify.mutants import Mutant

DEFAULT_REPEAT = 10  # docs/contract/mhc.md#mhc.sinkhorn


def one_iteration_fewer(sinkhorn: Callable[..., Any]) -> Callable[..., Any]:
    """The implementation called with repeat - 1 (at least 1): one row + column sweep fewer.

    With repeat = 1 there is no sweep to leave out and the mutant equals the op.
    """

    def broken(*args: Any, **kwargs: Any) -> Any:
        if len(args) >= 2:
            args = (args[0], max(int(args[1]) - 1, 1), *args[2:])
        else:
            kwargs["repeat"] = max(int(kwargs.get("repeat", DEFAULT_REPEAT)) - 1, 1)
        return sinkhorn(*args, **kwargs)

    return broken


def rows_columns_swapped(sinkhorn: Callable[..., Any]) -> Callable[..., Any]:
    """The eager forward with rows and columns exchanged in every normalisation (first step: rows)."""
    from kernels.torch import mhc

    def broken(x: Any, repeat: int = DEFAULT_REPEAT, eps: float = 1e-6) -> Any:
        mhc._check_x("x", x)
        repeat, eps = mhc._check_params(repeat, eps)
        return mhc._forward(x, repeat, eps, swapped=True)[0]

    return broken


def backward_missing_step(sinkhorn_bwd: Callable[..., Any]) -> Callable[..., Any]:
    """The eager backward with the first step of its reverse sweep (the last normalisation's) left out."""
    from kernels.torch import mhc

    def broken(grad_out: Any, x: Any, repeat: int = DEFAULT_REPEAT, eps: float = 1e-6) -> Any:
        mhc._check_x("x", x)
        repeat, eps = mhc._check_params(repeat, eps)
        _, s, saved = mhc._forward(x, repeat, eps)
        return mhc._backward(grad_out, s, saved, skip=0)

    return broken


def comb_transposed(impl: Callable[..., Any]) -> Callable[..., Any]:
    """post with out[n] = x post[n] + sum_i comb[n, i] residual[i] (a symmetric comb hides it)."""

    def broken(x: Any, residual: Any, post: Any, comb: Any) -> Any:
        return impl(x, residual, post, comb.transpose(-1, -2).contiguous())

    return broken


def scale1_on_comb(impl: Callable[..., Any]) -> Callable[..., Any]:
    """pre_split_mixes scaling the comb entries by scale[1] instead of scale[2]."""

    def broken(mixes: Any, scale: Any, base: Any, m: int, post_mult: float, pre_eps: float) -> Any:
        wrong = scale.clone()
        wrong[2] = scale[1]
        return impl(mixes, wrong, base, m, post_mult, pre_eps)

    return broken


def apply_mix_grad_rows_shifted(impl_bwd: Callable[..., Any]) -> Callable[..., Any]:
    """pre_apply_mix's backward writing row i's grad_mix into row i + 1 (mod m)."""

    def broken(grad_out: Any, x: Any, mix: Any) -> Any:
        grad_x, grad_mix = impl_bwd(grad_out, x, mix)
        return grad_x, grad_mix.roll(1, dims=2)

    return broken


def post_bwd_comb_transposed(impl_bwd: Callable[..., Any]) -> Callable[..., Any]:
    """post's backward reading comb[n, i] for comb[i, n] (grad_residual mixes the wrong cotangent rows)."""

    def broken(grad_out: Any, x: Any, residual: Any, post: Any, comb: Any) -> Any:
        return impl_bwd(grad_out, x, residual, post, comb.transpose(-1, -2).contiguous())

    return broken


_NO_MODEL = "eager only: a compiled kernel's normalisation sweep cannot be edited from Python"

MUTANTS = [
    Mutant("sinkhorn_one_iteration_fewer", "mhc.sinkhorn",
           "Sinkhorn runs repeat - 2 row/column sweeps after the first column normalisation, not repeat - 1",
           model=one_iteration_fewer),
    Mutant("sinkhorn_rows_columns_swapped", "mhc.sinkhorn",
           "the row and the column normalisations are swapped", eager=rows_columns_swapped, note=_NO_MODEL),
    Mutant("sinkhorn_backward_missing_step", "mhc.sinkhorn",
           "the Sinkhorn backward leaves out one step of the reverse sweep", backward=True,
           eager=backward_missing_step, note=_NO_MODEL),
    Mutant("post_comb_transposed", "mhc.post", "post mixes the residual rows with comb[n, i] instead of comb[i, n]",
           model=comb_transposed),
    Mutant("pre_apply_mix_backward_grad_mix_rows_shifted", "mhc.pre_apply_mix",
           "the pre_apply_mix backward writes row i's grad_mix into row i + 1", backward=True,
           model=apply_mix_grad_rows_shifted),
    Mutant("post_backward_comb_transposed", "mhc.post",
           "the post backward mixes the cotangent rows with comb[n, i] instead of comb[i, n]", backward=True,
           model=post_bwd_comb_transposed),
    Mutant("pre_split_scale1_on_comb", "mhc.pre_split_mixes",
           "pre_split_mixes applies scale[1] (the post block's) to the comb block", model=scale1_on_comb),
]
