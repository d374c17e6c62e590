"""The per-token casts on the GPU: per_token_cast, per_token_cast_with_sf_only and
per_token_cast_with_precomputed_sf, the host side of the token_cast kernel (`token_kernel`).

Signatures, argument checks and layouts are those of kernels/torch/quant.py, whose check
functions these wrappers call (docs/contract/quant.md says what the ops compute).  Besides,
every tensor must be on one CUDA device and every dimension fit an int32.

The host picks the kernel's path for the call's block size (`_token_geometry`) and launches
the kernel in pieces of whole rows, each covering at most `MAX_CHUNKS_PER_LAUNCH` chunks of y
and `MAX_X_WORDS_PER_LAUNCH` words of x (its indices are int32, sf offsets int64) and no grid
more than 2^31 - 1 CTAs.  T = 0 returns empty outputs without a launch.  Blocks of npc % 8 != 0
elements (npc = H of a row with H % 8 != 0; the SwiGLU backward's cast, npc = H of its 2H-column
gradient, two blocks a row) are each zero-padded to a multiple of 8 (zeros do not move an amax) and
the data cropped block by block.

Layouts: x is read in place at any row stride (x = buf[:, :H] of a wider buffer, a slice of a
batch of tokens): the kernel takes the row stride as a runtime argument (`row_pad`), so a
contiguous and a row-strided x run the same compiled configuration.  Its loads are 16-byte
vectors, so x is read in place where its data pointer and its row stride in bytes are multiples
of 16; otherwise (and for H % 8 != 0, already padded) the kernel reads a contiguous copy, the one
path that needs no alignment.  Layouts nobody can take (a last dimension of stride != 1,
overlapping rows) are refused by the eager checks, naming x.
"""

import functools
import math

import torch

from .. import _tilelang
from ..torch import quant as eager
from ..torch._checks import rows_aligned, span_view
from .common import (CHUNK, IN_DTYPES, VECTOR_BYTES, WARP, _data_width, _new_data, _new_sf, _sf_args, _SfArgs, _words,
                     magic_divisor)
from .token_kernel import (FAST_CHUNKS_PER_LANE, GENERIC_STEPS, ROW_PATH, TOKEN_CAST, TokenConfig, fast_paths,
                           row_chunks, token_config)

MAX_CHUNKS_PER_LAUNCH = 2**26  # token_cast: chunks of y per launch (x indices stay below 2^31)
MAX_X_WORDS_PER_LAUNCH = 2**30  # the words of x a launch spans, row padding included (int32 indices)


@functools.lru_cache(maxsize=None)  # per launch otherwise; pure in its arguments
def _token_geometry(config: TokenConfig, num_per_channels: int) -> tuple[int, int, int, int]:
    """(path, log2 L, K, chunks per CTA) for blocks of num_per_channels elements (npc / 8 chunks).

    A fast path (path = K) holds a lane's K chunks in registers: K = 4 when npc / 32 is a
    power of two up to 32 (and the configuration has that path), else K = 2 when npc / 16
    is.  Otherwise (npc = H) the row path (ROW_PATH) when a team of L threads, L the least
    power of two >= 32 with L * row_chunks >= npc / 8, fits the CTA (K = npc / 8 there);
    rows of fewer than 32 chunks, or too long for the CTA's registers, take the generic path.
    """
    chunks = num_per_channels // CHUNK
    for k in sorted(fast_paths(config.source, config.dtype), reverse=True):
        lanes = chunks // k
        if chunks % k == 0 and lanes & (lanes - 1) == 0 and lanes <= WARP:
            return k, lanes.bit_length() - 1, k, FAST_CHUNKS_PER_LANE[config.source, config.dtype] * config.threads \
                * config.steps
    per_thread = row_chunks(config.source, config.dtype)
    if WARP <= chunks <= per_thread * config.threads:
        team = max(WARP, 1 << (-(-chunks // per_thread) - 1).bit_length())
        return ROW_PATH, team.bit_length() - 1, chunks, (config.threads // team) * chunks
    return _generic_geometry(config, num_per_channels)


def _generic_geometry(config: TokenConfig, num_per_channels: int) -> tuple[int, int, int, int]:
    """The generic path's (0, log2 L, K, chunks per CTA): L = gcd(npc / 8, 32) lanes loop over K = npc / 8L chunks.

    It takes any npc % 8 == 0 (the GPU tests compare the other paths with it).
    """
    chunks = num_per_channels // CHUNK
    lanes = math.gcd(chunks, WARP)
    return 0, lanes.bit_length() - 1, chunks // lanes, GENERIC_STEPS * config.threads * (chunks // lanes)


def _token_launch(config: TokenConfig, x_rows: torch.Tensor, data: torch.Tensor | None, sf: _SfArgs,
                  num_per_channels: int, round_sf: bool, clamp_min: float, precomputed: bool,
                  swiglu: dict | None = None) -> None:
    """Run token_cast over x_rows (T, H8) (swiglu: (N, 2 H8)), H8 % 8 == 0, in row pieces.

    data: (T, width) output or None (sf only).  sf: the sf (output, or input
    when precomputed).  swiglu: the extra arguments of the swiglu source.
    """
    device = x_rows.device
    x_rows = _vector_rows(x_rows)
    num_rows = x_rows.shape[0]
    hidden = x_rows.shape[1] // 2 if swiglu is not None else x_rows.shape[1]
    cols = hidden // num_per_channels
    chunks_per_row = hidden // CHUNK
    row_stride = _row_stride(x_rows)
    # 16-byte vectors from the end of a row of y's chunks in x to the next row (swiglu: the r half too)
    row_pad = (row_stride - hidden) * x_rows.element_size() // VECTOR_BYTES
    path, lanes_log2, blk_k, _ = _token_geometry(config, num_per_channels)
    cols_mul, cols_shift = magic_divisor(cols)
    kernel = _tilelang.kernel_for(TOKEN_CAST, config, device)
    row_words = row_stride * x_rows.element_size() // 4
    rows_per_launch = max(1, min(MAX_CHUNKS_PER_LAUNCH // chunks_per_row, MAX_X_WORDS_PER_LAUNCH // row_words))
    dummy_words = _tilelang.placeholder(torch.int32, device)
    with _tilelang.device_guard(device):
        for r0 in range(0, num_rows, rows_per_launch):
            r1 = min(num_rows, r0 + rows_per_launch)
            xw = _row_words(x_rows[r0:r1])
            dw = _words(data[r0:r1]) if data is not None else dummy_words
            common = ((r1 - r0) * chunks_per_row, (r1 - r0) * cols, path, lanes_log2, blk_k, cols, cols_mul, cols_shift,
                      r0, sf.s0, sf.s1, sf.mode, int(round_sf), clamp_min)
            if swiglu is None:
                kernel(xw, dw, sf.flat_f32, sf.flat_u8, *common, int(data is not None), int(precomputed), row_pad)
            else:
                pos = swiglu["pos"][r0:r1] if swiglu["has_pos"] else swiglu["pos"]
                kernel(xw, dw, sf.flat_f32, sf.flat_u8, pos, swiglu["weights"], swiglu["counts"], *common,
                       chunks_per_row, row_pad, int(swiglu["has_pos"]), int(swiglu["has_w"]), int(swiglu["do_count"]),
                       swiglu["clamp"])


def _row_stride(x_rows: torch.Tensor) -> int:
    """Elements from one row of x_rows to the next (a single row: its length, whatever stride torch reports)."""
    return x_rows.stride(0) if x_rows.shape[0] > 1 else x_rows.shape[1]


def _vector_rows(x_rows: torch.Tensor) -> torch.Tensor:
    """x_rows itself where every row starts on a 16-byte boundary (the kernel's vector loads), else a
    contiguous copy in a fresh allocation (a view at an odd offset, contiguous or not; a row stride that
    is no multiple of 16 bytes)."""
    return x_rows if rows_aligned(x_rows, VECTOR_BYTES) else x_rows.clone(memory_format=torch.contiguous_format)


def _row_words(x_rows: torch.Tensor) -> torch.Tensor:
    """x_rows' memory from its first element to its last as flat int32 words, row padding included:
    the same memory, no copy (rows of whole 16-byte vectors at a 16-byte aligned start)."""
    return span_view(x_rows).view(torch.int32)


def _padded_hidden(hidden: int) -> int:
    return -(-hidden // CHUNK) * CHUNK


def _blocks_zero_padded(x: torch.Tensor, n: int) -> torch.Tensor:
    """x (T, H) with each of its H / n blocks of n elements in the first n columns of a zeroed slot of
    n8 = `_padded_hidden(n)`: a new contiguous (T, (H / n) n8) tensor whose blocks are whole chunks."""
    rows, hidden = x.shape
    cols, n8 = hidden // n, _padded_hidden(n)
    padded = torch.zeros((rows, cols, n8), dtype=x.dtype, device=x.device)
    padded[:, :, :n] = x.unflatten(1, (cols, n))
    return padded.view(rows, cols * n8)


def _blocks_cropped(data: torch.Tensor, cols: int, n: int, fmt: str) -> torch.Tensor:
    """The data of `_blocks_zero_padded` rows (T, cols slots) with each slot cropped to its block's n
    elements: contiguous (T, cols * width of n elements)."""
    rows, width = data.shape[0], _data_width(n, fmt)
    return data.view(rows, cols, -1)[:, :, :width].reshape(rows, cols * width).contiguous()  # one slot: a view


def _token_cast(x: torch.Tensor, fmt: str, n: int, round_sf: bool, use_ue8m0: bool, use_packed_ue8m0: bool,
                col_major: bool, clamp_min: float, with_data: bool):
    """(data or None, sf) of x (T, H) in blocks of 1 x n, n dividing H (the callers check n: one of the
    token blocks, or a row's H; the SwiGLU backward's cast takes H of its 2H-column gradient, sf (T, 2)).
    Blocks of n % 8 != 0 elements are zero-padded to whole chunks, the data cropped back."""
    num_rows, hidden = x.shape
    device = x.device
    cols = hidden // n
    sf = _new_sf(num_rows, cols, use_ue8m0, use_packed_ue8m0, col_major, device)
    data = _new_data(num_rows, hidden, fmt, device) if with_data else None
    if num_rows == 0:
        return data, sf
    config = token_config("x", IN_DTYPES[x.dtype], fmt)
    if n % CHUNK:
        n8 = _padded_hidden(n)
        dp = _new_data(num_rows, cols * n8, fmt, device) if with_data else None
        _token_launch(config, _blocks_zero_padded(x, n), dp, _sf_args(sf), n8, round_sf, clamp_min, False)
        return (_blocks_cropped(dp, cols, n, fmt) if with_data else None), sf
    _token_launch(config, x, data, _sf_args(sf), n, round_sf, clamp_min, False)
    return data, sf


def per_token_cast(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *, round_sf: bool = False,
                   use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                   use_tma_aligned_col_major_sf: bool = False,
                   clamp_min: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, sf) of x (T, H) quantised in blocks of 1 x num_per_channels (see kernels/torch/quant.py).

    x at any row stride: read in place where its rows start on 16-byte boundaries (data pointer and
    row stride in bytes multiples of 16), else from a contiguous copy (the module docstring says why).
    """
    fmt, n, cm = eager._check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                                        use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    return _token_cast(x, fmt, n, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm, True)


def per_token_cast_with_sf_only(x: torch.Tensor, fmt: str = "e4m3", num_per_channels: int = 128, *,
                                round_sf: bool = False, use_ue8m0: bool = False, use_packed_ue8m0: bool = False,
                                use_tma_aligned_col_major_sf: bool = False,
                                clamp_min: float | None = None) -> torch.Tensor:
    """The sf per_token_cast would return, without the data (x is read once, nothing else written);
    x's layouts as per_token_cast's."""
    fmt, n, cm = eager._check_per_token(x, fmt, num_per_channels, round_sf, use_ue8m0, use_packed_ue8m0,
                                        use_tma_aligned_col_major_sf, clamp_min)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    return _token_cast(x, fmt, n, round_sf, use_ue8m0, use_packed_ue8m0, use_tma_aligned_col_major_sf, cm,
                       False)[1]


def per_token_cast_with_precomputed_sf(x: torch.Tensor, sf: torch.Tensor, fmt: str = "e4m3",
                                       num_per_channels: int = 128) -> torch.Tensor:
    """The data of x (T, H) quantised with a given sf (T, H / num_per_channels) of any storage and strides;
    x's layouts as per_token_cast's."""
    fmt, n = eager._check_precomputed_args(x, sf, fmt, num_per_channels)
    num_rows, hidden = x.shape
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    device = x.device
    if num_rows == 0:
        return _new_data(0, hidden, fmt, device)
    config = token_config("x", IN_DTYPES[x.dtype], fmt, precomputed=True)
    if n % CHUNK:  # n = H (the checks): one block a row, zero-padded to whole chunks
        h8 = _padded_hidden(n)
        dp = _new_data(num_rows, h8, fmt, device)
        _token_launch(config, _blocks_zero_padded(x, n), dp, _sf_args(sf), h8, False, 1.0, True)
        return _blocks_cropped(dp, 1, n, fmt)
    data = _new_data(num_rows, hidden, fmt, device)
    _token_launch(config, x, data, _sf_args(sf), n, False, 1.0, True)
    return data
