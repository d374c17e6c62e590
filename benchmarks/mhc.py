"""Speed of the mHC kernels on a CUDA machine: TileLang (kernels.mhc) against eager PyTorch (kernels.torch.mhc).

    python -m benchmarks.mhc OUT.json

Shapes: Sinkhorn over 65536 matrices of 4 x 4, repeat 10, eps 1e-6 (forward
and backward); the mix ops at a = 1, b = 16384 tokens, m = 4 streams, H = 7168
channels (DeepSeek's mHC).  Median CUDA-event time with L2 flushed between
runs (tkverify.bench), the copy bandwidth measured in the same process.

Bytes counted (each once, what the op must move):

* sinkhorn: x read + P written (8 MB); sinkhorn_bwd: grad_out and x read +
  grad_x written (12 MB).  Both are latency / instruction bound: their figure
  is for reference, the target is time (forward <= 15 us).
* pre_split_mixes: mixes read + pre, post, comb written (+ scale and base).
* pre_apply_mix: x (T, m, H) bf16 read + out (T, H) bf16 written + mix read.
* post: x (T, H) and residual (T, m, H) read + out (T, m, H) written, bf16,
  + post and comb read.

An eager op missing from kernels.torch.mhc (the mix ops are written in
parallel) is reported as a row with "skipped" instead of a time.
"""

from __future__ import annotations

import json
import sys

import torch

from tkverify.bench import copy_bandwidth, median_time_s

MATRICES, M, REPEAT, EPS = 65536, 4, 10, 1e-6
A, B, STREAMS, HIDDEN = 1, 16384, 4, 7168


def main(out_json: str) -> dict:
    import kernels.mhc as tilelang_mhc
    import kernels.torch.mhc as torch_mhc

    try:
        from tkverify.report import device_info

        meta = device_info()
    except Exception as e:  # reported, not hidden
        meta = {"device_info_error": repr(e)}
    results = {"meta": meta,
               "shape": {"matrices": MATRICES, "m": M, "repeat": REPEAT, "a": A, "b": B, "streams": STREAMS,
                         "H": HIDDEN},
               "rows": []}
    roof = copy_bandwidth()
    results["copy_bandwidth_TBps"] = roof / 1e12
    print(f"copy bandwidth {roof / 1e12:.3f} TB/s", flush=True)

    def row(op, impl, fn, nbytes):
        if fn is None:
            results["rows"].append({"op": op, "impl": impl, "skipped": "not in kernels.torch.mhc"})
        else:
            t = median_time_s(fn)
            results["rows"].append({"op": op, "impl": impl, "time_us": t * 1e6, "bytes": nbytes,
                                    "TBps": nbytes / t / 1e12, "of_copy": nbytes / t / roof})
        print(results["rows"][-1], flush=True)

    def both(op, make_call, nbytes):
        for impl, module in (("tilelang", tilelang_mhc), ("torch", torch_mhc)):
            fn = getattr(module, op.split(".")[1], None)
            row(op, impl, None if fn is None else make_call(fn), nbytes)

    g = torch.Generator(device="cuda").manual_seed(0)

    # Sinkhorn
    x = torch.randn(MATRICES, M, M, device="cuda", generator=g) * 2
    grad = torch.randn(MATRICES, M, M, device="cuda", generator=g)
    both("mhc.sinkhorn", lambda f: lambda: f(x, REPEAT, EPS), 2 * x.numel() * 4)
    both("mhc.sinkhorn_bwd", lambda f: lambda: f(grad, x, REPEAT, EPS), 3 * x.numel() * 4)
    del x, grad

    # pre_split_mixes
    width = STREAMS * (STREAMS + 2)
    mixes = torch.randn(A, B, width, device="cuda", generator=g)
    scale = torch.rand(3, device="cuda", generator=g)
    base = torch.randn(width, device="cuda", generator=g)
    nbytes = 2 * A * B * width * 4 + (3 + width) * 4
    both("mhc.pre_split_mixes", lambda f: lambda: f(mixes, scale, base, STREAMS, 2.0, 1e-6), nbytes)

    # pre_apply_mix
    streams = torch.randn(A, B, STREAMS, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    mix = torch.rand(A, B, STREAMS, 1, device="cuda", generator=g)
    nbytes = A * B * (STREAMS * HIDDEN * 2 + HIDDEN * 2 + STREAMS * 4)
    both("mhc.pre_apply_mix", lambda f: lambda: f(streams, mix), nbytes)

    # post
    layer_out = torch.randn(A, B, HIDDEN, device="cuda", generator=g).to(torch.bfloat16)
    post_w = torch.rand(A, B, STREAMS, 1, device="cuda", generator=g)
    comb = torch.rand(A, B, STREAMS, STREAMS, device="cuda", generator=g)
    nbytes = A * B * (HIDDEN * 2 + 2 * STREAMS * HIDDEN * 2 + (STREAMS + STREAMS * STREAMS) * 4)
    both("mhc.post", lambda f: lambda: f(layer_out, streams, post_w, comb), nbytes)

    with open(out_json, "w") as f:
        json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1])
