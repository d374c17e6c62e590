"""The bad-argument tables of the quantisation functions beyond the first casts (family quant_swiglu: the
plain SwiGLU and its fused casts; quant_norm: RMSNorm and its cast; quant: the per-block cast's sf-only and
precomputed-sf variants, `QUANT_BLOCK`; quant_castback: the cast's round trip and the e2m1 unpack,
`QUANT_CASTBACK`; quant_layout: the transposed and the fused per-channel casts, the lossless re-coding and
the weight sf re-layout, `QUANT_LAYOUT`).

tests/bad_inputs.py says how a table is written (`Table`, `Bad` and the argument editors);
tests/test_bad_inputs.py merges these into its `TABLES` and runs them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bad_inputs import (CLAMP_MIN_BAD, FMT_BAD, NON_FINITE_OR_NOT_POSITIVE, OPTION_COMBINATIONS, SF_OPTIONS, SWIGLU_POS,
                        SWIGLU_ROUTING_BAD, Bad, Table, _gen, _put, _set, _with, _x)

# -- quant: the per-block cast's variants -----------------------------------------------------------------

BLOCK_BAD = (
    Bad("e5m6", "fmt", ValueError, _put("fmt", "e5m6")),
    Bad("block-64x64", "block", ValueError, _put("block", (64, 64))),
    Bad("block-one-int", "block", TypeError, _put("block", (128,))),
    Bad("block-str", "block", TypeError, _put("block", "128x128")),
    Bad("block-bool", "block", TypeError, _put("block", (True, 128))),
)


def _block_precomputed_base() -> dict[str, Any]:
    return {"x": _x(130, 256), "sf": torch.rand(2, 2, generator=_gen(8)) + 0.5, "fmt": "e4m3", "block": (128, 128)}


QUANT_BLOCK = {
    "per_block_cast_with_sf_only": Table(
        base=lambda: {"x": _x(4, 256), "fmt": "e4m3", "block": (128, 128), "round_sf": False, "use_ue8m0": False,
                      "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False, "clamp_min": None},
        tensors={"x": torch.float16}, reference="x", floats={"clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=FMT_BAD + OPTION_COMBINATIONS + BLOCK_BAD + (
            Bad("bk-not-dividing-H", "block", ValueError, _put("x", _x(4, 160))),)),
    "per_block_cast_with_precomputed_sf": Table(
        base=_block_precomputed_base, tensors={"x": torch.float16, "sf": torch.float64}, reference="x",
        any_strides=("sf",),
        extra=FMT_BAD + BLOCK_BAD + (
            Bad("bk-not-dividing-H", "block", ValueError, _with(x=_x(130, 160), sf=torch.ones(2, 1))),
            Bad("sf-other-columns", "sf", ValueError, _put("sf", torch.ones(2, 3))),
            Bad("sf-rows-of-T-not-ceil-T-over-bm", "sf", ValueError, _put("sf", torch.ones(130, 2))),
            Bad("sf-of-32x32-blocks", "sf", ValueError, _put("block", (32, 32))),
            Bad("packed-sf-unpacked-width", "sf", ValueError, _put("sf", torch.ones(2, 2, dtype=torch.int32))))),
}


def _swiglu_plain_base() -> dict[str, Any]:
    return {"x": _x(8, 64, torch.float32), "fmt": "bf16", "topk_weights": torch.rand(4, 2, generator=_gen(5)),
            "pos_to_token_topk": SWIGLU_POS.clone(), "clamp": 0.5}


def _swiglu_plain_bwd_base() -> dict[str, Any]:
    return {"grad_out": _x(8, 32), **_swiglu_plain_base()}


def _swiglu_bwd_cast_base() -> dict[str, Any]:
    return {"x": _x(8, 128, torch.float32).to(torch.float8_e4m3fn),
            "x_sf": torch.rand(8, 4, generator=_gen(6)) + 0.5, "grad_out": _x(8, 64), "fmt": "e4m3",
            "num_per_channels": 32,
            "topk_weights": torch.rand(4, 2, generator=_gen(7)), "pos_to_token_topk": SWIGLU_POS.clone(),
            "clamp": 0.5, "round_sf": False, "use_ue8m0": False, "use_packed_ue8m0": False,
            "use_tma_aligned_col_major_sf": False, "clamp_min": None}


PLAIN_FMT_BAD = (
    Bad("fmt-not-a-str", "fmt", TypeError, _put("fmt", 1)),
    Bad("fmt-e4m3", "fmt", ValueError, _put("fmt", "e4m3")),
)

QUANT_SWIGLU = {
    "swiglu": Table(
        base=_swiglu_plain_base,
        tensors={"x": torch.float16, "topk_weights": torch.float64, "pos_to_token_topk": torch.int64},
        reference="x", any_strides=("pos_to_token_topk",), floats={"clamp": NON_FINITE_OR_NOT_POSITIVE},
        extra=PLAIN_FMT_BAD + SWIGLU_ROUTING_BAD + (
            Bad("x-odd-columns", "x", ValueError, _set("x", lambda t: t[:, :63])),)),
    "swiglu_bwd": Table(
        base=_swiglu_plain_bwd_base,
        tensors={"grad_out": torch.float16, "x": torch.float16, "topk_weights": torch.float64,
                 "pos_to_token_topk": torch.int64},
        reference="x", any_strides=("pos_to_token_topk",), floats={"clamp": NON_FINITE_OR_NOT_POSITIVE},
        extra=PLAIN_FMT_BAD + SWIGLU_ROUTING_BAD + (
            Bad("x-odd-columns", "x", ValueError, _set("x", lambda t: t[:, :63])),
            Bad("grad_out-other-columns", "grad_out", ValueError, _set("grad_out", lambda t: t[:, :31])),
            Bad("grad_out-other-rows", "grad_out", ValueError, _set("grad_out", lambda t: t[:7])))),
    "swiglu_backward_and_per_token_cast": Table(
        base=_swiglu_bwd_cast_base,
        tensors={"x": torch.bfloat16, "x_sf": torch.float64, "grad_out": torch.float16,
                 "topk_weights": torch.float64, "pos_to_token_topk": torch.int64},
        reference="x", any_strides=("pos_to_token_topk",), ints={"num_per_channels": (48, 0)},
        floats={"clamp": NON_FINITE_OR_NOT_POSITIVE, "clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=FMT_BAD + OPTION_COMBINATIONS + SWIGLU_ROUTING_BAD + (
            Bad("x-odd-columns", "x", ValueError, _set("x", lambda t: t[:, :127])),
            Bad("x_sf-other-columns", "x_sf", ValueError, _set("x_sf", lambda t: t[:, :3])),
            Bad("x_sf-other-rows", "x_sf", ValueError, _set("x_sf", lambda t: t[:7])),
            Bad("grad_out-other-columns", "grad_out", ValueError, _set("grad_out", lambda t: t[:, :63])),
            Bad("fmt-e5m6", "fmt", ValueError, _put("fmt", "e5m6")))),
}

QUANT_SWIGLU["swiglu_forward_and_per_channel_cast_and_transpose"] = Table(
    base=lambda: {"x": _x(40, 64, torch.float32), "fmt": "e4m3", "num_per_tokens": 32, "clamp": 0.5,
                  "transpose": True, "round_sf": False, "use_ue8m0": False, "use_packed_ue8m0": False,
                  "use_tma_aligned_col_major_sf": False, "clamp_min": None},
    tensors={"x": torch.float16}, reference="x", ints={"num_per_tokens": (48, 0)},
    floats={"clamp": NON_FINITE_OR_NOT_POSITIVE, "clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS + ("transpose",),
    extra=OPTION_COMBINATIONS + (
        Bad("fmt-not-a-str", "fmt", TypeError, _put("fmt", 1)),
        Bad("fmt-e2m1", "fmt", ValueError, _put("fmt", "e2m1")),
        Bad("x-odd-columns", "x", ValueError, _set("x", lambda t: t[:, :63]))))


# -- quant_norm -----------------------------------------------------------------------------------------


def _norm_inputs() -> dict[str, Any]:
    g = _gen(11)
    return {"x": torch.randn(3, 16, generator=g).bfloat16(), "weight": torch.randn(16, generator=g).bfloat16(),
            "residual": torch.randn(3, 16, generator=g).bfloat16(), "eps": 1e-6, "out_scale": 1.0}


def _norm_bwd_inputs() -> dict[str, Any]:
    from kernels.torch.quant_norm import norm

    args = _norm_inputs()
    _, rstd, norm_input = norm(**args)
    g = _gen(12)
    return {"grad_out": torch.randn(3, 16, generator=g).bfloat16(),
            "grad_norm_input": torch.randn(3, 16, generator=g).bfloat16(), **args, "rstd": rstd,
            "norm_input": norm_input}


NORM_FLOATS = {"eps": NON_FINITE_OR_NOT_POSITIVE, "out_scale": (math.nan, math.inf, -math.inf)}
QUANT_NORM = {
    "norm": Table(
        base=_norm_inputs,
        tensors={"x": torch.float64, "weight": torch.float32, "residual": torch.float16}, reference="x",
        floats=NORM_FLOATS,
        extra=(Bad("x-no-columns", "x", ValueError, _with(x=torch.zeros(3, 0, dtype=torch.bfloat16),
                                                           weight=torch.zeros(0, dtype=torch.bfloat16),
                                                           residual=torch.zeros(3, 0, dtype=torch.bfloat16))),
               Bad("weight-other-H", "weight", ValueError, _set("weight", lambda t: t[:8])),
               Bad("residual-other-tokens", "residual", ValueError, _set("residual", lambda t: t[:2])))),
    "norm_bwd": Table(
        base=_norm_bwd_inputs,
        tensors={"grad_out": torch.float32, "grad_norm_input": torch.float16, "x": torch.float64,
                 "weight": torch.float32, "residual": torch.float16, "rstd": torch.bfloat16,
                 "norm_input": torch.float32},
        reference="x", floats=NORM_FLOATS, any_strides=("rstd",),
        extra=(Bad("grad_out-other-H", "grad_out", ValueError, _set("grad_out", lambda t: t[:, :8])),
               Bad("grad_norm_input-other-tokens", "grad_norm_input", ValueError,
                   _set("grad_norm_input", lambda t: t[:2])),
               Bad("rstd-other-tokens", "rstd", ValueError, _set("rstd", lambda t: t[:2])),
               Bad("norm_input-other-H", "norm_input", ValueError, _set("norm_input", lambda t: t[:, :8])))),
}

QUANT_NORM["norm_forward_and_per_token_cast"] = Table(
    base=lambda: {**_norm_inputs(), "fmt": "e4m3", "num_per_channels": 16},
    tensors={"x": torch.float64, "weight": torch.float32, "residual": torch.float16}, reference="x",
    floats=NORM_FLOATS,
    extra=(Bad("fmt-unknown", "fmt", ValueError, _put("fmt", "e3m4")),
           Bad("num_per_channels-not-dividing-H", "num_per_channels", ValueError, _put("num_per_channels", 3)),
           Bad("residual-other-tokens", "residual", ValueError, _set("residual", lambda t: t[:2]))))


# -- quant_castback: the cast's round trip and the e2m1 unpack ------------------------------------------------

QUANT_CASTBACK = {
    "per_token_cast_and_cast_back": Table(
        base=lambda: {"x": _x(4, 256), "fmt": "e4m3", "num_per_channels": 128, "round_sf": False, "clamp_min": None},
        tensors={"x": torch.float16}, reference="x", ints={"num_per_channels": (48, 0, 512)},
        floats={"clamp_min": CLAMP_MIN_BAD}, bools=("round_sf",),
        extra=FMT_BAD + (
            Bad("x-no-columns", "x", ValueError, _set("x", lambda t: t[:, :0])),
            Bad("e2m1-odd-H", "x", ValueError, _with(x=_x(4, 129), fmt="e2m1", num_per_channels=129)),
            Bad("npc-not-dividing-H", "num_per_channels", ValueError, _with(x=_x(4, 160))))),
    "unpack_from_e2m1fn_x2": Table(
        base=lambda: {"x": torch.randint(-128, 128, (4, 8), dtype=torch.int8, generator=_gen(9)),
                      "out_dtype": torch.float32},
        tensors={"x": torch.int16}, reference="x", any_rank=("x",),
        extra=(
            Bad("x-no-bytes", "x", ValueError, _set("x", lambda t: t[:, :0])),
            Bad("x-scalar", "x", ValueError, _set("x", lambda t: t[0, 0])),
            Bad("out_dtype-fp16", "out_dtype", TypeError, _put("out_dtype", torch.float16)),
            Bad("out_dtype-name", "out_dtype", ValueError, _put("out_dtype", "float")))),
}


# -- quant_layout: the transposed and fused per-channel casts, the lossless re-coding ----------------------


def _lossless_base() -> dict[str, Any]:
    """T = 4, H = 128: e2m1 codes (4, 64), input sf 2^k (k in [-3, 3]) of (1, 32) blocks, one (128, 128) out block."""
    exponents = torch.randint(-3, 4, (4, 4), generator=_gen(13)).float()
    return {"x": torch.randint(-128, 128, (4, 64), dtype=torch.int8, generator=_gen(14)),
            "x_sf": torch.pow(2.0, exponents), "fmt": "e4m3", "x_block_size": (1, 32), "out_block_size": (128, 128),
            "use_ue8m0": False, "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False}


def _sf_at(value: float):
    """x_sf with its first input sf replaced by `value`."""
    def spoil(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[0, 0] = value
        return t
    return _set("x_sf", spoil)


# pos_to_token of the fused cast: 5 rows gathered from T = 8 tokens (-1: a zero row).
FUSED_POS = torch.tensor([3, -1, 0, 7, 2], dtype=torch.int32)


def _fused_base() -> dict[str, Any]:
    """A quantised x: e4m3 codes (8, 128) with fp32 x_sf of (1, 32) blocks, rows gathered by pos_to_token."""
    return {"x": _x(8, 128, torch.float32).to(torch.float8_e4m3fn),
            "x_sf": torch.rand(8, 4, generator=_gen(15)) + 0.5, "fmt": "e4m3", "num_per_tokens": 32,
            "num_per_channels": 32, "pos_to_token": FUSED_POS.clone(), "round_sf": False, "use_ue8m0": False,
            "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False, "clamp_min": None}


def _weight_sf_base() -> dict[str, Any]:
    """G = 2 weights of n = 640, k = 384 (bs = 128): sf 2^k (k in [-8, 8]) of shape (2, 5, 3)."""
    exponents = torch.randint(-8, 9, (2, 5, 3), generator=_gen(16)).float()
    return {"sf": torch.pow(2.0, exponents), "block_size": 128, "transpose_sf1": False}


E4M3_ONLY_BAD = FMT_BAD + (Bad("fmt-e2m1", "fmt", ValueError, _put("fmt", "e2m1")),)
NUM_PER_TOKENS_BAD = (48, 0, 256)

QUANT_LAYOUT = {
    "per_channel_cast_and_transpose": Table(
        base=lambda: {"x": _x(40, 64), "fmt": "e4m3", "num_per_tokens": 32, "round_sf": False, "use_ue8m0": False,
                      "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False, "clamp_min": None},
        tensors={"x": torch.float16}, reference="x", ints={"num_per_tokens": NUM_PER_TOKENS_BAD},
        floats={"clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=E4M3_ONLY_BAD + OPTION_COMBINATIONS + (
            Bad("x-no-columns", "x", ValueError, _set("x", lambda t: t[:, :0])),)),
    "per_channel_cast_fused": Table(
        base=_fused_base,
        tensors={"x": torch.bfloat16, "x_sf": torch.float64, "pos_to_token": torch.int64}, reference="x",
        any_strides=("x_sf", "pos_to_token"),
        ints={"num_per_tokens": NUM_PER_TOKENS_BAD, "num_per_channels": (48, 0, 256)},
        floats={"clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=E4M3_ONLY_BAD + OPTION_COMBINATIONS + (
            Bad("num_per_channels-not-dividing-H", "num_per_channels", ValueError, _set("x", lambda t: t[:, :80])),
            Bad("num_per_channels-without-x_sf", "num_per_channels", ValueError, _put("x_sf", None)),
            Bad("plain-x-float16", "x", TypeError,
                _with(x=_x(8, 128, torch.float16), x_sf=None, num_per_channels=None)),
            Bad("plain-x-no-columns", "x", ValueError,
                _with(x=torch.zeros(8, 0, dtype=torch.bfloat16), x_sf=None, num_per_channels=None)),
            Bad("x_sf-other-columns", "x_sf", ValueError, _set("x_sf", lambda t: t[:, :3])),
            Bad("x_sf-other-rows", "x_sf", ValueError, _set("x_sf", lambda t: t[:7])),
            Bad("x_sf-of-16-channel-blocks", "x_sf", ValueError, _put("num_per_channels", 16)),
            Bad("packed-x_sf-unpacked-width", "x_sf", ValueError, _put("x_sf", torch.ones(8, 4, dtype=torch.int32))),
            Bad("pos-at-T", "pos_to_token", ValueError, _set("pos_to_token", lambda t: torch.where(t == 7, 8, t))),
            Bad("pos-below-minus-one", "pos_to_token", ValueError,
                _set("pos_to_token", lambda t: torch.where(t == -1, -2, t))))),
    "per_block_cast_lossless": Table(
        base=_lossless_base, tensors={"x": torch.uint8, "x_sf": torch.float64}, reference="x",
        any_strides=("x_sf",), bools=SF_OPTIONS[1:],
        extra=E4M3_ONLY_BAD + (
            Bad("packed-without-ue8m0", "use_packed_ue8m0", ValueError, _put("use_packed_ue8m0", True)),
            Bad("x_block_size-1x64", "x_block_size", ValueError, _put("x_block_size", (1, 64))),
            Bad("x_block_size-32x32", "x_block_size", ValueError, _put("x_block_size", (32, 32))),
            Bad("x_block_size-one-int", "x_block_size", TypeError, _put("x_block_size", (32,))),
            Bad("x_block_size-str", "x_block_size", TypeError, _put("x_block_size", "1x32")),
            Bad("x_block_size-bool", "x_block_size", TypeError, _put("x_block_size", (True, 32))),
            Bad("out_block_size-64x64", "out_block_size", ValueError, _put("out_block_size", (64, 64))),
            Bad("out_block_size-1x32", "out_block_size", ValueError, _put("out_block_size", (1, 32))),
            Bad("out_block_size-one-int", "out_block_size", TypeError, _put("out_block_size", (128,))),
            Bad("out_block_size-float", "out_block_size", TypeError, _put("out_block_size", (128.0, 128))),
            Bad("x-no-columns", "x", ValueError, _set("x", lambda t: t[:, :0])),
            Bad("H-not-a-multiple-of-bk-out", "x", ValueError,
                _with(x=torch.zeros(4, 48, dtype=torch.int8), x_sf=torch.ones(4, 3))),
            Bad("x_sf-other-columns", "x_sf", ValueError, _set("x_sf", lambda t: t[:, :3])),
            Bad("x_sf-other-rows", "x_sf", ValueError, _set("x_sf", lambda t: t[:3])),
            Bad("x_sf-of-1x16-blocks", "x_sf", ValueError, _put("x_block_size", (1, 16))),
            Bad("packed-x_sf-unpacked-width", "x_sf", ValueError, _put("x_sf", torch.ones(4, 4, dtype=torch.int32))),
            Bad("x_sf-not-a-power-of-two", "x_sf", ValueError, _sf_at(3.0)),
            Bad("x_sf-zero", "x_sf", ValueError, _sf_at(0.0)),
            Bad("x_sf-negative", "x_sf", ValueError, _sf_at(-1.0)),
            Bad("x_sf-inf", "x_sf", ValueError, _sf_at(math.inf)),
            Bad("x_sf-below-2^-127", "x_sf", ValueError, _sf_at(2.0**-128)),
            Bad("x_sf-spread-past-2^14", "x_sf", ValueError, _sf_at(2.0**-18)),
            Bad("ue8m0-out-sf-below-2^-127", "x_sf", ValueError,
                _with(x_sf=torch.full((4, 4), 2.0**-122), use_ue8m0=True)))),
    "batched_transpose_weight_sf": Table(
        base=_weight_sf_base, tensors={"sf": torch.float64}, reference="sf",
        ints={"block_size": (64, 0, 256)}, bools=("transpose_sf1",),
        extra=(
            Bad("sf-one-dim", "sf", ValueError, _set("sf", lambda t: t[0, 0])),
            Bad("sf-no-groups", "sf", ValueError, _set("sf", lambda t: t[:0])),
            Bad("sf-no-columns", "sf", ValueError, _set("sf", lambda t: t[:, :, :0])),
            Bad("n-not-a-multiple-of-128", "sf", ValueError, _put("block_size", 32)),
            Bad("k-not-a-multiple-of-128", "sf", ValueError,
                _with(sf=torch.ones(2, 4, 3), block_size=32)))),
}
