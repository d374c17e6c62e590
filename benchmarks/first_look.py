"""First timings of topk_gate and the transposes on a CUDA machine (issue 2's GPU run).

python -m benchmarks.first_look OUT.json
"""

import json
import sys

import torch

from tkverify.bench import copy_bandwidth, median_time_s
from tkverify.report import device_info


def main(out_path: str) -> None:
    import kernels.moe
    import kernels.transpose

    results = {"meta": device_info(), "rows": []}
    roof = copy_bandwidth()
    results["copy_bandwidth_TBps"] = roof / 1e12

    def row(op, impl, shape, t, nbytes):
        results["rows"].append({"op": op, "impl": impl, "shape": shape, "time_us": t * 1e6,
                                "TBps": nbytes / t / 1e12, "of_copy": nbytes / t / roof})
        print(results["rows"][-1], flush=True)

    scores = torch.randn(16384, 256, device="cuda")
    k = 8
    nbytes = scores.numel() * 4 + 16384 * k * 8
    row("moe.topk_gate", "tilelang", [16384, 256, k], median_time_s(lambda: kernels.moe.topk_gate(scores, k)), nbytes)
    row("moe.topk_gate", "torch", [16384, 256, k],
        median_time_s(lambda: torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]), nbytes)
    try:
        import tile_kernels

        row("moe.topk_gate", "tile_kernels " + getattr(tile_kernels, "__version__", "?"), [16384, 256, k],
            median_time_s(lambda: tile_kernels.moe.topk_gate(scores, k)), nbytes)
    except Exception as e:  # reported, not hidden
        results["tile_kernels_error"] = repr(e)

    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        for m, n in ((8192, 8192), (8191, 8193)):
            x = torch.randn(m, n, device="cuda").to(dtype)
            nbytes = 2 * x.numel() * x.element_size()
            row("transpose.transpose", "tilelang", [m, n, str(dtype)],
                median_time_s(lambda: kernels.transpose.transpose(x)), nbytes)
            raw = x.view(torch.uint8) if x.element_size() == 1 else x  # fp8 copies go through bytes
            row("transpose.transpose", "torch", [m, n, str(dtype)],
                median_time_s(lambda: raw.t().contiguous()), nbytes)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
