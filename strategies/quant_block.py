"""Strategies of per_block_cast's precomputed-sf variant (quant.per_block_cast_with_precomputed_sf).

Its x is drawn as per_block_cast's (`strategies.quant.per_block_cast_cases`: the block kinds, tile tails,
bm - 1, bm and bm + 1 rows, empty and single-row tensors); its sf is a `strategies.quant.given_sf` for that
x in bm x bk blocks: the oracle's own sf (in the storage the drawn sf flags ask for: fp32, round_sf fp32,
ue8m0 bytes or packed ue8m0), some blocks' sf moved so that amax / sf lands on the saturation edges, or
special values (0, inf, NaN, the smallest subnormal, 2^-127, 2^127; and a block row of zeros).  The sf
only variant (quant.per_block_cast_with_sf_only) takes per_block_cast's cases unchanged.
"""

from __future__ import annotations

from hypothesis import strategies as st

from strategies.classes import tagging
from strategies.quant import given_sf, given_sf_saturation, per_block_cast_cases
from tkverify.case import Case


@st.composite
def block_precomputed_sf_cases(draw) -> Case:
    """Cases of per_block_cast_with_precomputed_sf: per_block_cast's x, and a `given_sf` for its blocks."""
    case = draw(per_block_cast_cases())
    params, x = case.params, case.inputs["x"]
    sf = draw(given_sf(params, x, tuple(params["block"])))
    return Case(params={"fmt": params["fmt"], "block": list(params["block"])}, inputs={"x": x, "sf": sf})


# The classes the strategy reaches under the ci profile (tests/test_classes.py), as tkverify/specs/quant.py lists.
block_precomputed_sf_cases = tagging("x", (
    'dtype_max:x', 'nan:sf', 'nan:x', 'nan_payload:x', 'neg_zero:x', 'non_pow2', 'pos_inf:sf', 'pos_inf:x',
    'saturation_edge:x', 'saturation_midpoint:x', 'signed_zero_tie:x', 'single_row', 'subnormal:sf',
    'subnormal:x', 'zero_row:sf',
), given_sf_saturation(lambda p: tuple(p["block"])))(block_precomputed_sf_cases)
