"""The bad-argument tables of the mHC functions (families mhc, mhc_head, mhc_fused).

tests/bad_inputs.py says how a table is written (`Table`, `Bad` and the argument editors);
tests/test_bad_inputs.py merges `MHC`, `MHC_HEAD` and `MHC_FUSED` into its `TABLES` and runs them.

The eager functions of these families also accept float64 tensors (all of them float64), which the
TileLang wrappers refuse; a table is judged on both, so its dtype spoils are float16, bfloat16 or
float32 where float64 would be a valid eager call.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bad_inputs import NON_FINITE_OR_NOT_POSITIVE, Bad, Table, _gen, _put, _set, _with

NON_FINITE = (math.nan, math.inf)
NOT_NONNEGATIVE = (math.nan, math.inf, -1.0)
BEYOND_FP32 = 1e39  # finite in Python, not representable in fp32, the kernels' parameter type


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(torch.bfloat16)


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen(seed))


def _zeros_bf16(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.bfloat16)


def _narrowed(dim: int, size: int):
    """The first `size` entries of dimension `dim`, as a contiguous tensor (a shape that disagrees)."""
    return lambda t: t.narrow(dim, 0, size).contiguous()


# -- mhc: Sinkhorn and the mix operators, forward and backward ----------------------------------------


def _sinkhorn_inputs() -> dict[str, Any]:
    return {"x": torch.randn(3, 4, 4, generator=_gen(9)), "repeat": 3, "eps": 1e-6}


def _split_inputs() -> dict[str, Any]:
    return {"mixes": torch.randn(2, 3, 24, generator=_gen(11)), "scale": _rand(3, seed=12),
            "base": torch.randn(24, generator=_gen(13)), "m": 4, "post_mult": 2.0, "pre_eps": 1e-2}


def _split_bwd_inputs() -> dict[str, Any]:
    return {"grad_pre": torch.randn(2, 3, 4, 1, generator=_gen(20)),
            "grad_post": torch.randn(2, 3, 4, 1, generator=_gen(21)),
            "grad_comb": torch.randn(2, 3, 4, 4, generator=_gen(22)), **_split_inputs()}


def _apply_mix_inputs() -> dict[str, Any]:
    return {"x": _bf16(2, 3, 4, 40, seed=14), "mix": _rand(2, 3, 4, 1, seed=15)}


def _post_inputs() -> dict[str, Any]:
    return {"x": _bf16(2, 3, 40, seed=16), "residual": _bf16(2, 3, 4, 40, seed=17), "post": _rand(2, 3, 4, 1, seed=18),
            "comb": _rand(2, 3, 4, 4, seed=19)}


SINKHORN = dict(
    tensors={"x": torch.float16}, reference="x", any_rank=("x",), ints={"repeat": (0, -1)},
    floats={"eps": NON_FINITE_OR_NOT_POSITIVE},
    extra=(Bad("x-not-square", "x", ValueError, _put("x", torch.zeros(3, 4, 5))),
           Bad("x-m-1", "x", ValueError, _put("x", torch.zeros(3, 1, 1))),
           Bad("x-m-9", "x", ValueError, _put("x", torch.zeros(3, 9, 9))),
           Bad("x-one-dim", "x", ValueError, _put("x", torch.zeros(4)))))
SPLIT_PARAMS = dict(ints={"m": (1, 9)}, floats={"post_mult": NON_FINITE + (BEYOND_FP32,), "pre_eps": NOT_NONNEGATIVE})
SPLIT_SHAPES = (Bad("mixes-width-not-m(m+2)", "mixes", ValueError, _set("mixes", lambda t: t[..., :23])),
                Bad("mixes-width-of-another-m", "mixes", ValueError, _put("m", 3)),
                Bad("scale-four-entries", "scale", ValueError, _put("scale", torch.ones(4))),
                Bad("base-other-width", "base", ValueError, _set("base", lambda t: t[:15])))
APPLY_MIX_SHAPES = (Bad("x-m-1", "x", ValueError, _set("x", _narrowed(2, 1))),
                    Bad("x-m-9", "x", ValueError, _put("x", _zeros_bf16(2, 3, 9, 40))),
                    Bad("x-H-0", "x", ValueError, _put("x", _zeros_bf16(2, 3, 4, 0))),
                    Bad("mix-other-m", "mix", ValueError, _set("mix", _narrowed(2, 3))),
                    Bad("mix-other-tokens", "mix", ValueError, _set("mix", _narrowed(1, 2))))
POST_SHAPES = (Bad("x-H-0", "x", ValueError, _with(x=_zeros_bf16(2, 3, 0), residual=_zeros_bf16(2, 3, 4, 0))),
               Bad("residual-other-H", "residual", ValueError, _set("residual", _narrowed(3, 39))),
               Bad("residual-other-tokens", "residual", ValueError, _set("residual", _narrowed(1, 2))),
               Bad("residual-m-1", "residual", ValueError, _set("residual", _narrowed(2, 1))),
               Bad("residual-m-9", "residual", ValueError, _put("residual", _zeros_bf16(2, 3, 9, 40))),
               Bad("post-other-m", "post", ValueError, _set("post", _narrowed(2, 3))),
               Bad("comb-not-square", "comb", ValueError, _set("comb", _narrowed(3, 3))))
POST_TENSORS = {"x": torch.float32, "residual": torch.float16, "post": torch.bfloat16, "comb": torch.float64}

MHC = {
    "sinkhorn": Table(base=_sinkhorn_inputs, **SINKHORN),
    "Sinkhorn.apply": Table(base=_sinkhorn_inputs, positional=("x", "repeat", "eps"), **SINKHORN),
    "sinkhorn_bwd": Table(
        base=lambda: {"grad_out": torch.randn(3, 4, 4, generator=_gen(10)), **_sinkhorn_inputs()},
        tensors={"grad_out": torch.float64, "x": torch.float16}, reference="x", any_rank=("x",), ints={"repeat": (0,)},
        floats={"eps": NON_FINITE_OR_NOT_POSITIVE},
        extra=(Bad("grad_out-other-shape", "grad_out", ValueError, _set("grad_out", lambda t: t[:2])),)),
    "pre_split_mixes": Table(
        base=_split_inputs, tensors={"mixes": torch.bfloat16, "scale": torch.float64, "base": torch.float16},
        reference="mixes", extra=SPLIT_SHAPES, **SPLIT_PARAMS),
    "pre_split_mixes_bwd": Table(
        base=_split_bwd_inputs,
        tensors={"grad_pre": torch.float64, "grad_post": torch.bfloat16, "grad_comb": torch.float16,
                 "mixes": torch.bfloat16, "scale": torch.float64, "base": torch.float16},
        reference="mixes", **SPLIT_PARAMS,
        extra=SPLIT_SHAPES + (
            Bad("grad_pre-other-m", "grad_pre", ValueError, _set("grad_pre", _narrowed(2, 3))),
            Bad("grad_pre-flat", "grad_pre", ValueError, _set("grad_pre", lambda t: t.reshape(2, 3, 4))),
            Bad("grad_post-other-tokens", "grad_post", ValueError, _set("grad_post", _narrowed(1, 2))),
            Bad("grad_comb-not-square", "grad_comb", ValueError, _set("grad_comb", _narrowed(3, 3))),
            Bad("grad_comb-of-another-m", "grad_comb", ValueError,
                _with(mixes=torch.zeros(2, 3, 15), base=torch.zeros(15), m=3, grad_pre=torch.zeros(2, 3, 3, 1),
                      grad_post=torch.zeros(2, 3, 3, 1))))),
    "pre_apply_mix": Table(
        base=_apply_mix_inputs, tensors={"x": torch.float32, "mix": torch.bfloat16}, reference="x",
        extra=APPLY_MIX_SHAPES),
    "pre_apply_mix_bwd": Table(
        base=lambda: {"grad_out": _bf16(2, 3, 40, seed=23), **_apply_mix_inputs()},
        tensors={"grad_out": torch.float32, "x": torch.float32, "mix": torch.bfloat16}, reference="x",
        extra=APPLY_MIX_SHAPES[1:] + (
            Bad("grad_out-other-H", "grad_out", ValueError, _set("grad_out", _narrowed(2, 39))),
            Bad("grad_out-other-tokens", "grad_out", ValueError, _set("grad_out", _narrowed(1, 2))),
            Bad("grad_out-with-a-stream-axis", "grad_out", ValueError,
                _set("grad_out", lambda t: t[:, :, None].expand(2, 3, 4, 40).contiguous())))),
    "post": Table(base=_post_inputs, tensors=POST_TENSORS, reference="x", extra=POST_SHAPES),
    "post_bwd": Table(
        base=lambda: {"grad_out": _bf16(2, 3, 4, 40, seed=24), **_post_inputs()},
        tensors={"grad_out": torch.float32, **POST_TENSORS}, reference="x",
        extra=POST_SHAPES[1:] + (
            Bad("grad_out-other-m", "grad_out", ValueError, _set("grad_out", _narrowed(2, 3))),
            Bad("grad_out-other-H", "grad_out", ValueError, _set("grad_out", _narrowed(3, 39))),
            Bad("grad_out-of-x's-shape", "grad_out", ValueError, _set("grad_out", lambda t: t[:, :, 0].contiguous())))),
}

# -- mhc_head: expand_to_mhc and head_compute_mix, forward and backward ---------------------------------


def _head_inputs() -> dict[str, Any]:
    return {"mixes": torch.randn(2, 3, 4, generator=_gen(30)), "scale": _rand(1, seed=31),
            "base": torch.randn(4, generator=_gen(32)), "pre_eps": 1e-2}


EXPAND_PARAMS = dict(ints={"m": (1, 9)}, any_rank=("x",))
HEAD_TENSORS = {"mixes": torch.float16, "scale": torch.float64, "base": torch.bfloat16}
# scale has one element: every view of it is contiguous, so it has no non-contiguous spoil.
HEAD_PARAMS = dict(any_strides=("scale",), floats={"pre_eps": NOT_NONNEGATIVE + (BEYOND_FP32,)})
HEAD_SHAPES = (Bad("mixes-m-1", "mixes", ValueError, _with(mixes=torch.zeros(2, 3, 1), base=torch.zeros(1))),
               Bad("mixes-m-9", "mixes", ValueError, _with(mixes=torch.zeros(2, 3, 9), base=torch.zeros(9))),
               Bad("mixes-one-batch-dim", "mixes", ValueError, _set("mixes", lambda t: t[0])),
               Bad("scale-two-entries", "scale", ValueError, _put("scale", torch.ones(2))),
               Bad("scale-0-d", "scale", ValueError, _put("scale", torch.tensor(1.0))),
               Bad("base-other-m", "base", ValueError, _set("base", lambda t: t[:3])))

MHC_HEAD = {
    "expand_to_mhc": Table(
        base=lambda: {"x": _bf16(2, 3, 40, seed=33), "m": 4}, tensors={"x": torch.float16}, reference="x",
        **EXPAND_PARAMS,
        extra=(Bad("x-H-0", "x", ValueError, _put("x", _zeros_bf16(2, 3, 0))),
               Bad("x-0-d", "x", ValueError, _put("x", torch.tensor(1.0, dtype=torch.bfloat16))))),
    "expand_to_mhc_bwd": Table(
        base=lambda: {"grad_out": _bf16(2, 3, 4, 40, seed=34), "x": _bf16(2, 3, 40, seed=33), "m": 4},
        tensors={"grad_out": torch.float32, "x": torch.float16}, reference="x", **EXPAND_PARAMS,
        extra=(Bad("x-H-0", "x", ValueError, _put("x", _zeros_bf16(2, 3, 0))),
               Bad("grad_out-other-m", "grad_out", ValueError, _put("m", 3)),
               Bad("grad_out-other-H", "grad_out", ValueError, _set("grad_out", _narrowed(3, 39))),
               Bad("grad_out-other-leading", "grad_out", ValueError, _set("grad_out", _narrowed(1, 2))),
               Bad("grad_out-without-a-stream-axis", "grad_out", ValueError,
                   _set("grad_out", lambda t: t[:, :, 0].contiguous())))),
    "head_compute_mix": Table(
        base=_head_inputs, tensors=HEAD_TENSORS, reference="mixes", extra=HEAD_SHAPES, **HEAD_PARAMS),
    "head_compute_mix_bwd": Table(
        base=lambda: {"grad_mix": torch.randn(2, 3, 4, generator=_gen(35)), **_head_inputs()},
        tensors={"grad_mix": torch.float64, **HEAD_TENSORS}, reference="mixes", **HEAD_PARAMS,
        extra=HEAD_SHAPES + (
            Bad("grad_mix-other-m", "grad_mix", ValueError, _set("grad_mix", _narrowed(2, 3))),
            Bad("grad_mix-other-tokens", "grad_mix", ValueError, _set("grad_mix", _narrowed(1, 2))))),
}

# -- mhc_fused: the fused pre-block pieces and the multi-layer recompute -------------------------------


def _merge_inputs() -> dict[str, Any]:
    return {"fn": torch.randn(24, 40, generator=_gen(40)), "normw": _rand(40, seed=41) + 0.5}


def _reduce_inputs() -> dict[str, Any]:
    return {"out_mul_splitted": torch.randn(2, 3, 2, 24, generator=_gen(42)),
            "sqrsum_splitted": _rand(2, 3, 2, seed=43) + 0.5, "rms_group_size": 160, "rms_eps": 1e-6}


def _reduce_bwd_inputs() -> dict[str, Any]:
    args = _reduce_inputs()
    return {"grad_out": torch.randn(3, 24, generator=_gen(44)), **args,
            "out_mul": args["out_mul_splitted"].sum(0), "sqrsum": args["sqrsum_splitted"].sum(0)}


def _recompute_inputs() -> dict[str, Any]:
    """L = 2 layers, P = 2 posts, N = 3 tokens, m = 4, H = 40."""
    return {"initial_residual": _bf16(3, 4, 40, seed=45), "pre_mix": _rand(2, 3, 4, seed=46),
            "layer_output": _bf16(2, 3, 40, seed=47), "post_mix": _rand(2, 3, 4, seed=48),
            "comb_mix": _rand(2, 3, 4, 4, seed=49)}


MERGE_SHAPES = (Bad("normw-other-K", "normw", ValueError, _set("normw", lambda t: t[:39])),
                Bad("normw-2-d", "normw", ValueError, _set("normw", lambda t: t[None].expand(24, 40).contiguous())))
REDUCE_TENSORS = {"out_mul_splitted": torch.float16, "sqrsum_splitted": torch.bfloat16}
REDUCE_PARAMS = dict(ints={"rms_group_size": (0, -1)}, floats={"rms_eps": NON_FINITE_OR_NOT_POSITIVE + (BEYOND_FP32,)})
REDUCE_SHAPES = (
    Bad("no-splits", "out_mul_splitted", ValueError,
        _with(out_mul_splitted=torch.zeros(0, 3, 2, 24), sqrsum_splitted=torch.zeros(0, 3, 2))),
    Bad("no-groups", "out_mul_splitted", ValueError,
        _with(out_mul_splitted=torch.zeros(2, 3, 0, 24), sqrsum_splitted=torch.zeros(2, 3, 0))),
    Bad("no-columns", "out_mul_splitted", ValueError, _set("out_mul_splitted", _narrowed(3, 0))),
    Bad("sqrsum_splitted-other-splits", "sqrsum_splitted", ValueError, _set("sqrsum_splitted", _narrowed(0, 1))),
    Bad("sqrsum_splitted-other-groups", "sqrsum_splitted", ValueError, _set("sqrsum_splitted", _narrowed(2, 1))),
    Bad("sqrsum_splitted-with-columns", "sqrsum_splitted", ValueError,
        _set("sqrsum_splitted", lambda t: t[..., None].expand(2, 3, 2, 24).contiguous())))

MHC_FUSED = {
    "fn_normw_merge": Table(
        base=_merge_inputs, tensors={"fn": torch.float16, "normw": torch.float64}, reference="fn", extra=MERGE_SHAPES),
    "fn_normw_merge_bwd": Table(
        base=lambda: {"grad_out_fn": torch.randn(24, 40, generator=_gen(50)), **_merge_inputs()},
        tensors={"grad_out_fn": torch.float64, "fn": torch.float16, "normw": torch.bfloat16}, reference="fn",
        extra=MERGE_SHAPES + (
            Bad("grad_out_fn-other-rows", "grad_out_fn", ValueError, _set("grad_out_fn", _narrowed(0, 23))),
            Bad("grad_out_fn-transposed", "grad_out_fn", ValueError, _set("grad_out_fn", lambda t: t.T.contiguous())))),
    "reduce_partials_and_rmsnorm": Table(
        base=_reduce_inputs, tensors=REDUCE_TENSORS, reference="out_mul_splitted", extra=REDUCE_SHAPES,
        **REDUCE_PARAMS),
    "reduce_partials_and_rmsnorm_bwd": Table(
        base=_reduce_bwd_inputs,
        tensors={"grad_out": torch.float16, **REDUCE_TENSORS, "out_mul": torch.float64, "sqrsum": torch.bfloat16},
        reference="out_mul_splitted", **REDUCE_PARAMS,
        extra=REDUCE_SHAPES + (
            Bad("grad_out-other-width", "grad_out", ValueError, _set("grad_out", _narrowed(1, 23))),
            Bad("grad_out-other-tokens", "grad_out", ValueError, _set("grad_out", _narrowed(0, 2))),
            Bad("out_mul-other-groups", "out_mul", ValueError, _set("out_mul", _narrowed(1, 1))),
            Bad("out_mul-with-the-splits", "out_mul", ValueError,
                lambda args, foreign: args.update(out_mul=args["out_mul_splitted"].clone())),
            Bad("sqrsum-other-tokens", "sqrsum", ValueError, _set("sqrsum", _narrowed(0, 2))))),
    "multilayer_recompute": Table(
        base=_recompute_inputs,
        tensors={"initial_residual": torch.float32, "pre_mix": torch.bfloat16, "layer_output": torch.float32,
                 "post_mix": torch.float64, "comb_mix": torch.bfloat16},
        reference="initial_residual",
        extra=(Bad("initial_residual-m-1", "initial_residual", ValueError, _set("initial_residual", _narrowed(1, 1))),
               Bad("initial_residual-m-9", "initial_residual", ValueError,
                   _put("initial_residual", _zeros_bf16(3, 9, 40))),
               Bad("initial_residual-H-0", "initial_residual", ValueError,
                   _put("initial_residual", _zeros_bf16(3, 4, 0))),
               Bad("pre_mix-no-layers", "pre_mix", ValueError, _set("pre_mix", _narrowed(0, 0))),
               Bad("pre_mix-other-m", "pre_mix", ValueError, _set("pre_mix", _narrowed(2, 3))),
               Bad("pre_mix-other-tokens", "pre_mix", ValueError, _set("pre_mix", _narrowed(1, 2))),
               Bad("layer_output-more-layers-than-pre_mix", "layer_output", ValueError,
                   _put("layer_output", _zeros_bf16(3, 3, 40))),
               Bad("layer_output-two-layers-short", "layer_output", ValueError,
                   _with(pre_mix=torch.zeros(3, 3, 4), layer_output=_zeros_bf16(1, 3, 40),
                         post_mix=torch.zeros(1, 3, 4), comb_mix=torch.zeros(1, 3, 4, 4))),
               Bad("layer_output-other-H", "layer_output", ValueError, _set("layer_output", _narrowed(2, 39))),
               Bad("post_mix-other-layers", "post_mix", ValueError, _set("post_mix", _narrowed(0, 1))),
               Bad("post_mix-other-m", "post_mix", ValueError, _set("post_mix", _narrowed(2, 3))),
               Bad("comb_mix-not-square", "comb_mix", ValueError, _set("comb_mix", _narrowed(3, 3))),
               Bad("comb_mix-other-layers", "comb_mix", ValueError, _set("comb_mix", _narrowed(0, 1))))),
}


# -- mhc_big_fuse: the fused pre-block forward ----------------------------------------------------------


def _big_fuse_inputs() -> dict[str, Any]:
    """S = 2 splits, N = 3 tokens, m = 4 (M = 24), H = 40."""
    return {"gemm_out_mul": torch.randn(2, 3, 24, generator=_gen(50)), "gemm_out_sqrsum": _rand(2, 3, seed=51) + 0.5,
            "scale": _rand(3, seed=52), "base": torch.randn(24, generator=_gen(53)), "residual": _bf16(3, 4, 40, seed=54),
            "rms_eps": 1e-6, "pre_eps": 1e-2, "sinkhorn_eps": 1e-6, "post_mult": 2.0, "sinkhorn_repeat": 10}


MHC_BIG_FUSE = {
    "pre_big_fuse": Table(
        base=_big_fuse_inputs,
        tensors={"gemm_out_mul": torch.float16, "gemm_out_sqrsum": torch.bfloat16, "scale": torch.float64,
                 "base": torch.float16, "residual": torch.float32},
        reference="residual",
        ints={"sinkhorn_repeat": (0, -1)},
        floats={"rms_eps": NON_FINITE_OR_NOT_POSITIVE + (BEYOND_FP32,), "pre_eps": NOT_NONNEGATIVE + (BEYOND_FP32,),
                "sinkhorn_eps": NON_FINITE_OR_NOT_POSITIVE + (BEYOND_FP32,), "post_mult": NON_FINITE + (BEYOND_FP32,)},
        extra=(Bad("residual-m-1", "residual", ValueError, _set("residual", _narrowed(1, 1))),
               Bad("residual-m-9", "residual", ValueError, _put("residual", _zeros_bf16(3, 9, 40))),
               Bad("residual-H-0", "residual", ValueError, _put("residual", _zeros_bf16(3, 4, 0))),
               Bad("gemm_out_mul-no-splits", "gemm_out_mul", ValueError,
                   _with(gemm_out_mul=torch.zeros(0, 3, 24), gemm_out_sqrsum=torch.zeros(0, 3))),
               Bad("gemm_out_mul-width-of-another-m", "gemm_out_mul", ValueError, _set("gemm_out_mul", _narrowed(2, 15))),
               Bad("gemm_out_mul-other-tokens", "gemm_out_mul", ValueError, _set("gemm_out_mul", _narrowed(1, 2))),
               Bad("gemm_out_sqrsum-other-splits", "gemm_out_sqrsum", ValueError,
                   _set("gemm_out_sqrsum", _narrowed(0, 1))),
               Bad("gemm_out_sqrsum-with-columns", "gemm_out_sqrsum", ValueError,
                   _set("gemm_out_sqrsum", lambda t: t[..., None].expand(2, 3, 24).contiguous())),
               Bad("scale-four-entries", "scale", ValueError, _put("scale", torch.ones(4))),
               Bad("base-other-width", "base", ValueError, _set("base", lambda t: t[:15])))),
}
