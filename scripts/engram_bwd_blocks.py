"""Time the Engram backward at the bench's shape for several caps on its token blocks (BWD_BLOCKS).

    python scripts/engram_bwd_blocks.py [CAP ...]        # on a CUDA machine; default 256 132 128 66 64

The cap sets the grad_w partials (blocks x hc x H fp32, written and read again by the reduction) and
the CTAs' waves; grad_w's summation order changes with it, so its bits do (grad_x, grad_k and grad_v
must not: checked here).  Prints one line a cap: blocks, tokens a block, eager and graph time, the
share of the copy bandwidth measured in the same process, grad_w's largest relative difference to the
first cap's.
"""

import sys

import torch

from kernels import engram
from tkverify import bench
from tkverify.specs import engram as spec


def main(caps: list[int]) -> None:
    copy = bench.copy_bandwidth()
    inputs, params = spec.bench_backward_inputs(torch.device("cuda"))
    nbytes = spec.bench_backward_bytes(inputs, params)
    tokens = inputs["x"].shape[0]
    print(f"copy bandwidth {copy / 1e12:.3f} TB/s; T {tokens}, bytes {nbytes}", flush=True)
    first = None
    for cap in caps:
        engram.BWD_BLOCKS = cap
        per_block, blocks = engram.backward_blocks(tokens)
        fn = lambda: engram.engram_gate_bwd(**inputs, **params)  # noqa: E731
        got = fn()
        first = first or got
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got[:3], first[:3]))
        diff = ((got[3] - first[3]).abs() / first[3].abs().clamp_min(1e-30)).max().item()
        eager, graph = bench.median_time_s(fn) * 1e6, bench.graph_time_s(fn) * 1e6
        best = min(eager, graph)
        print(f"cap {cap}: {blocks} blocks of {per_block} tokens | {eager:.1f} us eager | {graph:.1f} us graph | "
              f"{nbytes / (best * 1e-6) / copy:.1%} of copy | grad_x,k,v same bits as cap {caps[0]}: {same} | "
              f"grad_w max rel diff {diff:.2e}", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [256, 132, 128, 66, 64])
