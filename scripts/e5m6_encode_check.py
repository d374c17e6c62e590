"""Exhaustive CPU check of the fast e5m6 encode (kernels/quant/encode.py `_e5m6_code_fast`) against the
shipped one (`_e5m6_code`) on every float32 bit pattern of the quotient q, and against the float64
oracle (tkverify.formats.E5M6.encode, satfinite) on every finite one.

    python scripts/e5m6_encode_check.py [--oracle] [--chunk-log2 24] [--start 0 --stop 4294967296]

Both recipes are modelled with numpy uint32 / float32 vector operations, with the GPU's semantics
where numpy's differ: an fp32 operation that yields NaN gives the canonical NaN 0x7FFFFFFF on
NVIDIA GPUs (numpy propagates the input's payload), and min.NaN returns that canonical NaN.
numpy's float32 add / multiply are IEEE round-to-nearest-even with subnormals (no FTZ), as the
kernel's __fadd_rn / __fmul_rn are (tilelang compiles without --use_fast_math).
"""
import argparse
import sys
import time

import numpy as np

U32 = np.uint32
CANON_NAN = U32(0x7FFFFFFF)


def f32(u):
    return u.view(np.float32)


def bits(f):
    return f.view(np.uint32)


def gpu(f):
    """bits of an fp32 result, NaN made canonical as the GPU makes it."""
    b = bits(f).copy()
    b[np.isnan(f)] = CANON_NAN
    return b


def shipped(b):
    """The shipped _e5m6_code(q) (precomputed == 0), as lowered to CUDA."""
    u = b & U32(0x7FFFFFFF)
    uc = np.minimum(u, U32(0x47800000))
    e = np.maximum(uc >> U32(23), U32(113))
    c_bits = (e + U32(17)) << U32(23)
    with np.errstate(all="ignore"):
        v = gpu(f32(uc) + f32(c_bits))
    code = np.minimum(v - c_bits + ((e - U32(113)) << U32(6)), U32(0x7BF))
    code = np.where(u.view(np.int32) > np.int32(0x7F800000), U32(0x7E0), code)
    return code | ((b >> U32(20)) & U32(0x800))


def fast(b):
    """The fast recipe (see _e5m6_code_fast's docstring)."""
    q = f32(b)
    with np.errstate(all="ignore"):
        a = np.minimum(np.abs(q), np.float32(65024.0))  # min.NaN(|q|, 65024): NaN stays NaN
        ab = gpu(a)  # canonical NaN, as min.NaN gives
        cb = np.maximum((ab & U32(0x7F800000)) + U32(0x08800000), U32(0x41000000))  # uint32 wrap, unsigned max
        c = f32(cb)
        v = gpu(f32(ab) + c)
        r = gpu(f32(v) - c)
        t = gpu(f32(r) * np.float32(2.0**-112))
    t17 = np.minimum(t, U32(0x0FC00000))  # NaN (0x7FFFFFFF) -> 0x7E0 << 17
    return (t17 >> U32(17)) | ((b >> U32(20)) & U32(0x800))


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--oracle", action="store_true", help="also compare finite patterns with the float64 oracle")
    p.add_argument("--chunk-log2", type=int, default=24)
    p.add_argument("--start", type=lambda s: int(s, 0), default=0)
    p.add_argument("--stop", type=lambda s: int(s, 0), default=1 << 32)
    args = p.parse_args(argv)
    if args.oracle:
        sys.path.insert(0, ".")
        from tkverify.formats import E5M6
    n = 1 << args.chunk_log2
    checked = bad = oracle_checked = oracle_bad = 0
    t0 = time.time()
    for lo in range(args.start, args.stop, n):
        b = np.arange(lo, min(lo + n, args.stop), dtype=np.uint64).astype(U32)
        s, f = shipped(b), fast(b)
        diff = np.nonzero(s != f)[0]
        checked += b.size
        if diff.size:
            bad += diff.size
            for i in diff[:5]:
                print(f"MISMATCH q=0x{int(b[i]):08x} shipped=0x{int(s[i]):03x} fast=0x{int(f[i]):03x}", flush=True)
        if args.oracle:
            q = f32(b)
            fin = np.isfinite(q)
            ref = E5M6.encode(q[fin].astype(np.float64)).astype(U32)
            od = np.nonzero(ref != f[fin])[0]
            oracle_checked += int(fin.sum())
            oracle_bad += od.size
            for i in od[:5]:
                print(f"ORACLE MISMATCH q=0x{int(b[fin][i]):08x} oracle=0x{int(ref[i]):03x} fast=0x{int(f[fin][i]):03x}",
                      flush=True)
        if (lo // n) % 16 == 15:
            print(f"  {checked} patterns ({checked / 2**32:.1%}), {bad} mismatches, oracle {oracle_checked} / "
                  f"{oracle_bad}, {time.time() - t0:.0f} s", flush=True)
    print(f"checked {checked} patterns [0x{args.start:x}, 0x{args.stop:x}): {bad} mismatches fast vs shipped; "
          f"oracle: {oracle_checked} finite patterns, {oracle_bad} mismatches; {time.time() - t0:.0f} s")
    return 1 if bad or oracle_bad else 0


if __name__ == "__main__":
    sys.exit(main())
