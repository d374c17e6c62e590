"""expand_to_fused: x's rows moved to the fused layout as raw integers, and its kernel registry entry.

out (N, H): row pos = token_topk_to_pos[t, k] holds x[t] for every pair with 0 <= pos < N, the rows no
pair reaches hold zero bits.  Bits are moved, never converted:

1. row_src (N,) int32 is filled with -1 and gets row_src[pos] = t for every pair whose position is a
   row: from the map kernel, or from the order kernel where the gather runs (`expand_rows`,
   `expand_gather`).
2. the rows, by the configuration `expand_rows_config` names for the largest unit (16, 4, 2 or 1
   bytes) dividing the row length in bytes and the addresses: as shipped, the gather for 16-byte
   units (an order kernel, then a CTA a destination row, `expand_gather`) and the row kernel for the
   others (a block a tile of a token's row, stored to each of its rows, `expand_rows`).
3. sf rows: a row-major x_sf is one more call of the row kernel, or of the gather (with the same
   order) where its rows are 16-byte units (it is a (T, G) matrix like x).  A TMA-aligned
   column-major x_sf goes through the sf-column kernel (`expand_rows`).
"""

import torch

from kernels.torch import moe as eager  # the argument checks are the eager module's
from kernels.torch.moe import is_tma_column_major, tma_padded_rows  # the sf layout contract

from .. import _tilelang
from .._tilelang import KernelDef, tuning_only
from .common import _ceildiv
from .expand_config import (EXPAND_CONFIGS, EXPAND_SHIPPED, EXPAND_TUNE_CONFIGS, EXPAND_UNITS,
                            RAW_TORCH_DTYPES, ExpandConfig, expand_rows_config)
from .expand_gather import ORDER_SLOTS, _build_expand_gather, _build_expand_order
from .expand_rows import (SF_THREADS, _build_expand_map, _build_expand_rows, _build_expand_rows_tuned,
                          _build_expand_sf_columns)


def build_expand(config: ExpandConfig):
    """prim_func of one of expand_to_fused's kernels (see the module docstring)."""
    if config.stage == "map":
        return _build_expand_map()
    if config.stage == "order":
        return _build_expand_order()
    if config.stage == "gather":
        return _build_expand_gather(config)
    if config.stage == "rows":
        if config == ExpandConfig("rows", config.width):
            return _build_expand_rows(config.width)  # the base row kernel
        return _build_expand_rows_tuned(config)
    return _build_expand_sf_columns(config.width)


EXPAND_TO_FUSED = KernelDef("moe.expand_to_fused", build_expand, EXPAND_CONFIGS + EXPAND_TUNE_CONFIGS,
                            candidates=tuning_only(EXPAND_TUNE_CONFIGS, EXPAND_SHIPPED))


def _check_expand_args(x, token_topk_to_pos, num_expanded_rows, x_sf) -> int:
    num_rows = eager._check_expand_args(x, token_topk_to_pos, num_expanded_rows, x_sf)
    _tilelang.require_cuda("x", x)
    _tilelang.check_dims_fit_int32("x", x)
    if x_sf is not None:
        _tilelang.check_dims_fit_int32("x_sf", x_sf)
    return num_rows


def _row_unit(*tensors: torch.Tensor) -> int:
    """The largest unit (16, 4, 2, 1 bytes) dividing each tensor's row length in bytes and address."""
    for unit in EXPAND_UNITS:
        if all((t.shape[1] * t.element_size()) % unit == 0 and t.data_ptr() % unit == 0 for t in tensors):
            return unit
    return 1


def _as_units(t: torch.Tensor, unit: int) -> torch.Tensor:
    """A (rows, cols) contiguous tensor viewed as rows of raw `unit`-byte integers (16 bytes: 4 int32)."""
    return t.view(torch.uint8).view(RAW_TORCH_DTYPES[4 if unit == 16 else unit])


def _expand_rows(src: torch.Tensor, token_topk_to_pos: torch.Tensor, row_src: torch.Tensor,
                 out: torch.Tensor, order: torch.Tensor | None, target) -> None:
    """out[pos] = src[t] for the pairs, zero rows where row_src < 0 (src, out row-major contiguous).
    `order`: the gather's (_expand_order), where the caller has it."""
    unit = _row_unit(src, out)
    config = expand_rows_config(unit)
    kernel = _tilelang.compiled_kernel(EXPAND_TO_FUSED, config, target)
    num_units = src.shape[1] * src.element_size() // unit
    if num_units * (4 if unit == 16 else 1) > _tilelang.MAX_DIM:
        raise ValueError(f"x: rows of {src.shape[1] * src.element_size()} bytes are too long for this alignment "
                         f"(at most {_tilelang.MAX_DIM} units of {unit} bytes)")
    tiles = _ceildiv(num_units, config.threads * config.units)
    padding_blocks = _ceildiv(out.shape[0], config.pad_rows) * tiles
    if config.stage == "gather":
        if order is None:
            order = _expand_order(token_topk_to_pos, row_src, target)
        _tilelang.launch_in_pieces(kernel, order.numel() + padding_blocks, _as_units(src, unit), order, row_src,
                                   _as_units(out, unit))
        return
    total = src.shape[0] * tiles + padding_blocks
    _tilelang.launch_in_pieces(kernel, total, _as_units(src, unit), token_topk_to_pos, row_src, _as_units(out, unit))


def _expand_order(token_topk_to_pos: torch.Tensor, row_src: torch.Tensor, target) -> torch.Tensor:
    """The gather's order: (chunks * ORDER_SLOTS,) int64 (pos << 32) + token, in position-bucket order in
    each chunk of ORDER_SLOTS // K tokens, -1 for empty slots.  Sets row_src as the map kernel does."""
    num_tokens, k = token_topk_to_pos.shape
    chunk_tokens = ORDER_SLOTS // k
    num_chunks = _ceildiv(num_tokens, chunk_tokens)
    order = torch.empty((num_chunks * ORDER_SLOTS,), dtype=torch.int64, device=token_topk_to_pos.device)
    kernel = _tilelang.compiled_kernel(EXPAND_TO_FUSED, ExpandConfig("order", 0), target)
    kernel(token_topk_to_pos.reshape(-1), row_src, order, k, chunk_tokens * k, num_chunks,
           _ceildiv(row_src.numel(), ORDER_SLOTS))
    return order


def _expand_sf_columns(x_sf: torch.Tensor, row_src: torch.Tensor, num_rows: int, target) -> torch.Tensor:
    """out_sf (N, G), TMA-aligned column-major, gathered from a column-major x_sf through row_src."""
    num_tokens, num_cols = x_sf.shape
    width = x_sf.element_size()
    rows_padded = tma_padded_rows(num_rows, x_sf.dtype)
    storage = torch.empty((num_cols, rows_padded), dtype=x_sf.dtype, device=x_sf.device)
    kernel = _tilelang.compiled_kernel(EXPAND_TO_FUSED, ExpandConfig("sf_columns", width), target)
    in_stride = x_sf.stride(1)
    # Only the elements of the (T, G) view: a column-major tensor's last column may end before its padding.
    flat_in = torch.as_strided(x_sf, ((num_cols - 1) * in_stride + num_tokens,), (1,))
    raw = RAW_TORCH_DTYPES[width]
    total = _ceildiv(num_cols * rows_padded, SF_THREADS)
    _tilelang.launch_in_pieces(kernel, total, flat_in.view(raw), row_src, storage.view(raw), in_stride)
    return storage.T[:num_rows]


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, num_expanded_rows: int,
                    x_sf: torch.Tensor | None = None):
    """out (N, H): row pos = token_topk_to_pos[t, k] holds x[t], padding rows zero; bits unchanged.

    With x_sf (the per-token sf of a quantised x), returns (out, out_sf):
    out_sf (N, G) holds the sf rows moved the same way, in x_sf's dtype and
    layout (row-major, or TMA-aligned column-major padded for N).  No host sync.
    """
    num_rows = _check_expand_args(x, token_topk_to_pos, num_expanded_rows, x_sf)
    device = x.device
    num_tokens, k = token_topk_to_pos.shape
    column_major_sf = x_sf is not None and is_tma_column_major(x_sf)
    if num_rows == 0 or num_tokens == 0:
        # Nothing to move: every row (if any) is padding.
        out = torch.zeros((num_rows, x.shape[1]), dtype=x.dtype, device=device)
        if x_sf is None:
            return out
        if column_major_sf:
            out_sf = torch.zeros((x_sf.shape[1], tma_padded_rows(num_rows, x_sf.dtype)), dtype=x_sf.dtype,
                                 device=device).T[:num_rows]
        else:
            out_sf = torch.zeros((num_rows, x_sf.shape[1]), dtype=x_sf.dtype, device=device)
        return out, out_sf
    target = _tilelang.target_for(device)
    with _tilelang.device_guard(device):
        row_src = torch.full((num_rows,), -1, dtype=torch.int32, device=device)
        out = torch.empty((num_rows, x.shape[1]), dtype=x.dtype, device=device)
        order = None
        if expand_rows_config(_row_unit(x, out)).stage == "gather":
            order = _expand_order(token_topk_to_pos, row_src, target)  # row_src with it
        else:
            mapper = _tilelang.compiled_kernel(EXPAND_TO_FUSED, ExpandConfig("map", 0), target)
            mapper(token_topk_to_pos.reshape(-1), row_src, k)
        _expand_rows(x, token_topk_to_pos, row_src, out, order, target)
        if x_sf is None:
            return out
        if column_major_sf:
            out_sf = _expand_sf_columns(x_sf, row_src, num_rows, target)
        else:
            out_sf = torch.empty((num_rows, x_sf.shape[1]), dtype=x_sf.dtype, device=device)
            _expand_rows(x_sf, token_topk_to_pos, row_src, out_sf, order, target)
    return out, out_sf
