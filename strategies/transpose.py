"""Strategies for the transposes.

A transpose moves bits, so the values are arbitrary bit patterns: uniformly
random codes (NaNs with every payload come for free in fp8, often enough in
bf16), random codes salted with each format's special codes (±0, ±inf, quiet
and signalling NaNs of both signs, the smallest subnormal, the largest
finite), or each element's own position, which makes a misplaced element in a
failure report say where it came from.  The shapes aim at the tile edges:
0, 1, primes, one either side of multiples of 64, and now and then ~2048.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from strategies import element_bits, keyed_bits, rarely, seeds, tensor_from_bits, unsigned_view
from strategies.classes import tagging
from tkverify.case import Case

# The dtypes of the three element widths the kernels support.
DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
BATCHES = (1, 2, 3, 7)

# Each kind of size leads with a small one, so that a failure found at a tail
# or a large size can shrink within its kind (hypothesis shrinks a sampled
# value towards the first one far more readily than it switches kinds).
TAIL_DIMS = (1, 63, 64, 65, 127, 128, 129)
PRIME_DIMS = (2, 3, 5, 13, 31, 67, 131, 257)
LARGE_DIMS = (1, 1024, 1031, 2047, 2048, 2049)
# Sizes that are multiples of 16 (and so of 16 bytes' worth of elements of every width), the vectorised
# kernels' condition on M and N: below, at and past their tiles (64 to 256 elements a side).
VECTOR_DIMS = (16, 48, 64, 128, 144, 256, 272)
# Batches are thinned out where B * M * N would pass this many elements.
MAX_ELEMENTS = 1 << 23

# Each format's special codes with the sign bit clear; both signs are used.
_POSITIVE_SPECIAL_CODES = {
    #                 zero, min subnormal, max finite, +inf, quiet NaN, signalling NaN, all-ones payload
    torch.float32: (0x0000_0000, 0x0000_0001, 0x7F7F_FFFF, 0x7F80_0000, 0x7FC0_0000, 0x7F80_0001, 0x7FFF_FFFF),
    torch.bfloat16: (0x0000, 0x0001, 0x7F7F, 0x7F80, 0x7FC0, 0x7F81, 0x7FFF),
    # e4m3fn has no infinities and one NaN code a sign: S.1111.111
    torch.float8_e4m3fn: (0x00, 0x01, 0x7E, 0x7F),
}


def special_codes(dtype: torch.dtype) -> np.ndarray:
    """The special codes of `dtype` with both signs, as unsigned integers of its width."""
    positive = np.array(_POSITIVE_SPECIAL_CODES[dtype], dtype=unsigned_view(dtype))
    sign = positive.dtype.type(1 << (element_bits(dtype) - 1))
    return np.concatenate([positive, positive | sign])


def dims() -> SearchStrategy[int]:
    """One of M, N: small, a tile tail, a prime, mid-sized, or (one in 12) about 2048."""
    common = st.one_of(st.integers(0, 8), st.sampled_from(TAIL_DIMS), st.sampled_from(PRIME_DIMS), st.integers(0, 300))
    return rarely(common, st.sampled_from(LARGE_DIMS), one_in=12)


# -- bit patterns: seed, shape, dtype -> unsigned array --------------------------
# Every element's bits depend on its index, never on the shape around it (see
# `keyed_bits`), so a failing tensor keeps failing as hypothesis shrinks M and N.


def _uniform_bits(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> np.ndarray:
    return keyed_bits(seed, shape, dtype)


def _salted_with_specials(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> np.ndarray:
    # Half the elements (by a second hash) become a special code (by a third).
    bits = keyed_bits(seed, shape, dtype)
    codes = special_codes(dtype)
    salted = keyed_bits(seed, shape, torch.uint8, stream=1) < 128
    which = keyed_bits(seed, shape, torch.uint8, stream=2) % len(codes)
    return np.where(salted, codes[which], bits)


def _own_position(seed: int, shape: tuple[int, ...], dtype: torch.dtype) -> np.ndarray:
    # Each element's index packed into its bits (batch, row, column from the
    # high end down), wrapped to the element width: a misplaced element in a
    # failure report says where it came from.
    width = element_bits(dtype)
    field = width // len(shape)
    packed = np.zeros((), dtype=np.uint64)
    for axis, size in enumerate(shape):
        coordinate = np.arange(size, dtype=np.uint64) & np.uint64((1 << field) - 1)
        packed = packed[..., None] + (coordinate << np.uint64(field * (len(shape) - 1 - axis)))
    return packed.astype(unsigned_view(dtype))


BIT_PATTERNS = {
    "uniform_bits": _uniform_bits,
    "salted_with_specials": _salted_with_specials,
    "own_position": _own_position,
}


def build_bits_tensor(seed: int, shape: tuple[int, ...], dtype: torch.dtype, pattern: str) -> torch.Tensor:
    """The tensor that a drawn recipe describes (deterministic in its arguments)."""
    return tensor_from_bits(BIT_PATTERNS[pattern](seed, shape, dtype), dtype)


@st.composite
def _transposable_x(draw, batched: bool) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    # A batch's single row (M = 1) one time in four: with B = 1 it is the whole tensor's single row, which
    # the sizes of `dims` alone reach too seldom for the ci profile's examples.
    rows = draw(rarely(dims(), st.just(1), one_in=4) if batched else dims())
    columns = draw(dims())
    # One time in two both sizes are multiples of 16 (`VECTOR_DIMS`), which `dims` seldom draws together:
    # each width's vectorised kernel runs, with whole and partial tiles.
    if draw(rarely(st.just(False), st.just(True), one_in=2)):
        rows, columns = draw(st.sampled_from(VECTOR_DIMS)), draw(st.sampled_from(VECTOR_DIMS))
    shape: tuple[int, ...] = (rows, columns)
    if batched:
        batch = draw(st.sampled_from([b for b in BATCHES if b * rows * columns <= MAX_ELEMENTS]))
        shape = (batch, rows, columns)
    pattern = draw(st.sampled_from(tuple(BIT_PATTERNS)))
    return build_bits_tensor(draw(seeds()), shape, dtype, pattern)


def transpose_cases() -> SearchStrategy[Case]:
    """Cases of ``transpose(x (M, N))``."""
    return _transposable_x(batched=False).map(lambda x: Case(params={}, inputs={"x": x}))


def batched_transpose_cases() -> SearchStrategy[Case]:
    """Cases of ``batched_transpose(x (B, M, N))``."""
    return _transposable_x(batched=True).map(lambda x: Case(params={}, inputs={"x": x}))


# The classes each strategy reaches under the ci profile (tests/test_classes.py), as tkverify/specs/transpose.py lists.
transpose_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x',
    'neg_zero:x', 'non_pow2', 'pos_inf:x', 'signed_zero_tie:x', 'subnormal:x',
))(transpose_cases)
batched_transpose_cases = tagging("x", (
    'dtype_max:x', 'empty', 'nan:x', 'nan_payload:x', 'neg_inf:x',
    'neg_zero:x', 'non_pow2', 'pos_inf:x', 'signed_zero_tie:x', 'single_row',
    'subnormal:x',
))(batched_transpose_cases)
