"""What every quant kernel and wrapper shares: constants, TIR bit helpers, the multiply-shift
division, and the host-side storage of data and sf.

The kernels read and write 32-bit words: x as words of its bf16 halves or fp32 values, data as
words of packed codes, in *chunks* of 8 consecutive elements (one or two 16-byte vectors of
input).  Every global access is guarded by hand: tilelang's safe-memory legalisation is
disabled (`PASS_CONFIGS`), as in the other kernel families.
"""

import functools
from typing import NamedTuple

import torch

from .. import _tilelang
from ..torch import quant as eager

FORMATS = eager.FORMATS
MAX_Q = eager.MAX_Q
IN_DTYPES = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}

CHUNK = 8  # elements per chunk
VECTOR_BYTES = 16
WARP = 32
WORDS_PER_CHUNK = {"bfloat16": 4, "float32": 8}  # 32-bit words of input per chunk
DATA_WORDS_PER_CHUNK = {"e4m3": 2, "e2m1": 1, "e5m6": 3}

# sf storage modes, a runtime argument of every kernel (see `_sf_args`)
SF_FP32, SF_UE8M0, SF_PACKED = 0, 1, 2

F32_INF = 0x7F800000
F32_QNAN = 0x7FC00000

# ------------------------------------------------------------------- TIR helpers


def _bits(T, f):
    return T.reinterpret(f, "uint32")


def _f32(T, u):
    return T.reinterpret(u, "float32")


def _u(T, v):
    return T.uint32(v)


def _fastdiv(T, n, mul, shift):
    """n // d for 0 <= n < 2^31, with (mul, shift) = `magic_divisor(d)`."""
    return T.Cast("int32", (T.Cast("int64", n) * mul) >> shift)


@functools.lru_cache(maxsize=None)  # per launch otherwise; pure in its arguments
def magic_divisor(d: int) -> tuple[int, int]:
    """(mul, shift) with n // d == (n * mul) >> shift for every 0 <= n < 2^31 (1 <= d < 2^31).

    mul = ceil(2^(31 + l) / d) with l = ceil(log2 d): mul * d - 2^(31 + l) < d <= 2^l,
    so the error of n * mul / 2^(31 + l) against n / d stays below 1 / d.
    """
    if not 1 <= d < 2**31:
        raise ValueError(f"divisor out of range: {d}")
    l = (d - 1).bit_length()
    shift = 31 + l
    mul = -(-(1 << shift) // d)
    return mul, shift


# --------------------------------------------------------- host: data and sf storage

_DATA_DTYPES = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.int8, "e5m6": torch.uint8}


def _words(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor whose byte size is a multiple of 4 as a flat int32 tensor (same memory)."""
    return t.reshape(-1).view(torch.uint8).view(torch.int32)


class _SfArgs(NamedTuple):
    """The sf storage as the kernels see it: flat fp32 and byte views, strides, storage mode."""

    flat_f32: torch.Tensor
    flat_u8: torch.Tensor
    s0: int
    s1: int
    mode: int


def _sf_args(sf: torch.Tensor) -> _SfArgs:
    """Kernel view of an sf tensor of any storage (fp32 / ue8m0 uint8 / packed int32) and strides.

    The flat views start at sf's first element and reach its last one; sf
    element (row, col) is at row * s0 + col * s1 of them (for packed storage in
    int32 words, whose byte col % 4 holds the code).
    """
    device = sf.device
    extent = 1 + sum((size - 1) * stride for size, stride in zip(sf.shape, sf.stride())) if sf.numel() else 1
    flat = torch.as_strided(sf, (extent,), (1,)) if sf.numel() else torch.zeros(1, dtype=sf.dtype, device=device)
    s0, s1 = sf.stride()
    if sf.dtype == torch.float32:
        return _SfArgs(flat, _tilelang.placeholder(torch.uint8, device), s0, s1, SF_FP32)
    if sf.dtype == torch.uint8:
        return _SfArgs(_tilelang.placeholder(torch.float32, device), flat, s0, s1, SF_UE8M0)
    return _SfArgs(_tilelang.placeholder(torch.float32, device), flat.view(torch.uint8), s0, s1, SF_PACKED)


def _new_sf(rows: int, cols: int, use_ue8m0: bool, use_packed_ue8m0: bool, col_major: bool,
            device: torch.device) -> torch.Tensor:
    """An sf output (rows, cols) in the storage and layout the options ask for (see the eager module).

    Packed storage whose last word is partial starts zeroed (its padding bytes
    must be 0 and the kernels write only the codes); everything else is
    written by the kernels (the column-major padding rows are never read).
    """
    dtype = torch.int32 if use_packed_ue8m0 else (torch.uint8 if use_ue8m0 else torch.float32)
    stored_cols = -(-cols // 4) if use_packed_ue8m0 else cols
    alloc = torch.zeros if use_packed_ue8m0 and cols % 4 else torch.empty
    if col_major:
        per_16_bytes = eager.TMA_ALIGN_BYTES // torch.tensor([], dtype=dtype).element_size()
        padded_rows = -(-rows // per_16_bytes) * per_16_bytes
        return alloc((stored_cols, padded_rows), dtype=dtype, device=device).T[:rows]
    return alloc((rows, stored_cols), dtype=dtype, device=device)


def _data_width(hidden: int, fmt: str) -> int:
    """Columns of the data tensor of rows of `hidden` elements (e2m1: two codes a byte; e5m6: 8 codes in 12 bytes)."""
    return {"e4m3": hidden, "e2m1": hidden // 2, "e5m6": 3 * hidden // 2}[fmt]


def _new_data(rows: int, hidden: int, fmt: str, device: torch.device) -> torch.Tensor:
    return torch.empty((rows, _data_width(hidden, fmt)), dtype=_DATA_DTYPES[fmt], device=device)


def _crop_data(data: torch.Tensor, hidden: int, fmt: str) -> torch.Tensor:
    return data[:, :_data_width(hidden, fmt)].contiguous()
