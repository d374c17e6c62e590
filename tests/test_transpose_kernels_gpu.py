"""The TileLang transposes (kernels.transpose) on the shapes that decide their paths.

GPU tests (skipped without CUDA or tilelang), bitwise against torch's
``x.transpose(-1, -2).contiguous()``: for each width, the word kernel
(M and N multiples of 16 bytes' worth of elements) at full and partial
tiles, the any-shape kernel at every row misalignment (N mod 16 / width and
M mod 16 / width each taking all their values), B > 1, and an x that starts
off a 16-byte boundary.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

HAS_TILELANG = importlib.util.find_spec("tilelang") is not None
pytestmark = pytest.mark.skipif(not (HAS_TILELANG and torch.cuda.is_available()),
                                reason="needs CUDA and tilelang")

DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _random_bits(shape, dtype) -> torch.Tensor:
    width = torch.empty((), dtype=dtype).element_size()
    bits = torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int64, device="cuda", generator=None)
    return bits.to(RAW[width]).view(dtype)


def _assert_transposed(x: torch.Tensor, out: torch.Tensor) -> None:
    width = x.element_size()
    expected = x.transpose(-1, -2).contiguous().view(RAW[width])
    assert out.shape == expected.shape
    assert torch.equal(out.view(RAW[width]), expected), f"{tuple(x.shape)} {x.dtype}"


def _vector(dtype) -> int:
    return 16 // torch.empty((), dtype=dtype).element_size()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", (1, 3))
def test_word_kernel_full_and_partial_tiles(dtype, batch):
    from kernels import transpose

    vec = _vector(dtype)
    torch.manual_seed(0)
    for rows, cols in ((vec, vec), (128, 128), (3 * vec, 17 * vec), (256 + vec, 128 - vec), (9 * vec, 2 * vec)):
        x = _random_bits((batch, rows, cols), dtype)
        _assert_transposed(x, transpose.batched_transpose(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_any_kernel_every_misalignment(dtype):
    from kernels import transpose

    vec = _vector(dtype)
    torch.manual_seed(1)
    for shift in range(1, vec):
        for rows, cols in ((130 + shift, 64 + shift), (shift, 257), (300, 2 * vec + shift), (vec * 9 + shift, vec)):
            for batch in (1, 2):
                x = _random_bits((batch, rows, cols), dtype)
                _assert_transposed(x, transpose.batched_transpose(x))
        x = _random_bits((1000 + shift, 999), dtype)
        _assert_transposed(x, transpose.transpose(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_x_off_a_16_byte_boundary(dtype):
    from kernels import transpose

    torch.manual_seed(2)
    for rows, cols in ((64, 64), (33, 17)):
        storage = _random_bits((rows * cols + 1,), dtype)
        x = storage[1:].view(rows, cols)
        _assert_transposed(x, transpose.transpose(x))
