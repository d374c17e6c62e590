"""The TileLang kernels on row-strided inputs: the same bits as on the contiguous copy.

GPU tests (skipped, with the reason, without CUDA or tilelang).  The token_cast kernel (per_token_cast,
its sf-only and precomputed-sf variants, swiglu_forward_and_per_token_cast) reads x in place at any
row stride whose rows start on 16-byte boundaries, and from a contiguous copy otherwise.  Each call on
a strided x must equal, bit for bit, the same call on ``x.contiguous()``:

* layouts: rows padded by 16 bytes, by 128 elements, by a whole row (in place); by one or three
  elements, or starting one element into the buffer (unaligned: the copy); a slice of a taller buffer
  (a storage offset of whole rows); the padding and everything around the slice NaN, so a read past
  a row shows;
* every path of the kernel: the fast paths (K = 4 and K = 2), the row path (npc = H, one team per
  row, with partial last slots), the generic path (short rows, and every block forced onto it), rows
  of H % 8 != 0 (zero-padded copies), launches cut into pieces of a few rows (`MAX_X_WORDS_PER_LAUNCH`
  lowered), every shipped and tuning configuration (`TOKEN_OVERRIDES`), each sf storage option;
* swiglu's gate and up halves at the row stride, plain and routed (padding rows, weights, clamp and
  its counts).

The transposes read x in place at its row and batch strides: the vectorized variants (base and
every tuning configuration, through `TRANSPOSE_OVERRIDES`) where x's rows start on 16-byte
boundaries, the scalar one otherwise; batch entries padded, interleaved by rows, in launches of one
entry.  topk_gate reads scores in place at any row stride, every width configuration.
"""

from __future__ import annotations

import pytest
import torch

from strategies.layouts import batch_slice, row_strided
from tkverify.case import strided_view

FORMATS = ("e4m3", "e2m1", "e5m6")
DTYPES = (torch.bfloat16, torch.float32)
SF_OPTIONS = (
    {},
    {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True},
    {"round_sf": True, "use_ue8m0": True, "use_tma_aligned_col_major_sf": True},
)
# (H, T, num_per_channels or None for H): fast K = 4 (bf16 npc 128) / K = 2 (npc 16, fp32 npc 128),
# row path (npc = H: 40 and 897 chunks, partial last slots), generic (npc = H = 200: 25 chunks, under
# a row path's 32; 16392: past every row path), H % 8 != 0 (a zero-padded copy).
CAST_SHAPES = ((256, 37, 128), (512, 9, 16), (320, 33, None), (7176, 5, None), (200, 41, None), (16392, 3, None),
               (100, 7, None))
SWIGLU_HIDDEN = (256, 2048, 320, 7176, 100)


@pytest.fixture(scope="module")
def quant(tilelang_family):
    return tilelang_family("quant")


def _block(fmt: str, hidden: int, npc: int | None) -> int:
    """num_per_channels of a call: `npc`, or H where it is None or the format is e5m6 (one block a row)."""
    return hidden if npc is None or fmt == "e5m6" else npc


def _skip_unsupported(fmt: str, hidden: int) -> None:
    if fmt == "e2m1" and hidden % 2:
        pytest.skip("e2m1 needs an even H")
    if fmt == "e5m6" and hidden % 8:
        pytest.skip("e5m6 needs H a multiple of 8")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same_bits(got, want, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride(), f"{what} [{i}]"
        if w.numel():
            differ = (_bits(g) != _bits(w)).sum().item()
            assert differ == 0, f"{what} [{i}]: {differ} bytes differ"


def _unaligned_start(x: torch.Tensor) -> torch.Tensor:
    """x's values in buf[:, 1:H + 1] of a NaN-filled (T, H + 2) buffer: every row starts one element in."""
    rows, cols = x.shape
    return strided_view(x, (cols + 2, 1), 1, rows * (cols + 2))


def _taller_slice(x: torch.Tensor, pad: int) -> torch.Tensor:
    """x's values in rows 2 .. T + 1 of a NaN-filled buffer of T + 3 rows, each `pad` elements longer."""
    rows, cols = x.shape
    stride = cols + pad
    return strided_view(x, (stride, 1), 2 * stride, (rows + 3) * stride)


def layouts_of(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """x in every layout the kernels are tested on, by name (see the module docstring)."""
    vector = 16 // x.element_size()
    return {
        "pad 16 bytes": row_strided(x, vector),
        "pad 128": row_strided(x, 128),
        "pad a row": row_strided(x, x.shape[1]),
        "pad 1": row_strided(x, 1),
        "pad 3": row_strided(x, 3),
        "unaligned start": _unaligned_start(x),
        "slice of taller rows": _taller_slice(x, vector),
        "batch slice": batch_slice(x),
    }


def _input(shape, dtype, seed: int) -> torch.Tensor:
    """randn rows at scales 2^-8 .. 2^8, with a NaN, an inf, a zero row and the amax at a row's end."""
    g = torch.Generator("cuda").manual_seed(seed)
    rows, cols = shape
    x = torch.randn(shape, generator=g, device="cuda") * torch.exp2(
        torch.randint(-8, 8, (rows, 1), device="cuda", generator=g).float())
    x[0, -1] = 200.0
    if rows > 3:
        x[1] = 0.0
        x[2, cols // 2] = float("nan")
        x[3, 0] = -float("inf")
    return x.to(dtype)


def _each_layout(x: torch.Tensor, call, what: str) -> None:
    """call(layout of x) equals call(x.contiguous()) bit for bit, for every layout of `layouts_of`."""
    want = call(x.contiguous())
    want = want if isinstance(want, tuple) else (want,)
    for name, strided in layouts_of(x).items():
        assert torch.equal(strided.nan_to_num(), x.nan_to_num()), name
        got = call(strided)
        assert_same_bits(got if isinstance(got, tuple) else (got,), want, f"{what} {name}")


@pytest.mark.parametrize("hidden, rows, npc", CAST_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp32"))
@pytest.mark.parametrize("fmt", FORMATS)
def test_per_token_cast_on_strided_rows(quant, fmt, dtype, hidden, rows, npc):
    npc = _block(fmt, hidden, npc)
    _skip_unsupported(fmt, hidden)
    x = _input((rows, hidden), dtype, hidden + rows)
    for options in SF_OPTIONS:
        what = f"{fmt} {dtype} H={hidden} npc={npc} {options}"
        _each_layout(x, lambda v: quant.per_token_cast(v, fmt, npc, **options), what)
        _each_layout(x, lambda v: quant.per_token_cast_with_sf_only(v, fmt, npc, **options), f"sf only {what}")
    sf = quant.per_token_cast(x, fmt, npc, round_sf=True)[1]
    _each_layout(x, lambda v: quant.per_token_cast_with_precomputed_sf(v, sf, fmt, npc), f"precomputed {fmt} {npc}")


@pytest.mark.parametrize("hidden, rows, npc", CAST_SHAPES[:4])
def test_strided_rows_on_the_generic_path(quant, monkeypatch, hidden, rows, npc):
    """Every block on the generic path (its own chunk order) at the row stride."""
    x = _input((rows, hidden), torch.bfloat16, 3)
    with monkeypatch.context() as patch:
        patch.setattr(quant.token_cast, "_token_geometry", quant.token_cast._generic_geometry)
        for fmt in FORMATS:
            _each_layout(x, lambda v: quant.per_token_cast(v, fmt, _block(fmt, hidden, npc)),
                         f"generic {fmt} H={hidden}")


@pytest.mark.parametrize("hidden, rows, npc", ((256, 37, 128), (320, 33, None), (16392, 5, None)))
def test_strided_rows_in_launch_pieces_of_a_few_rows(quant, monkeypatch, hidden, rows, npc):
    """Launches of a few rows each (the words cap lowered): each piece's rows at the row stride."""
    x = _input((rows, hidden), torch.bfloat16, 5)
    for pieces_of in (2, 3):
        with monkeypatch.context() as patch:
            # the cap counts the widest layout's row words (a whole row of padding): pieces of <= pieces_of rows
            patch.setattr(quant.token_cast, "MAX_X_WORDS_PER_LAUNCH", pieces_of * hidden)
            _each_layout(x, lambda v: quant.per_token_cast(v, "e4m3", npc or hidden), f"pieces of {pieces_of}")


def _token_configs(quant):
    kernel = quant.token_kernel
    return [c for c in kernel.TOKEN_CAST.configs if c.source == "x"]


def test_every_token_cast_configuration_on_strided_rows(quant, monkeypatch):
    """Each configuration of the x source (shipped, precomputed-sf and tuning ones) at the row stride."""
    kernel = quant.token_kernel
    for config in _token_configs(quant):
        dtype = getattr(torch, config.dtype)
        key = (config.source, config.dtype, config.fmt, config.precomputed)
        with monkeypatch.context() as patch:
            patch.setitem(kernel.TOKEN_OVERRIDES, key, config)
            for hidden, rows, npc in ((7168, 9, 128), (7176, 5, None), (256, 37, 32)):
                x = _input((rows, hidden), dtype, rows)
                npc = _block(config.fmt, hidden, npc)
                what = f"{config} H={hidden} npc={npc}"
                if config.precomputed:
                    sf = quant.per_token_cast(x.contiguous(), config.fmt, npc)[1]
                    _each_layout(x, lambda v: quant.per_token_cast_with_precomputed_sf(v, sf, config.fmt, npc), what)
                else:
                    _each_layout(x, lambda v: quant.per_token_cast(v, config.fmt, npc), what)


def _routing(rows: int, seed: int) -> dict:
    g = torch.Generator("cuda").manual_seed(seed)
    pos = torch.randperm(rows, device="cuda", generator=g).to(torch.int32)
    pos[::3] = -1
    return {"pos_to_token_topk": pos, "topk_weights": torch.rand(rows, 1, device="cuda", generator=g)}


@pytest.mark.parametrize("hidden", SWIGLU_HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp32"))
@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu_on_strided_rows(quant, fmt, dtype, hidden):
    """The gate and up halves at the row stride, plain and routed with clamp counts (the counts too)."""
    _skip_unsupported(fmt, hidden)
    rows = 19
    x = _input((rows, 2 * hidden), dtype, hidden) * 4
    for npc in dict.fromkeys((_block(fmt, hidden, 128 if hidden % 128 == 0 else None), hidden)):
        what = f"swiglu {fmt} {dtype} H={hidden} npc={npc}"
        _each_layout(x, lambda v: quant.swiglu_forward_and_per_token_cast(v, fmt, npc), what)
        routing = _routing(rows, hidden)

        def routed(v):
            counts = torch.zeros(3, dtype=torch.int64, device="cuda")
            data, sf = quant.swiglu_forward_and_per_token_cast(v, fmt, npc, clamp=7.0, clamped_count=counts,
                                                               **routing)
            return data, sf, counts

        _each_layout(x, routed, f"routed {what}")


def test_swiglu_configurations_on_strided_rows(quant, monkeypatch):
    """Each swiglu configuration of the kernel (shipped and tuning) at the row stride."""
    kernel = quant.token_kernel
    for config in [c for c in kernel.TOKEN_CAST.configs if c.source == "swiglu"]:
        key = (config.source, config.dtype, config.fmt, config.precomputed)
        x = _input((11, 2 * 2048), getattr(torch, config.dtype), 1)
        with monkeypatch.context() as patch:
            patch.setitem(kernel.TOKEN_OVERRIDES, key, config)
            for npc in dict.fromkeys((_block(config.fmt, 2048, 128), 2048)):
                _each_layout(x, lambda v: quant.swiglu_forward_and_per_token_cast(v, config.fmt, npc),
                             f"{config} npc={npc}")


# -- transpose ---------------------------------------------------------------------------------------

RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
# (M, N) per element width: vectorized with tail tiles (multiples of 16 / width), and scalar (odd sizes)
TRANSPOSE_SHAPES = {1: ((144, 272), (37, 53)), 2: ((136, 200), (37, 53)), 4: ((68, 132), (37, 53))}


@pytest.fixture(scope="module")
def transpose(tilelang_family):
    return tilelang_family("transpose")


def _raw_bits(shape, width: int, seed: int) -> torch.Tensor:
    """Random raw bits of `width` bytes (NaN payloads and -0 among them, as the kernel moves them)."""
    g = torch.Generator("cuda").manual_seed(seed)
    return torch.randint(0, 256, (*shape[:-1], shape[-1] * width), dtype=torch.uint8, device="cuda",
                         generator=g).view(RAW[width])


def _batched_layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """x (B, M, N) in batch layouts: padded rows and batch entries, and batch entries interleaved by rows."""
    batch, rows, cols = x.shape
    vector = 16 // x.element_size()
    padded = strided_view(x, ((rows + 1) * (cols + vector), cols + vector, 1), cols + vector,
                          (batch * (rows + 1) + 1) * (cols + vector))
    interleaved = strided_view(x, (cols + vector, batch * (cols + vector), 1), 0, rows * batch * (cols + vector))
    return {"padded rows and entries": padded, "entries interleaved by rows": interleaved,
            "unaligned rows": row_strided(x, 1)}


@pytest.mark.parametrize("width", sorted(RAW))
def test_transpose_on_strided_rows(transpose, width):
    """Each variant (vectorized where the rows stay 16-byte aligned, scalar otherwise) at the row stride."""
    for rows, cols in TRANSPOSE_SHAPES[width]:
        x = _raw_bits((rows, cols), width, rows)
        want = transpose.transpose(x)
        for name, strided in layouts_of(x).items():
            assert torch.equal(strided, x), name
            assert_same_bits((transpose.transpose(strided),), (want,), f"width {width} {rows}x{cols} {name}")
        for name, batched in _batched_layouts(torch.stack([x, x.flip(0)])).items():
            want_batched = transpose.batched_transpose(batched.contiguous())
            assert_same_bits((transpose.batched_transpose(batched),), (want_batched,),
                             f"batched width {width} {rows}x{cols} {name}")


def test_every_transpose_configuration_on_strided_rows(transpose, monkeypatch):
    """Each vectorized configuration (base and tuning candidates) on aligned strided rows, in launches
    of one batch entry each."""
    for config in [c for c in transpose.BATCHED_TRANSPOSE.configs if c.vectorized]:
        width = transpose.WIDTH_OF[config.dtype]
        base = transpose.TransposeConfig(config.dtype, True)
        x = torch.stack([_raw_bits((272, 272), width, s) for s in range(3)])
        with monkeypatch.context() as patch:
            patch.setitem(transpose.TRANSPOSE_OVERRIDES, base, config)
            want = transpose.batched_transpose(x)
            layouts = {**_batched_layouts(x), "padded rows": row_strided(x, 128)}
            del layouts["unaligned rows"]  # the scalar variant, whatever the override
            for name, strided in layouts.items():
                assert transpose._choose_config(strided, want, width) == config, name
                assert_same_bits((transpose.batched_transpose(strided),), (want,), f"{config} {name}")
                with monkeypatch.context() as pieces:
                    pieces.setattr(transpose, "_batches_per_launch", lambda *args: 1)
                    assert_same_bits((transpose.batched_transpose(strided),), (want,), f"{config} {name} pieces")


# -- moe.topk_gate -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moe(tilelang_family):
    return tilelang_family("moe")


@pytest.mark.parametrize("experts", (1, 7, 32, 100, 256, 1024))
def test_topk_gate_on_strided_rows(moe, experts):
    """Every width configuration at the row stride; ties, NaN and signed zeros in the rows."""
    g = torch.Generator("cuda").manual_seed(experts)
    scores = torch.randint(-4, 4, (37, experts), generator=g, device="cuda").float()  # many ties
    scores[1, experts // 2] = float("nan")
    scores[2] = -0.0
    scores[3, 0] = float("inf")
    for k in dict.fromkeys((1, min(experts, 8), min(experts, 32))):
        _each_layout(scores, lambda v: moe.topk_gate(v, k), f"E={experts} k={k}")
