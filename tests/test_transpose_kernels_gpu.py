"""The TileLang transpose's tuning candidates (kernels.transpose.TRANSPOSE_TUNE_CONFIGS).

GPU tests (skipped, with the reason, without CUDA or tilelang): each candidate, put in place of the
shipped vectorized kernel through TRANSPOSE_OVERRIDES, returns the shipped kernel's bits (and
torch's) on random bits of every element width, at shapes that are multiples of the 16-byte vector
but not of the candidate's tile, with B > 1, and past a whole band of tile rows for the candidates
that walk bands.

CPU tests: the candidates' geometry and the override plumbing need no GPU.  (That their CUDA sources
call the prelude's block transpose, whose 16-byte store is spelled out in PTX, is checked in
tests/test_lowering.py, which lowers every configuration once.)
"""

from __future__ import annotations

import pytest
import torch

from kernels import transpose

# (dtype, (B, M, N)): M and N multiples of 16 / width, rarely of a tile; the last of each width runs past
# a band of 16 tile rows of 64 (f32) or 8 of 128 (bf16, e4m3)
CANDIDATE_CASES = [
    (torch.float32, (1, 256, 512)), (torch.int32, (3, 44, 68)), (torch.float32, (2, 132, 196)),
    (torch.int32, (1, 4, 4)), (torch.float32, (1, 1100, 68)),
    (torch.bfloat16, (1, 256, 512)), (torch.int16, (3, 40, 72)), (torch.bfloat16, (2, 136, 200)),
    (torch.int16, (1, 8, 8)), (torch.bfloat16, (2, 1096, 72)),
    (torch.uint8, (1, 256, 512)), (torch.int8, (3, 48, 80)), (torch.float8_e4m3fn, (2, 272, 144)),
    (torch.uint8, (1, 16, 16)), (torch.int8, (2, 1168, 48)),
]


def _case_id(case) -> str:
    dtype, shape = case
    return f"{str(dtype).removeprefix('torch.')}-{'x'.join(map(str, shape))}"


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Any bit pattern (NaN payloads included) of `dtype`, on the CPU."""
    size = torch.empty((), dtype=dtype).element_size()
    count = shape[0] * shape[1] * shape[2]
    raw = torch.randint(0, 256, (count * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _candidates_of(width: int) -> list[transpose.TransposeConfig]:
    return [c for c in transpose.TRANSPOSE_TUNE_CONFIGS if c.dtype == transpose.RAW_DTYPES[width]]


@pytest.mark.parametrize("case", CANDIDATE_CASES, ids=[_case_id(c) for c in CANDIDATE_CASES])
def test_tuning_candidates_give_the_shipped_bits(tilelang_family, monkeypatch, case):
    tilelang_family("transpose")
    dtype, shape = case
    x = random_bits(shape, dtype, torch.Generator().manual_seed(sum(shape))).cuda()
    width = x.element_size()
    base = transpose.TransposeConfig(transpose.RAW_DTYPES[width], True)
    shipped = transpose.TRANSPOSE_SHIPPED.get(base, base)
    assert transpose._choose_config(x, x.transpose(1, 2).contiguous(), width) == shipped
    want = transpose.batched_transpose(x)
    assert torch.equal(_bits(want), _bits(x.transpose(1, 2))), "the shipped kernel"
    candidates = [base] + _candidates_of(width)  # the base kernel is a candidate where another ships
    for config in candidates:
        with monkeypatch.context() as patch:
            patch.setitem(transpose.TRANSPOSE_OVERRIDES, base, config)
            out = torch.empty_like(want)
            assert transpose._choose_config(x, out, width) == config
            got = transpose.batched_transpose(x)
        assert got.shape == want.shape and got.dtype == want.dtype
        differ = (_bits(got) != _bits(want)).sum().item()
        assert differ == 0, f"{config}: {differ} bytes differ from the shipped kernel's"


# ---------------------------------------------------------------------------------------- CPU


def test_default_knobs_are_the_shipped_kernel():
    for config in transpose.STATIC_CONFIGS:
        assert config == transpose.TransposeConfig(config.dtype, config.vectorized)
    assert transpose.tile_shape(transpose.TransposeConfig("int16", True)) == (64, 64)
    assert transpose.tile_shape(transpose.TransposeConfig("uint8", True)) == (128, 128)
    assert transpose.tile_shape(transpose.TransposeConfig("int32", False)) == (64, 64)


def test_candidates_are_compiled_vectorized_configurations_of_every_width():
    configs = transpose.TRANSPOSE_TUNE_CONFIGS
    assert len(set(configs)) == len(configs)
    assert {c.dtype for c in configs} == set(transpose.RAW_DTYPES.values())
    for config in configs:
        assert config.vectorized and config != transpose.TransposeConfig(config.dtype, True)
        assert config in transpose.BATCHED_TRANSPOSE.configs
        transpose._check_tuned_tile(config)  # the geometry its swizzle and thread mapping need


@pytest.mark.parametrize("config", [
    transpose.TransposeConfig("int16", True, tile_n=32, read_bytes=16),  # rows of 4 chunks: no 8-way swizzle
    transpose.TransposeConfig("int16", True, tile_m=96, read_bytes=16),  # 12 row chunks a column
    transpose.TransposeConfig("int16", True, read_bytes=16),  # 64 blocks for 256 threads
    transpose.TransposeConfig("uint8", True, read_bytes=2),  # 2-byte pieces of 1-byte elements (narrow reads are one element)
    transpose.TransposeConfig("int32", True, read_bytes=2),  # half an element
    transpose.TransposeConfig("int32", True, tile_m=128),  # the shipped gather in another tile: no such kernel
])
def test_unsupported_tuned_geometry_is_refused(config):
    with pytest.raises(ValueError, match="unsupported tuned transpose"):
        transpose._check_tuned_tile(config)


def test_overrides_replace_only_their_shipped_configuration(monkeypatch):
    x = torch.zeros(2, 64, 128, dtype=torch.bfloat16)
    out = torch.zeros(2, 128, 64, dtype=torch.bfloat16)
    base = transpose.TransposeConfig("int16", True)
    candidate = _candidates_of(2)[0]
    monkeypatch.setitem(transpose.TRANSPOSE_OVERRIDES, base, candidate)
    assert transpose._choose_config(x, out, 2) == candidate
    assert transpose._choose_config(x[:, :, :-3], out, 2) == transpose.TransposeConfig("int16", False)
    assert transpose._choose_config(x.view(torch.int32), out.view(torch.int32), 4) == \
        transpose.TRANSPOSE_SHIPPED[transpose.TransposeConfig("int32", True)]


def test_each_width_ships_one_of_its_candidates():
    for base, shipped in transpose.TRANSPOSE_SHIPPED.items():
        assert base == transpose.TransposeConfig(base.dtype, True)
        assert shipped in _candidates_of(transpose.WIDTH_OF[base.dtype])


def test_launches_are_cut_by_the_candidate_tile():
    config = transpose.TransposeConfig("int16", True, tile_m=128, tile_n=64, threads=128, read_bytes=16)
    tiles = 2 * 4  # 256 rows / 128, 256 columns / 64
    assert transpose._batches_per_launch(config, 256, 256) == (2**31 - 1) // tiles
