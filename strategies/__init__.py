"""Hypothesis strategies that draw `tkverify.case.Case` objects, one module per family.

The strategies draw a handful of choices with hypothesis - sizes, a seed, and
which edge-case features to plant where - and build the tensors from them with
NumPy.  A tensor of a million elements then costs a few draws instead of a
million, and shrinking works on the choices that matter: fewer features,
smaller sizes, seed 0.

Static parameters (those that select a compiled kernel) come from small finite
sets; dynamic sizes range widely, with tile tails and the occasional large
size drawn on purpose.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

# Unsigned NumPy views of each element width, and the NumPy dtypes that carry
# them into torch (torch fully supports int16/int32, not uint16/uint32).
_NUMPY_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_TORCH_CARRIER = {1: np.uint8, 2: np.int16, 4: np.int32}


def seeds() -> SearchStrategy[int]:
    """Seeds for the NumPy generator or the hash (`keyed_bits`) that fills a tensor; shrinks towards 0."""
    return st.integers(0, 2**32 - 1)


@st.composite
def rarely(draw, common: SearchStrategy, rare: SearchStrategy, *, one_in: int) -> object:
    """A value of `rare` about once in `one_in` draws, else of `common`.

    For sizes that are worth testing but costly (a few thousand tokens):
    hypothesis' `one_of` would pick them as often as the cheap ones.  Shrinks
    towards `common`.
    """
    if draw(st.integers(0, one_in - 1)) == one_in - 1:
        return draw(rare)
    return draw(common)


def element_bits(dtype: torch.dtype) -> int:
    """The width in bits of one element of `dtype`."""
    return torch.empty((), dtype=dtype).element_size() * 8


def unsigned_view(dtype: torch.dtype) -> type[np.unsignedinteger]:
    """The unsigned NumPy integer type as wide as one element of `dtype`."""
    return _NUMPY_BITS[element_bits(dtype) // 8]


def torch_copy(array: np.ndarray) -> torch.Tensor:
    """A contiguous CPU tensor, allocated by torch, holding a copy of `array`.

    Not `torch.from_numpy`: NumPy gives empty arrays zero strides, which torch
    keeps and its dtype views (``x.view(torch.uint8)``) then reject.
    """
    out = torch.empty(array.shape, dtype=torch.from_numpy(np.empty(0, array.dtype)).dtype)
    out.numpy()[...] = array
    return out


_GOLDEN_GAMMA = np.uint64(0x9E37_79B9_7F4A_7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 arrays that spreads every input bit over the output."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58_476D_1CE4_E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D0_49BB_1331_11EB)
    return x ^ (x >> np.uint64(31))


def keyed_bits(seed: int, shape: tuple[int, ...], dtype: torch.dtype, *, stream: int = 0) -> np.ndarray:
    """Random bit patterns, each element's a hash of (seed, stream, its index) alone.

    A generator's stream would give an element new bits whenever the shape
    around it changes; these stay put, so when hypothesis shrinks a failing
    tensor (fewer rows, fewer columns) the elements that made it fail survive.
    """
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64, as a hash's should
        acc = _mix64(_mix64(np.uint64(seed)) + np.uint64(stream) * _GOLDEN_GAMMA)
        for axis, size in enumerate(shape):
            coordinate = _mix64(np.arange(size, dtype=np.uint64) + np.uint64(axis + 1) * _GOLDEN_GAMMA)
            acc = acc[..., None] + coordinate
        hashed = _mix64(acc)
    return (hashed >> np.uint64(64 - element_bits(dtype))).astype(unsigned_view(dtype))


def tensor_from_bits(bits: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """The CPU tensor of `dtype` whose elements have exactly these bit patterns."""
    return torch_copy(bits.view(_TORCH_CARRIER[bits.dtype.itemsize])).view(dtype)
