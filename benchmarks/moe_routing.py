"""Speed of the MoE routing data movers against the copy roofline, on a CUDA machine.

    python -m benchmarks.moe_routing OUT.json

DeepSeek-V3's shape: T = 16384 tokens, K = 8 slots of E = 256 experts (distinct
per token, no masked slot), hidden H = 7168 in bf16, segments aligned to 128
rows.  Times expand_to_fused and reduce_fused of the TileLang kernels
(kernels.moe) and of the eager PyTorch implementation (kernels.torch.moe),
plus an fp8 (e4m3 + per-row sf) variant of each and fused_mapping; the
device-to-device copy bandwidth is measured in the same process, with
tkverify.bench's median CUDA-event timing (L2 flushed between runs).

Effective bandwidth = the bytes an op must move, each counted once, / time:

* expand_to_fused: x read once (T * H * elem) + every row of out written once
  (N * H * elem, padding rows included: they must be zeroed) + token_topk_to_pos
  read (T * K * 4); with an sf, also x_sf read (T * G * 4) and out_sf written
  (N * G * 4).
* reduce_fused: the rows that slots reach read once (P * H * elem, P = placed
  pairs = T * K here; padding rows need not be read) + out written (T * H *
  out_elem) + topk_weights and token_topk_to_pos read (T * K * 8); with e4m3,
  also the P reached row scales (P * 4).
* fused_mapping: topk_idx read (T * K * 8), token_topk_to_pos written (T * K * 4),
  pos_to_token and pos_to_token_topk written (2 * N * 4).  (It is latency-bound:
  its figure is for reference.)

Not counted: the kernels' own scratch (row_src, the chunk counts), which the
TileLang implementation adds on top (N * 4 bytes for expand).
"""

from __future__ import annotations

import json
import sys

import torch

from tkverify.bench import copy_bandwidth, median_time_s, write_bandwidth

TOKENS, SLOTS, EXPERTS, HIDDEN, ALIGNMENT = 16384, 8, 256, 7168, 128
SF_COLUMNS = HIDDEN // 128  # one fp32 sf per 128 channels


def main(out_json: str) -> dict:
    import kernels.moe as tilelang_moe
    import kernels.torch.moe as torch_moe

    try:
        from tkverify.report import device_info

        meta = device_info()
    except Exception as e:  # reported, not hidden
        meta = {"device_info_error": repr(e)}
    results = {"meta": meta, "shape": {"T": TOKENS, "K": SLOTS, "E": EXPERTS, "H": HIDDEN, "alignment": ALIGNMENT},
               "rows": []}
    roof = copy_bandwidth()
    results["copy_bandwidth_TBps"] = roof / 1e12
    # expand_to_fused writes 8 bytes for each one it reads: its ceiling is nearer a fill than a copy.
    results["write_bandwidth_TBps"] = write_bandwidth() / 1e12
    print(f"write-only bandwidth {results['write_bandwidth_TBps']:.3f} TB/s", flush=True)
    print(f"copy bandwidth {roof / 1e12:.3f} TB/s", flush=True)

    def row(op, impl, variant, fn, nbytes):
        t = median_time_s(fn)
        results["rows"].append({"op": op, "impl": impl, "variant": variant, "time_us": t * 1e6, "bytes": nbytes,
                                "TBps": nbytes / t / 1e12, "of_copy": nbytes / t / roof})
        print(results["rows"][-1], flush=True)

    g = torch.Generator(device="cuda").manual_seed(0)
    topk_idx = torch.rand(TOKENS, EXPERTS, device="cuda", generator=g).argsort(dim=1)[:, :SLOTS].contiguous()
    pairs = topk_idx.numel()
    mapping = tilelang_moe.fused_mapping(topk_idx, EXPERTS, ALIGNMENT)
    token_topk_to_pos, num_rows = mapping[2], mapping[5]
    results["shape"]["N"] = num_rows
    nbytes = pairs * 8 + pairs * 4 + 2 * num_rows * 4
    for impl, module in (("tilelang", tilelang_moe), ("torch", torch_moe)):
        row("moe.fused_mapping", impl, "int64", lambda m=module: m.fused_mapping(topk_idx, EXPERTS, ALIGNMENT), nbytes)

    # expand_to_fused
    x = torch.randn(TOKENS, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    nbytes = TOKENS * HIDDEN * 2 + num_rows * HIDDEN * 2 + pairs * 4
    for impl, module in (("tilelang", tilelang_moe), ("torch", torch_moe)):
        row("moe.expand_to_fused", impl, "bf16",
            lambda m=module: m.expand_to_fused(x, token_topk_to_pos, num_rows), nbytes)
    x8 = x.to(torch.float8_e4m3fn)
    x8_sf = torch_moe.column_major_zeros(TOKENS, SF_COLUMNS, torch.float32, x.device)
    x8_sf.copy_(torch.rand(TOKENS, SF_COLUMNS, device="cuda", generator=g))
    nbytes = (TOKENS * HIDDEN + num_rows * HIDDEN + pairs * 4 + TOKENS * SF_COLUMNS * 4 + num_rows * SF_COLUMNS * 4)
    for impl, module in (("tilelang", tilelang_moe), ("torch", torch_moe)):
        row("moe.expand_to_fused", impl, "e4m3+sf(fp32, tma column-major)",
            lambda m=module: m.expand_to_fused(x8, token_topk_to_pos, num_rows, x8_sf), nbytes)
    del x8, x8_sf

    # reduce_fused
    expanded = torch.randn(num_rows, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    weights = torch.rand(TOKENS, SLOTS, device="cuda", generator=g)
    nbytes = pairs * HIDDEN * 2 + TOKENS * HIDDEN * 2 + pairs * 8
    for impl, module in (("tilelang", tilelang_moe), ("torch", torch_moe)):
        row("moe.reduce_fused", impl, "bf16",
            lambda m=module: m.reduce_fused(expanded, weights, token_topk_to_pos), nbytes)
    expanded8 = expanded.to(torch.float8_e4m3fn)
    row_sf = torch.rand(num_rows, 1, device="cuda", generator=g)
    nbytes = pairs * HIDDEN + TOKENS * HIDDEN * 2 + pairs * 8 + pairs * 4
    for impl, module in (("tilelang", tilelang_moe), ("torch", torch_moe)):
        row("moe.reduce_fused", impl, "e4m3+row sf",
            lambda m=module: m.reduce_fused(expanded8, weights, token_topk_to_pos, row_sf), nbytes)

    with open(out_json, "w") as f:
        json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1])
