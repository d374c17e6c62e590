"""The quantisation family's benchmark shapes (`tkverify bench`): DeepSeek-V3's activations,
bf16 (16384, 7168), and its SwiGLU input (16384, 2 x 2048).  `BENCH` maps an op to its
`BenchShape`s; `tkverify.specs.quant` declares them with the ops."""

from __future__ import annotations

import torch

from tkverify import benchshapes
from tkverify.registry import BenchShape

TOKENS, HIDDEN, SWIGLU_HIDDEN = 16384, 7168, 2048
_DATA_BYTES = {"e4m3": 1.0, "e2m1": 0.5, "e5m6": 1.5}  # bytes of data per element


ROW_PADDING = 128  # elements past each row of the strided rows' wider buffer (256 bytes of bf16)


def _x_shape(params):
    return lambda device: ({"x": benchshapes.randn((TOKENS, HIDDEN), torch.bfloat16, device)}, dict(params))


def _row_strided(shape: tuple[int, int], device) -> torch.Tensor:
    """A bf16 (rows, cols) x as buf[:, :cols] of a (rows, cols + ROW_PADDING) buffer: row stride
    cols + ROW_PADDING, rows 16-byte aligned (the layout of a fused QKV or gate/up buffer's slice)."""
    rows, cols = shape
    return benchshapes.randn((rows, cols + ROW_PADDING), torch.bfloat16, device)[:, :cols]


def _x_strided_shape(params):
    return lambda device: ({"x": _row_strided((TOKENS, HIDDEN), device)}, dict(params))


def _cast_bytes(sf_rows, sf_cols):
    """x read + data written + an fp32 sf of sf_rows(T) x sf_cols(H, params) written."""
    def count(i, p):
        t, h = i["x"].shape
        return (benchshapes.nbytes(i["x"]) + int(t * h * _DATA_BYTES[p["fmt"]]) + sf_rows(t, p) * sf_cols(h, p) * 4)
    return count


def _cast_back_shape(device):
    g = benchshapes.generator(device, 3)
    data = torch.randint(0, 256, (TOKENS, HIDDEN), dtype=torch.uint8, device=device, generator=g)
    data[(data & 0x7F) == 0x7F] = 0  # no NaN codes: a dequantisation of real data
    sf = torch.rand(TOKENS, HIDDEN // 128, device=device, generator=g) + 0.5
    return ({"data": data.view(torch.float8_e4m3fn), "sf": sf},
            {"fmt": "e4m3", "block": [1, 128], "out_dtype": torch.bfloat16})


def swiglu_shape(device):
    return ({"x": benchshapes.randn((TOKENS, 2 * SWIGLU_HIDDEN), torch.bfloat16, device)},
            {"fmt": "e4m3", "num_per_channels": 128})


def swiglu_strided_shape(device):
    """swiglu_shape's x as a slice of a wider buffer (the padding is never read: not counted)."""
    inputs, params = swiglu_shape(device)
    return {"x": _row_strided((TOKENS, 2 * SWIGLU_HIDDEN), device)}, params


def swiglu_bytes(i, p):
    """x read, e4m3 data and an fp32 sf per token block written."""
    n, h2 = i["x"].shape
    return benchshapes.nbytes(i["x"]) + n * h2 // 2 + n * (h2 // 2 // p["num_per_channels"]) * 4


def swiglu_routed_shape(device):
    """A tenth of the rows padding (pos -1), weights gathered through pos_to_token_topk, clamp 7, counting."""
    inputs, params = swiglu_shape(device)
    g = benchshapes.generator(device, 4)
    pos = torch.randperm(TOKENS, device=device, generator=g).to(torch.int32)
    pos[torch.rand(TOKENS, device=device, generator=g) < 0.1] = -1
    inputs.update(pos_to_token_topk=pos, topk_weights=torch.rand(TOKENS // 8 + 1, 8, device=device, generator=g),
                  clamped_count=torch.zeros(3, dtype=torch.int64, device=device))
    return inputs, dict(params, clamp=7.0)


def _block_sf_only_bytes(i, p):
    """x read and an fp32 sf of (T/128) x (H/128) written."""
    t, h = i["x"].shape
    return benchshapes.nbytes(i["x"]) + -(-t // 128) * (h // 128) * 4


def _block_precomputed_shape(device):
    """x and a given fp32 sf of 128 x 128 blocks (positive, of a realistic size: x is randn)."""
    inputs, params = _x_shape({"fmt": "e4m3", "block": [128, 128]})(device)
    g = benchshapes.generator(device, 5)
    inputs["sf"] = torch.rand(-(-TOKENS // 128), HIDDEN // 128, device=device, generator=g) / 64 + 2.0**-9
    return inputs, params


def _per_token(h, p):
    return h // p["num_per_channels"]


_X = f"T{TOKENS} H{HIDDEN} bf16"
BENCH = {
    "quant.per_token_cast": (
        BenchShape(f"{_X} e4m3/128", _x_shape({"fmt": "e4m3", "num_per_channels": 128}),
                   _cast_bytes(lambda t, p: t, _per_token)),
        BenchShape(f"{_X} e2m1/32", _x_shape({"fmt": "e2m1", "num_per_channels": 32}),
                   _cast_bytes(lambda t, p: t, _per_token)),
        BenchShape(f"{_X} e5m6/H", _x_shape({"fmt": "e5m6", "num_per_channels": HIDDEN}),
                   _cast_bytes(lambda t, p: t, _per_token)),
        BenchShape(f"{_X} e4m3/128 round_sf packed ue8m0 tma", _x_shape(
            {"fmt": "e4m3", "num_per_channels": 128, "round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True,
             "use_tma_aligned_col_major_sf": True}),
            lambda i, p: benchshapes.nbytes(i["x"]) + i["x"].numel() + i["x"].shape[0] * (HIDDEN // 128 // 4) * 4),
        # x = buf[:, :H], row stride H + ROW_PADDING: read in place; the bytes count the data moved only
        BenchShape(f"{_X} e4m3/128 row stride H+{ROW_PADDING}",
                   _x_strided_shape({"fmt": "e4m3", "num_per_channels": 128}), _cast_bytes(lambda t, p: t, _per_token)),
    ),
    "quant.per_block_cast": (
        BenchShape(f"{_X} e4m3 128x128", _x_shape({"fmt": "e4m3", "block": [128, 128]}),
                   _cast_bytes(lambda t, p: -(-t // 128), lambda h, p: h // 128)),
    ),
    "quant.per_block_cast_with_sf_only": (
        BenchShape(f"{_X} e4m3 128x128", _x_shape({"fmt": "e4m3", "block": [128, 128]}), _block_sf_only_bytes),
    ),
    "quant.per_block_cast_with_precomputed_sf": (
        BenchShape(f"{_X} e4m3 128x128", _block_precomputed_shape,
                   lambda i, p: benchshapes.nbytes(i["x"]) + benchshapes.nbytes(i["sf"]) + i["x"].numel()),
    ),
    "quant.per_channel_cast": (
        BenchShape(f"{_X} e4m3 128x1", _x_shape({"fmt": "e4m3", "num_per_tokens": 128}),
                   _cast_bytes(lambda t, p: -(-t // p["num_per_tokens"]), lambda h, p: h)),
    ),
    "quant.cast_back": (
        BenchShape(f"T{TOKENS} H{HIDDEN} e4m3/128 -> bf16", _cast_back_shape,
                   lambda i, p: benchshapes.nbytes(i["data"]) + benchshapes.nbytes(i["sf"]) + i["data"].numel() * 2),
    ),
    "quant.swiglu_forward_and_per_token_cast": (
        BenchShape(f"N{TOKENS} 2x{SWIGLU_HIDDEN} bf16 e4m3/128", swiglu_shape, swiglu_bytes),
        BenchShape(f"N{TOKENS} 2x{SWIGLU_HIDDEN} bf16 e4m3/128 row stride 2H+{ROW_PADDING}", swiglu_strided_shape,
                   swiglu_bytes),
        BenchShape(f"N{TOKENS} 2x{SWIGLU_HIDDEN} bf16 e4m3/128 weights clamp count", swiglu_routed_shape,
                   lambda i, p: swiglu_bytes(i, p) + i["x"].shape[0] * 8),
    ),
}
