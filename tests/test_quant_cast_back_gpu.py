"""The TileLang cast_back kernel (kernels.quant) against the eager implementation (kernels.torch.quant).

GPU tests (skipped, with the reason, without CUDA or tilelang): every code of every format times
special and ordinary sf values; each runtime path of the kernel (an sf per chunk, an sf per element,
rows that are not whole chunks), at and around its tiles (T * H not a multiple of a chunk or of a
CTA's span), data that starts off a 16-byte boundary, sf of every storage in row-major,
column-major and arbitrary strides, launches cut into pieces (the element limit lowered, including
rows that start inside a chunk, which go through aligned copies); each compared bit for bit with
the torch implementation on the same device (NaN equal to NaN whatever its payload; a signed zero
is compared by its bits).

Source tests (tilelang only, no GPU): the generated CUDA of each configuration stores its output in
16-byte vectors and forms the bf16 products through the prelude's round-to-odd functions.
"""

from __future__ import annotations


import pytest
import torch

import kernels.torch.quant as eager

OUT_DTYPES = (torch.bfloat16, torch.float32)
# sf values: zeros, infinities, NaN, subnormals, the edge of the fp32 fast path (2^-100), the
# largest finite, negatives, and ordinary ones.
SF_SPECIALS = (0.0, -0.0, float("inf"), float("-inf"), float("nan"), 2.0**-149, 2.0**-127, 2.0**-126, 2.0**-101,
               2.0**-100 * (1 - 2**-24), 2.0**-100, 2.0**-90 * 1.7, 2.0**120 * 1.999, 2.0**127,
               3.4028234663852886e38, -1.5, 1.0, 0.3, 7e-3, 448.0)


@pytest.fixture(scope="module")
def quant(tilelang_family):
    return tilelang_family("quant")



def _gen(seed: int) -> torch.Generator:
    return torch.Generator("cuda").manual_seed(seed)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Same dtype, shape and bits, except that any NaN equals any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    assert torch.equal(nan_got, nan_want), f"{what}: NaN at other places"
    raw = torch.int16 if got.dtype == torch.bfloat16 else torch.int32
    g = torch.where(nan_got, 0, got.view(raw))
    w = torch.where(nan_want, 0, want.view(raw))
    differ = (g != w).sum().item()
    assert differ == 0, f"{what}: {differ} elements differ, first at {(g != w).nonzero()[:4].tolist()}"


def random_data(rows: int, hidden: int, fmt: str, seed: int) -> torch.Tensor:
    g = _gen(seed)
    if fmt == "e4m3":
        return torch.randint(0, 256, (rows, hidden), dtype=torch.uint8, device="cuda", generator=g).view(
            torch.float8_e4m3fn)
    if fmt == "e2m1":
        return torch.randint(-128, 128, (rows, hidden // 2), dtype=torch.int8, device="cuda", generator=g)
    return torch.randint(0, 256, (rows, hidden * 3 // 2), dtype=torch.uint8, device="cuda", generator=g)


def random_sf(rows: int, cols: int, storage: str, layout: str, seed: int) -> torch.Tensor:
    """sf of a storage ("fp32", "ue8m0", "packed") and layout ("row", "col", "strided"), specials mixed in."""
    g = _gen(seed)
    if storage == "fp32":
        exponent = torch.randint(-140, 128, (rows, cols), device="cuda", generator=g).float()
        sf = torch.ldexp(1 + torch.rand(rows, cols, device="cuda", generator=g), exponent)
        specials = torch.tensor(SF_SPECIALS, device="cuda")
        pick = torch.randint(0, len(SF_SPECIALS), (rows, cols), device="cuda", generator=g)
        sf = torch.where(torch.rand(rows, cols, device="cuda", generator=g) < 0.3, specials[pick], sf)
    else:
        codes = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, device="cuda", generator=g)  # 0 and 0xFF too
        if storage == "packed":
            padded = torch.zeros(rows, -(-cols // 4) * 4, dtype=torch.uint8, device="cuda")
            padded[:, :cols] = codes
            sf = padded.view(torch.int32)
        else:
            sf = codes
    if layout == "col":
        return sf.T.contiguous().T
    if layout == "strided":
        big = torch.zeros(2 * sf.shape[0] + 1, 3 * sf.shape[1] + 2, dtype=sf.dtype, device="cuda")
        view = big[1::2][:sf.shape[0], 2::3][:, :sf.shape[1]]
        view.copy_(sf)
        return view
    return sf


def check(quant, data, sf, fmt, block, out_dtype, what=""):
    got = quant.cast_back(data, sf, fmt, block, out_dtype)
    want = eager.cast_back(data, sf, fmt, block, out_dtype)
    assert_same(got, want, f"{what} {fmt} {block} {out_dtype}")


@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
@pytest.mark.parametrize("fmt", ("e4m3", "e2m1", "e5m6"))
def test_every_code_times_special_and_ordinary_sf(quant, fmt, out_dtype):
    """One row per sf value, each holding every code of the format (NaN and infinity codes included)."""
    sf_values = torch.tensor(SF_SPECIALS + tuple(2.0 ** e * 1.37 for e in range(-130, 128, 7)), device="cuda")
    rows = len(sf_values)
    if fmt == "e4m3":
        data = torch.arange(256, device="cuda").to(torch.uint8).repeat(rows, 1).view(torch.float8_e4m3fn)
    elif fmt == "e2m1":
        data = torch.arange(256, device="cuda").to(torch.uint8).view(torch.int8).repeat(rows, 1)
    else:
        data = eager._pack_e5m6(torch.arange(4096, device="cuda").repeat(rows, 1))
    hidden = eager._hidden_of(data, fmt)
    check(quant, data, sf_values.reshape(-1, 1), fmt, (1, hidden), out_dtype)


# (fmt, block with -1 for H, H): each runtime path - an sf per chunk (1 x bk, 1 x H, 2-D blocks), an sf
# per element (bm x 1), and rows that are not whole chunks (H % 8 != 0: bf16; H % 4 != 0: fp32 too)
GEOMETRIES = [
    ("e4m3", (1, 128), 7168), ("e4m3", (1, 16), 48), ("e4m3", (1, 32), 96), ("e4m3", (1, 64), 320),
    ("e2m1", (1, 32), 7168), ("e2m1", (1, 16), 48), ("e2m1", (1, 128), 384), ("e5m6", (1, -1), 7168),
    ("e5m6", (1, -1), 8), ("e5m6", (1, -1), 40), ("e5m6", (1, -1), 1000),
    ("e4m3", (1, -1), 8), ("e4m3", (1, -1), 200), ("e2m1", (1, -1), 24),
    ("e4m3", (128, 128), 384), ("e4m3", (32, 32), 96), ("e2m1", (128, 128), 256), ("e2m1", (32, 32), 32),
    ("e4m3", (16, 1), 136), ("e4m3", (128, 1), 8), ("e2m1", (64, 1), 40), ("e2m1", (32, 1), 256),
    # rows that are not whole chunks
    ("e4m3", (1, -1), 1), ("e4m3", (1, -1), 3), ("e4m3", (1, -1), 12), ("e4m3", (1, -1), 13),
    ("e4m3", (1, -1), 1001), ("e2m1", (1, -1), 2), ("e2m1", (1, -1), 6), ("e2m1", (1, -1), 12),
    ("e2m1", (1, -1), 1002), ("e4m3", (16, 1), 5), ("e4m3", (128, 1), 100), ("e2m1", (16, 1), 6),
    ("e2m1", (64, 1), 14),
]


@pytest.mark.parametrize("rows", (1, 3, 17, 129, 300))
@pytest.mark.parametrize("case", GEOMETRIES, ids=lambda c: f"{c[0]}-{c[1][0]}x{c[1][1]}-H{c[2]}")
def test_geometries_both_out_dtypes(quant, case, rows):
    fmt, (bm, bk), hidden = case
    bk = hidden if bk == -1 else bk
    data = random_data(rows, hidden, fmt, seed=rows * 1000 + hidden)
    for i, out_dtype in enumerate(OUT_DTYPES):
        storage = ("fp32", "ue8m0", "packed")[(rows + i) % 3]
        layout = ("row", "col", "strided")[(hidden + i) % 3]
        sf = random_sf(-(-rows // bm), hidden // bk, storage, layout, seed=rows + hidden + i)
        check(quant, data, sf, fmt, (bm, bk), out_dtype, f"T={rows} {storage} {layout}")


@pytest.mark.parametrize("storage", ("fp32", "ue8m0", "packed"))
@pytest.mark.parametrize("layout", ("row", "col", "strided"))
def test_every_sf_storage_and_layout(quant, storage, layout):
    for fmt, (bm, bk), hidden in (("e4m3", (1, 128), 1024), ("e2m1", (1, 32), 256), ("e5m6", (1, 512), 512),
                                  ("e4m3", (64, 1), 40), ("e4m3", (1, 13), 13), ("e2m1", (16, 1), 6),
                                  ("e4m3", (128, 128), 256)):
        data = random_data(37, hidden, fmt, seed=hidden)
        sf = random_sf(-(-37 // bm), hidden // bk, storage, layout, seed=bk)
        for out_dtype in OUT_DTYPES:
            check(quant, data, sf, fmt, (bm, bk), out_dtype, f"{storage} {layout}")


@pytest.mark.parametrize("fmt,block,hidden", [("e4m3", (1, 128), 256), ("e4m3", (1, 7), 7), ("e2m1", (1, 6), 6),
                                              ("e5m6", (1, 16), 16), ("e4m3", (16, 1), 9)])
def test_data_off_a_16_byte_boundary(quant, fmt, block, hidden):
    """data a view that starts one row (or one byte) into its storage."""
    base = random_data(41, hidden, fmt, seed=7)
    views = [base[1:]]
    if fmt == "e4m3":
        views.append(base.view(torch.uint8).reshape(-1)[1:1 + 40 * hidden].view(torch.float8_e4m3fn).reshape(40, -1))
    for data in views:
        sf = random_sf(-(-data.shape[0] // block[0]), hidden // block[1], "fp32", "row", seed=8)
        for out_dtype in OUT_DTYPES:
            check(quant, data, sf, fmt, block, out_dtype, f"offset {data.data_ptr() % 16}")


@pytest.mark.parametrize("limit", (64, 100, 4096))
def test_launches_in_pieces(quant, monkeypatch, limit):
    """A lowered element limit cuts the rows into launches; with H % 8 != 0 and fewer than 8 rows a
    launch, pieces start inside a chunk (aligned copies)."""
    monkeypatch.setattr(quant.dequant, "BACK_MAX_ELEMENTS", limit)
    for fmt, block, hidden in (("e4m3", (1, 13), 13), ("e4m3", (16, 1), 7), ("e2m1", (1, 6), 6),
                               ("e4m3", (1, 16), 32), ("e5m6", (1, 16), 16), ("e2m1", (32, 32), 64),
                               ("e4m3", (1, 3), 3), ("e2m1", (128, 1), 10), ("e4m3", (1, 200), 200)):
        for rows in (1, 9, 33, 70):
            data = random_data(rows, hidden, fmt, seed=rows)
            for i, out_dtype in enumerate(OUT_DTYPES):
                sf = random_sf(-(-rows // block[0]), hidden // block[1], ("fp32", "ue8m0")[i], ("row", "col")[i],
                               seed=rows + i)
                check(quant, data, sf, fmt, block, out_dtype, f"limit {limit} T={rows}")


def test_no_rows(quant):
    for fmt, hidden in (("e4m3", 13), ("e2m1", 64), ("e5m6", 16)):
        data = random_data(0, hidden, fmt, seed=0)
        for out_dtype in OUT_DTYPES:
            check(quant, data, torch.ones(0, 1, device="cuda"), fmt, (1, hidden), out_dtype)


def test_tuning_candidates_are_bitwise_equal(quant, monkeypatch):
    """Each CAST_BACK_TUNE_CONFIGS candidate (through CAST_BACK_OVERRIDES) gives the shipped bytes."""
    data = random_data(130, 7168, "e4m3", seed=11)
    sf = random_sf(130, 56, "fp32", "row", seed=12)
    shipped = quant.cast_back(data, sf, "e4m3", (1, 128), torch.bfloat16)
    for config in quant.CAST_BACK_TUNE_CONFIGS:
        monkeypatch.setitem(quant.CAST_BACK_OVERRIDES, (config.fmt, config.out_dtype, config.path), config)
        out_dtype = torch.bfloat16 if config.out_dtype == "bfloat16" else torch.float32
        got = quant.cast_back(data, sf, "e4m3", (1, 128), out_dtype)
        want = shipped if out_dtype == torch.bfloat16 else quant.cast_back(data, sf, "e4m3", (1, 128), out_dtype)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), config


def test_cuda_source_stores_16_byte_vectors(tilelang_only):
    from kernels import _tilelang
    from kernels import quant as kq

    for config in kq.CAST_BACK.configs:
        source = _tilelang.lower_to_cuda(kq.build_cast_back(config), _tilelang.SM90)
        assert "*(int4*)(out" in source or "*(float4*)(out" in source, f"{config}: no 16-byte store"
        if config.out_dtype == "bfloat16":
            assert "tkq_odd_product_fast(" in source and "tkq_bf16x2_rn(" in source, config
