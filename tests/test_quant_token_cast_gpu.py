"""The TileLang per-token cast (kernels.quant's token_cast) across its paths.

GPU tests (skipped, with the reason, without CUDA or tilelang): one block per
row (num_per_channels = H) for row lengths that take the row path - a team of
warps holding the row in registers - with every kind of tail (a last slot
only some lanes fill, teams past the last row in the last CTA, one warp, a
whole CTA), and rows too long for it (the generic path).  Each output (data,
sf, clamped counts) must equal, bit for bit, what the same kernel gives with
every block forced onto the generic path, whose numerics are the same device
functions; for the exactly rounded casts (e4m3 / e5m6 of x) also the eager
implementation's data given the kernel's sf, and with round_sf its sf (a plain
sf of the eager implementation on CUDA may be an ULP off: it multiplies by
fl(1 / max_q), which the spec allows; the kernel divides).

Host tests (no GPU): which path `_token_geometry` picks, and that a row path
team holds its row.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import kernels.torch.quant as eager

HAS_TILELANG = importlib.util.find_spec("tilelang") is not None
FORMATS = ("e4m3", "e2m1", "e5m6")
DTYPES = (torch.bfloat16, torch.float32)
# (H, T): rows of 33, 40, 125, 896 (7168: 7 slots of a 128-thread team), 897 (an 8th slot for one
# lane), 2048 chunks (a whole 256-thread CTA, bf16) and 2049 (past every row path: generic)
ROW_SHAPES = ((264, 17), (320, 33), (1000, 9), (7168, 5), (7176, 3), (16384, 3), (16392, 2))
SWIGLU_HIDDEN = (320, 2056, 4096, 4104, 7168, 8200)
SF_OPTIONS = (
    {},
    {"round_sf": True, "use_ue8m0": True, "use_packed_ue8m0": True},
    {"round_sf": True, "use_ue8m0": True, "use_tma_aligned_col_major_sf": True},
)


@pytest.fixture(scope="module")
def quant(tilelang_family):
    return tilelang_family("quant")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride(), what
    if want.numel():
        differ = (_bits(got) != _bits(want)).sum().item()
        assert differ == 0, f"{what}: {differ} bytes differ"


def _on_generic_path(quant, monkeypatch, fn):
    """fn() with every token_cast block on the generic path."""
    with monkeypatch.context() as patch:
        patch.setattr(quant.token_cast, "_token_geometry", quant._generic_geometry)
        return fn()


def _input(shape, dtype, seed):
    g = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda") * torch.exp2(torch.randint(-8, 8, (shape[0], 1), device="cuda",
                                                                                  generator=g).float())
    x[0, -1] = 200.0  # the amax at the row's last element: the last (partial) slot's lane
    return x.to(dtype)


@pytest.mark.parametrize("hidden, rows", ROW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp32"))
@pytest.mark.parametrize("fmt", FORMATS)
def test_whole_row_casts_equal_the_generic_path(quant, monkeypatch, fmt, dtype, hidden, rows):
    x = _input((rows, hidden), dtype, hidden + rows)
    for options in SF_OPTIONS:
        data, sf = quant.per_token_cast(x, fmt, hidden, **options)
        want_data, want_sf = _on_generic_path(quant, monkeypatch,
                                              lambda: quant.per_token_cast(x, fmt, hidden, **options))
        assert_same_bits(data, want_data, f"data {options}")
        assert_same_bits(sf, want_sf, f"sf {options}")
        assert_same_bits(quant.per_token_cast_with_sf_only(x, fmt, hidden, **options), want_sf, f"sf only {options}")
        precomputed = quant.per_token_cast_with_precomputed_sf(x, want_sf, fmt, hidden)
        assert_same_bits(precomputed, _on_generic_path(
            quant, monkeypatch, lambda: quant.per_token_cast_with_precomputed_sf(x, want_sf, fmt, hidden)),
            f"precomputed {options}")
        if fmt != "e2m1":  # the exactly rounded quotients: the eager cast's bits too (and x / sf by division)
            assert_same_bits(precomputed, want_data, f"precomputed = computed {options}")
            assert_same_bits(data, eager.per_token_cast_with_precomputed_sf(x, want_sf, fmt, hidden),
                             f"eager data given the kernel's sf {options}")
            if options.get("round_sf"):  # an exact power of two: the eager sf is the same too
                eager_data, eager_sf = eager.per_token_cast(x, fmt, hidden, **options)
                assert_same_bits(data, eager_data, f"eager data {options}")
                assert_same_bits(sf, eager_sf, f"eager sf {options}")
            # A plain sf may differ by an ULP: the eager a / max_q on CUDA is a multiplication by
            # fl(1 / max_q) (kernels/torch/quant.py, "Numerics"); the kernel divides.


def test_special_values_anywhere_in_a_row(quant, monkeypatch):
    x = _input((6, 7176), torch.bfloat16, 1)
    x[1, 7175] = float("nan")
    x[2, 0] = float("inf")
    x[3] = 0.0
    x[4, 5000] = -float("inf")
    for fmt in FORMATS:
        got = quant.per_token_cast(x, fmt, 7176)
        want = _on_generic_path(quant, monkeypatch, lambda: quant.per_token_cast(x, fmt, 7176))
        for g, w, what in zip(got, want, ("data", "sf")):
            assert_same_bits(g, w, f"{fmt} {what}")


@pytest.mark.parametrize("hidden", SWIGLU_HIDDEN)
@pytest.mark.parametrize("dtype", DTYPES, ids=("bf16", "fp32"))
@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu_whole_rows_equal_the_generic_path(quant, monkeypatch, fmt, dtype, hidden):
    rows, k = 11, 2
    x = _input((rows, 2 * hidden), dtype, hidden)
    pos = torch.arange(rows, dtype=torch.int32, device="cuda")
    pos[3] = -1
    pos[rows - 1] = -1
    weights = torch.rand((rows + 1) // k + 1, k, device="cuda")

    def run():
        counts = torch.zeros(3, dtype=torch.int64, device="cuda")
        data, sf = quant.swiglu_forward_and_per_token_cast(x, fmt, hidden, topk_weights=weights, pos_to_token_topk=pos,
                                                           clamp=1.5, clamped_count=counts)
        return data, sf, counts

    got = run()
    want = _on_generic_path(quant, monkeypatch, run)
    for g, w, what in zip(got, want, ("data", "sf", "clamped_count")):
        assert_same_bits(g, w, what)


# -- host side: the geometry ------------------------------------------------------------------


@pytest.fixture(scope="module")
def quant_host():
    if not HAS_TILELANG:
        pytest.skip("kernels.quant needs the module 'tilelang', which is not installed")
    import kernels.quant

    return kernels.quant


def test_row_path_geometry(quant_host):
    q = quant_host
    for config in q.TOKEN_CAST.configs:
        per_thread = q.row_chunks(config.source, config.dtype)
        for chunks in range(1, 4 * per_thread * config.threads):
            path, log2, k, per_cta = q._token_geometry(config, 8 * chunks)
            if path == q.ROW_PATH:
                team = 1 << log2
                assert q.WARP <= team <= config.threads and team * per_thread >= chunks and k == chunks
                assert team == q.WARP or (team // 2) * per_thread < chunks  # the least team that holds it
                assert per_cta == (config.threads // team) * chunks
            elif path == 0:
                assert chunks < q.WARP or chunks > per_thread * config.threads
                assert (path, log2, k, per_cta) == q._generic_geometry(config, 8 * chunks)
            else:
                assert path in q.fast_paths(config.source, config.dtype)


def test_the_benchmarked_whole_row_cast_takes_the_row_path(quant_host):
    q = quant_host
    config = q.token_config("x", "bfloat16", "e5m6")
    assert q._token_geometry(config, 7168)[:3] == (q.ROW_PATH, 7, 896)  # 128 threads x 7 chunks per row


def _tune_candidates():
    if not HAS_TILELANG:
        return []
    import kernels.quant as q

    return [c for c in q.TOKEN_TUNE_CONFIGS if c.source == "x"]


@pytest.mark.parametrize("config", _tune_candidates(), ids=str)
def test_tuning_candidates_equal_the_shipped_configuration(quant, monkeypatch, config):
    """benchmarks.tune byte-compares a candidate with the shipped configuration on randn only; here
    on what randn does not reach: e5m6 quotients in the subnormal range and at ties, zero rows,
    NaN / inf rows, rows of one slot or a partial last slot, every sf option."""
    g = torch.Generator("cuda").manual_seed(7)
    for hidden, rows in ((7168, 9), (7176, 5), (320, 33)):
        x = torch.randn((rows, hidden), generator=g, device="cuda") * torch.exp2(
            torch.randint(-40, 1, (rows, hidden), generator=g, device="cuda").float())
        x[:, 0] = 65024.0 * 2.0**-20  # quotients k * 2^-20 + ties below 2^-14 (sf = 2^-20 with round_sf)
        x[:, 1:65] = torch.arange(1, 65, device="cuda") * 2.0**-21
        x[1] = 0.0
        x[2, 3] = float("nan")
        x[3, hidden - 1] = -float("inf")
        x = x.to(getattr(torch, config.dtype))
        key = (config.source, config.dtype, config.fmt, config.precomputed)
        npc = hidden if config.fmt == "e5m6" else (128 if config.fmt == "e4m3" else 32)
        if hidden % npc:
            continue
        for options in SF_OPTIONS:
            want = quant.per_token_cast(x, config.fmt, npc, **options)
            with monkeypatch.context() as patch:
                patch.setitem(quant.TOKEN_OVERRIDES, key, config)
                got = quant.per_token_cast(x, config.fmt, npc, **options)
            for gt, w, what in zip(got, want, ("data", "sf")):
                assert_same_bits(gt, w, f"{config} H={hidden} {options} {what}")
