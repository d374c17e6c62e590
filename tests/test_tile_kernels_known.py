"""tile-kernels' known discrepancies (tkverify/adapters/tile_kernels_known.py): each committed
finding's own case, failing the way its replay on the H200 failed, is recognised as that
finding, on the releases it was reproduced on only; the same case failing any other way, a
case outside the finding's domain, or another release, is not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tkverify.adapters import tile_kernels_known as known
from tkverify.case import load_case
from tkverify.registry import Failure

# The committed cases these tests read: copies of the findings' cases of each release (tests/data/README.md).
CASES = Path(__file__).resolve().parent / "data" / "tile_kernels"
EMPTY_GRID = "InternalError: Check failed: ... CUDALaunch Error: grid dimension must be positive, but got grid=(0,1,1)"
NO_LAYOUT = "InternalError: Check failed: (has_best) is false: no available layout found"
CP_ASYNC = ("InternalError: Explicit async copy semantics require cp.async lowering, but no eligible global->shared "
            "store was rewritten.")

# 1.0.0's findings that 2.1.0 was later seen to share, and the 2.1.0 finding they are declared as there
G_SEEN_ON_2_1_0_AS = {"G14": "F2", "G18": "F13"}

# (case file, release, backward, failing outputs (None: the error below), error text, finding)
FINDING_CASES = [
    ("2.1.0/quant.per_token_cast-F1-nan-e4m3.json", "2.1.0", False, {"sf"}, "", "F1"),
    ("2.1.0/quant.per_token_cast-F1-nan-e2m1.json", "2.1.0", False, {"sf"}, "", "F1"),
    ("2.1.0/quant.per_token_cast_with_sf_only-F1-nan.json", "2.1.0", False, {"sf"}, "", "F1"),
    ("2.1.0/quant.swiglu_forward_and_per_token_cast-P2-plain.json", "2.1.0", False, {"sf"}, "",
     "F1"),
    ("2.1.0/quant.swiglu_backward_and_per_token_cast-F1-nan.json", "2.1.0", False, {"sf"}, "", "F1"),
    ("2.1.0/quant.per_token_cast-F2-inf-round_sf.json", "2.1.0", False, {"sf", "data"}, "", "F2"),
    ("2.1.0/quant.per_token_cast-F2-inf-plain.json", "2.1.0", False, {"sf"}, "", "F2"),
    ("2.1.0/quant.per_token_cast-F2-inf-ue8m0.json", "2.1.0", False, {"data"}, "", "F2"),
    ("2.1.0/quant.per_token_cast_with_precomputed_sf-F3-subnormal-sf-e2m1.json", "2.1.0", False,
     {"data"}, "", "F3"),
    ("2.1.0/quant.per_token_cast_with_precomputed_sf-F3-subnormal-sf-e4m3.json", "1.0.0", False,
     {"data"}, "", "F3"),
    ("2.1.0/mhc.sinkhorn-F4-empty-batch.json", "2.1.0", False, None, EMPTY_GRID, "F4"),
    ("2.1.0/mhc.sinkhorn-F4-empty-batch-gradients.json", "2.1.0", True, None, EMPTY_GRID, "F4"),
    ("1.0.0/mhc.post-G1-empty-batch.json", "1.0.0", False, None, EMPTY_GRID, "F9"),
    ("1.0.0/mhc.pre_apply_mix-G1-empty-batch.json", "2.1.0", False, None, EMPTY_GRID, "F9"),
    ("1.0.0/mhc.pre_split_mixes-G1-empty-batch.json", "2.1.0", False, None, EMPTY_GRID, "F9"),
    ("2.1.0/mhc.pre_split_mixes-F12-m5-shrunk.json", "2.1.0", False, None,
     NO_LAYOUT, "F12"),
    ("1.0.0/mhc.sinkhorn-G2-repeat30-shared-memory-gradients.json", "1.0.0", True, None,
     "InternalError: Failed to set the allowed dynamic shared memory size to 552960", "G2"),
    ("1.0.0/moe.topk_gate-G3-nan-score.json", "1.0.0", False, {"indices"}, "", "G3"),
    ("1.0.0/quant.per_token_cast_with_sf_only-G5-nan-and-inf.json", "1.0.0", False, {"sf"}, "",
     "F1"),
    ("2.1.0/mhc.pre_split_mixes-F12-m5-one-token-run10.json", "2.1.0", False, None,
     NO_LAYOUT, "F12"),
    ("2.1.0/mhc.pre_split_mixes-F12-m5-one-token-run10.json", "2.1.0", False, None,
     "InternalError: ", "F12"),
    ("2.1.0/quant.per_block_cast-F13-nan.json", "2.1.0", False, {"sf"}, "", "F13"),
    ("1.0.0/quant.per_block_cast-F13-nan-ue8m0.json", "1.0.0", False, {"sf"}, "", "F13"),
    # an empty batch, but with post_mult 0: F12, not F9 (one token with post_mult 0 fails the same way)
    ("1.0.0/mhc.pre_split_mixes-G1-empty-batch-divide-by-zero.json", "1.0.0", False, None,
     "InternalError: Check failed: fb->value != 0 (0 vs. 0) : Divide by zero", "F12"),
    ("1.0.0/moe.topk_gate-G8-tied-neg-inf.json", "1.0.0", False, {"indices"}, "", "G8"),
    ("1.0.0/quant.per_token_cast-G10-e5m6-nan.json", "1.0.0", False, {"sf", "data"}, "", "G10"),
    ("1.0.0/mhc.pre_apply_mix-G11-m5.json", "1.0.0", False, None,
     "InternalError: Check failed: (!use_count_.count(v)) is false: variable i_mhc has been used before definition!",
     "G11"),
    ("1.0.0/moe.expand_to_fused_with_sf-G12-no-token.json", "1.0.0", False, {"out", "sf"}, "",
     "G12"),
    ("1.0.0/mhc.pre_split_mixes-F12-m4-one-token-divide-by-zero.json", "1.0.0", False, None,
     "InternalError: Check failed: fb->value != 0 (0 vs. 0) : Divide by zero", "F12"),
    ("2.1.0/mhc.pre_split_mixes-F12-m6-empty-batch-run16.json", "2.1.0", False, None,
     NO_LAYOUT, "F12"),
    ("1.0.0/mhc.pre_apply_mix-G11-m6-empty-batch.json", "1.0.0", False, None,
     "InternalError: Check failed: (!use_count_.count(v)) is false: variable i_mhc has been used before definition!",
     "G11"),
    ("1.0.0/moe.expand_to_fused-G12-no-token.json", "1.0.0", False, {"out"}, "", "G12"),
    ("1.0.0/quant.per_block_cast-G14-inf.json", "1.0.0", False, {"sf"}, "", "G14"),
    # G14 with round_sf, G8 with one -inf that k reaches, F10 on 1.0.0
    ("1.0.0/quant.per_block_cast-G14-inf-round_sf.json", "1.0.0", False, {"sf", "data"}, "",
     "G14"),
    ("1.0.0/moe.topk_gate-G8-one-neg-inf.json", "1.0.0", False, {"indices"}, "", "G8"),
    ("1.0.0/engram.gate-F10-t0-gradients.json", "1.0.0", True, None,
     "RuntimeError: kernel engram_gate_bwd_kernel input grad_out strides[2] violates packed ABI constraint; "
     "expected: 0, got: 1", "F10"),
    ("2.1.0/mhc.pre_apply_mix-F17-backward-hidden8-gradients.json", "2.1.0", True, {"mix"}, "", "F17"),
    ("2.1.0/mhc.head_compute_mix-F18-backward-m2-gradients.json", "2.1.0", True, {"scale"}, "", "F18"),
    ("2.1.0/mhc.post-F19-backward-m2-gradients.json", "2.1.0", True, None,
     "RuntimeError: kernel mhc_post_bwd_cuda input dx shape[1] violates packed ABI constraint; expected: 2, got: 4",
     "F19"),
    ("2.1.0/mhc.multilayer_recompute-F20-hidden1.json", "2.1.0", False, None,
     CP_ASYNC, "F20"),
    ("2.1.0/mhc.reduce_partials_and_rmsnorm-F15-empty-batch-size35.json", "2.1.0", False, None,
     NO_LAYOUT, "F15"),
    ("2.1.0/quant.norm_forward_and_per_token_cast-F1-nan.json", "2.1.0", False, {"sf"}, "", "F1"),
    ("2.1.0/mhc.reduce_partials_and_rmsnorm-F21-width35-one-token.json", "2.1.0", False, None,
     NO_LAYOUT, "F21"),
    ("2.1.0/mhc.reduce_partials_and_rmsnorm-F21-width35-one-token-gradients.json", "2.1.0", True, None,
     NO_LAYOUT, "F21"),
    ("1.0.0/mhc.norm_fn-G15-empty-k.json", "1.0.0", False, None,
     "InternalError: Check failed: (wl.grid_dim(0) > 0 && wl.grid_dim(1) > 0 && wl.grid_dim(2) > 0) is false: "
     "CUDALaunch Error: grid dimension must be positive, but got grid=(24,0,1)", "F15"),
    ("1.0.0/mhc.reduce_partials_and_rmsnorm-G15-no-token-gradients.json", "1.0.0", True, None,
     "InternalError: Check failed: (wl.grid_dim(0) > 0 && wl.grid_dim(1) > 0 && wl.grid_dim(2) > 0) is false: "
     "CUDALaunch Error: grid dimension must be positive, but got grid=(0,1,1)", "F15"),
    ("1.0.0/moe.aux_fi-G16-no-token.json", "1.0.0", False, {"fi"}, "", "G16"),
    ("1.0.0/moe.topk_sum_and_topk_group_idx-G17-nan-group.json", "1.0.0", False, {"group_idx"}, "", "G17"),
    ("1.0.0/quant.per_block_cast_with_sf_only-G18-nan.json", "1.0.0", False, {"sf"}, "", "G18"),
    ("1.0.0/quant.per_channel_cast_fused-G19-nan-channel.json", "1.0.0", False, {"sf"}, "", "G19"),
    ("1.0.0/quant.per_block_cast_lossless-G20-no-token.json", "1.0.0", False, None,
     "InternalError: Check failed: (min_reg_num < (9223372036854775807L)) is false: no available layout found", "G20"),
    ("1.0.0/quant.swiglu_backward_and_per_token_cast-G21-one-row.json", "1.0.0", False, None,
     "InternalError: Check failed: (min_reg_num < (9223372036854775807L)) is false: no available layout found", "G21"),
    # the seeded ci run of 2026-12-02 08:19 UTC (seed 1, every implementation, on the H200)
    ("2.1.0/mhc.multilayer_recompute-F20-hidden7.json", "2.1.0", False, None,
     CP_ASYNC, "F20"),
    ("2.1.0/mhc.reduce_partials_and_rmsnorm-F21-width48-one-token.json", "2.1.0", False, None,
     NO_LAYOUT, "F21"),
    ("2.1.0/mhc.reduce_partials_and_rmsnorm-F21-width48-one-token-gradients.json", "2.1.0", True, None,
     NO_LAYOUT, "F21"),
    ("2.1.0/mhc.head_compute_mix-F18-backward-m5-gradients.json", "2.1.0", True, None,
     "InternalError: Layout Layout((1, 160) -> (1, 128), transform: (_i, _j) -> (0, (_j % 32 * 5 + _j // 32) % 128)) "
     "has errors: (\"The iterations do not traverse full iter space\", \"Index mapping does not form a bijective "
     "transform.\")", "F18"),
    ("2.1.0/mhc.pre_big_fuse-F15-empty-batch.json", "2.1.0", False, None,
     "InternalError: Check failed: (wl.grid_dim(0) > 0 && wl.grid_dim(1) > 0 && wl.grid_dim(2) > 0) is false: "
     "CUDALaunch Error: grid dimension must be positive, but got grid=(0,1,1) in kernel mhc_pre_big_fuse_fwd_cuda_kernel",
     "F15"),
    ("2.1.0/quant.per_token_cast_and_cast_back-F1-nan.json", "2.1.0", False, {"out"}, "", "F1"),
    ("2.1.0/moe.topk_gate_scored-F23-subnormal-gradient-gradients.json", "2.1.0", True, {"logits"}, "", "F23"),
    ("2.1.0/engram.gate-P1-empty-batch-gradients.json", "2.1.0", True, None,
     "RuntimeError: kernel engram_gate_bwd_kernel_cuda input grad_out strides[2] violates packed ABI constraint; "
     "expected: 0, got: 1", "F10"),
    # the seeded ci runs of 2026-12-02 10:57 UTC (seeds 2 and 3, tile-kernels, on the H200)
    ("2.1.0/quant.per_block_cast-F2-inf.json", "2.1.0", False, {"sf"}, "", "F2"),
    ("2.1.0/quant.per_block_cast_with_sf_only-F13-nan.json", "2.1.0", False, {"sf"}, "", "F13"),
    ("2.1.0/mhc.multilayer_recompute-F20-hidden8.json", "2.1.0", False, None, CP_ASYNC, "F20"),
    ("2.1.0/mhc.pre_big_fuse-F15-m3-one-token.json", "2.1.0", False, None,
     "InternalError: Check failed: (tirx::is_const_power_of_two_integer(Integer(logical_width), &shift)) is false: "
     "tl.reduce: XOR-butterfly AllReduce requires logical_width (threads / scale) to be a positive power of two, "
     "got 3 (threads=3, scale=1)", "F15"),
    ("2.1.0/mhc.pre_split_mixes-F24-post-mult-0-nan.json", "2.1.0", False, {"post"}, "", "F24"),
]


def _failure(path, backward, outputs, error):
    case, meta = load_case(CASES / path)
    return case, Failure(meta["op"], backward, None if outputs is None else frozenset(outputs), error)


@pytest.mark.parametrize("path, release, backward, outputs, error, finding", FINDING_CASES,
                         ids=[Path(c[0]).stem for c in FINDING_CASES])
def test_each_committed_finding_is_recognised_on_its_releases_only(path, release, backward, outputs, error, finding):
    case, failure = _failure(path, backward, outputs, error)
    explained = known.known(release, case, failure)
    assert explained is not None and explained.startswith(f"{finding} ("), explained
    assert known.known("2.2.0", case, failure) is None
    if finding.startswith("G"):  # 1.0.0 only, or on 2.1.0 under the id of the 2.1.0 finding it repeats
        on_2_1_0 = known.known("2.1.0", case, failure)
        twin = G_SEEN_ON_2_1_0_AS.get(finding)
        assert on_2_1_0 is None if twin is None else on_2_1_0.startswith(f"{twin} ("), on_2_1_0


@pytest.mark.parametrize("path, release, backward, outputs, error, finding", FINDING_CASES,
                         ids=[Path(c[0]).stem for c in FINDING_CASES])
def test_the_same_case_failing_another_way_is_not_excused(path, release, backward, outputs, error, finding):
    case, failure = _failure(path, backward, outputs, error)
    if outputs is None:  # another error, or outputs that disagree instead of the crash
        other = [Failure(failure.op, backward, None, "RuntimeError: illegal memory access"),
                 Failure(failure.op, backward, frozenset({"out"}), "")]
    else:  # an output the finding does not touch, or a crash
        other = [Failure(failure.op, backward, failure.outputs | {"clamped_count", "comb"}, ""),
                 Failure(failure.op, backward, None, EMPTY_GRID)]
    other.append(Failure("quant.cast_back", backward, failure.outputs, error))  # another op
    if finding == "G2":
        other.append(Failure(failure.op, False, None, error))  # its forward
    for f in other:
        assert known.known(release, case, f) is None, f


def test_a_case_outside_the_domain_is_not_excused():
    # F1's op and failure, on a block that holds no NaN: a new failure, not F1.
    case, failure = _failure(FINDING_CASES[0][0], False, {"sf"}, "")
    case.inputs["x"] = case.inputs["x"].nan_to_num(0.0)
    assert known.known("2.1.0", case, failure) is None
    # F3's failure with normal sfs.
    case, failure = _failure("2.1.0/quant.per_token_cast_with_precomputed_sf-F3-subnormal-sf-e2m1.json", False,
                             {"data"}, "")
    case.inputs["sf"] = case.inputs["sf"].abs() + 1.0
    assert known.known("2.1.0", case, failure) is None
    # F1 in SwiGLU's backward cast: the sf failing on a case without a NaN would be new.
    case, failure = _failure("2.1.0/quant.swiglu_backward_and_per_token_cast-F1-nan.json", False, {"sf"}, "")
    case.inputs["x"] = case.inputs["x"].float().nan_to_num(0.0).to(case.inputs["x"].dtype)
    assert known.known("2.1.0", case, failure) is not None  # its x_sf still holds a NaN
    case.inputs["x_sf"] = case.inputs["x_sf"].nan_to_num(1.0)
    assert known.known("2.1.0", case, failure) is None
    # F17 at a hidden tile of 32 or more, F18 at m = 4, F19 at m = 4, F20 at hidden 7168 (its bench shape): new
    # failures.
    case, failure = _failure("2.1.0/mhc.pre_apply_mix-F17-backward-hidden8-gradients.json", True, {"mix"}, "")
    case.inputs["x"] = case.resized([("x", -1)], 32).inputs["x"]
    assert known.known("2.1.0", case, failure) is None
    case, failure = _failure("2.1.0/mhc.head_compute_mix-F18-backward-m2-gradients.json", True, {"scale"}, "")
    case = case.resized([("mixes", -1), ("base", 0)], 4)
    assert known.known("2.1.0", case, failure) is None
    case, failure = _failure("2.1.0/mhc.post-F19-backward-m2-gradients.json", True, None,
                             "RuntimeError: kernel mhc_post_bwd_cuda input dx shape[1] violates packed ABI constraint")
    assert known.known("2.1.0", case.resized([("comb", 2), ("comb", 3), ("post", 2), ("residual", 2)], 4),
                       failure) is None
    case, failure = _failure("2.1.0/mhc.multilayer_recompute-F20-hidden1.json", False, None,
                             "InternalError: Explicit async copy semantics require cp.async lowering")
    assert known.known("2.1.0", case.resized([("initial_residual", -1), ("layer_output", -1)], 7168), failure) is None
    # F15 in pre_big_fuse with tokens at m = 4, F24 where no post logit is NaN: new failures.
    case, failure = _failure("2.1.0/mhc.pre_big_fuse-F15-m3-one-token.json", False, None, NO_LAYOUT)
    assert known.known("2.1.0", case, failure) is not None
    four = case.resized([("residual", -2)], 4)
    assert known.known("2.1.0", four, failure) is None
    case, failure = _failure("2.1.0/mhc.pre_split_mixes-F24-post-mult-0-nan.json", False, {"post"}, "")
    case.inputs["mixes"] = case.inputs["mixes"].nan_to_num(0.0, posinf=1.0, neginf=-1.0)
    assert known.known("2.1.0", case, failure) is None
    # F23: a flushed gradient where no logit reaches 2^120 would be new.
    case, failure = _failure("2.1.0/moe.topk_gate_scored-F23-subnormal-gradient-gradients.json", True, {"logits"}, "")
    case.inputs["logits"] = case.inputs["logits"].clamp(max=2.0**100)
    assert known.known("2.1.0", case, failure) is None
    # F12's compile error where post_mult is not 0 would be new (m = 5 with post_mult 2 passes, 1 to 3 tokens).
    case, _ = load_case(CASES / "2.1.0/mhc.pre_split_mixes-F12-m5.json")
    error = NO_LAYOUT
    assert known.known("2.1.0", case, Failure("mhc.pre_split_mixes", False, None, error)) is None
    # G8: the same repeated index on distinct finite scores would be new.
    case, failure = _failure("1.0.0/moe.topk_gate-G8-tied-neg-inf.json", False, {"indices"}, "")
    case.inputs["scores"] = torch.tensor([[0.0, 1.0]])
    assert known.known("1.0.0", case, failure) is None
    # ... or on a -inf that k does not reach.
    case.inputs["scores"] = torch.tensor([[0.0, 1.0, -float("inf"), -float("inf")]])
    assert known.known("1.0.0", case, failure) is None
    # G14: an sf failing in a block cast without an inf in x would be new.
    case, failure = _failure("1.0.0/quant.per_block_cast-G14-inf.json", False, {"sf"}, "")
    case.inputs["x"] = case.inputs["x"].nan_to_num(posinf=1.0, neginf=-1.0)
    assert known.known("1.0.0", case, failure) is None
    # G13 is not declared: an e5m6 data failure on 1.0.0 always fails, off by one code or by more.
    case, failure = _failure("1.0.0/quant.per_token_cast-G13-e5m6-subnormal-rounding.json", False,
                             {"data"}, "")
    assert known.known("1.0.0", case, failure) is None
    # G12: unwritten rows when x has tokens would be new.
    case, failure = _failure("1.0.0/moe.expand_to_fused_with_sf-G12-no-token.json", False,
                             {"out"}, "")
    case.params["num_expanded_rows"] = 0
    assert known.known("1.0.0", case, failure) is None
