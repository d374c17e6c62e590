"""Speed of Engram gating (forward and backward) against the copy roofline, on a CUDA machine.

    python -m benchmarks.engram OUT.json

The spec's benchmark shape (tkverify/specs/engram.py: T = 4096 tokens, hc = 4
heads, H = 4096, bf16 activations, fp32 w) and DeepSeek's H = 7168 at the
same T and hc.  Times the TileLang kernels (kernels.engram: the forward; the
backward, its grad_w reduction kernel included) and the eager PyTorch
implementation (kernels.torch.engram), with tkverify.bench's median
CUDA-event timing (L2 flushed between runs); the device-to-device copy
bandwidth is measured in the same process.

Effective bandwidth = the bytes an op must move, each counted once, / time
(the spec's `bench_forward_bytes` / `bench_backward_bytes`):

* forward: x, k, v, w read; out, d, g, rx, rk written.
* backward: grad_out, x, k, v, w, d, g, rx, rk read; grad_x, grad_k, grad_v,
  grad_w written.  Not counted: the grad_w partial sums (blocks x hc x H fp32,
  written once and read once by the reduction), which the TileLang backward
  adds on top.

tile-kernels' engram_gate_fwd / bwd are not timed here: they take k and v
packed as kv (T, hc + 1, H), return no grad_v and leave grad_w as partials
to be reduced with the unfused weights, so their signatures do not map onto
this op's without extra copies (a tile-kernels adapter is separate work).
"""

from __future__ import annotations

import json
import sys

import torch

from tkverify.bench import copy_bandwidth, median_time_s

SHAPES = ((4096, 4, 4096), (4096, 4, 7168))  # (T, hc, H); the first is the spec's benchmark shape


def main(out_json: str) -> dict:
    import kernels.engram as tilelang_engram
    import kernels.torch.engram as torch_engram
    from tkverify.specs import engram as spec

    try:
        from tkverify.report import device_info

        meta = device_info()
    except Exception as e:  # reported, not hidden
        meta = {"device_info_error": repr(e)}
    results = {"meta": meta, "rows": []}
    roof = copy_bandwidth()
    results["copy_bandwidth_TBps"] = roof / 1e12
    print(f"copy bandwidth {roof / 1e12:.3f} TB/s", flush=True)

    def row(op, impl, shape, fn, nbytes, target):
        t = median_time_s(fn)
        results["rows"].append({"op": op, "impl": impl, "shape": shape, "time_us": t * 1e6, "bytes": nbytes,
                                "TBps": nbytes / t / 1e12, "of_copy": nbytes / t / roof, "target": target})
        print(results["rows"][-1], flush=True)

    device = torch.device("cuda")
    for tokens, heads, hidden in SHAPES:
        shape = {"T": tokens, "hc": heads, "H": hidden}
        inputs, params = spec.bench_forward_inputs(device, tokens, heads, hidden)
        nbytes = spec.bench_forward_bytes(inputs, params)
        for impl, module in (("tilelang", tilelang_engram), ("torch", torch_engram)):
            row("engram.gate_fwd", impl, shape, lambda m=module: m.engram_gate_fwd(**inputs, **params), nbytes, 0.9)
        del inputs
        kwargs, params = spec.bench_backward_inputs(device, tokens, heads, hidden)
        nbytes = spec.bench_backward_bytes(kwargs, params)
        for impl, module in (("tilelang", tilelang_engram), ("torch", torch_engram)):
            row("engram.gate_bwd", impl, shape, lambda m=module: m.engram_gate_bwd(**kwargs, **params), nbytes, 0.8)
        del kwargs
        torch.cuda.empty_cache()

    with open(out_json, "w") as f:
        json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1])
