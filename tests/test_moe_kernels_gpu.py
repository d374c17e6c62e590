"""The TileLang routing kernels (kernels.moe) against the eager PyTorch implementation (kernels.torch.moe).

GPU tests (skipped, with the reason, without CUDA or tilelang): hand-picked
adversarial inputs - masked slots, empty experts, every token on one expert,
alignment 1 / 16 / 64 / 128 / 1024, T = 0, 1 and odd, hidden sizes that are
not a multiple of a tile or of a 16-byte vector, misaligned x (the fallback
configurations), positions outside [0, N) - each compared bit for bit with the
torch implementation run on the same device.  reduce_fused is compared bit for
bit too (both add the same rounded terms in the same order), with NaN equal to
NaN whatever its payload.  fused_mapping is also run repeatedly and with other
chunk sizes (its only launch-size knob), which must not change a single bit.

Source tests (tilelang only, no GPU): the generated CUDA of each configuration
has the 16-byte vector accesses, IEEE intrinsics and no fast-math that the
kernels' exactness and speed rely on.
"""

from __future__ import annotations


import numpy as np
import pytest
import torch

import kernels.torch.moe as eager


@pytest.fixture(scope="module")
def moe(tilelang_family):
    return tilelang_family("moe")



def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.device == want.device, (what, got.device, want.device)
    if want.numel():
        differ = (_bits(got) != _bits(want)).sum().item()
        assert differ == 0, f"{what}: {differ} bytes differ"


def assert_same_values(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Bitwise equal, except that any NaN equals any NaN (bf16 rounding may canonicalise payloads)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    assert torch.equal(nan_got, nan_want), f"{what}: NaNs at different places"
    keep = ~nan_got
    assert_same_bits(got[keep], want[keep], what)


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Any bit pattern (NaN payloads included) of `dtype`, on the CPU."""
    size = torch.empty((), dtype=dtype).element_size()
    count = int(np.prod(shape))
    raw = torch.randint(0, 256, (max(1, count) * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype)[:count].reshape(shape)


# ------------------------------------------------------------------ routings

def routing(kind: str, num_tokens: int, k: int, num_experts: int, g: torch.Generator) -> torch.Tensor:
    """int64 (T, K) topk_idx of one of a few shapes of routing (CPU)."""
    if kind == "uniform":  # repeats allowed: a row may name an expert twice
        idx = torch.randint(0, num_experts, (num_tokens, k), generator=g)
    elif kind == "distinct":  # a real top-k: distinct experts per row
        idx = torch.rand(num_tokens, num_experts, generator=g).argsort(dim=1)[:, :k]
    elif kind == "one_expert":  # every pair on the last expert; the others empty
        idx = torch.full((num_tokens, k), num_experts - 1)
    elif kind == "two_experts":  # most experts empty
        idx = torch.randint(0, 2, (num_tokens, k), generator=g) * (num_experts // 2)
    elif kind == "masked":  # expert parallelism: 40 % of the slots masked, some with large negatives
        idx = torch.randint(0, num_experts, (num_tokens, k), generator=g)
        idx[torch.rand(num_tokens, k, generator=g) < 0.4] = -1
        idx[torch.rand(num_tokens, k, generator=g) < 0.05] = -(2**62)
    elif kind == "all_masked":
        idx = torch.full((num_tokens, k), -1)
    else:
        raise ValueError(kind)
    return idx.to(torch.int64).contiguous()


# (routing, T, K, E, alignment)
MAPPING_CASES = [
    ("uniform", 0, 8, 16, 128),
    ("uniform", 1, 1, 1, 1),
    ("masked", 1, 8, 256, 128),
    ("one_expert", 33, 8, 256, 16),
    ("two_experts", 257, 4, 64, 64),
    ("masked", 333, 9, 64, 64),
    ("all_masked", 65, 8, 32, 128),
    ("uniform", 1000, 32, 1024, 1),
    ("masked", 2047, 6, 1000, 1024),
    ("distinct", 4097, 8, 7, 128),
    ("distinct", 16384, 8, 256, 128),
]


@pytest.mark.parametrize("case", MAPPING_CASES, ids=["-".join(map(str, c)) for c in MAPPING_CASES])
def test_fused_mapping_matches_torch(moe, case):
    kind, num_tokens, k, num_experts, alignment = case
    idx = routing(kind, num_tokens, k, num_experts, _generator(1)).cuda()
    got = moe.fused_mapping(idx, num_experts, alignment)
    want = eager.fused_mapping(idx, num_experts, alignment)
    names = ("pos_to_token", "pos_to_token_topk", "token_topk_to_pos", "expert_start", "expert_end")
    for name, a, b in zip(names, got[:5], want[:5]):
        assert_same_bits(a, b, name)
    assert type(got[5]) is int and got[5] == want[5]


@pytest.mark.parametrize("case", [MAPPING_CASES[5], MAPPING_CASES[8], MAPPING_CASES[10]],
                         ids=["odd-masked", "alignment-1024", "16384x8"])
def test_fused_mapping_is_deterministic(moe, case):
    """Repeated runs, and every chunk size (the count/place kernels' launch shape), give the same bits."""
    kind, num_tokens, k, num_experts, alignment = case
    idx = routing(kind, num_tokens, k, num_experts, _generator(2)).cuda()
    first = moe.fused_mapping(idx, num_experts, alignment)
    runs = [moe.fused_mapping(idx, num_experts, alignment) for _ in range(3)]
    runs += [moe.mapping._fused_mapping(idx, num_experts, alignment, chunk_batches)
             for chunk_batches in (1, 2, 5, 64, 1024)]
    for run in runs:
        for a, b in zip(run[:5], first[:5]):
            assert_same_bits(a, b)
        assert run[5] == first[5]


def test_fused_mapping_rejects_experts_beyond_e(moe):
    idx = routing("uniform", 50, 4, 8, _generator(3))
    idx[3, 1] = 8
    idx[7, 0] = 2**63 - 1
    with pytest.raises(ValueError, match="2 entries >= num_experts=8"):
        moe.fused_mapping(idx.cuda(), 8, 16)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("num_tokens,k,num_groups", [(0, 8, 16), (1, 1, 1), (7, 3, 7), (2049, 8, 256),
                                                     (4099, 9, 1024), (16384, 8, 256)])
def test_group_count_matches_torch(moe, dtype, num_tokens, k, num_groups):
    g = _generator(4)
    idx = torch.randint(-3, num_groups + 3, (num_tokens, k), generator=g).to(dtype)
    flat = idx.view(-1)
    if flat.numel() >= 4:
        info = torch.iinfo(dtype)
        flat[0], flat[1], flat[2] = info.max, info.min, num_groups
        if dtype == torch.int64:
            flat[3] = 2**32 + 1  # not group 1
    idx = idx.cuda()
    assert_same_bits(moe.group_count(idx, num_groups), eager.group_count(idx, num_groups))


# ----------------------------------------------------------------- positions

def positions(layout: str, num_tokens: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, int]:
    """(token_topk_to_pos int32 (T, K) on the CPU, N).

    "mapping": fused_mapping's layout of a masked routing over 64 experts,
    aligned to 16 (padding rows between segments); "scattered": the placed
    pairs at random distinct rows of N = placed + 37 rows, plus a few
    positions >= N (to be skipped).
    """
    if layout == "mapping":
        idx = routing("masked", num_tokens, k, 64, g)
        _, _, pos, _, _, num_rows = eager.fused_mapping(idx, 64, 16)
        return pos, num_rows
    placed = torch.rand(num_tokens, k, generator=g) < 0.7
    num_rows = int(placed.sum()) + 37
    pos = torch.full((num_tokens, k), -1, dtype=torch.int32)
    pos[placed] = torch.randperm(num_rows, generator=g)[: int(placed.sum())].to(torch.int32)
    if num_tokens:
        pos[0, 0] = num_rows + 5
        pos[-1, -1] = 2**31 - 1
    return pos, num_rows


def tma_column_major(sf: torch.Tensor) -> torch.Tensor:
    out = eager.column_major_zeros(sf.shape[0], sf.shape[1], sf.dtype, sf.device)
    out.copy_(sf)
    assert eager.is_tma_column_major(out) or sf.shape[1] == 1
    return out


def _case_ids(cases) -> list[str]:
    return ["-".join(str(v).replace("torch.", "") for v in c) for c in cases]


# (dtype, T, K, H, position layout)
EXPAND_CASES = [
    (torch.bfloat16, 0, 8, 7168, "mapping"),
    (torch.bfloat16, 1, 8, 7168, "mapping"),
    (torch.bfloat16, 333, 8, 7168, "scattered"),
    (torch.bfloat16, 129, 9, 7, "mapping"),
    (torch.bfloat16, 65, 2, 129, "scattered"),
    (torch.float32, 33, 4, 1, "mapping"),
    (torch.float32, 300, 32, 1000, "scattered"),
    (torch.float16, 77, 3, 24, "mapping"),
    (torch.float8_e4m3fn, 257, 8, 7168, "mapping"),
    (torch.float8_e5m2, 31, 5, 17, "scattered"),
    (torch.int8, 64, 6, 3584, "scattered"),
    (torch.uint8, 63, 6, 3, "mapping"),
]


@pytest.mark.parametrize("case", EXPAND_CASES, ids=_case_ids(EXPAND_CASES))
def test_expand_to_fused_matches_torch(moe, case):
    dtype, num_tokens, k, hidden, layout = case
    g = _generator(5)
    pos, num_rows = positions(layout, num_tokens, k, g)
    x = random_bits((num_tokens, hidden), dtype, g).cuda()
    pos = pos.cuda()
    assert_same_bits(moe.expand_to_fused(x, pos, num_rows), eager.expand_to_fused(x, pos, num_rows))


def test_expand_to_fused_misaligned_x_takes_the_fallback(moe):
    """x starting 2 bytes past a 16-byte boundary: smaller units, the same bits."""
    g = _generator(6)
    pos, num_rows = positions("mapping", 100, 4, g)
    storage = random_bits((100 * 64 + 1,), torch.bfloat16, g).cuda()
    x = storage[1:].view(100, 64)
    assert x.data_ptr() % 16 != 0
    pos = pos.cuda()
    assert_same_bits(moe.expand_to_fused(x, pos, num_rows), eager.expand_to_fused(x, pos, num_rows))


def test_expand_to_fused_without_rows(moe):
    g = _generator(7)
    x = random_bits((5, 16), torch.bfloat16, g).cuda()
    pos = torch.full((5, 2), -1, dtype=torch.int32, device="cuda")
    assert_same_bits(moe.expand_to_fused(x, pos, 0), eager.expand_to_fused(x, pos, 0))
    assert_same_bits(moe.expand_to_fused(x, pos, 9), eager.expand_to_fused(x, pos, 9))  # only padding rows
    sf = random_bits((5, 3), torch.float32, g).cuda()
    for layout in (sf, tma_column_major(sf)):
        got, want = moe.expand_to_fused(x, pos, 9, layout), eager.expand_to_fused(x, pos, 9, layout)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])
        assert got[1].stride() == want[1].stride()


# (dtype, T, K, H, position layout): rows of 896 units (the bench's), tails of a 256-, 512- and 1024-unit
# tile (125, 250, 1025 units), a single token, and more logical blocks than a persistent wave
EXPAND_TUNE_CASES = [
    (torch.bfloat16, 1, 8, 7168, "mapping"),
    (torch.bfloat16, 333, 8, 7168, "scattered"),
    (torch.bfloat16, 129, 9, 1000, "mapping"),
    (torch.float32, 300, 32, 1000, "scattered"),
    (torch.bfloat16, 65, 3, 8200, "mapping"),
    (torch.bfloat16, 2049, 8, 7168, "mapping"),
]


@pytest.mark.parametrize("case", EXPAND_TUNE_CASES,
                         ids=_case_ids(EXPAND_TUNE_CASES))
def test_expand_tuning_candidates_give_the_shipped_bits(moe, monkeypatch, case):
    """Every row-kernel configuration a tuning run may time (kernels.moe.EXPAND_TUNE_CONFIGS) returns
    the shipped configuration's bits: out, padding rows, and a row-major sf moved by the same kernel."""
    dtype, num_tokens, k, hidden, layout = case
    g = _generator(12)
    pos, num_rows = positions(layout, num_tokens, k, g)
    x = random_bits((num_tokens, hidden), dtype, g).cuda()
    sf = random_bits((num_tokens, 4), torch.float32, g).cuda()  # 16-byte rows: the 16-byte row kernel too
    pos = pos.cuda()
    want, want_sf = moe.expand_to_fused(x, pos, num_rows, sf)
    assert_same_bits(want, eager.expand_to_fused(x, pos, num_rows), "shipped out")
    base = moe.ExpandConfig("rows", 16)  # the override key; the one-unit kernel the other widths ship
    for config in (base,) + moe.EXPAND_TUNE_CONFIGS:
        with monkeypatch.context() as patch:
            patch.setitem(moe.EXPAND_OVERRIDES, base, config)
            assert moe.expand_rows_config(16) == config
            got, got_sf = moe.expand_to_fused(x, pos, num_rows, sf)
        assert_same_bits(got, want, f"{config} out")
        assert_same_bits(got_sf, want_sf, f"{config} out_sf")


# (T, K, position layout): a single token, chunks of 256 tokens (K 8) with a partial last one, 227 (K 9:
# 2043 of a chunk's 2048 slots), 64 (K 32), positions >= N and masked slots ("scattered")
EXPAND_ORDER_CASES = [(1, 8, "mapping"), (333, 8, "scattered"), (2049, 8, "mapping"), (500, 9, "mapping"),
                      (300, 32, "scattered")]


@pytest.mark.parametrize("case", EXPAND_ORDER_CASES, ids=_case_ids(EXPAND_ORDER_CASES))
def test_expand_order_buckets_each_chunk_by_position(moe, case):
    """The gather's order (kernels.moe.expand._expand_order): each chunk's pairs with a row (0 <= pos < N), as
    (pos << 32) + token, in position-bucket order (the order inside a bucket is free), then -1 for the
    chunk's other slots; and row_src as the map kernel sets it."""
    num_tokens, k, layout = case
    pos, num_rows = positions(layout, num_tokens, k, _generator(13))
    token = torch.arange(num_tokens).repeat_interleave(k).view(num_tokens, k)
    row_src = torch.full((num_rows,), -1, dtype=torch.int32, device="cuda")
    from kernels import _tilelang

    order = moe.expand._expand_order(pos.cuda(), row_src, _tilelang.target_for(row_src.device)).cpu()
    chunk_tokens = moe.ORDER_SLOTS // k
    chunks = -(-num_tokens // chunk_tokens)
    assert order.shape == (chunks * moe.ORDER_SLOTS,)
    for c in range(chunks):
        p, t = pos[c * chunk_tokens:(c + 1) * chunk_tokens], token[c * chunk_tokens:(c + 1) * chunk_tokens]
        reached = (p >= 0) & (p < num_rows)
        keys = (p[reached].long() << 32) + t[reached]
        got = order[c * moe.ORDER_SLOTS:(c + 1) * moe.ORDER_SLOTS]
        placed, rest = got[:keys.numel()], got[keys.numel():]
        assert torch.equal(placed.sort().values, keys.sort().values), f"chunk {c}: not its pairs"
        assert bool((rest == -1).all()), f"chunk {c}: slots past its pairs"
        buckets = (placed >> 32) // -(-num_rows // moe.ORDER_SLOTS)
        assert bool((buckets[1:] >= buckets[:-1]).all()), f"chunk {c}: buckets out of order"
    want_row_src = torch.full((num_rows,), -1, dtype=torch.int32)
    reached = (pos >= 0) & (pos < num_rows)
    assert reached.any()
    want_row_src[pos[reached].long()] = token[reached].to(torch.int32)
    assert torch.equal(row_src.cpu(), want_row_src)


# (x dtype, sf dtype, T, K, H, G, sf layout, position layout)
EXPAND_SF_CASES = [
    (torch.float8_e4m3fn, torch.float32, 257, 8, 7168, 56, "row_major", "mapping"),
    (torch.float8_e4m3fn, torch.float32, 257, 8, 7168, 56, "tma_column_major", "mapping"),
    (torch.float8_e4m3fn, torch.int32, 33, 8, 7168, 14, "tma_column_major", "scattered"),
    (torch.float8_e4m3fn, torch.uint8, 1, 8, 7168, 56, "tma_column_major", "mapping"),
    (torch.int8, torch.uint8, 130, 4, 33, 7, "row_major", "scattered"),
    (torch.uint8, torch.uint8, 129, 9, 64, 1, "tma_column_major", "scattered"),
    (torch.uint8, torch.int32, 17, 3, 5, 2, "row_major", "mapping"),
    (torch.int8, torch.float32, 0, 8, 64, 4, "row_major", "mapping"),
]


@pytest.mark.parametrize("case", EXPAND_SF_CASES,
                         ids=_case_ids(EXPAND_SF_CASES))
def test_expand_to_fused_moves_sf(moe, case):
    dtype, sf_dtype, num_tokens, k, hidden, sf_cols, sf_layout, layout = case
    g = _generator(8)
    pos, num_rows = positions(layout, num_tokens, k, g)
    x = random_bits((num_tokens, hidden), dtype, g).cuda()
    sf = random_bits((num_tokens, sf_cols), sf_dtype, g).cuda()
    if sf_layout == "tma_column_major":
        sf = tma_column_major(sf)
    pos = pos.cuda()
    got, got_sf = moe.expand_to_fused(x, pos, num_rows, sf)
    want, want_sf = eager.expand_to_fused(x, pos, num_rows, sf)
    assert_same_bits(got, want, "out")
    assert_same_bits(got_sf, want_sf, "out_sf")
    assert got_sf.stride() == want_sf.stride()
    if eager.is_tma_column_major(got_sf):  # the alignment rows past N are zero bits too
        storage = torch.as_strided(got_sf, (sf_cols, got_sf.stride(1)), (got_sf.stride(1), 1))
        assert not _bits(storage[:, num_rows:]).any()


# ----------------------------------------------------------------- reduce_fused

def reduce_inputs(dtype: torch.dtype, num_tokens: int, k: int, hidden: int, layout: str, sf_layout: str,
                  g: torch.Generator):
    pos, num_rows = positions(layout, num_tokens, k, g)
    # Rows of very different magnitudes (products and sums that round), weights of both signs.
    scale = torch.exp2(torch.randint(-30, 30, (num_rows, 1), generator=g).float())
    x = (torch.randn(num_rows, hidden, generator=g) * scale).to(dtype)
    x_sf = None
    if dtype == torch.float8_e4m3fn:
        x = (torch.randn(num_rows, hidden, generator=g) * 64).to(dtype)
        x_sf = torch.exp2(torch.randint(-20, 20, (num_rows, 1), generator=g).float()) * torch.rand(num_rows, 1, generator=g)
        x_sf = x_sf.cuda()
        if sf_layout == "tma_column_major":
            x_sf = tma_column_major(x_sf)
    w = torch.randn(num_tokens, k, generator=g)
    w[pos < 0] = float("nan")  # masked slots are skipped, not multiplied by zero
    if num_tokens > 2:
        w[1] = -0.0
        w[2, 0] = float("inf")
    return x.cuda(), w.cuda(), pos.cuda(), x_sf


# (x dtype, T, K, H, position layout, sf layout)
REDUCE_CASES = [
    (torch.bfloat16, 0, 8, 7168, "mapping", None),
    (torch.bfloat16, 1, 8, 7168, "mapping", None),
    (torch.bfloat16, 333, 8, 7168, "scattered", None),
    (torch.bfloat16, 129, 9, 7, "mapping", None),
    (torch.bfloat16, 65, 32, 136, "scattered", None),
    (torch.float32, 77, 1, 1, "mapping", None),
    (torch.float32, 300, 8, 1000, "scattered", None),
    (torch.float32, 31, 3, 129, "mapping", None),
    (torch.float8_e4m3fn, 257, 8, 7168, "mapping", "row_major"),
    (torch.float8_e4m3fn, 100, 9, 7168, "scattered", "tma_column_major"),
    (torch.float8_e4m3fn, 33, 4, 100, "mapping", "row_major"),
]


@pytest.mark.parametrize("case", REDUCE_CASES, ids=_case_ids(REDUCE_CASES))
def test_reduce_fused_matches_torch(moe, case):
    dtype, num_tokens, k, hidden, layout, sf_layout = case
    x, w, pos, x_sf = reduce_inputs(dtype, num_tokens, k, hidden, layout, sf_layout, _generator(9))
    assert_same_values(moe.reduce_fused(x, w, pos, x_sf), eager.reduce_fused(x, w, pos, x_sf))


def test_reduce_fused_without_rows(moe):
    x = torch.zeros((0, 16), dtype=torch.bfloat16, device="cuda")
    w = torch.randn(5, 2, device="cuda")
    pos = torch.full((5, 2), -1, dtype=torch.int32, device="cuda")
    assert_same_bits(moe.reduce_fused(x, w, pos), eager.reduce_fused(x, w, pos))


# ------------------------------------------------------------- normalize_weight

@pytest.mark.parametrize("num_tokens,k", [(0, 8), (1, 1), (129, 8), (333, 9), (16384, 32)])
def test_normalize_weight_matches_torch(moe, num_tokens, k):
    g = _generator(10)
    w = torch.rand(num_tokens, k, generator=g)
    if num_tokens > 5:
        w[0] = 0.0  # denom = 1e-20
        w[1] = 1e-40  # subnormals
        w[2, 0] = -0.0
        w[3] = 1e-30 * torch.rand(k, generator=g)  # the 1e-20 dominates
        w[4, -1] = float("inf")
        w[5, 0] = float("nan")
    w = w.cuda()
    got, want = moe.normalize_weight(w), eager.normalize_weight(w)
    assert_same_bits(got[0], want[0], "denom")
    assert_same_bits(got[1], want[1], "weights")


# ------------------------------------------------------------------ argument checks

def test_arguments_are_checked_like_torch(moe):
    """The same exception type and message as the torch implementation, for a few wrong calls."""
    i64 = torch.zeros(4, 2, dtype=torch.int64, device="cuda")
    pos = torch.zeros(4, 2, dtype=torch.int32, device="cuda")
    w = torch.zeros(4, 2, device="cuda")
    x = torch.zeros(4, 8, dtype=torch.bfloat16, device="cuda")
    calls = [
        ("group_count", (i64.float(), 3)), ("group_count", (i64, 0)), ("group_count", (i64, 2.0)),
        ("fused_mapping", (i64.int(), 4, 1)), ("fused_mapping", (i64, 4, 1025)), ("fused_mapping", (i64, True, 1)),
        ("expand_to_fused", (x.double(), pos, 8)), ("expand_to_fused", (x, pos[:3], 8)),
        ("expand_to_fused", (x, pos, 8, torch.zeros(2, 5, device="cuda")[:, :4].t())),
        ("reduce_fused", (x.half(), w, pos)), ("reduce_fused", (x.to(torch.float8_e4m3fn), w, pos)),
        ("reduce_fused", (x, w, pos, torch.zeros(4, 1, device="cuda"))),
        ("normalize_weight", (torch.zeros(4, 33, device="cuda"),)),
    ]
    for name, args in calls:
        with pytest.raises((TypeError, ValueError)) as want:
            getattr(eager, name)(*args)
        with pytest.raises(want.type) as got:
            getattr(moe, name)(*args)
        assert str(got.value) == str(want.value), name
    with pytest.raises(ValueError, match="CUDA"):
        moe.normalize_weight(torch.zeros(4, 2))


# ------------------------------------------------------- generated source (no GPU)

def _sources(kernel_name: str) -> dict:
    from kernels import _tilelang

    kernel = _tilelang.kernel_defs()[kernel_name]
    return {config: _tilelang.lower_to_cuda(kernel.build(config), _tilelang.SM90) for config in kernel.configs}


VECTOR_ACCESSES = ("*(int4*)", "*(uint4*)", "*(float4*)", "*(fp8_e4_16_t*)")


def _vector_accesses(source: str) -> int:
    return sum(source.count(pattern) for pattern in VECTOR_ACCESSES)


def test_vectorized_configs_use_16_byte_accesses(tilelang_only):
    """Vectorization failing is only a warning in tilelang; the bandwidth depends on it."""
    for config, source in _sources("moe.expand_to_fused").items():
        if config.stage == "rows" and config.width == 16 and config.streaming:
            # the row load; the stores go through the evict-first helper (slot rows, padding zeros)
            body = source.split('extern "C" __global__')[-1]  # the kernel's definition, not the helper
            from kernels import _tilelang

            assert _vector_accesses(body) >= 1 and body.count(f"{_tilelang.STORE16_STREAM}(") >= 2, (config, source)
            assert "st.global.cs.v4" in source, (config, source)
        elif config.stage == "gather" and config.streaming:
            # the row load and both stores (slot rows, padding zeros) through the L2-hint helpers
            from kernels import _tilelang

            body = source.split('extern "C" __global__')[-1]
            assert body.count(f"{_tilelang.LOAD16_KEEP}(") >= 1, (config, source)
            assert body.count(f"{_tilelang.STORE16_PASS}(") >= 2, (config, source)
            assert "ld.global.L2::cache_hint.v4" in source and "st.global.L2::cache_hint.v4" in source, config
        elif config.width == 16 and config.stage in ("rows", "gather"):
            # the row load, the stores to each slot's row, the padding rows' zeros
            assert _vector_accesses(source) >= 3, (config, source)
    for config, source in _sources("moe.reduce_fused").items():
        if config.vectorized:
            assert _vector_accesses(source) >= 2, (config, source)  # row loads, output store


def test_reduce_and_normalize_round_each_operation_once(tilelang_only):
    """__fadd_rn / __fmul_rn / __fdiv_rn: never contracted into an FMA, division IEEE."""
    from kernels import _tilelang

    for config, source in _sources("moe.reduce_fused").items():
        assert "__fadd_rn(" in source and "__fmul_rn(" in source, config
        assert "fma" not in source.split("__global__")[-1], config
    source = _sources("moe.normalize_weight")[_tilelang.kernel_defs()["moe.normalize_weight"].configs[0]]
    body = source.split("__global__")[-1]
    assert "__fdiv_rn(" in body and "__fdividef" not in body and "fma" not in body
    # 1e-20 as the float32 torch rounds it to: its bits, not a literal.
    assert f"(uint){np.float32(1e-20).view(np.uint32)}" in body


def test_no_fast_math(tilelang_only):
    from kernels import _tilelang

    for name, kernel in _tilelang.kernel_defs().items():
        if not name.startswith("moe."):
            continue
        for config in kernel.configs:
            configs = _tilelang.pass_configs_of(kernel.build(config))
            assert not configs.get("tl.enable_fast_math", False), (name, config)
