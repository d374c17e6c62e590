"""The tile_kernels adapter without a GPU: what it registers and how it reports a missing
library, version or op; its exact layout conversions on CPU tensors; and, where tile-kernels
2.x imports (PYTHONPATH=/tmp/tk21site), that those conversions match the sf shapes its own
allocation helpers produce (no kernel is run)."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from tkverify import registry
from tkverify.adapters import tile_kernels as tk
from tkverify.registry import Impl

EVERY_OP = {s.name for s in registry.all_specs()}


def test_every_registered_op_gets_a_cuda_tile_kernels_impl():
    mapped = set(tk.REGISTERED)
    assert mapped == EVERY_OP - {"toy.negate"}
    for op in mapped:
        spec = registry.get(op)
        impl = spec.impls["tile_kernels"]
        assert impl.device == "cuda" and impl.requires == ("tile_kernels",) and impl.available is not None
        if spec.backward is not None:
            assert spec.backward.impls["tile_kernels"].available is not None


def test_unavailable_reasons_name_what_is_missing():
    reason = registry.get("moe.topk_gate").impls["tile_kernels"].unavailable_reason()
    if not torch.cuda.is_available():
        assert "needs CUDA" in reason
    elif importlib.util.find_spec("tile_kernels") is None:
        assert "'tile_kernels'" in reason and "not installed" in reason


@pytest.mark.parametrize("op, version, expected", [
    ("moe.topk_gate", "1.0.0", None),
    ("moe.topk_gate", "2.1.0", None),
    ("moe.group_count", "1.0.0", None),
    ("moe.group_count", "2.1.0", "tile-kernels 2.1.0 lacks moe.group_count"),
    ("moe.reduce_fused", "2.1.0", "tile-kernels 2.1.0 lacks moe.reduce_fused"),
    ("transpose.batched_transpose", "2.1.0", "tile-kernels 2.1.0 lacks transpose.batched_transpose"),
    ("transpose.transpose", "1.0.0", None),
    ("mhc.sinkhorn", "3.0.0", "tile-kernels 3.0.0 is not a release this adapter maps"),
    ("mhc.sinkhorn", None, "tile-kernels is not installed"),
])
def test_missing_reason_per_version(op, version, expected):
    reason = tk.missing_reason(op, version)
    if expected is None:
        assert reason is None
    else:
        assert reason.startswith(expected)


def test_an_op_declared_later_is_registered_only_if_it_exists():
    """mhc.post & co. come with another family's specs: registered once declared, skipped before."""
    if registry.has("mhc.post"):
        assert "tile_kernels" in registry.get("mhc.post").impls
        return
    assert "mhc.post" not in tk.REGISTERED
    base = registry.get("mhc.sinkhorn")
    registry.register(registry.OpSpec(name="mhc.post", oracle=base.oracle, strategy=base.strategy,
                                      outputs=dict(base.outputs), impls={}))
    try:
        assert "mhc.post" in tk.register_all()
        assert registry.get("mhc.post").impls["tile_kernels"].target is tk.post
    finally:
        del registry._REGISTRY["mhc.post"]


# -- exact layout conversions ---------------------------------------------------------------


def test_ue8m0_packing_puts_the_first_byte_low_and_pads_with_zeros():
    codes = torch.tensor([[1, 2, 3, 4, 5], [250, 251, 252, 253, 254]], dtype=torch.uint8)
    packed = tk.bytes_to_packed(codes)
    assert packed.dtype == torch.int32 and packed.shape == (2, 2)
    assert int(packed[0, 0]) == 0x04030201 and int(packed[0, 1]) == 0x05
    assert int(packed[1, 1]) == 0xFE  # bytes past the 5th column are zero
    assert torch.equal(tk.packed_to_bytes(packed, 5), codes)
    # From a column-major store (strides (1, padded rows)) as well.
    assert torch.equal(tk.packed_to_bytes(tk.store_tma_column_major(packed), 5), codes)


def test_row_packed_words_unpack_to_rows():
    """2.x per-channel packing: byte m % 4 of word (m // 4, k) is block row m."""
    rows, cols = 6, 3
    codes = torch.arange(rows * cols, dtype=torch.uint8).reshape(rows, cols) + 10
    words = torch.zeros((2, cols), dtype=torch.int64)
    for m in range(rows):
        for k in range(cols):
            words[m // 4, k] |= int(codes[m, k]) << (8 * (m % 4))
    words = words.to(torch.int32)
    assert torch.equal(tk.row_packed_to_bytes(words, rows), codes)


def test_ue8m0_bytes_become_the_exact_fp32_power_of_two():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = tk.ue8m0_to_fp32(codes)
    assert values.dtype == torch.float32
    for e in range(255):
        assert float(values[e]) == math.ldexp(1.0, e - 127), e
    assert math.isnan(float(values[255]))
    packed = tk.bytes_to_packed(codes.reshape(8, 32))
    assert torch.equal(tk.sf_as_fp32(packed, 32).view(torch.int32), values.reshape(8, 32).view(torch.int32))


@pytest.mark.parametrize("use_packed", [False, True])
@pytest.mark.parametrize("column_major", [False, True])
def test_our_sf_from_their_packed_ue8m0(use_packed, column_major):
    rows, cols = 5, 6
    codes = torch.randint(0, 255, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    theirs = tk.store_tma_column_major(tk.bytes_to_packed(codes))  # as 1.0 writes it
    # Garbage in their padding bytes must not reach ours (the contract says zero).
    raw = tk.bytes_to_packed(codes).view(torch.uint8).clone()
    raw[:, cols:] = 0xAB
    dirty = raw.view(torch.int32)
    for source in (theirs, dirty):
        ours = tk.our_sf(source, rows, cols, use_ue8m0=True, use_packed_ue8m0=use_packed, column_major=column_major)
        assert ours.dtype == (torch.int32 if use_packed else torch.uint8)
        bytes_ = tk.packed_to_bytes(ours, cols) if use_packed else ours
        assert torch.equal(bytes_, codes)
        if use_packed:
            assert torch.equal(tk.packed_to_bytes(ours, 8)[:, cols:], torch.zeros(rows, 2, dtype=torch.uint8))
        if column_major:
            per_16 = 16 // ours.element_size()
            assert ours.stride() == (1, -(-rows // per_16) * per_16)
        else:
            assert ours.is_contiguous()


def test_fp32_sf_is_only_relaid_out():
    sf = torch.tensor([[0.5, float("nan"), -0.0], [3.0, 1e-30, 7.0]])
    ours = tk.our_sf(sf.T.contiguous().T, 2, 3, use_ue8m0=False, use_packed_ue8m0=False, column_major=True)
    assert ours.stride() == (1, 4) and torch.equal(ours.view(torch.int32), sf.view(torch.int32))


def test_fused_order_is_canonicalised_by_moving_whole_rows():
    # T = 3 tokens, K = 2 slots; expert 0 has pairs 1, 2, 5 (aligned to 4), expert 1 has pair 0.
    # tile-kernels-like layout: expert 0's rows in the order 5, 1, 2; then padding; expert 1.
    pos_to_expert = torch.tensor([0, 0, 0, -1, 1, -1, -1, -1], dtype=torch.int32)
    pos_to_token_topk = torch.tensor([5, 1, 2, -1, 0, -1, -1, -1], dtype=torch.int32)
    pos_to_token = torch.tensor([2, 0, 1, -1, 0, -1, -1, -1], dtype=torch.int32)
    token_topk_to_pos = torch.tensor([[4, 1], [2, -1], [-1, 0]], dtype=torch.int32)
    start, end = torch.tensor([0, 4], dtype=torch.int32), torch.tensor([4, 8], dtype=torch.int32)
    got = tk.canonical_fused_order(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, start, end)
    ptt, ptt_topk, t2p = got
    assert ptt_topk.tolist() == [1, 2, 5, -1, 0, -1, -1, -1]
    assert ptt.tolist() == [0, 1, 2, -1, 0, -1, -1, -1]
    assert t2p.tolist() == [[4, 0], [1, -1], [-1, 2]] and t2p.dtype == torch.int32
    # A row outside its expert's segment is left for the judge to see.
    stray = pos_to_expert.clone()
    stray[1] = 1  # pair 1, of expert 1, sits in expert 0's segment
    assert tk.canonical_fused_order(stray, pos_to_token, pos_to_token_topk, token_topk_to_pos, start, end) is None


def test_padding_marks_flag_rows_no_pair_maps_to():
    t2p = torch.tensor([[0, 3], [-1, 5]], dtype=torch.int32)
    assert tk.padding_marks(t2p, 6).tolist() == [0, -1, -1, 0, -1, 0]


# -- against tile-kernels' own sf allocation (2.x on CPU; no kernel runs) ---------------------


def _tile_kernels_2():
    if importlib.util.find_spec("tile_kernels") is None or tk.generation(tk.installed_version()) != 2:
        pytest.skip("tile-kernels 2.x is not importable here (PYTHONPATH=/tmp/tk21site)")
    try:
        return importlib.import_module("tile_kernels.quant.common")
    except Exception as e:  # noqa: BLE001 - tilelang may refuse this machine
        pytest.skip(f"tile_kernels.quant.common does not import here: {e}")


import importlib  # noqa: E402


@pytest.mark.parametrize("block, column_major", [((1, 32), False), ((1, 128), True), ((128, 128), False),
                                                 ((128, 128), True)])
@pytest.mark.parametrize("tokens", [200, 0])
def test_their_packed_sf_shape_is_what_the_adapter_unpacks(block, column_major, tokens):
    common = _tile_kernels_2()
    hidden = 640
    config = common.CastOutputConfig(torch_dtype=torch.float8_e4m3fn, sf_block=block,
                                     use_tma_aligned_col_major_sf=column_major, round_sf=True, use_packed_ue8m0=True)
    raw = common.alloc_scaling_factors((tokens, hidden), config, device="cpu")
    sf = common.cast_epilogue(raw, config)
    rows, cols = -(-tokens // block[0]), hidden // block[1]
    assert sf.dtype == torch.int32 and tuple(sf.shape) == (rows, -(-cols // 4))
    if column_major:
        assert sf.stride(0) == 1
    ours = tk.our_sf(sf.zero_(), rows, cols, use_ue8m0=True, use_packed_ue8m0=False, column_major=False)
    assert tuple(ours.shape) == (rows, cols)


def test_their_per_channel_packing_runs_along_rows():
    common = _tile_kernels_2()
    tokens, hidden = 256, 384
    config = common.CastOutputConfig(torch_dtype=torch.float8_e4m3fn, sf_block=(32, 1), round_sf=True,
                                     use_packed_ue8m0=True)
    assert config.sf_col_pack
    sf = common.cast_epilogue(common.alloc_scaling_factors((tokens, hidden), config, device="cpu"), config)
    assert tuple(sf.shape) == (-(-(tokens // 32) // 4), hidden) and sf.dtype == torch.int32
    assert tuple(tk.row_packed_to_bytes(sf.zero_(), tokens // 32).shape) == (tokens // 32, hidden)


def test_impl_availability_is_consulted_before_a_call():
    impl = Impl("tile_kernels", tk.topk_gate, device="cpu", requires=("tile_kernels",),
                available=lambda: tk.missing_reason("moe.group_count", "2.1.0"))
    reason = impl.unavailable_reason()
    assert reason is not None


# -- empty batches, refusals and the swiglu subset, against a stand-in tile_kernels (no GPU) ------


@pytest.mark.parametrize("use_packed, column_major", [(False, False), (True, False), (True, True)])
def test_an_empty_batch_converts_its_packed_sf(use_packed, column_major):
    """T = 0: their packed sf has no rows, and unpacking must not ask reshape to guess the width."""
    theirs = torch.zeros((0, 1), dtype=torch.int32)
    ours = tk.our_sf(theirs, 0, 3, use_ue8m0=True, use_packed_ue8m0=use_packed, column_major=column_major)
    assert tuple(ours.shape) == (0, 1 if use_packed else 3)
    assert ours.dtype == (torch.int32 if use_packed else torch.uint8)
    assert tuple(tk.sf_as_fp32(theirs, 3).shape) == (0, 3)
    assert tuple(tk.packed_to_bytes(theirs, 3).shape) == (0, 3)


def _in_tile_kernels(tmp_path, source: str, name: str):
    """A function whose code lives in a file of a tile_kernels package (as tracebacks see it)."""
    path = tmp_path / "tile_kernels" / "engram" / f"fake_{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    namespace: dict = {}
    exec(compile(source, str(path), "exec"), namespace)
    return namespace[name]


def test_its_own_value_errors_and_asserts_are_refusals_and_others_are_failures(tmp_path):
    refuse = _in_tile_kernels(tmp_path, "def refuse(h):\n    raise ValueError(f'No valid blk_d for hidden_size={h}')\n",
                              "refuse")
    with pytest.raises(registry.Unsupported, match=r"\(engram/fake_refuse.py:2\): No valid blk_d for hidden_size=64"):
        tk._call(refuse, 64)
    check = _in_tile_kernels(tmp_path, "def check(h):\n    assert h % 64 == 0\n", "check")
    with pytest.raises(registry.Unsupported, match="assert h % 64 == 0"):
        tk._call(check, 65)

    def ours(h):
        raise ValueError("raised outside tile_kernels")

    with pytest.raises(ValueError, match="outside"):
        tk._call(ours, 1)
    broken = _in_tile_kernels(tmp_path, "def broken(h):\n    raise RuntimeError('grid dimension must be positive')\n", "broken")
    with pytest.raises(RuntimeError):
        tk._call(broken, 0)


class _FakeQuant:
    """Records the call and returns what tile-kernels' swiglu returns: e4m3 data and packed ue8m0 words."""

    def __init__(self):
        self.calls = []

    def swiglu_forward_and_per_token_cast(self, x, fmt, num_per_channels, **kwargs):
        self.calls.append((x, fmt, num_per_channels, kwargs))
        rows, hidden = x.shape[0], x.shape[1] // 2
        cols = hidden // num_per_channels
        data = torch.zeros((rows, hidden), dtype=torch.float8_e4m3fn)
        codes = torch.full((rows, cols), 127, dtype=torch.uint8)
        codes[:, 0] = 120
        return data, tk.bytes_to_packed(codes)


@pytest.fixture
def fake_tile_kernels(monkeypatch):
    def install(version: str):
        quant = _FakeQuant()
        monkeypatch.setattr(tk, "installed_version", lambda: version)
        monkeypatch.setattr(tk, "_tk", lambda sub: {"quant": quant}[sub])
        return quant
    return install


@pytest.mark.parametrize("version", ["1.0.0", "2.1.0"])
def test_swiglu_without_weights_calls_its_public_function(fake_tile_kernels, version):
    quant = fake_tile_kernels(version)
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    data, sf = tk.swiglu_forward_and_per_token_cast(x=x, fmt="e4m3", num_per_channels=128, round_sf=True,
                                                    use_ue8m0=True, use_packed_ue8m0=False)
    (got_x, fmt, npc, kwargs), = quant.calls
    assert torch.equal(got_x, x) and (fmt, npc) == ("e4m3", 128)
    assert kwargs["use_packed_ue8m0"] and kwargs["round_sf"]
    # 1.0 writes packed ue8m0 column-major only, so the adapter asks for that layout there.
    assert kwargs["use_tma_aligned_col_major_sf"] == (version == "1.0.0")
    assert not any(k in kwargs for k in ("topk_weights", "pos_to_token_topk", "clamp_value", "swiglu_clamp_value",
                                         "clamped_count"))
    assert tuple(data.shape) == (3, 256) and sf.dtype == torch.uint8 and tuple(sf.shape) == (3, 2)
    assert sf[:, 0].tolist() == [120] * 3 and sf[:, 1].tolist() == [127] * 3


def test_swiglu_sf_clamp_min_goes_to_1_0s_own_argument(fake_tile_kernels):
    quant = fake_tile_kernels("1.0.0")
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    tk.swiglu_forward_and_per_token_cast(x=x, num_per_channels=128, clamp_min=0.5)
    tk.swiglu_forward_and_per_token_cast(x=x, num_per_channels=128, clamp_min=1e-4)  # the default: not passed
    assert quant.calls[0][3]["sf_clamp_min"] == 0.5 and "sf_clamp_min" not in quant.calls[1][3]


@pytest.mark.parametrize("version", ["1.0.0", "2.1.0"])
@pytest.mark.parametrize("extra, why", [
    ({"topk_weights": torch.ones(2, 1), "pos_to_token_topk": torch.tensor([0, 1], dtype=torch.int32)},
     "without weights only"),
    ({"clamp": 7.0}, "without clamp only"),
    ({"clamp": 7.0, "clamped_count": torch.zeros(3, dtype=torch.int64)}, "without clamp only"),
])
def test_swiglu_weights_routing_and_clamp_stay_unsupported(fake_tile_kernels, version, extra, why):
    quant = fake_tile_kernels(version)
    with pytest.raises(registry.Unsupported, match=why):
        tk.swiglu_forward_and_per_token_cast(x=torch.randn(2, 256, dtype=torch.bfloat16), **extra)
    assert quant.calls == []


@pytest.mark.parametrize("m, refused", [(2, False), (3, True), (4, False), (5, True), (6, True), (8, False)])
def test_sinkhorn_refuses_m_that_is_not_a_power_of_two_unless_raw(monkeypatch, m, refused):
    monkeypatch.delenv(tk.RAW_ENV, raising=False)
    x = torch.zeros(1, m, m)
    if refused:
        with pytest.raises(registry.Unsupported, match=f"power-of-two m.*got m={m}"):
            tk._sinkhorn_size(x)
        monkeypatch.setenv(tk.RAW_ENV, "1")
    tk._sinkhorn_size(x)


@pytest.mark.parametrize("shape, strides", [((1, 1), (1, 4)), ((1, 1), (4, 4)), ((3, 1), (1, 4)), ((1, 2), (1, 4))])
def test_a_packed_sf_with_a_size_one_dim_and_odd_strides_converts(shape, strides):
    """tile-kernels 2.1.0's per_block_cast of x (128, 128), (128, 128) blocks, TMA column-major
    ue8m0: its packed sf is (1, 1) with strides (1, 4), which torch calls contiguous; the adapter
    raised 'self.stride(-1) must be 1 to view Int as Byte' (the H200 run of 2026-11-29)."""
    words = torch.arange(1, 1 + math.prod(shape), dtype=torch.int32) * 0x01010101
    theirs = torch.empty_strided(shape, strides, dtype=torch.int32)
    theirs.copy_(words.reshape(shape))
    rows, cols = shape[0], 4 * shape[1] - 1
    expected = words.reshape(shape).contiguous().view(torch.uint8).reshape(rows, 4 * shape[1])[:, :cols]
    assert torch.equal(tk.packed_to_bytes(theirs, cols), expected)
    ours = tk.our_sf(theirs, rows, cols, use_ue8m0=True, use_packed_ue8m0=False, column_major=True)
    assert torch.equal(ours, expected) and ours.stride(0) == 1
    assert torch.equal(tk.sf_as_fp32(theirs, cols), tk.ue8m0_to_fp32(expected))
    along_rows = torch.empty_strided(shape, strides, dtype=torch.int32)
    along_rows.copy_(words.reshape(shape))
    assert torch.equal(tk.row_packed_to_bytes(along_rows, 4 * shape[0]),
                       tk.row_packed_to_bytes(words.reshape(shape).clone(), 4 * shape[0]))


def test_an_sf_of_2_to_the_minus_127_is_refused_before_the_device_assert(fake_tile_kernels):
    """Finding F22: 2.1.0's batched_transpose_weight_sf raises a device assert on an sf holding 2^-127, which
    leaves the CUDA context unusable; the adapter refuses such an sf (Unsupported) and calls nothing."""
    from tkverify.adapters import tile_kernels_quant_layout as layout
    quant = fake_tile_kernels("2.1.0")
    sf = torch.full((1, 4, 7), 2.0**-20)
    sf[0, 3, 2] = 2.0**-127
    with pytest.raises(registry.Unsupported, match="F22"):
        layout.batched_transpose_weight_sf(sf)
    assert quant.calls == []
