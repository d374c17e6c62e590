"""The TileLang block_cast kernel (per_block_cast, its sf-only and precomputed-sf variants,
per_channel_cast) on its own paths.

GPU tests (skipped, with the reason, without CUDA or tilelang):

* against the eager implementation (kernels.torch.quant) run on the CPU, bit for bit: there
  sf = a / max_q and x / sf are correctly rounded fp32 divisions, as the kernel's are (its
  quotient is x * (1 / sf) with the Markstein correction, exact for blocks with a >= 2^-60), so
  on finite inputs with such blocks data and sf agree exactly, in every sf storage and layout;
* the kernel's paths against each other on any bit pattern (NaN, inf, subnormals): the vector
  path (H % 8 == 0, 16-byte loads) against the element path (forced through
  BLOCK_MAX_ELEMENTS_PER_LAUNCH), one launch against many (MAX_BLOCKS_PER_LAUNCH and the
  element limit cut to a tile row or two), the tuning candidates (BLOCK_TUNE_CONFIGS)
  against the shipped configuration, and a misaligned x (a view at an odd offset) against
  its aligned copy.  Each must not change a single byte.

The variants: per_block_cast_with_sf_only returns per_block_cast's sf byte for byte, and
per_block_cast_with_precomputed_sf given per_block_cast's own sf (every storage and layout) its
data (an IEEE division by sf is the correctly rounded quotient the corrected product gives), and
the eager variant's on the CPU given any sf, special values included (e4m3: NaN codes of either
sign agree; e2m1 has no NaN, so it is compared on finite quotients only by the differential suite).

Shapes reach the tiling's tails: T not a multiple of the 128-row tile or of bm, H not a
multiple of the 128-column tile (96, 160, 320), per_channel H % 8 != 0 (the element path,
partial chunks) and H < 8.
"""

from __future__ import annotations


import pytest
import torch

import kernels.torch.quant as eager


@pytest.fixture(scope="module")
def quant(tilelang_family):
    return tilelang_family("quant")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def finite_input(num_rows: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Gaussian rows at scales from 2^-12 to 2^12 (per row and per column), some zeros (CPU)."""
    g = _generator(seed)
    x = torch.randn(num_rows, hidden, generator=g)
    x = x * torch.exp2(torch.randint(-12, 13, (num_rows, 1), generator=g).float())
    x = x * torch.exp2(torch.randint(-6, 7, (1, hidden), generator=g).float())
    x[torch.rand(num_rows, hidden, generator=g) < 0.05] = 0.0
    return x.to(dtype)


def any_bits(num_rows: int, hidden: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Any bit pattern of the dtype (NaN payloads, infinities, subnormals), mixed with normal values (CPU)."""
    g = _generator(seed)
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (max(1, num_rows * hidden) * size,), dtype=torch.uint8, generator=g)
    bits = raw.view(dtype)[: num_rows * hidden].reshape(num_rows, hidden)
    normal = finite_input(num_rows, hidden, dtype, seed + 1)
    return torch.where(torch.rand(num_rows, hidden, generator=g) < 0.1, bits, normal)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.numel(), dtype=t.dtype)  # stride 1 (a 1 x 1 column-major sf is "contiguous" with stride 4)
    flat.copy_(t.reshape(-1))
    return flat.view(torch.uint8)


def assert_same_output(got, want, what: str = "") -> None:
    """data and sf: dtype, shape, strides and every byte."""
    for name, a, b in zip(("data", "sf"), got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (what, name, a.dtype, a.shape, b.dtype, b.shape)
        assert a.stride() == b.stride(), (what, name, a.stride(), b.stride())
        differ = (_bytes(a) != _bytes(b)).sum().item()
        assert differ == 0, f"{what}: {name}: {differ} bytes differ"


SF_OPTIONS = [
    {},
    {"round_sf": True},
    {"round_sf": True, "use_ue8m0": True, "use_tma_aligned_col_major_sf": True},
    {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True},
    {"use_tma_aligned_col_major_sf": True, "clamp_min": 0.5},
]
# (op, block argument, T, H): tails of the 128 x 128 tile, of bm, of H % 8.
CASES = [
    ("per_block_cast", (128, 128), 1, 128),
    ("per_block_cast", (128, 128), 129, 384),
    ("per_block_cast", (128, 128), 300, 896),
    ("per_block_cast", (32, 32), 33, 96),
    ("per_block_cast", (32, 32), 257, 160),
    ("per_block_cast", (32, 32), 127, 320),
    ("per_channel_cast", 128, 200, 256),
    ("per_channel_cast", 64, 65, 136),
    ("per_channel_cast", 32, 31, 40),
    ("per_channel_cast", 16, 129, 24),
    ("per_channel_cast", 16, 17, 66),  # H % 8 == 2: element path, even (e2m1 too)
    ("per_channel_cast", 128, 130, 6),  # H < 8
    ("per_channel_cast", 32, 100, 2),
]


def _call(quant_or_eager, op, x, fmt, block, options):
    return getattr(quant_or_eager, op)(x, fmt, block, **options)


def _ids(cases):
    return [f"{op}-{block}-{t}x{h}" for op, block, t, h in cases]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_matches_eager_cpu_bitwise(quant, case, fmt, dtype):
    op, block, num_rows, hidden = case
    x = finite_input(num_rows, hidden, dtype, seed=hidden + num_rows)
    for options in SF_OPTIONS:
        got = _call(quant, op, x.cuda(), fmt, block, options)
        want = _call(eager, op, x, fmt, block, options)
        assert_same_output(got, want, f"{options}")


# odd H only for e4m3 (e2m1 needs an even H)
ODD_CASES = [("per_channel_cast", 16, 33, 7), ("per_channel_cast", 128, 129, 131), ("per_channel_cast", 64, 3, 1)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", ODD_CASES, ids=_ids(ODD_CASES))
def test_odd_hidden_matches_eager_cpu_bitwise(quant, case, dtype):
    op, block, num_rows, hidden = case
    x = finite_input(num_rows, hidden, dtype, seed=7)
    for options in SF_OPTIONS:
        assert_same_output(_call(quant, op, x.cuda(), "e4m3", block, options),
                           _call(eager, op, x, "e4m3", block, options), f"{options}")


PATH_CASES = [c for c in CASES if c[3] % 8 == 0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("case", PATH_CASES, ids=_ids(PATH_CASES))
def test_vector_and_element_paths_agree(quant, monkeypatch, case, fmt, dtype):
    op, block, num_rows, hidden = case
    x = any_bits(num_rows, hidden, dtype, seed=3).cuda()
    for options in SF_OPTIONS[:4]:
        vector = _call(quant, op, x, fmt, block, options)
        with monkeypatch.context() as m:
            m.setattr(quant.block_cast, "BLOCK_MAX_ELEMENTS_PER_LAUNCH", 0)  # no row fits: the element path
            assert not quant._block_vectors(x)
            element = _call(quant, op, x, fmt, block, options)
        assert_same_output(element, vector, f"{options}")


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("case", [("per_block_cast", (32, 32), 700, 320), ("per_channel_cast", 16, 517, 136),
                                  ("per_channel_cast", 64, 300, 66)], ids=["block32", "channel16", "channel64-odd8"])
def test_launch_pieces_agree(quant, monkeypatch, case, fmt):
    """Cut into launches of one tile row (CTA limit) or two (element limit): the same bytes."""
    from kernels import _tilelang

    op, block, num_rows, hidden = case
    x = any_bits(num_rows, hidden, torch.bfloat16, seed=5).cuda()
    options = {"round_sf": True, "use_ue8m0": True, "use_tma_aligned_col_major_sf": True}
    whole = _call(quant, op, x, fmt, block, options)
    col_tiles = -(-hidden // quant.block_geometry(quant.block_config("bfloat16", fmt))[2])
    with monkeypatch.context() as m:
        m.setattr(_tilelang, "MAX_BLOCKS_PER_LAUNCH", col_tiles)
        assert_same_output(_call(quant, op, x, fmt, block, options), whole, "one tile row per launch")
    with monkeypatch.context() as m:
        m.setattr(quant.block_cast, "BLOCK_MAX_ELEMENTS_PER_LAUNCH", 2 * quant.BLOCK_TILE_ROWS * hidden)
        assert_same_output(_call(quant, op, x, fmt, block, options), whole, "two tile rows per launch")


@pytest.mark.parametrize("case", [("per_block_cast", (128, 128), 300, 896), ("per_block_cast", (32, 32), 129, 160),
                                  ("per_channel_cast", 16, 257, 264), ("per_channel_cast", 128, 33, 66)],
                         ids=["block128", "block32", "channel16", "channel128-odd8"])
def test_tuning_candidates_agree(quant, monkeypatch, case):
    op, block, num_rows, hidden = case
    for config in quant.BLOCK_TUNE_CONFIGS:
        dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[config.dtype]
        x = any_bits(num_rows, hidden, dtype, seed=11).cuda()
        for options in SF_OPTIONS:
            shipped = _call(quant, op, x, config.fmt, block, options)
            with monkeypatch.context() as m:
                m.setitem(quant.BLOCK_OVERRIDES, (config.dtype, config.fmt), config)
                assert_same_output(_call(quant, op, x, config.fmt, block, options), shipped, f"{config} {options}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_misaligned_x(quant, dtype):
    """x a view at an element offset (not 16-byte aligned): the same bytes as its contiguous copy."""
    num_rows, hidden = 130, 256
    storage = any_bits(1, num_rows * hidden + 3, dtype, seed=13).reshape(-1).cuda()
    x = storage[1:1 + num_rows * hidden].view(num_rows, hidden)
    assert x.data_ptr() % 16
    for op, block in (("per_block_cast", (128, 128)), ("per_channel_cast", 32)):
        assert_same_output(_call(quant, op, x, "e4m3", block, {}), _call(quant, op, x.clone(), "e4m3", block, {}), op)


@pytest.mark.parametrize("op,block", [("per_block_cast", (128, 128)), ("per_channel_cast", 128)])
def test_large_matches_eager_cpu_bitwise(quant, op, block):
    """A DeepSeek-sized slab (1024 x 7168 bf16): many tiles, the vector path's common case."""
    x = finite_input(1024 + 77, 7168, torch.bfloat16, seed=17)
    options = {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True, "use_tma_aligned_col_major_sf": True}
    for opts in ({}, options):
        assert_same_output(_call(quant, op, x.cuda(), "e4m3", block, opts), _call(eager, op, x, "e4m3", block, opts),
                           f"{opts}")


BLOCK_CASES = [c for c in CASES if c[0] == "per_block_cast"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("case", BLOCK_CASES, ids=_ids(BLOCK_CASES))
def test_sf_only_and_precomputed_sf_reproduce_per_block_cast(quant, case, fmt, dtype):
    _, block, num_rows, hidden = case
    x = finite_input(num_rows, hidden, dtype, seed=hidden + num_rows + 1).cuda()
    for options in SF_OPTIONS:
        data, sf = quant.per_block_cast(x, fmt, block, **options)
        sf_only = quant.block_cast.per_block_cast_with_sf_only(x, fmt, block, **options)
        assert_same_output((data, sf_only), (data, sf), f"sf only {options}")
        given = quant.block_cast.per_block_cast_with_precomputed_sf(x, sf, fmt, block)
        assert_same_output((given, sf), (data, sf), f"precomputed {options}")


def _e4m3_codes_nan_agnostic(t: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes with every NaN code (0x7F, 0xFF) as 0x7F."""
    b = _bytes(t)
    return torch.where((b & 0x7F) == 0x7F, torch.full_like(b, 0x7F), b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block, num_rows, hidden", [((128, 128), 257, 384), ((32, 32), 65, 160)])
def test_precomputed_sf_with_special_values_matches_eager_cpu(quant, block, num_rows, hidden, dtype):
    """sf of 0 (x / 0 = +-inf saturates, 0 / 0 = NaN), inf, NaN, subnormals, 2^127, in fp32 and (where the storage
    has them) ue8m0 bytes and packed ue8m0, row-major and column-major: IEEE division, as the eager cast's."""
    x = finite_input(num_rows, hidden, dtype, seed=23)
    x[0, :5] = torch.tensor([0.0, -0.0, 448.0, -1e-30, 3e38]).to(dtype)
    _, sf = eager.per_block_cast(x, "e4m3", block)
    g = _generator(29)
    specials = torch.tensor([0.0, float("inf"), float("nan"), 2.0**-149, 2.0**-127, 2.0**127, 1e-30])
    hit = torch.rand(sf.shape, generator=g) < 0.3
    sf = torch.where(hit, specials[torch.randint(0, len(specials), sf.shape, generator=g)], sf)
    sf[0] = 0.0
    pow2 = eager.per_block_cast(x, "e4m3", block, round_sf=True, use_ue8m0=True)[1]
    pow2[hit] = torch.tensor([0, 0xFF, 1, 254], dtype=torch.uint8)[torch.randint(0, 4, (int(hit.sum()),), generator=g)]
    packed = eager.per_block_cast(x, "e4m3", block, round_sf=True, use_ue8m0=True, use_packed_ue8m0=True)[1]
    for given in (sf, sf.T.contiguous().T, pow2, packed):
        got = quant.block_cast.per_block_cast_with_precomputed_sf(x.cuda(), given.cuda(), "e4m3", block)
        want = eager.per_block_cast_with_precomputed_sf(x, given, "e4m3", block)
        assert got.dtype == want.dtype and got.shape == want.shape
        differ = (_e4m3_codes_nan_agnostic(got) != _e4m3_codes_nan_agnostic(want)).sum().item()
        assert differ == 0, f"{given.dtype} {given.stride()}: {differ} codes differ"


def test_variants_of_an_empty_x(quant):
    x = torch.zeros(0, 256, dtype=torch.bfloat16, device="cuda")
    sf = quant.block_cast.per_block_cast_with_sf_only(x, "e4m3", (128, 128), use_tma_aligned_col_major_sf=True)
    assert sf.shape == (0, 2) and sf.dtype == torch.float32
    data = quant.block_cast.per_block_cast_with_precomputed_sf(x, torch.ones(0, 2, device="cuda"), "e2m1", (128, 128))
    assert data.shape == (0, 128) and data.dtype == torch.int8
