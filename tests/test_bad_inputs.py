"""Bad input, for every public kernel function: refused before any launch, with the argument named.

One table per function (`TABLES`): a valid call and the ways to spoil one
argument of it (wrong type, dtype, rank, shape, device, layout, an aliased
in-place buffer, an out-of-range or non-finite parameter, an option
combination the function does not support).  Each spoiled call must raise
the exception the table names (TypeError for a wrong type or dtype,
ValueError for everything else) with a message that starts with the
argument's name, and leave every tensor it was given bit-identical, the
in-place buffer (swiglu's clamped_count) included.

The same tables judge both implementations of a function: the eager one
(kernels/torch/<family>.py) on this machine's devices, and the TileLang
wrapper (kernels/<family>.py), whose contract is to raise the same errors
for the same bad arguments, but for the rows `VALUE_CHECKED` names: those
are refused by reading tensor values back to the host, which only the eager
implementations do (the wrappers never synchronise with the device); the
GPU tests there check what the wrappers give instead.  Without CUDA the
wrappers still run here: they apply the eager metadata checks first, so
every other spoiled call gets the eager error, and a valid call on the CPU
is refused with an error naming the tensor that must be on a CUDA device.
On a CUDA machine the valid call also runs.

Which functions: every implementation (forward and backward) the registry
declares, and every other public callable of the kernels modules, so a new
op or a new entry point fails `test_every_public_kernel_function_has_a_table`
until it has a table (or a reason in `NOT_ENTRY_POINTS`).

Aliasing: only swiglu_forward_and_per_token_cast writes into a tensor it is
given (clamped_count); a clamped_count sharing memory with an input is
refused.  Every other function only reads its tensors and returns new ones,
so inputs aliasing one another are harmless there.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
from typing import Any, Callable

import pytest
import torch

import kernels
import kernels.torch
from kernels._tilelang import kernel_defs
from tkverify import registry

# How a table is written: tests/bad_inputs.py.  The mHC tables live in tests/bad_inputs_mhc.py, the norm and
# SwiGLU ones in tests/bad_inputs_quant.py.
from bad_inputs import (CLAMP_MIN_BAD, FMT_BAD, NON_FINITE_OR_NOT_POSITIVE, OPTION_COMBINATIONS, SF_OPTIONS, SWIGLU_POS,
                        SWIGLU_ROUTING_BAD, Bad, Table, _gen, _put, _set, _with, _x)
from bad_inputs_mhc import MHC, MHC_BIG_FUSE, MHC_FUSED, MHC_HEAD
from bad_inputs_moe import MOE_GATE
from bad_inputs_moe_tp import MOE_TP
from bad_inputs_quant import QUANT_BLOCK, QUANT_CASTBACK, QUANT_LAYOUT, QUANT_NORM, QUANT_SWIGLU


# -- moe ---------------------------------------------------------------------------------------------


def _pos(tokens: int, k: int, rows: int) -> torch.Tensor:
    """A token_topk_to_pos with distinct rows in [0, rows), and one masked slot."""
    pos = torch.randperm(rows, generator=_gen(1))[: tokens * k].reshape(tokens, k).to(torch.int32)
    pos[-1, -1] = -1
    return pos


MOE = {
    "topk_gate": Table(
        base=lambda: {"scores": torch.randn(4, 8, generator=_gen(0)), "k": 2},
        tensors={"scores": torch.float64}, reference="scores", ints={"k": (0, 9)},
        extra=(Bad("no-experts", "scores", ValueError, _set("scores", lambda t: t[:, :0])),
               Bad("too-many-experts", "scores", ValueError, _put("scores", torch.zeros(4, 1025))),
               Bad("k-beyond-32", "k", ValueError, _with(scores=torch.zeros(4, 64), k=33)))),
    "group_count": Table(
        base=lambda: {"idx": torch.randint(-1, 8, (4, 2), generator=_gen(0), dtype=torch.int32), "num_groups": 8},
        tensors={"idx": torch.float32}, reference="idx", ints={"num_groups": (0, 1025)},
        extra=(Bad("no-slots", "idx", ValueError, _set("idx", lambda t: t[:, :0])),
               Bad("33-slots", "idx", ValueError, _put("idx", torch.zeros(4, 33, dtype=torch.int32))))),
    "fused_mapping": Table(
        base=lambda: {"topk_idx": torch.randint(-1, 8, (4, 2), generator=_gen(0)), "num_experts": 8, "alignment": 4},
        tensors={"topk_idx": torch.int32}, reference="topk_idx",
        ints={"num_experts": (0, 1025), "alignment": (0, 1025)},
        extra=(Bad("33-slots", "topk_idx", ValueError, _put("topk_idx", torch.zeros(4, 33, dtype=torch.int64))),)),
    "expand_to_fused": Table(
        base=lambda: {"x": torch.randn(4, 16, generator=_gen(0)).to(torch.float8_e4m3fn),
                      "token_topk_to_pos": _pos(4, 2, 10), "num_expanded_rows": 10,
                      "x_sf": torch.rand(4, 2, generator=_gen(2))},
        tensors={"x": torch.float64, "token_topk_to_pos": torch.int64, "x_sf": torch.float16}, reference="x",
        ints={"num_expanded_rows": (-1, 2**31)},
        extra=(Bad("x-no-columns", "x", ValueError, _set("x", lambda t: t[:, :0])),
               Bad("pos-other-token-count", "token_topk_to_pos", ValueError,
                   _set("token_topk_to_pos", lambda t: t[:3])),
               Bad("pos-33-slots", "token_topk_to_pos", ValueError,
                   _put("token_topk_to_pos", torch.full((4, 33), -1, dtype=torch.int32))),
               Bad("x_sf-other-token-count", "x_sf", ValueError, _set("x_sf", lambda t: t[:3])),
               Bad("x_sf-no-columns", "x_sf", ValueError, _set("x_sf", lambda t: t[:, :0])),
               # Column-major, but ue8m0 bytes pad 4 rows to 16: not the TMA layout.
               Bad("x_sf-column-major-unpadded", "x_sf", ValueError,
                   _put("x_sf", torch.ones(2, 4, dtype=torch.uint8).T)))),
    "reduce_fused": Table(
        base=lambda: {"x": torch.randn(8, 16, generator=_gen(0)).to(torch.float8_e4m3fn),
                      "topk_weights": torch.rand(4, 2, generator=_gen(1)), "token_topk_to_pos": _pos(4, 2, 8),
                      "x_sf": torch.rand(8, 1, generator=_gen(2))},
        tensors={"x": torch.float16, "topk_weights": torch.float64, "token_topk_to_pos": torch.int64,
                 "x_sf": torch.float64},
        reference="x",
        extra=(Bad("x-no-columns", "x", ValueError, _set("x", lambda t: t[:, :0])),
               Bad("weights-33-slots", "topk_weights", ValueError, _put("topk_weights", torch.zeros(4, 33))),
               Bad("pos-other-shape", "token_topk_to_pos", ValueError, _set("token_topk_to_pos", lambda t: t[:3])),
               Bad("e4m3-without-x_sf", "x_sf", ValueError, _put("x_sf", None)),
               Bad("x_sf-with-bf16-x", "x_sf", ValueError, _set("x", lambda t: t.to(torch.bfloat16))),
               Bad("x_sf-two-columns", "x_sf", ValueError, _put("x_sf", torch.ones(8, 2))),
               Bad("x_sf-other-rows", "x_sf", ValueError, _set("x_sf", lambda t: t[:7])))),
    "normalize_weight": Table(
        base=lambda: {"topk_weights": torch.rand(4, 2, generator=_gen(0))},
        tensors={"topk_weights": torch.float64}, reference="topk_weights",
        extra=(Bad("no-slots", "topk_weights", ValueError, _set("topk_weights", lambda t: t[:, :0])),
               Bad("33-slots", "topk_weights", ValueError, _put("topk_weights", torch.zeros(4, 33))))),
}

MOE_GROUPS = {
    "topk_sum_and_topk_group_idx": Table(
        base=lambda: {"scores": torch.randn(4, 4, 8, generator=_gen(0)), "num_topk_sum": 2, "num_topk_groups": 2},
        tensors={"scores": torch.float64}, reference="scores",
        ints={"num_topk_sum": (0, 3), "num_topk_groups": (0, 5)},
        extra=(Bad("scores-2d", "scores", ValueError, _put("scores", torch.zeros(4, 32))),
               Bad("scores-33-groups", "scores", ValueError, _put("scores", torch.zeros(4, 33, 1))),
               Bad("scores-1025-experts", "scores", ValueError, _put("scores", torch.zeros(4, 5, 205))),
               Bad("scores-no-experts", "scores", ValueError, _set("scores", lambda t: t[:, :, :0])),
               Bad("num_topk_sum-beyond-M", "num_topk_sum", ValueError,
                   _with(scores=torch.zeros(4, 4, 1), num_topk_sum=2)))),
    "unique_group_indices": Table(
        base=lambda: {"group_indices": torch.randint(-1, 8, (4, 8), generator=_gen(0)), "num_groups": 8},
        tensors={"group_indices": torch.int32}, reference="group_indices", ints={"num_groups": (0, 1025)},
        extra=(Bad("no-slots", "group_indices", ValueError, _set("group_indices", lambda t: t[:, :0])),
               Bad("33-slots", "group_indices", ValueError,
                   _put("group_indices", torch.zeros(4, 33, dtype=torch.int64))))),
}

MOE_GROUPS["aux_fi"] = Table(
    base=lambda: {"topk_idx": torch.randint(-1, 8, (4, 2), generator=_gen(0)), "num_experts": 8, "num_aux_topk": 2},
    tensors={"topk_idx": torch.int32}, reference="topk_idx",
    ints={"num_experts": (0, 1025), "num_aux_topk": (0, 1025)},
    extra=(Bad("no-slots", "topk_idx", ValueError, _set("topk_idx", lambda t: t[:, :0])),
           Bad("33-slots", "topk_idx", ValueError, _put("topk_idx", torch.zeros(4, 33, dtype=torch.int64)))))

# -- quant ---------------------------------------------------------------------------------------------


def _token_cast_table() -> Table:
    return Table(
        base=lambda: {"x": _x(4, 256), "fmt": "e4m3", "num_per_channels": 128, "round_sf": False,
                      "use_ue8m0": False, "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False,
                      "clamp_min": None},
        tensors={"x": torch.float16}, reference="x", ints={"num_per_channels": (48, 0, 512)},
        floats={"clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=FMT_BAD + OPTION_COMBINATIONS + (
            Bad("x-no-columns", "x", ValueError, _set("x", lambda t: t[:, :0])),
            Bad("e2m1-odd-H", "x", ValueError, _with(x=_x(4, 129), fmt="e2m1", num_per_channels=129)),
            Bad("e5m6-H-not-multiple-of-8", "x", ValueError, _with(x=_x(4, 132), fmt="e5m6", num_per_channels=132)),
            Bad("e5m6-two-blocks-a-row", "num_per_channels", ValueError, _put("fmt", "e5m6")),
            Bad("npc-not-dividing-H", "num_per_channels", ValueError, _with(x=_x(4, 160)))))


def _precomputed_base() -> dict[str, Any]:
    return {"x": _x(4, 256), "sf": torch.rand(4, 2, generator=_gen(5)) + 0.5, "fmt": "e4m3", "num_per_channels": 128}




def _swiglu_base() -> dict[str, Any]:
    return {"x": _x(8, 64, torch.float32), "fmt": "e4m3", "num_per_channels": 32,
            "topk_weights": torch.rand(4, 2, generator=_gen(3)), "pos_to_token_topk": SWIGLU_POS.clone(),
            "clamp": 0.5, "clamped_count": torch.tensor([1, 2, 3]), "round_sf": False, "use_ue8m0": False,
            "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False, "clamp_min": None}


def _alias(into: str):
    """clamped_count as three int64 words of another argument's memory."""
    return lambda args, foreign: args.update(clamped_count=args[into].view(-1).view(torch.int64)[:3])


QUANT = {
    "per_token_cast": _token_cast_table(),
    "per_token_cast_with_sf_only": _token_cast_table(),
    "per_token_cast_with_precomputed_sf": Table(
        base=_precomputed_base, tensors={"x": torch.float16, "sf": torch.float64}, reference="x",
        any_strides=("sf",), ints={"num_per_channels": (48, 0)},
        extra=FMT_BAD + (
            Bad("sf-other-columns", "sf", ValueError, _put("sf", torch.ones(4, 3))),
            Bad("sf-other-rows", "sf", ValueError, _put("sf", torch.ones(3, 2))),
            Bad("packed-sf-unpacked-width", "sf", ValueError, _put("sf", torch.ones(4, 2, dtype=torch.int32))),
            Bad("e5m6-two-blocks-a-row", "num_per_channels", ValueError, _put("fmt", "e5m6")))),
    "per_block_cast": Table(
        base=lambda: {"x": _x(4, 256), "fmt": "e4m3", "block": (128, 128), "round_sf": False, "use_ue8m0": False,
                      "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False, "clamp_min": None},
        tensors={"x": torch.float16}, reference="x", floats={"clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=FMT_BAD + OPTION_COMBINATIONS + (
            Bad("e5m6", "fmt", ValueError, _put("fmt", "e5m6")),
            Bad("block-64x64", "block", ValueError, _put("block", (64, 64))),
            Bad("block-one-int", "block", TypeError, _put("block", (128,))),
            Bad("block-str", "block", TypeError, _put("block", "128x128")),
            Bad("block-bool", "block", TypeError, _put("block", (True, 128))),
            Bad("bk-not-dividing-H", "block", ValueError, _put("x", _x(4, 160))))),
    "per_channel_cast": Table(
        base=lambda: {"x": _x(4, 256), "fmt": "e4m3", "num_per_tokens": 128, "round_sf": False, "use_ue8m0": False,
                      "use_packed_ue8m0": False, "use_tma_aligned_col_major_sf": False, "clamp_min": None},
        tensors={"x": torch.float16}, reference="x", ints={"num_per_tokens": (48, 0, 256)},
        floats={"clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=FMT_BAD + OPTION_COMBINATIONS + (
            Bad("e5m6", "fmt", ValueError, _put("fmt", "e5m6")),
            Bad("e2m1-odd-H", "x", ValueError, _with(x=_x(4, 129), fmt="e2m1")))),
    "cast_back": Table(
        base=lambda: {"data": _x(4, 256).to(torch.float8_e4m3fn), "sf": torch.rand(4, 2, generator=_gen(4)),
                      "fmt": "e4m3", "block": (1, 128), "out_dtype": torch.bfloat16},
        tensors={"data": torch.int8, "sf": torch.float64}, reference="data", any_strides=("sf",),
        extra=FMT_BAD + (
            Bad("data-no-columns", "data", ValueError, _set("data", lambda t: t[:, :0])),
            Bad("e5m6-row-not-12-bytes", "data", ValueError,
                _with(data=torch.zeros(4, 30, dtype=torch.uint8), fmt="e5m6", block=(1, 20))),
            Bad("out_dtype-fp16", "out_dtype", TypeError, _put("out_dtype", torch.float16)),
            Bad("out_dtype-name", "out_dtype", ValueError, _put("out_dtype", "half")),
            Bad("block-1x48", "block", ValueError, _put("block", (1, 48))),
            Bad("block-2x2", "block", ValueError, _put("block", (2, 2))),
            Bad("block-one-int", "block", TypeError, _put("block", (128,))),
            Bad("sf-other-columns", "sf", ValueError, _put("sf", torch.ones(4, 3))))),
    "swiglu_forward_and_per_token_cast": Table(
        base=_swiglu_base,
        tensors={"x": torch.float16, "topk_weights": torch.float64, "pos_to_token_topk": torch.int64,
                 "clamped_count": torch.int32},
        reference="x", any_strides=("pos_to_token_topk",), ints={"num_per_channels": (48, 0)},
        floats={"clamp": NON_FINITE_OR_NOT_POSITIVE, "clamp_min": CLAMP_MIN_BAD}, bools=SF_OPTIONS,
        extra=FMT_BAD + OPTION_COMBINATIONS + SWIGLU_ROUTING_BAD + (
            Bad("x-odd-columns", "x", ValueError, _set("x", lambda t: t[:, :63])),
            Bad("count-four-counters", "clamped_count", ValueError, _put("clamped_count", torch.zeros(4, dtype=torch.int64))),
            Bad("count-aliases-x", "clamped_count", ValueError, _alias("x")),
            Bad("count-aliases-topk_weights", "clamped_count", ValueError, _alias("topk_weights")),
            Bad("count-aliases-pos", "clamped_count", ValueError, _alias("pos_to_token_topk")))),
}

# -- transpose ------------------------------------------------------------------------------------------

TRANSPOSE = {
    "transpose": Table(base=lambda: {"x": _x(3, 5)}, tensors={"x": torch.float64}, reference="x"),
    "batched_transpose": Table(base=lambda: {"x": _x(6, 5).reshape(2, 3, 5)}, tensors={"x": torch.float64},
                               reference="x"),
}

# -- engram ---------------------------------------------------------------------------------------------


def _engram_inputs() -> dict[str, Any]:
    g = _gen(7)
    return {"x": torch.randn(2, 2, 16, generator=g).bfloat16(), "k": torch.randn(2, 2, 16, generator=g).bfloat16(),
            "v": torch.randn(2, 16, generator=g).bfloat16(), "w": torch.rand(2, 16, generator=g) + 0.5,
            "eps": 1e-6, "clamp": 1e-6}


def _engram_bwd_inputs() -> dict[str, Any]:
    from kernels.torch.engram import engram_gate_fwd

    args = _engram_inputs()
    _, d, g, rx, rk = engram_gate_fwd(**args)
    grad_out = torch.randn(2, 2, 16, generator=_gen(8)).bfloat16()
    return {"grad_out": grad_out, **{k: args[k] for k in "xkvw"}, "d": d, "g": g, "rx": rx, "rk": rk,
            "eps": args["eps"], "clamp": args["clamp"]}


def _unfused_inputs() -> dict[str, Any]:
    args = _engram_inputs()
    w = args.pop("w")
    return {**{k: args[k] for k in "xkv"}, "wh": w, "we": torch.full_like(w, 0.5), "eps": 1e-6, "clamp": 1e-6}


def _fused_weight_inputs():
    return {"weight_hidden": torch.ones(2, 8, dtype=torch.bfloat16), "weight_embed": torch.full((2, 8), 0.5, dtype=torch.bfloat16)}


def _grad_w_reduce_inputs():
    return {"grad_w_partial": torch.ones(3, 2, 8), **_fused_weight_inputs(), "grad_weight_hidden": torch.zeros(2, 8),
            "grad_weight_embed": torch.zeros(2, 8)}


def _hash_inputs():
    return {"ngram_token_ids": torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32),
            "multipliers": torch.tensor([[3, 5, 7], [1, 1, 1]]), "vocab_sizes": torch.full((2, 2, 2), 7, dtype=torch.int32),
            "offsets": torch.zeros(2, 4, dtype=torch.int32), "image_token_mask": torch.tensor([False, True])}


ENGRAM_FWD = dict(
    tensors={"x": torch.float16, "k": torch.float16, "v": torch.float16, "w": torch.float64}, reference="x",
    floats={"eps": NON_FINITE_OR_NOT_POSITIVE, "clamp": NON_FINITE_OR_NOT_POSITIVE},
    extra=(Bad("x-no-heads", "x", ValueError, _set("x", lambda t: t[:, :0])),
           Bad("k-other-H", "k", ValueError, _set("k", lambda t: t[..., :8])),
           Bad("v-other-tokens", "v", ValueError, _set("v", lambda t: t[:1])),
           Bad("w-other-heads", "w", ValueError, _set("w", lambda t: t[:1]))))
ENGRAM = {
    "engram_gate_fwd": Table(base=_engram_inputs, **ENGRAM_FWD),
    "EngramGate.apply": Table(base=_engram_inputs, positional=("x", "k", "v", "w", "eps", "clamp"), **ENGRAM_FWD),
    "engram_gate_bwd": Table(
        base=_engram_bwd_inputs,
        tensors={"grad_out": torch.float16, "x": torch.float16, "k": torch.float16, "v": torch.float16,
                 "w": torch.float64, "d": torch.float64, "g": torch.float64, "rx": torch.float64,
                 "rk": torch.float64},
        reference="x", floats={"eps": NON_FINITE_OR_NOT_POSITIVE, "clamp": NON_FINITE_OR_NOT_POSITIVE},
        extra=(Bad("grad_out-other-heads", "grad_out", ValueError, _set("grad_out", lambda t: t[:, :1])),
               Bad("d-other-tokens", "d", ValueError, _set("d", lambda t: t[:1])),
               Bad("rk-other-heads", "rk", ValueError, _set("rk", lambda t: t[:, :1])))),
    "engram_gate": Table(
        base=_unfused_inputs,
        tensors={"x": torch.float16, "k": torch.float16, "v": torch.float16, "wh": torch.bfloat16,
                 "we": torch.float64},
        reference="x", floats={"eps": NON_FINITE_OR_NOT_POSITIVE, "clamp": NON_FINITE_OR_NOT_POSITIVE},
        extra=(Bad("wh-other-H", "wh", ValueError, _set("wh", lambda t: t[:, :8])),
               Bad("we-broadcast-row", "we", ValueError, _set("we", lambda t: t[:1])))),
    "fused_weight": Table(
        base=_fused_weight_inputs, tensors={"weight_hidden": torch.float32, "weight_embed": torch.float16},
        reference="weight_hidden",
        extra=(Bad("weight_embed-other-H", "weight_embed", ValueError, _set("weight_embed", lambda t: t[:, :4])),
               Bad("weight_hidden-no-heads", "weight_hidden", ValueError, _set("weight_hidden", lambda t: t[:0])))),
    "grad_w_reduce": Table(
        base=_grad_w_reduce_inputs,
        tensors={"grad_w_partial": torch.float64, "weight_hidden": torch.float32, "weight_embed": torch.float32,
                 "grad_weight_hidden": torch.bfloat16, "grad_weight_embed": torch.float64},
        reference="weight_hidden",
        extra=(Bad("grad_w_partial-other-H", "grad_w_partial", ValueError, _set("grad_w_partial", lambda t: t[..., :4])),
               Bad("grad_weight_embed-other-heads", "grad_weight_embed", ValueError,
                   _set("grad_weight_embed", lambda t: t[:1])),
               Bad("accumulators-one-tensor", "grad_weight_hidden", ValueError,
                   lambda args, foreign: args.update(grad_weight_embed=args["grad_weight_hidden"])))),
    "engram_hash": Table(
        base=_hash_inputs,
        tensors={"ngram_token_ids": torch.int64, "multipliers": torch.int32, "vocab_sizes": torch.int64,
                 "offsets": torch.int64, "image_token_mask": torch.uint8},
        reference="ngram_token_ids",
        extra=(Bad("ngram_token_ids-one-column", "ngram_token_ids", ValueError,
                   _set("ngram_token_ids", lambda t: t[:, :1])),
               Bad("multipliers-other-N", "multipliers", ValueError, _set("multipliers", lambda t: t[:, :2])),
               Bad("vocab_sizes-other-orders", "vocab_sizes", ValueError, _set("vocab_sizes", lambda t: t[:, :1])),
               Bad("offsets-other-tables", "offsets", ValueError, _set("offsets", lambda t: t[:, :3])),
               Bad("image_token_mask-other-tokens", "image_token_mask", ValueError,
                   _set("image_token_mask", lambda t: t[:1])))),
}

# -- mhc, mhc_head, mhc_fused ----------------------------------------------------------------------------


TABLES: dict[str, Table] = {f"{family}.{name}": table for family, tables in
                            (("moe", MOE), ("moe_groups", MOE_GROUPS), ("quant", QUANT), ("quant_swiglu", QUANT_SWIGLU),
                             ("quant_norm", QUANT_NORM), ("transpose", TRANSPOSE),
                             ("engram", ENGRAM), ("mhc", MHC), ("mhc_head", MHC_HEAD), ("mhc_fused", MHC_FUSED),
                             ("mhc_big_fuse", MHC_BIG_FUSE), ("quant", QUANT_BLOCK), ("quant_castback", QUANT_CASTBACK),
                             ("moe_gate", MOE_GATE), ("quant_layout", QUANT_LAYOUT), ("moe_tp", MOE_TP))
                            for name, table in tables.items()}

# Public callables of the kernels modules that take no user tensors: not entry points of an op.
NOT_ENTRY_POINTS = {
    "quant_castback.check_unpack_args": "unpack_from_e2m1fn_x2's argument check (its table exercises it)",
    "quant_castback.round_trip": "per_token_cast then cast_back for a pair of implementations (each checks its "
                                 "arguments; per_token_cast_and_cast_back's table calls it)",
    "quant_castback.unpack_rows": "cast_back of packed e2m1 codes for a cast_back (unpack_from_e2m1fn_x2's table)",
    "moe.config_for_experts": "picks a TileLang static configuration from E (checked by topk_gate)",
    "moe.expand_rows_config": "the row kernel's configuration (a tuning override or the shipped one)",
    "moe.default_chunk_batches": "a chunk size from the pair count",
    "moe.tma_padded_rows": "the sf layout's arithmetic",
    "moe.is_tma_column_major": "a layout predicate",
    "moe.column_major_zeros": "an allocator for the sf layout",
    "quant.fast_paths": "which fast paths a TileLang configuration compiles",
    "quant.magic_divisor": "host arithmetic for a kernel argument",
    "quant.token_config": "picks a TileLang static configuration (the tuned one) for a call",
    "quant.block_config": "picks the block_cast static configuration (the shipped one, or a tuning override)",
    "quant.block_geometry": "launch geometry arithmetic of a block_cast configuration",
    "quant.row_chunks": "launch geometry arithmetic of the token cast's row path",
    "transpose.vector_tile": "a TileLang tile size",
    "engram.apply_unfused": "engram_gate's body, shared by both implementations (covered by engram_gate's table)",
    "engram.gate_function": "builds the autograd Function of a (fwd, bwd) pair (covered by EngramGate's table)",
    "engram.config_for_hidden": "picks a TileLang static configuration from H",
    "engram.fwd_config": "picks the forward's static configuration (the shipped one, or a tuning override)",
    "engram.bwd_config": "picks the backward's static configuration (the shipped one, or a tuning override)",
    "engram.forward_tokens_per_block": "launch geometry arithmetic",
    "engram.fwd_resident": "a static configuration's resident CTAs an SM (launch geometry)",
    "engram.row_chunks": "a static configuration's 16-byte chunks a row (threads x chunks)",
    "engram.backward_blocks": "launch geometry arithmetic",
    "mhc.checkpoint_interval": "the backward's checkpoint arithmetic",
    "mhc.post_config": "picks post's static configuration (the shipped one, or a tuning override)",
    "mhc.sinkhorn_function": "builds the autograd Function of a (fwd, bwd) pair (covered by Sinkhorn's table)",
    "transpose.tile_shape": "a TileLang tile size",
}

# -- which functions, in which implementations ----------------------------------------------------------


def _registered_functions() -> set[str]:
    """family.attr of every kernels.* target the registry declares, forward and backward."""
    names = set()
    for spec in registry.all_specs():
        impls = list(spec.impls.values()) + (list(spec.backward.impls.values()) if spec.backward else [])
        for impl in impls:
            target = impl.target if isinstance(impl.target, str) else getattr(impl.target, "target", None)
            if not isinstance(target, str) or not target.startswith("kernels."):
                continue  # a user's own implementation, or a callable: not ours to table
            module, _, attr = target.partition(":")
            names.add(f"{_family(module, attr)}.{attr}")
    return names


@functools.lru_cache(maxsize=None)
def _eager_families() -> dict[str, str]:
    """attr -> the kernels.torch module defining that public function (its family in a table's key)."""
    families = {}
    for info in pkgutil.iter_modules(kernels.torch.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"kernels.torch.{info.name}")
        for name, obj in vars(module).items():
            if not name.startswith("_") and callable(obj) and getattr(obj, "__module__", None) == module.__name__:
                families.setdefault(name, info.name)
    return families


def _family(module: str, attr: str) -> str:
    """The family a table keys a function by: the kernels.torch module of its eager twin (a TileLang wrapper
    of kernels.mhc.expand is keyed by kernels.torch.mhc_head's name), else its kernels package."""
    parts = module.split(".")
    if parts[1] == "torch":
        return parts[2]
    return _eager_families().get(attr.split(".")[0], parts[1])


def _kernel_modules():
    """Every kernels module: a family module, or each module of a family package."""
    for package in (kernels, kernels.torch):
        for info in pkgutil.iter_modules(package.__path__):
            if info.name.startswith("_") or info.name in ("precompile", "torch"):
                continue
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            if not info.ispkg:
                yield module
                continue
            for sub in pkgutil.iter_modules(module.__path__):
                if not sub.name.startswith("_"):
                    yield importlib.import_module(f"{module.__name__}.{sub.name}")


def _public_functions() -> set[str]:
    """family.name of every public callable defined in a kernels module (autograd Functions by .apply)."""
    builders = {d.build for d in kernel_defs().values()}
    names = set()
    for module in _kernel_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or not callable(obj) or getattr(obj, "__module__", None) != module.__name__:
                continue
            if obj in builders or (inspect.isclass(obj) and issubclass(obj, tuple)):
                continue  # a prim_func builder, reached through its KernelDef; a static-configuration NamedTuple
            if inspect.isclass(obj) and issubclass(obj, torch.autograd.Function):
                name = f"{name}.apply"
            names.add(f"{_family(module.__name__, name)}.{name}")
    return names


def test_every_public_kernel_function_has_a_table():
    registered = _registered_functions()
    public = _public_functions()
    assert registered <= public | set(TABLES), "registered targets missing from the kernels modules"
    missing = sorted((registered | public) - set(TABLES) - set(NOT_ENTRY_POINTS))
    assert not missing, f"these public kernel functions lack a bad-input table in {__file__}: {missing}"
    stale = sorted(set(NOT_ENTRY_POINTS) - public)
    assert not stale, f"NOT_ENTRY_POINTS names functions that no longer exist: {stale}"


def _function(impl: str, key: str) -> Callable[..., Any]:
    family, _, attr = key.partition(".")
    module_name = f"kernels.torch.{family}" if impl == "torch" else _wrapper_module(family, attr)
    if importlib.util.find_spec(module_name) is None:
        pytest.skip(f"{module_name} does not exist (yet)")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            if key in _registered_functions():
                pytest.fail(f"{module_name} lacks {attr}, which the registry names")
            pytest.skip(f"{module_name} has no {attr}")
        obj = getattr(obj, part)
    return obj


def _wrapper_module(family: str, attr: str) -> str:
    """The kernels module of the TileLang wrapper keyed family.attr: the one the registry names, else the
    family's package."""
    for spec in registry.all_specs():
        impls = list(spec.impls.values()) + (list(spec.backward.impls.values()) if spec.backward else [])
        for impl in impls:
            target = impl.target if isinstance(impl.target, str) else ""
            module, _, name = target.partition(":")
            if module.startswith("kernels.") and not module.startswith("kernels.torch") and name == attr \
                    and _family(module, name) == family:
                return module
    return f"kernels.{family}"


def _call(table: Table, fn: Callable[..., Any], args: dict[str, Any]):
    if table.positional is not None:
        return fn(*(args[n] for n in table.positional))
    return fn(**args)


def _on(device: torch.device, args: dict[str, Any]) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _snapshot(args: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone(memory_format=torch.contiguous_format) for k, v in args.items()
            if isinstance(v, torch.Tensor) and v.device.type != "meta"}


def _assert_untouched(args: dict[str, Any], before: dict[str, torch.Tensor]) -> None:
    for name, old in before.items():
        new = args[name].detach().clone(memory_format=torch.contiguous_format)
        # As bytes (NaN payloads compare too), flattened: a 0-d tensor has no last dimension to view as bytes.
        assert torch.equal(new.reshape(-1).view(torch.uint8), old.reshape(-1).view(torch.uint8)), \
            f"a refused call changed {name}"


def _expect(bad: Bad, raised: pytest.ExceptionInfo) -> None:
    assert raised.type is bad.error, f"{bad.id}: raised {raised.type.__name__}: {raised.value}"
    message = str(raised.value)
    assert re.match(rf"{re.escape(bad.arg)}\b", message), f"{bad.id}: the message does not start with " \
                                                          f"{bad.arg!r}: {message}"


# -- the rows only the eager implementations refuse -------------------------------------------------------
#
# These spoiled calls are refused by checking tensor VALUES, which on CUDA means reading them back to the host
# (a device sync).  The TileLang wrappers check metadata alone and never synchronise (tests/test_sync_gpu.py);
# for them such an input is outside the contract: no error, nothing read or written out of bounds, and the
# answer the contract gives (docs/contract/quant.md, quant_swiglu.md, quant_layout.md): an index outside its
# range makes its row a padding row (-1), an x_sf the lossless cast refuses makes its out block NaN.

_SWIGLU_POS_ROWS = ("pos-past-the-slots", "pos-below-minus-one")
_LOSSLESS_SF_ROWS = ("x_sf-not-a-power-of-two", "x_sf-zero", "x_sf-negative", "x_sf-inf", "x_sf-below-2^-127",
                     "x_sf-spread-past-2^14", "ue8m0-out-sf-below-2^-127")
# key -> (the rows refused by value, the index argument: None where the values are x_sf's)
VALUE_CHECKED = {
    "quant.swiglu_forward_and_per_token_cast": (_SWIGLU_POS_ROWS, "pos_to_token_topk"),
    "quant_swiglu.swiglu": (_SWIGLU_POS_ROWS, "pos_to_token_topk"),
    "quant_swiglu.swiglu_bwd": (_SWIGLU_POS_ROWS, "pos_to_token_topk"),
    "quant_swiglu.swiglu_backward_and_per_token_cast": (_SWIGLU_POS_ROWS, "pos_to_token_topk"),
    "quant_layout.per_channel_cast_fused": (("pos-at-T", "pos-below-minus-one"), "pos_to_token"),
    "quant_layout.per_block_cast_lossless": (_LOSSLESS_SF_ROWS, None),
}


def _value_checked(key: str, bad: Bad) -> bool:
    return bad.id in VALUE_CHECKED.get(key, ((), None))[0]


CASES = [pytest.param(key, bad, id=f"{key}-{bad.id}") for key, table in TABLES.items() for bad in table.bads()]
TILELANG_CASES = [p for p in CASES if not _value_checked(*p.values)]
VALUE_CASES = [p for p in CASES if _value_checked(*p.values)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device, which this machine lacks")
    return torch.device(name)


def _foreign(device: torch.device) -> torch.device:
    """Another device than the call's: the meta device stands in for one on a CPU-only machine."""
    return torch.device("cpu") if device.type == "cuda" else torch.device("meta")


def _run_bad(impl: str, key: str, bad: Bad, device: torch.device) -> None:
    table = TABLES[key]
    fn = _function(impl, key)
    args = _on(device, table.base())
    bad.change(args, _foreign(device))
    before = _snapshot(args)
    with pytest.raises((TypeError, ValueError)) as raised:
        _call(table, fn, args)
    _expect(bad, raised)
    _assert_untouched(args, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("key", list(TABLES))
def test_the_valid_call_of_each_table_runs(key, device):
    """Each table's base call is accepted, so its spoiled calls fail for the spoiled argument alone."""
    device = _device(device)
    table = TABLES[key]
    _call(table, _function("torch", key), _on(device, table.base()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("key, bad", CASES)
def test_eager_function_refuses_bad_input(key, bad, device):
    _run_bad("torch", key, bad, _device(device))


@pytest.mark.parametrize("key, bad", TILELANG_CASES)
def test_tilelang_wrapper_refuses_bad_input_before_the_device_check(key, bad):
    """On CPU tensors: the wrappers apply the eager checks first, so they give the eager error."""
    _run_bad("tilelang", key, bad, torch.device("cpu"))


@pytest.mark.parametrize("key", list(TABLES))
def test_tilelang_wrapper_refuses_cpu_tensors(key):
    table = TABLES[key]
    fn = _function("tilelang", key)
    args = table.base()
    before = _snapshot(args)
    with pytest.raises(ValueError, match=rf"^{re.escape(table.reference)} must be on a CUDA device"):
        _call(table, fn, args)
    _assert_untouched(args, before)


@pytest.mark.gpu
@pytest.mark.parametrize("key, bad", TILELANG_CASES)
def test_tilelang_wrapper_refuses_bad_input_on_cuda(key, bad):
    device = _device("cuda")
    if importlib.util.find_spec("tilelang") is None:
        pytest.skip("the TileLang kernels need the module 'tilelang', which is not installed")
    _run_bad("tilelang", key, bad, device)


@pytest.mark.gpu
@pytest.mark.parametrize("key", list(TABLES))
def test_tilelang_wrapper_runs_the_valid_call_on_cuda(key):
    device = _device("cuda")
    if importlib.util.find_spec("tilelang") is None:
        pytest.skip("the TileLang kernels need the module 'tilelang', which is not installed")
    table = TABLES[key]
    _call(table, _function("tilelang", key), _on(device, table.base()))


def test_value_checked_rows_exist():
    """Every row VALUE_CHECKED names is a row of its table (a renamed row would drop out silently)."""
    for key, (ids, _) in VALUE_CHECKED.items():
        assert set(ids) <= {bad.id for bad in TABLES[key].bads()}, key
    assert len(VALUE_CASES) == sum(len(ids) for ids, _ in VALUE_CHECKED.values())


def _cuda_tilelang(key: str) -> Callable[..., Any]:
    _device("cuda")
    if importlib.util.find_spec("tilelang") is None:
        pytest.skip("the TileLang kernels need the module 'tilelang', which is not installed")
    return _function("tilelang", key)


def _index_bound(key: str, args: dict[str, Any]) -> int | None:
    """The end of an index's range: T * K for the swiglu paths (None without weights), T for the fused cast."""
    if key == "quant_layout.per_channel_cast_fused":
        return args["x"].shape[0]
    return args["topk_weights"].numel() if args.get("topk_weights") is not None else None


def _as_the_contract_reads_it(key: str, args: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor | None]:
    """(a copy of args with the out-of-contract values replaced by what the TileLang contract treats them as,
    the rows that become padding rows).  An index below -1 or at or past its bound becomes -1; the lossless
    tables have one out block, so any refused x_sf makes all of it NaN, as an all-NaN x_sf does."""
    _, index = VALUE_CHECKED[key]
    repaired = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    if index is None:
        repaired["x_sf"] = torch.full_like(args["x_sf"], float("nan"))
        return repaired, None
    pos, bound = args[index], _index_bound(key, args)
    outside = (pos < -1) | ((pos >= bound) if bound is not None else torch.zeros_like(pos, dtype=torch.bool))
    repaired[index] = torch.where(outside, -1, pos)
    return repaired, outside


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _assert_bitwise(got: Any, want: Any, what: str) -> None:
    for i, (g, w) in enumerate(zip(_outputs(got), _outputs(want), strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: output {i}"
        assert torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), f"{what}: output {i}"


def _assert_out_of_contract_call(key: str, args: dict[str, Any]) -> None:
    """The TileLang wrapper runs args without error and gives the answer of the in-contract call the TileLang
    contract equates it with, bit for bit (clamped_count included); the rows made padding are zero."""
    table, fn = TABLES[key], _cuda_tilelang(key)
    repaired, padding = _as_the_contract_reads_it(key, args)
    got = _call(table, fn, args)
    torch.cuda.synchronize()  # an access out of bounds would surface here
    _assert_bitwise(got, _call(table, fn, repaired), key)
    if "clamped_count" in args and args["clamped_count"] is not None:
        assert torch.equal(args["clamped_count"], repaired["clamped_count"])
    if padding is not None:  # the first output holds the rows (y, the gradient, the codes)
        rows = _outputs(got)[0][padding].reshape(-1)
        assert padding.any() and rows.numel()
        magnitudes = rows.view(torch.uint8) & 0x7F if rows.element_size() == 1 else rows.abs()  # +-0 agree
        assert not magnitudes.any(), f"{key}: a padding row is not zero"
    else:
        for out in _outputs(got):
            nan = out.view(torch.uint8) == 0xFF if out.dtype == torch.uint8 else torch.isnan(out.float())
            assert nan.all(), f"{key}: the refused block is not NaN"


@pytest.mark.gpu
@pytest.mark.parametrize("key, bad", VALUE_CASES)
def test_tilelang_wrapper_runs_a_value_the_contract_leaves_out(key, bad):
    """A row only the eager implementation refuses (it reads values back): the TileLang wrapper raises nothing,
    stays in bounds, and gives the contract's answer (a padding row, or a NaN out block)."""
    device = _device("cuda")
    args = _on(device, TABLES[key].base())
    bad.change(args, _foreign(device))
    _assert_out_of_contract_call(key, args)


@pytest.mark.gpu
@pytest.mark.parametrize("key", [k for k, (_, index) in VALUE_CHECKED.items() if index is not None])
def test_tilelang_wrapper_bounds_a_far_index(key):
    """An index far past its range (an unchecked read there faults) is a padding row too."""
    args = _on(_device("cuda"), TABLES[key].base())
    index = VALUE_CHECKED[key][1]
    args[index] = args[index].clone()
    args[index][0] = 2**31 - 1
    _assert_out_of_contract_call(key, args)


def test_swiglu_writes_clamped_count_on_a_valid_call():
    """The buffer the refusal tests find untouched is one the function does write when the call is valid."""
    from kernels.torch.quant import swiglu_forward_and_per_token_cast

    args = _swiglu_base()
    args["x"][0, 0] = 100.0  # l > clamp in a live row (row 0 is slot 0)
    swiglu_forward_and_per_token_cast(**args)
    assert args["clamped_count"][0] > 1
