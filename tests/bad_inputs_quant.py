"""The bad-argument tables of the quantisation functions beyond the first casts (family quant_swiglu: the
plain SwiGLU and its fused casts; quant_norm: RMSNorm and its cast).

tests/bad_inputs.py says how a table is written (`Table`, `Bad` and the argument editors);
tests/test_bad_inputs.py merges these into its `TABLES` and runs them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bad_inputs import (CLAMP_MIN_BAD, FMT_BAD, NON_FINITE_OR_NOT_POSITIVE, OPTION_COMBINATIONS, SF_OPTIONS, SWIGLU_POS,
                        SWIGLU_ROUTING_BAD, Bad, Table, _gen, _put, _set, _with, _x)


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
