"""Time candidate static configurations of the per-token cast, mHC post, Engram gate, MoE expand and transpose kernels against the shipped ones.

    python -m benchmarks.tune OUT.json            # on a CUDA machine
    python -m benchmarks.tune --precompile         # here: compile every config it will time (sm_90)
    python -m benchmarks.tune OUT.json -k engram   # only the groups whose name contains "engram"

Each group is one call on one shape (DeepSeek-V3's: bf16 16384 x 7168 per-token
e4m3/128, e2m1/32 and e5m6 whole rows; SwiGLU 16384 x 2 x 2048 e4m3/128, plain and routed as the
bench's second SwiGLU shape (pos_to_token_topk, weights, clamp, counts); mHC post 16384 x 4 x 7168;
the Engram gate forward and backward at the bench's T 4096, hc 4, H 4096 bf16, inputs and bytes
as `tkverify.specs.engram` gives them to the bench; the backward's time includes its grad_w reduction;
moe.expand_to_fused at the bench's T 16384, K 8, H 7168 bf16, inputs and bytes as `tkverify.specs.moe`
gives them to the bench, the time including the row map kernel; transpose.transpose at the bench's
8192 x 8192 f32, bf16 and e4m3, inputs and bytes as `tkverify.specs.transpose` gives them to the bench).
For each candidate (`kernels.quant.TOKEN_TUNE_CONFIGS` of that source, dtype and
format, `kernels.mhc.POST_TUNE_CONFIGS` of that padded m, `kernels.engram.FWD_TUNE_CONFIGS` /
`BWD_TUNE_CONFIGS` covering rows as the shipped configuration does (`engram.row_chunks`: threads x
chunks; a forward candidate may have fewer threads, each owning more chunks), `kernels.moe.EXPAND_TUNE_CONFIGS`
of the row kernel's 16-byte unit, `kernels.transpose.TRANSPOSE_TUNE_CONFIGS` of that element width)
the wrapper is pointed at it through `kernels.quant.TOKEN_OVERRIDES` / `kernels.mhc.POST_OVERRIDES` /
`kernels.engram.FWD_OVERRIDES` / `BWD_OVERRIDES` / `kernels.moe.EXPAND_OVERRIDES` /
`kernels.transpose.TRANSPOSE_OVERRIDES` (keyed by the shipped configuration), its outputs
are compared byte for byte with the shipped configuration's on the timed input
(a candidate that changes a single byte is disqualified), and it is timed twice:
eagerly (CUDA events around the call) and replayed from a CUDA graph.  The
winner of a group is the bitwise-equal candidate with the least best time
(`tkverify.bench.best_time_us`: the smaller of the two; the bench itself judges the eager p50).

OUT.json: {"meta", "copy_bandwidth_TBps", "groups": [{"name", "key", "bytes",
"rows": [{"config", "default", "time_us", "kernel_us", "of_copy",
"bitwise_equal", "error"?}], "winner"}]}; the same as a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, NamedTuple

TOKENS, HIDDEN, SWIGLU_HIDDEN = 16384, 7168, 2048
MHC_M = 4
# the bench's Engram shape (tkverify.specs.engram.BENCH_*), repeated here to name the groups
ENGRAM_TOKENS, ENGRAM_HEADS, ENGRAM_HIDDEN = 4096, 4, 4096
EXPAND_SLOTS = 8  # the bench's MoE top-k (tkverify.specs.moe), repeated here to name the group
TRANSPOSE_SIDE = 8192  # the bench's aligned transpose shape (tkverify.specs.transpose), to name the groups


class Target(NamedTuple):
    """What a group tunes: the kernel, the wrapper's override table and the shipped configuration's key
    in it, the shipped configuration, the candidates, and the kernels its call launches besides."""

    kernel: Any
    overrides: dict
    key: Any
    shipped: Any
    candidates: tuple
    support: tuple = ()  # (kernel, config) pairs, compiled by --precompile too

    def configs(self) -> list:
        """The shipped configuration, then every other candidate (once each)."""
        return list(dict.fromkeys((self.shipped, *self.candidates)))


def _token_target(source: str, dtype: str, fmt: str) -> Target:
    """The per-token cast of that source, dtype and format (TUNED applied); its static candidates."""
    from kernels import quant

    key = (source, dtype, fmt, 0)
    return Target(quant.TOKEN_CAST, quant.TOKEN_OVERRIDES, key, quant.token_config(source, dtype, fmt),
                  tuple(c for c in quant.TOKEN_TUNE_CONFIGS if tuple(c[:3]) == key[:3]))


def _post_target(vectorized: bool, padded: int) -> Target:
    from kernels import mhc

    return Target(mhc.POST, mhc.POST_OVERRIDES, (vectorized, padded), mhc.post_config(vectorized, padded),
                  tuple(c for c in mhc.POST_TUNE_CONFIGS if tuple(c[:2]) == (vectorized, padded)))


def _engram_target(backward: bool) -> Target:
    """Keyed by the base configuration of H (config_for_hidden's); candidates that cover its rows (threads x chunks: a forward
    candidate of 256 threads x 2 chunks serves the 512-thread group)."""
    from kernels import engram

    if backward:
        shipped = engram.bwd_config(ENGRAM_HIDDEN, ENGRAM_HEADS)
        base = engram.config_for_hidden(ENGRAM_HIDDEN)  # a candidate where BWD_SHIPPED names another
        return Target(engram.GATE_BWD, engram.BWD_OVERRIDES, base, shipped,
                      (base,) + tuple(c for c in engram.BWD_TUNE_CONFIGS
                                      if engram.row_chunks(c) == engram.row_chunks(shipped)),
                      ((engram.GRAD_W_REDUCE, engram.ReduceConfig()),))
    shipped = engram.fwd_config(ENGRAM_HIDDEN)
    return Target(engram.GATE_FWD, engram.FWD_OVERRIDES, engram.config_for_hidden(ENGRAM_HIDDEN), shipped,
                  tuple(c for c in engram.FWD_TUNE_CONFIGS if engram.row_chunks(c) == engram.row_chunks(shipped)))


def _expand_target() -> Target:
    """The 16-byte row kernel, keyed by its base configuration (one unit a thread, a candidate again since
    EXPAND_SHIPPED ships 2); row_src's map kernel beside it."""
    from kernels import moe

    return Target(moe.EXPAND_TO_FUSED, moe.EXPAND_OVERRIDES, moe.ExpandConfig("rows", 16),
                  moe.expand_rows_config(16),
                  (moe.ExpandConfig("rows", 16),) + tuple(c for c in moe.EXPAND_TUNE_CONFIGS if c.width == 16),
                  ((moe.EXPAND_TO_FUSED, moe.ExpandConfig("map", 0)),))


def _transpose_target(dtype: str) -> Target:
    """The vectorized transpose of that raw-bits dtype (the 8192 x 8192 bench shapes take it)."""
    from kernels import transpose

    base = transpose.TransposeConfig(dtype, True)
    return Target(transpose.BATCHED_TRANSPOSE, transpose.TRANSPOSE_OVERRIDES, base,
                  transpose.TRANSPOSE_SHIPPED.get(base, base),
                  (base,) + tuple(c for c in transpose.TRANSPOSE_TUNE_CONFIGS if c.dtype == dtype))


def _groups():
    """(name, Target, make(device) -> (fn(), nbytes))."""
    import torch

    from kernels import quant

    def cast(fmt, npc, data_bytes):
        def make(device):
            x = torch.randn(TOKENS, HIDDEN, device=device, generator=torch.Generator(device).manual_seed(0))
            x = x.to(torch.bfloat16)
            return (lambda: quant.per_token_cast(x, fmt, npc),
                    x.numel() * 2 + int(x.numel() * data_bytes) + TOKENS * (HIDDEN // npc) * 4)
        return make

    def swiglu(device):
        x = torch.randn(TOKENS, 2 * SWIGLU_HIDDEN, device=device, generator=torch.Generator(device).manual_seed(0))
        x = x.to(torch.bfloat16)
        return (lambda: quant.swiglu_forward_and_per_token_cast(x, "e4m3", 128),
                x.numel() * 2 + TOKENS * SWIGLU_HIDDEN + TOKENS * (SWIGLU_HIDDEN // 128) * 4)

    def swiglu_routed(device):
        # the bench's routed shape (a tenth of the rows padding, weights through pos, clamp 7, counting); the
        # wrapper reads no tensor value on the host (tests/test_sync_gpu.py), so the whole call is timed
        from tkverify.specs import quant_bench

        inputs, params = quant_bench.swiglu_routed_shape(device)
        return (lambda: quant.swiglu_forward_and_per_token_cast(inputs["x"], params["fmt"], params["num_per_channels"],
                                                                topk_weights=inputs["topk_weights"],
                                                                pos_to_token_topk=inputs["pos_to_token_topk"],
                                                                clamp=params["clamp"],
                                                                clamped_count=inputs["clamped_count"]),
                quant_bench.swiglu_bytes(inputs, params) + inputs["x"].shape[0] * 8)

    def post(device):
        from kernels import mhc

        g = torch.Generator(device).manual_seed(0)
        x = torch.randn(1, TOKENS, HIDDEN, device=device, generator=g).to(torch.bfloat16)
        residual = torch.randn(1, TOKENS, MHC_M, HIDDEN, device=device, generator=g).to(torch.bfloat16)
        weights = torch.rand(1, TOKENS, MHC_M, 1, device=device, generator=g) * 2
        comb = torch.rand(1, TOKENS, MHC_M, MHC_M, device=device, generator=g)
        return (lambda: mhc.post(x, residual, weights, comb),
                (x.numel() + 2 * residual.numel()) * 2 + (weights.numel() + comb.numel()) * 4)

    def engram_gate(backward):
        def make(device):
            from kernels import engram
            from tkverify.specs import engram as spec

            if backward:
                inputs, params = spec.bench_backward_inputs(device)
                return (lambda: engram.engram_gate_bwd(**inputs, **params),
                        spec.bench_backward_bytes(inputs, params))
            inputs, params = spec.bench_forward_inputs(device)
            return lambda: engram.engram_gate_fwd(**inputs, **params), spec.bench_forward_bytes(inputs, params)
        return make

    def expand(device):
        from kernels import moe
        from tkverify.specs import moe as spec

        (shape,) = spec.BENCH["moe.expand_to_fused"]
        inputs, params = shape.make(device)
        return lambda: moe.expand_to_fused(**inputs, **params), shape.nbytes(inputs, params)

    def transposed(shape_name):
        def make(device):
            from kernels import transpose
            from tkverify.specs import transpose as spec

            (shape,) = [s for s in spec.BENCH["transpose.transpose"] if s.name == shape_name]
            inputs, params = shape.make(device)
            return lambda: transpose.transpose(**inputs, **params), shape.nbytes(inputs, params)
        return make

    return [
        (f"per_token_cast bf16 {TOKENS}x{HIDDEN} e4m3/128", _token_target("x", "bfloat16", "e4m3"),
         cast("e4m3", 128, 1.0)),
        (f"per_token_cast bf16 {TOKENS}x{HIDDEN} e2m1/32", _token_target("x", "bfloat16", "e2m1"),
         cast("e2m1", 32, 0.5)),
        (f"per_token_cast bf16 {TOKENS}x{HIDDEN} e5m6/{HIDDEN}", _token_target("x", "bfloat16", "e5m6"),
         cast("e5m6", HIDDEN, 1.5)),
        (f"swiglu_forward_and_per_token_cast bf16 {TOKENS}x2x{SWIGLU_HIDDEN} e4m3/128",
         _token_target("swiglu", "bfloat16", "e4m3"), swiglu),
        (f"swiglu_forward_and_per_token_cast routed bf16 {TOKENS}x2x{SWIGLU_HIDDEN} e4m3/128 weights clamp count "
         "(range check outside the timing)", _token_target("swiglu", "bfloat16", "e4m3"), swiglu_routed),
        (f"mhc.post bf16 1x{TOKENS}x{MHC_M}x{HIDDEN}", _post_target(True, MHC_M), post),
        (f"engram.gate_fwd bf16 T{ENGRAM_TOKENS} hc{ENGRAM_HEADS} H{ENGRAM_HIDDEN}", _engram_target(False),
         engram_gate(False)),
        (f"engram.gate_bwd bf16 T{ENGRAM_TOKENS} hc{ENGRAM_HEADS} H{ENGRAM_HIDDEN}", _engram_target(True),
         engram_gate(True)),
        (f"moe.expand_to_fused bf16 T{TOKENS} K{EXPAND_SLOTS} H{HIDDEN}", _expand_target(), expand),
    ] + [
        (f"transpose.transpose {TRANSPOSE_SIDE}x{TRANSPOSE_SIDE} {name}", _transpose_target(raw),
         transposed(f"{TRANSPOSE_SIDE}x{TRANSPOSE_SIDE} {name}"))
        for name, raw in (("float32", "int32"), ("bfloat16", "int16"), ("e4m3", "uint8"))
    ]


def _bytes_of(outputs):
    import torch

    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [o.contiguous().view(torch.uint8).clone() for o in outs if isinstance(o, torch.Tensor)]


def _selected(select: str | None):
    """The groups whose name contains `select` (every group without one)."""
    return [g for g in _groups() if not select or select in g[0]]


def tune(out_path: str, select: str | None = None) -> dict:
    import torch

    from tkverify import bench

    copy = bench.copy_bandwidth()
    doc = {"meta": bench.meta(), "copy_bandwidth_TBps": copy / 1e12, "groups": []}
    print(f"copy bandwidth {copy / 1e12:.3f} TB/s", flush=True)
    for name, target, make in _selected(select):
        fn, nbytes = make(torch.device("cuda"))
        group = {"name": name, "key": list(target.key), "bytes": nbytes, "rows": []}
        reference = None
        overrides, override_key = target.overrides, target.key
        for config in target.configs():
            row = {"config": config._asdict(), "default": not group["rows"]}
            overrides[override_key] = config
            try:
                got = _bytes_of(fn())
                if reference is None:
                    reference = got
                row["bitwise_equal"] = len(got) == len(reference) and all(
                    a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, reference))
                row["time_us"] = bench.median_time_s(fn) * 1e6
                try:
                    row["kernel_us"] = bench.graph_time_s(fn) * 1e6
                except Exception as e:  # reported; the eager time stands
                    row["kernel_us"], row["graph_error"] = None, f"{type(e).__name__}: {e}"[:200]
                t = bench.best_time_us(row)
                row["of_copy"] = nbytes / (t * 1e-6) / copy
            except Exception as e:  # reported, the other candidates still run
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            finally:
                overrides.pop(override_key, None)
            group["rows"].append(row)
            print(_line(name, row), flush=True)
        fair = [r for r in group["rows"] if r.get("bitwise_equal") and "error" not in r]
        best = min(fair, key=bench.best_time_us, default=None)
        group["winner"] = best["config"] if best else None
        doc["groups"].append(group)
        del fn
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {out_path}")
    return doc


def _line(name: str, row: dict) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in row["config"].items())
    if "error" in row:
        return f"{name} | {knobs} | error {row['error']}"
    k = row.get("kernel_us")
    return (f"{name} | {knobs}{' (default)' if row['default'] else ''} | {row['time_us']:.1f} us eager | "
            f"{'-' if k is None else f'{k:.1f}'} us graph | {row['of_copy']:.0%} of copy | "
            f"bitwise {'equal' if row['bitwise_equal'] else 'DIFFERENT'}")


def precompile(select: str | None = None) -> int:
    """Compile (sm_90, into TILELANG_CACHE_DIR) every configuration tune() will run."""
    from kernels import _tilelang

    start = time.perf_counter()
    groups = _selected(select)
    configs = [(target.kernel, c) for _, target, _ in groups for c in target.configs()]
    configs += [pair for _, target, _ in groups for pair in target.support]
    for kernel, config in configs:
        t = time.perf_counter()
        _tilelang.compiled_kernel(kernel, config, _tilelang.SM90)
        print(f"compiled {config} in {time.perf_counter() - t:.1f} s", flush=True)
    print(f"{len(configs)} configurations in {time.perf_counter() - start:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="OUT.json (timing, needs CUDA)")
    p.add_argument("--precompile", action="store_true", help="only compile the configurations (no GPU needed)")
    p.add_argument("-k", dest="select", metavar="TEXT", help="only the groups whose name contains TEXT")
    args = p.parse_args(argv)
    if args.precompile:
        return precompile(args.select)
    if not args.out:
        p.error("OUT.json is required unless --precompile")
    tune(args.out, args.select)
    return 0


if __name__ == "__main__":
    sys.exit(main())
