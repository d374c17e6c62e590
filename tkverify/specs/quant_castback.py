"""The quantisation round trips that compose quant.per_token_cast and quant.cast_back
(docs/contract/quant_castback.md): each is judged through the composed ops' own analysis, imported
from `tkverify.specs.quant_judge` / `tkverify.specs.quant_bounds`, never restated.

- quant.per_token_cast_and_cast_back: out = RN_dtype(q * sf) for the per-token cast (q, sf) of x.
  An implementation's sf is hidden inside the op, so out is judged within the bracket of every result
  the cast's two judgements allow: an sf inside quant.per_token_cast's sf bracket (exact with
  round_sf; 1.5 ULP either side of a / max_q when plain) and, for each such sf, a code inside its data
  bracket (the correctly rounded code, or its neighbour within the 2^-22 window of a plain sf), times
  that sf, rounded once to x's dtype.  With round_sf the bracket is one value: bitwise.
- quant.unpack_from_e2m1fn_x2: cast_back of e2m1 codes with a unit sf: bitwise, as cast_back.

tile-kernels' ``per_token_cast_back`` is quant.cast_back itself with a per-token block: it is an
implementation of that op (``tile_kernels.per_token_cast_back``), registered by the adapter
``tkverify.adapters.tile_kernels_quant_castback``, not an op here.

Input classes (`strategies.quant_castback`):

* quant.per_token_cast_and_cast_back: per_token_cast's, as it draws the same x: ``dtype_max:x``,
  ``empty``, ``nan:x``, ``nan_payload:x``, ``neg_zero:x``, ``non_pow2``, ``saturation_edge:x``,
  ``signed_zero_tie:x``, ``single_row``, ``subnormal:x``, ``zero_row:x``.
* quant.unpack_from_e2m1fn_x2: ``dtype_max:x`` (a code of magnitude 6), ``empty``, ``neg_zero:x`` (the
  code -0), ``non_pow2``, ``single_row``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

import references.quant as quant_ref
import references.quant_castback as ref
import strategies.quant_castback as strategies
from tkverify import benchshapes, formats
from tkverify.policies import Bracket, bitwise, within
from tkverify.registry import BenchShape, OpSpec, register, tilelang_impl, torch_impl
from tkverify.specs.quant import X_LAYOUTS, Decided
from tkverify.specs.quant_bench import HIDDEN, TOKENS
from tkverify.specs.quant_bounds import CAST_WINDOW, element_bracket, quotient_slack, sf_bracket
from tkverify.specs.quant_judge import Cast, Judgement, malformed

# -- the round trip's bracket -------------------------------------------------------------------


def _codes_between(x64: np.ndarray, sf: np.ndarray, block: tuple[int, int], fmt: str,
                   plain: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lowest and highest code values the cast's data judgement allows for x given the block sf
    `sf` (per block); `plain` marks the elements whose sf ranges over more than one value, which keep
    the full 2^-22 window even where this end of the range is a power of two."""
    q = quant_ref.quotients(x64, sf, block)
    sf_elements = quant_ref.expand_to_elements(sf, x64.shape, block)
    with np.errstate(invalid="ignore", over="ignore"):
        slack = np.where(plain, CAST_WINDOW * np.abs(q), quotient_slack(q, sf_elements, None))
    bracket = element_bracket(q, slack, fmt, np.zeros(x64.shape, dtype=formats.get(fmt).code_dtype))
    return bracket.low, bracket.high


def round_trip_bracket(x64: np.ndarray, fmt: str, num_per_channels: int, round_sf: bool,
                       clamp_min: float | None, out_dtype: torch.dtype, exact: np.ndarray) -> Bracket:
    """Every out = RN_out(c * s) with s in the cast's sf bracket and c in its data bracket given s.

    For x >= 0 the allowed codes fall as s grows (x / s falls), for x < 0 they rise; so over
    s in [s_lo, s_hi] every allowed code lies between the extreme codes at the two ends, and every
    product c * s between the four products of those extremes with s_lo and s_hi.  RN is monotone, so
    rounding the least and the greatest product bounds every rounded result.  A block whose sf is NaN
    (a NaN or an infinity in it) must give NaN.
    """
    block = (1, num_per_channels)
    cast = Cast(x64, fmt, block, round_sf=round_sf, clamp_min=clamp_min)
    sf = sf_bracket(*cast.amax_range(), fmt, round_sf)
    plain = quant_ref.expand_to_elements(np.asarray(sf.low != sf.high, dtype=np.float64), x64.shape, block) > 0
    ends = [_codes_between(x64, s, block, fmt, plain) for s in (sf.low, sf.high)]
    code_low = np.minimum(ends[0][0], ends[1][0])
    code_high = np.maximum(ends[0][1], ends[1][1])
    s_low, s_high = (quant_ref.expand_to_elements(s, x64.shape, block) for s in (sf.low, sf.high))
    with np.errstate(invalid="ignore", over="ignore"):
        products = np.stack([code_low * s_low, code_low * s_high, code_high * s_low, code_high * s_high])
    out = formats.of_dtype(out_dtype)
    low, high = (out.decode(out.encode(v)) for v in (products.min(axis=0), products.max(axis=0)))
    nan = np.isnan(quant_ref.expand_to_elements(sf.exact, x64.shape, block))
    return Bracket(exact, np.where(nan, np.nan, low), np.where(nan, np.nan, high))


def given_round_trip(case, actual: dict[str, Any]) -> dict[str, Judgement]:
    p, x = case.params, case.inputs["x"]
    fmt, npc = p.get("fmt", "e4m3"), p.get("num_per_channels", 128)
    round_sf, clamp_min = p.get("round_sf", False), p.get("clamp_min")
    out, name = actual["out"], formats.of_dtype(x.dtype).name
    if not isinstance(out, torch.Tensor) or out.dtype != x.dtype:
        return {"out": malformed(f"out must be a {x.dtype} tensor (x's dtype), got "
                                 f"{getattr(out, 'dtype', type(out).__name__)}", name)}
    if tuple(out.shape) != tuple(x.shape) or not out.is_contiguous():
        return {"out": malformed(f"out must be contiguous of x's shape {tuple(x.shape)}, got shape "
                                 f"{tuple(out.shape)}, strides {out.stride()}", name)}
    exact = quant_ref.as_float64(ref.per_token_cast_and_cast_back(x, fmt, npc, round_sf=round_sf,
                                                                  clamp_min=clamp_min))
    bracket = round_trip_bracket(quant_ref.as_float64(x), fmt, npc, round_sf, clamp_min, x.dtype, exact)
    return {"out": Judgement(within(name), out, bracket)}


# -- bench shapes -------------------------------------------------------------------------------


def _round_trip_shape(device):
    return ({"x": benchshapes.randn((TOKENS, HIDDEN), torch.bfloat16, device)},
            {"fmt": "e4m3", "num_per_channels": 128})


def _unpack_shape(device):
    g = benchshapes.generator(device, 5)
    codes = torch.randint(-128, 128, (TOKENS, HIDDEN // 2), dtype=torch.int8, device=device, generator=g)
    return {"x": codes}, {"out_dtype": torch.float32}


BENCH = {
    # The fused op's own traffic: x read and out written once (a composition of two kernels moves more).
    "quant.per_token_cast_and_cast_back": (
        BenchShape(f"T{TOKENS} H{HIDDEN} bf16 e4m3/128", _round_trip_shape,
                   lambda i, p: 2 * benchshapes.nbytes(i["x"])),
    ),
    "quant.unpack_from_e2m1fn_x2": (
        BenchShape(f"T{TOKENS} H{HIDDEN} e2m1 -> fp32", _unpack_shape,
                   lambda i, p: benchshapes.nbytes(i["x"]) + i["x"].numel() * 2 * 4),
    ),
}

# -- the registry entries -------------------------------------------------------------------------

register(OpSpec(
    name="quant.per_token_cast_and_cast_back",
    bench=BENCH["quant.per_token_cast_and_cast_back"],
    oracle=ref.per_token_cast_and_cast_back,
    strategy=strategies.per_token_cast_and_cast_back_cases,
    outputs={"out": Decided(
        "within RN_dtype(c * s) over s in quant.per_token_cast's sf bracket and c in its data bracket given s "
        "(round_sf: bitwise); NaN blocks NaN; dtype x's, shape and contiguity checked")},
    impls={
        "torch": torch_impl("kernels.torch.quant_castback:per_token_cast_and_cast_back", layouts=X_LAYOUTS),
        "tilelang": dataclasses.replace(
            tilelang_impl("kernels.quant.quant_castback:per_token_cast_and_cast_back"), layouts=dict(X_LAYOUTS)),
    },
    given=given_round_trip,
    doc="The fake-quantised x: cast_back(per_token_cast(x)) in x's dtype.",
))

register(OpSpec(
    name="quant.unpack_from_e2m1fn_x2",
    bench=BENCH["quant.unpack_from_e2m1fn_x2"],
    oracle=ref.unpack_from_e2m1fn_x2,
    strategy=strategies.unpack_cases,
    outputs={"out": bitwise()},
    impls={
        "torch": torch_impl("kernels.torch.quant_castback:unpack_from_e2m1fn_x2"),
        "tilelang": tilelang_impl("kernels.quant.quant_castback:unpack_from_e2m1fn_x2"),
    },
    doc="Packed e2m1 codes (..., K) decoded to (..., 2K): cast_back with a unit sf.",
))
