"""The quantisation family: casts to e4m3 / e2m1 / e5m6 with block scale factors,
cast_back, and SwiGLU fused with a per-token cast.  What each op computes:
docs/contract/quant.md; the number formats and scale factors: docs/contract/README.md.

This module registers the ops.  Every output is judged by a `Decided` policy, which the
op's ``given`` hook (`tkverify.specs.quant_judge`) fills per case from the error analysis
of `tkverify.specs.quant_bounds`; the bench shapes are in `tkverify.specs.quant_bench`.
The public swiglu function updates clamped_count in place; the spec wraps it
(`ReturningClampedCount`) so that the counter after the call is judged as a third output
(empty when the call had none).

Input classes (the differential suite tags each judged case ``class: <name>`` per class it is in,
computed from its tensors by `strategies.classes.case_classes`; ``<class>:<input>`` names the input; the
report counts them and tests/test_classes.py fails where one has no example under the ci profile).
Besides the value classes every family has (``signed_zero_tie``: -0.0 beside +0.0 in a row, whose codes
keep their signs; ``nan_payload``: a NaN other than the canonical quiet one, whose bits the casts must not
read as a number), the casts' x has two saturation-edge classes, computed from x and each block's sf
(the oracle's, or the one given: `strategies.quant_classes.saturation_classes`): ``saturation_edge:x`` is a
finite |x / sf| from the format's largest value max_q up to the rounding midpoint beyond it (448..464 in
e4m3, 6..7 in e2m1, 65024..65280 in e5m6; all of it rounds to max_q), ``saturation_midpoint:x`` |x / sf|
at that midpoint, where rounding without saturation would leave the format:

* quant.cast_back: ``dtype_max:data``, ``empty``, ``nan:data``, ``nan:sf``, ``nan_payload:data``,
  ``neg_zero:data``, ``non_pow2``, ``pos_inf:sf``, ``signed_zero_tie:data``, ``single_row``,
  ``subnormal:data``, ``subnormal:sf``.
* quant.per_block_cast, quant.per_block_cast_with_sf_only: ``dtype_max:x``, ``empty``, ``nan:x``,
  ``nan_payload:x``, ``neg_inf:x``, ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``saturation_edge:x``,
  ``signed_zero_tie:x``, ``single_row``, ``subnormal:x``.
* quant.per_block_cast_with_precomputed_sf: ``dtype_max:x``, ``nan:sf``, ``nan:x``, ``nan_payload:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:sf``, ``pos_inf:x``, ``saturation_edge:x``,
  ``saturation_midpoint:x``, ``signed_zero_tie:x``, ``single_row``, ``subnormal:sf``, ``subnormal:x``,
  ``zero_row:sf``.
* quant.per_channel_cast: ``dtype_max:x``, ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``saturation_edge:x``, ``signed_zero_tie:x``, ``single_row``,
  ``subnormal:x``.
* quant.per_token_cast, quant.per_token_cast_with_sf_only: ``dtype_max:x``, ``empty``, ``nan:x``,
  ``nan_payload:x``, ``neg_zero:x``, ``non_pow2``, ``saturation_edge:x``, ``signed_zero_tie:x``,
  ``single_row``, ``subnormal:x``, ``zero_row:x``.
* quant.per_token_cast_with_precomputed_sf: ``dtype_max:x``, ``nan:sf``, ``nan:x``, ``nan_payload:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:sf``, ``pos_inf:x``, ``saturation_edge:x``,
  ``saturation_midpoint:x``, ``signed_zero_tie:x``, ``single_row``, ``subnormal:sf``, ``subnormal:x``,
  ``zero_row:sf``.
* quant.swiglu_forward_and_per_token_cast: ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_inf:x``,
  ``neg_zero:x``, ``non_pow2``, ``pos_inf:x``, ``signed_zero_tie:x``, ``single_row``, ``subnormal:x``,
  ``zero_row:topk_weights``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import torch

import references.quant as ref
import strategies.quant
import strategies.quant_block
import strategies.quant_castback
from strategies.layouts import LAYOUTS
from tkverify.registry import OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.quant_bench import BENCH
from tkverify.specs.quant_bounds import SF_PLAIN_ULP
from tkverify.specs.quant_judge import (
    Decided,
    given_cast,
    given_cast_back,
    given_precomputed,
    given_precomputed_of,
    given_sf_only,
    given_sf_only_of,
    given_swiglu,
    two_d_block,
)


# -- the swiglu counter as an output ------------------------------------------------------------------


class ReturningClampedCount:
    """Calls a swiglu implementation (a callable, or an import path resolved on first use) and
    returns (data, sf, clamped_count after the call), so that the in-place
    counter is judged like an output.  The counter is copied first: on the CPU
    the case's own tensor would otherwise be updated before the oracle reads it.
    """

    def __init__(self, target: str | Callable[..., Any]):
        self.target = target
        self._fn: Callable[..., Any] | None = target if callable(target) else None

    def __repr__(self) -> str:
        return f"ReturningClampedCount({self.target!r})"

    def __call__(self, **kwargs: Any):
        if self._fn is None:
            module, _, attr = self.target.partition(":")
            self._fn = getattr(importlib.import_module(module), attr)
        count = kwargs.get("clamped_count")
        if count is not None:
            kwargs["clamped_count"] = count.clone()
        data, sf = self._fn(**kwargs)
        after = kwargs["clamped_count"] if count is not None else torch.empty(0, dtype=torch.int64,
                                                                              device=kwargs["x"].device)
        return data, sf, after


# -- the registry entries -------------------------------------------------------------------------------

_DATA_POLICY = Decided(
    "the code of x / sf_impl (float64) rounded RNE_sat; a neighbour only where fp32 rounding of the quotient "
    "(relative 2^-22) can cross a rounding boundary, never when sf is a power of two; "
    "NaN blocks NaN (e2m1: unconstrained)"
)
_SF_POLICY = Decided(
    f"round_sf / ue8m0 / packed ue8m0: exact; plain fp32: within {SF_PLAIN_ULP:g} ULP of a / max_q; "
    "NaN for non-finite blocks; dtype, shape and layout (TMA column-major: stride(0) == 1, rows padded) checked"
)


# The casts' eager implementations take x at any row stride (and a slice of a batch of tokens); so do
# the per-token casts' and swiglu's TileLang wrappers (the token_cast kernel takes the row stride as an
# argument), drawn in the same layouts.  The block_cast kernel (per_block_cast, its sf-only and
# precomputed-sf variants, per_channel_cast) reads dense rows (kernels.torch._checks.check_dense_rows), as
# tile-kernels' per-block and per-channel casts do (both releases assert a contiguous x): drawn contiguous.
X_LAYOUTS = {"x": LAYOUTS}


def _impls(name: str, torch_target: Any = None, tilelang_target: Any = None,
           torch_layouts: dict | None = None, tilelang_layouts: dict | None = None) -> dict:
    tilelang = tilelang_impl(tilelang_target or f"kernels.quant:{name}")
    return {
        "torch": torch_impl(torch_target or f"kernels.torch.quant:{name}", layouts=torch_layouts),
        "tilelang": dataclasses.replace(tilelang, layouts=dict(tilelang_layouts or {})),
    }


register(OpSpec(
    name="quant.per_token_cast",
    bench=BENCH.get("quant.per_token_cast", ()),
    oracle=ref.per_token_cast,
    strategy=strategies.quant.per_token_cast_probed_cases,
    outputs={"data": _DATA_POLICY, "sf": _SF_POLICY},
    impls=_impls("per_token_cast", torch_layouts=X_LAYOUTS, tilelang_layouts=X_LAYOUTS),
    given=given_cast(lambda p: (1, p.get("num_per_channels", 128))),
    doc="x (T, H) in 1 x num_per_channels blocks -> (data, sf).",
))

register(OpSpec(
    name="quant.per_token_cast_with_sf_only",
    bench=BENCH.get("quant.per_token_cast_with_sf_only", ()),
    oracle=ref.per_token_cast_with_sf_only,
    strategy=strategies.quant.per_token_cast_probed_cases,
    outputs={"sf": _SF_POLICY},
    impls=_impls("per_token_cast_with_sf_only", torch_layouts=X_LAYOUTS, tilelang_layouts=X_LAYOUTS),
    given=given_sf_only,
    doc="The sf of per_token_cast alone.",
))

register(OpSpec(
    name="quant.per_token_cast_with_precomputed_sf",
    bench=BENCH.get("quant.per_token_cast_with_precomputed_sf", ()),
    oracle=ref.per_token_cast_with_precomputed_sf,
    strategy=strategies.quant.precomputed_sf_cases,
    outputs={"data": _DATA_POLICY},
    impls=_impls("per_token_cast_with_precomputed_sf", torch_layouts=X_LAYOUTS, tilelang_layouts=X_LAYOUTS),
    given=given_precomputed,
    doc="The data of x quantised with a given sf (fp32, ue8m0 or packed ue8m0): q = RNE_sat(x / sf).",
))

register(OpSpec(
    name="quant.per_block_cast",
    bench=BENCH.get("quant.per_block_cast", ()),
    oracle=ref.per_block_cast,
    strategy=strategies.quant.per_block_cast_cases,
    outputs={"data": _DATA_POLICY, "sf": _SF_POLICY},
    impls=_impls("per_block_cast", torch_layouts=X_LAYOUTS),
    given=given_cast(lambda p: tuple(p.get("block", (128, 128)))),
    doc="x (T, H) in bm x bk blocks -> (data, sf (ceil(T/bm), H/bk)).",
))

register(OpSpec(
    name="quant.per_block_cast_with_sf_only",
    bench=BENCH.get("quant.per_block_cast_with_sf_only", ()),
    oracle=ref.per_block_cast_with_sf_only,
    strategy=strategies.quant.per_block_cast_cases,
    outputs={"sf": _SF_POLICY},
    impls=_impls("per_block_cast_with_sf_only", torch_layouts=X_LAYOUTS),
    given=given_sf_only_of(two_d_block),
    doc="The sf of per_block_cast alone.",
))

register(OpSpec(
    name="quant.per_block_cast_with_precomputed_sf",
    bench=BENCH.get("quant.per_block_cast_with_precomputed_sf", ()),
    oracle=ref.per_block_cast_with_precomputed_sf,
    strategy=strategies.quant_block.block_precomputed_sf_cases,
    outputs={"data": _DATA_POLICY},
    impls=_impls("per_block_cast_with_precomputed_sf", torch_layouts=X_LAYOUTS),
    given=given_precomputed_of(two_d_block),
    doc="The data of x quantised in bm x bk blocks with a given sf (fp32, ue8m0 or packed ue8m0).",
))

register(OpSpec(
    name="quant.per_channel_cast",
    bench=BENCH.get("quant.per_channel_cast", ()),
    oracle=ref.per_channel_cast,
    strategy=strategies.quant.per_channel_cast_cases,
    outputs={"data": _DATA_POLICY, "sf": _SF_POLICY},
    impls=_impls("per_channel_cast", torch_layouts=X_LAYOUTS),
    given=given_cast(lambda p: (p.get("num_per_tokens", 128), 1)),
    doc="x (T, H) in num_per_tokens x 1 blocks -> (data, sf (ceil(T/npt), H)).",
))

register(OpSpec(
    name="quant.cast_back",
    bench=BENCH.get("quant.cast_back", ()),
    oracle=ref.cast_back,
    strategy=strategies.quant_castback.cast_back_cases,
    outputs={"out": Decided("bitwise against q * sf (exact) rounded once to out_dtype; dtype checked")},
    impls=_impls("cast_back"),
    given=given_cast_back,
    doc="Dequantise: q * sf correctly rounded to bf16 or fp32.",
))

register(OpSpec(
    name="quant.swiglu_forward_and_per_token_cast",
    bench=BENCH.get("quant.swiglu_forward_and_per_token_cast", ()),
    oracle=ref.swiglu_forward_and_per_token_cast,
    strategy=strategies.quant.swiglu_cases,
    outputs={
        "data": Decided(
            "given sf_impl, the code of some value within the fp32 error bound of y (relative 2^-18 "
            "plus 2^-125 (1+|l|)(1+|r|)(1+|w|)) divided by sf_impl; padding rows +0"
        ),
        "sf": Decided(
            "the sf of an amax within y's error bound (plain: 1.5 ULP either side); padding rows the sf of a "
            "zero block; layout checked"
        ),
        "clamped_count": Decided("bitwise: the counter plus the exact counts, int64"),
    },
    impls=_impls(
        "swiglu_forward_and_per_token_cast",
        ReturningClampedCount("kernels.torch.quant:swiglu_forward_and_per_token_cast"),
        ReturningClampedCount("kernels.quant:swiglu_forward_and_per_token_cast"),
        torch_layouts=X_LAYOUTS,
        tilelang_layouts=X_LAYOUTS,
    ),
    given=given_swiglu,
    doc="y = l * sigmoid(l) * r * w (clamped), per-token cast of y; clamped_count accumulates.",
))
