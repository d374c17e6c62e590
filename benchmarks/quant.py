"""Speed of the quantisation casts against the copy roofline, on a CUDA machine.

    python -m benchmarks.quant OUT.json

Shapes (DeepSeek-V3's): x bf16 (16384, 7168) for per_token_cast, e4m3 in
blocks of 128 (plain fp32 sf) and e2m1 in blocks of 32; SwiGLU x bf16
(16384, 2 * 2048) cast to e4m3 in blocks of 128, without weights or clamp.
Implementations: the TileLang kernels (kernels.quant), the eager PyTorch
implementation (kernels.torch.quant) and, if it imports, tile-kernels
(tile_kernels.quant.per_token_cast / swiglu_forward_and_per_token_cast, its
public functions, with the same format, block and sf options).  A few extra
rows time other option sets of the TileLang kernels (round_sf + packed ue8m0
+ TMA-aligned column-major sf; fp32 input; swiglu with weights, padding rows
and a clamp with counting).

Timing: tkverify.bench.median_time_s (median of CUDA-event times, L2 flushed
between runs); the device-to-device copy bandwidth (tkverify.bench.copy_bandwidth)
is measured in the same process.

Effective bandwidth = bytes an op must read and write, each counted once,
over the median time:

* per_token_cast: x read (T * H * 2 bytes for bf16) + data written (e4m3:
  T * H bytes; e2m1: T * H / 2) + sf written (T * H / npc * 4 bytes for fp32,
  1 byte per block for ue8m0, packed: 4 bytes per 4 blocks).
* swiglu_forward_and_per_token_cast: x read (N * 2H * 2) + data written
  (N * H) + sf written (N * H / 128 * 4); with weights, also
  pos_to_token_topk (N * 4) and the weights reached (N * 4).

Not counted: the padding of a column-major sf (never written nor read) and
any scratch an implementation allocates.  Each row also says whether the
implementation's outputs agree with the TileLang ones on the timed input
(sf and data bitwise; torch on CUDA divides by max_q through a reciprocal, so
its plain sf may differ by an ULP there).
"""

from __future__ import annotations

import json
import sys

import torch

from tkverify.bench import copy_bandwidth, median_time_s

TOKENS, HIDDEN = 16384, 7168
SWIGLU_ROWS, SWIGLU_HIDDEN = 16384, 2048


def _agreement(ours, theirs) -> dict:
    """Fractions of equal sf and data bytes (informational)."""
    out = {}
    for name, a, b in (("data", ours[0], theirs[0]), ("sf", ours[1], theirs[1])):
        try:
            a8 = a.contiguous().view(torch.uint8).reshape(-1)
            b8 = b.contiguous().view(torch.uint8).reshape(-1)
            out[f"{name}_bytes_equal"] = float((a8 == b8).float().mean()) if a8.shape == b8.shape else None
        except Exception as e:  # reported, not hidden
            out[f"{name}_compare_error"] = repr(e)
    return out


def main(out_json: str) -> dict:
    import kernels.quant as tl_quant
    import kernels.torch.quant as torch_quant

    try:
        from tkverify.report import device_info

        meta = device_info()
    except Exception as e:  # reported, not hidden
        meta = {"device_info_error": repr(e)}
    results = {"meta": meta, "rows": []}
    roof = copy_bandwidth()
    results["copy_bandwidth_TBps"] = roof / 1e12
    print(f"copy bandwidth {roof / 1e12:.3f} TB/s", flush=True)

    try:
        import tile_kernels.quant as tk_quant

        results["tile_kernels_version"] = getattr(sys.modules.get("tile_kernels"), "__version__", "?")
    except Exception as e:  # reported, not hidden
        tk_quant = None
        results["tile_kernels_error"] = repr(e)

    def row(op, impl, shape, fn, nbytes, reference=None, **extra):
        try:
            out = fn()
            t = median_time_s(fn)
        except Exception as e:  # reported, not hidden
            results["rows"].append({"op": op, "impl": impl, "shape": shape, "error": repr(e), **extra})
            print(results["rows"][-1], flush=True)
            return None
        entry = {"op": op, "impl": impl, "shape": shape, "time_us": t * 1e6, "TBps": nbytes / t / 1e12,
                 "of_copy": nbytes / t / roof, "bytes": nbytes, **extra}
        if reference is not None:
            entry.update(_agreement(reference, out))
        results["rows"].append(entry)
        print(entry, flush=True)
        return out

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)

    for fmt, npc, data_bytes in (("e4m3", 128, TOKENS * HIDDEN), ("e2m1", 32, TOKENS * HIDDEN // 2)):
        nbytes = x.numel() * 2 + data_bytes + TOKENS * (HIDDEN // npc) * 4
        shape = [TOKENS, HIDDEN, fmt, npc]
        ours = row("quant.per_token_cast", "tilelang", shape, lambda: tl_quant.per_token_cast(x, fmt, npc), nbytes)
        row("quant.per_token_cast", "torch", shape, lambda: torch_quant.per_token_cast(x, fmt, npc), nbytes, ours)
        if tk_quant is not None:
            row("quant.per_token_cast", "tile_kernels", shape, lambda: tk_quant.per_token_cast(x, fmt, npc), nbytes,
                ours)

    # Other option sets of ours (informational).
    cols = HIDDEN // 128
    nbytes = x.numel() * 3 + TOKENS * (-(-cols // 4)) * 4
    row("quant.per_token_cast", "tilelang", [TOKENS, HIDDEN, "e4m3", 128, "round_sf+packed_ue8m0+tma_col_major"],
        lambda: tl_quant.per_token_cast(x, "e4m3", 128, round_sf=True, use_ue8m0=True, use_packed_ue8m0=True,
                                        use_tma_aligned_col_major_sf=True), nbytes)
    x32 = x.float()
    row("quant.per_token_cast", "tilelang", [TOKENS, HIDDEN, "e4m3", 128, "fp32 input"],
        lambda: tl_quant.per_token_cast(x32, "e4m3", 128), x32.numel() * 5 + TOKENS * cols * 4)
    del x32

    xs = torch.randn(SWIGLU_ROWS, 2 * SWIGLU_HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    nbytes = xs.numel() * 2 + SWIGLU_ROWS * SWIGLU_HIDDEN + SWIGLU_ROWS * (SWIGLU_HIDDEN // 128) * 4
    shape = [SWIGLU_ROWS, 2 * SWIGLU_HIDDEN, "e4m3", 128]
    ours = row("quant.swiglu_forward_and_per_token_cast", "tilelang", shape,
               lambda: tl_quant.swiglu_forward_and_per_token_cast(xs, "e4m3", 128), nbytes)
    row("quant.swiglu_forward_and_per_token_cast", "torch", shape,
        lambda: torch_quant.swiglu_forward_and_per_token_cast(xs, "e4m3", 128), nbytes, ours)
    if tk_quant is not None:
        row("quant.swiglu_forward_and_per_token_cast", "tile_kernels", shape,
            lambda: tk_quant.swiglu_forward_and_per_token_cast(xs, "e4m3", 128), nbytes, ours)

    # With weights through pos_to_token_topk (a tenth of the rows padding), a clamp, and counting.
    k = 8
    pos = torch.randperm(SWIGLU_ROWS, device="cuda", generator=gen).to(torch.int32)
    pos[torch.rand(SWIGLU_ROWS, device="cuda", generator=gen) < 0.1] = -1
    weights = torch.rand(SWIGLU_ROWS // k + 1, k, device="cuda", generator=gen)
    counts = torch.zeros(3, dtype=torch.int64, device="cuda")
    row("quant.swiglu_forward_and_per_token_cast", "tilelang", shape + ["weights+clamp 7+count"],
        lambda: tl_quant.swiglu_forward_and_per_token_cast(xs, "e4m3", 128, topk_weights=weights,
                                                           pos_to_token_topk=pos, clamp=7.0, clamped_count=counts),
        nbytes + SWIGLU_ROWS * 8)

    with open(out_json, "w") as f:
        json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1])
