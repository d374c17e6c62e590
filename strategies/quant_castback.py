"""Cases of the quantisation round trips (docs/contract/quant_castback.md), drawn by the strategies of
the ops they compose: nothing here invents values of its own.

* per_token_cast_and_cast_back_cases: quant.per_token_cast's cases, keeping what the round trip takes
  (fmt, num_per_channels, round_sf, clamp_min; a ue8m0 sf is round_sf's power of two, so use_ue8m0
  becomes round_sf) and dropping the sf storage flags, which change no value of the round trip.  The
  same x, so the same edge classes: saturation edges, zero rows, NaN, subnormals, empty batches.
* unpack_cases: quant.cast_back's e2m1 data (all sixteen codes, salted with zeros, -0, 0.5 and 6),
  reshaped to 1 to 3 dimensions (the last holding a row's bytes) or cut to no rows, as int8 or uint8, with its
  out_dtype; its sf is dropped (unpack has a unit sf).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

import strategies.quant as quant
from strategies.classes import tagging
from tkverify.case import Case


@st.composite
def per_token_cast_and_cast_back_cases(draw) -> Case:
    case = draw(quant.per_token_cast_cases())
    p = case.params
    params = {"fmt": p["fmt"], "num_per_channels": p["num_per_channels"],
              "round_sf": bool(p["round_sf"] or p["use_ue8m0"]), "clamp_min": p["clamp_min"]}
    return Case(params=params, inputs={"x": case.inputs["x"]})


@st.composite
def unpack_cases(draw) -> Case:
    case = draw(quant.cast_back_cases().filter(lambda c: c.params["fmt"] == "e2m1"))
    data = case.inputs["data"]  # int8 (T, H/2)
    rows, width = data.shape
    shape = draw(st.sampled_from(("1d", "2d", "3d", "empty")))
    if shape == "empty":  # no rows: an empty out of (0, 2K)
        data = data[:0]
    elif shape == "1d":
        data = data.reshape(rows * width)
        if data.numel() == 0:  # a 1-D tensor keeps one byte at least (K >= 1)
            data = data.new_zeros(1)
    elif shape == "3d" and rows % 2 == 0:
        data = data.reshape(2, rows // 2, width)
    if draw(st.booleans()):
        data = data.view(torch.uint8)
    return Case(params={"out_dtype": case.params["out_dtype"]}, inputs={"x": data})


per_token_cast_and_cast_back_cases = tagging(
    "x", quant.per_token_cast_cases.classes,
    quant.computed_sf_saturation(lambda p, x: (1, p["num_per_channels"])),
)(per_token_cast_and_cast_back_cases)
def code_classes(case: Case) -> set[str]:
    """The value classes of packed e2m1 codes: -0 (nibble 0x8) and the largest magnitude, 6 (0x7, 0xF)."""
    nibbles = set(case.inputs["x"].view(torch.uint8).flatten().tolist())
    nibbles = {b & 0xF for b in nibbles} | {b >> 4 for b in nibbles}
    return ({"neg_zero:x"} if 0x8 in nibbles else set()) | ({"dtype_max:x"} if nibbles & {0x7, 0xF} else set())


unpack_cases = tagging("x", (
    'dtype_max:x', 'empty', 'neg_zero:x', 'non_pow2', 'single_row',
), code_classes)(unpack_cases)
