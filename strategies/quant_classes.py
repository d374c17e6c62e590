"""The casts' own input classes beside the ones every family has (`strategies.classes`): the saturation edges,
computed from a case's x and the sf of each block (the oracle's, or the one given), for the strategies'
``tagging`` (`strategies.quant`, `strategies.quant_block`, `strategies.quant_castback`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

import references.quant as ref
from tkverify.case import Case

# The rounding midpoint past each format's largest value: |x / sf| from max_q up to it rounds to max_q.
SATURATION_MIDPOINT = {"e4m3": 464.0, "e2m1": 7.0, "e5m6": 65280.0}

# |x / sf| within this relative distance of the rounding midpoint beyond max_q is "at" the midpoint: a
# precomputed sf of amax / 464 stored in fp32 puts the quotient within 2^-24 of it.
MIDPOINT_NEAR = 2.0**-18


def saturation_classes(fmt: str, x: torch.Tensor, sf: np.ndarray, block: tuple[int, int]) -> set[str]:
    """The saturation-edge classes of a cast's x given each block's sf (float64, (rows, cols)):
    ``saturation_edge:x``, a finite |x / sf| from the format's largest value max_q up to (not including)
    the rounding midpoint beyond it, all of which round to max_q; ``saturation_midpoint:x``, |x / sf| at
    that midpoint (within `MIDPOINT_NEAR`), where round-to-nearest without saturation would leave the
    format."""
    if x.numel() == 0 or sf.size == 0:
        return set()
    x64 = ref.as_float64(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.abs(ref.quotients(x64, sf, block))
    q = q[np.isfinite(q)]
    top, past = ref.MAX_Q[fmt], SATURATION_MIDPOINT[fmt]
    found = set()
    if bool(((q >= top) & (q < past)).any()):
        found.add("saturation_edge:x")
    if bool((np.abs(q / past - 1) <= MIDPOINT_NEAR).any()):
        found.add("saturation_midpoint:x")
    return found


def computed_sf_saturation(block_of: Callable[[dict, torch.Tensor], tuple[int, int]]) -> Callable[[Case], set[str]]:
    """The saturation classes of a cast that computes its sf (the oracle's stored sf of each block);
    ``block_of(params, x)`` gives the case's block."""
    def classify(case: Case) -> set[str]:
        p, x = case.params, case.inputs["x"]
        if x.numel() == 0:
            return set()
        block = block_of(p, x)
        exact = ref.exact_scales(ref.as_float64(x), p["fmt"], block, p["round_sf"], p["clamp_min"])
        return saturation_classes(p["fmt"], x, ref.stored_scales(exact), block)
    return classify


def given_sf_saturation(block_of: Callable[[dict], tuple[int, int]]) -> Callable[[Case], set[str]]:
    """The saturation classes of a cast with a precomputed sf: x against the sf it is given;
    ``block_of(params)`` gives the case's block."""
    def classify(case: Case) -> set[str]:
        p, x = case.params, case.inputs["x"]
        if x.numel() == 0:
            return set()
        block = block_of(p)
        sf = ref.sf_logical_values(case.inputs["sf"], x.shape[-1] // block[1])
        return saturation_classes(p["fmt"], x, sf, block)
    return classify
