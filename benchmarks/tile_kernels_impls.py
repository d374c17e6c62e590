"""tile-kernels as a `tile_kernels` implementation of the ops it shares with us, for `tkverify bench` only.

    tkverify bench --load benchmarks.tile_kernels_impls --out DIR

The specs do not declare tile-kernels: the differential suite would then judge
it too.  Here it is registered in the bench process alone, through its public
functions called positionally as the earlier benchmarks did (its keyword names
are not ours).  Ops without an adapter here are listed by the bench as not run.
"""

from tkverify.registry import Impl, register_impl

REQUIRES = ("tile_kernels",)


def _topk_gate(scores, k):
    import tile_kernels

    return tile_kernels.moe.topk_gate(scores, k)


def _per_token_cast(x, fmt, num_per_channels, **options):
    import tile_kernels.quant

    return tile_kernels.quant.per_token_cast(x, fmt, num_per_channels, **options)


def _swiglu(x, fmt, num_per_channels, **options):
    import tile_kernels.quant

    return tile_kernels.quant.swiglu_forward_and_per_token_cast(x, fmt, num_per_channels, **options)


for op, fn in (("moe.topk_gate", _topk_gate), ("quant.per_token_cast", _per_token_cast),
               ("quant.swiglu_forward_and_per_token_cast", _swiglu)):
    register_impl(op, Impl("tile_kernels", fn, device="cuda", requires=REQUIRES))
