"""The Engram forward kernel (engram.gate_fwd): out, and the row scalars d, g, rx, rk it saves.

CTA (token block, head h): the rows (t, h) of ``tokens_per_block`` consecutive tokens; w[h] stays in
registers (8 fp32 a chunk) for the whole CTA, and the hc CTAs of one token block are adjacent in
launch order, so v is read from DRAM about once (the other heads find it in L2).  Per row: sums x^2,
k^2 and x w k (products (x w) k, each rounded), then, in fp32, rx = rsqrt(sum x^2 * (1/H) + eps)
(CUDA rsqrtf), rk likewise, z = ((d rx) rk) s with s = fp32(1/sqrt(H)),
a = sign(z) sqrt(max(|z|, c)) (IEEE sqrtf; a = 0 at z = 0, so g = 1/2 exactly there),
g = 1 / (1 + expf(-a)) (libdevice's accurate expf, IEEE division: a -> -inf gives exactly 0),
out = x + g v in fp32 rounded once to bf16 (RN).  Thread 0 writes d, g, rx, rk.

The grid is ``FWD_WAVES`` waves of resident CTAs (``fwd_resident`` an SM, asked for through the
launch bounds), which the ring's shared memory admits; the results do not depend on it.  The base
configurations (one chunk a thread, 4 ring slots of 48 bytes a thread: 24, 96 and 168 KiB a CTA; 8,
2 and 1 CTAs an SM) take at most 64 registers a thread (ptxas, sm_90: 56 at 128 and 512 threads, 57
at 896, no spills).  Rows of 1025 .. 4096 elements launch the 256-thread CTA of 2 chunks a thread, 2
ring slots and 4 CTAs an SM (``FWD_SHIPPED``), which computes the same bits as the 512-thread CTA
(``chunks`` in ``configs``).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from .. import _tilelang
from .._tilelang import KernelDef, tuning_only
from .configs import (CHUNK, FWD_SHIPPED, FWD_STAGES, FWD_TUNE_CONFIGS, GATE_CONFIGS, MAX_SHARED_PER_CTA, PASS_CONFIGS,
                      WARP, WORDS, GateConfig, _fwd_shared_bytes, fwd_resident, row_chunks)
from .macros import _at, _macros, _ring_macros


# One TileLang kernel body with its macros, which close over the configuration's static values: one function.
def build_gate_fwd(config: GateConfig):
    """prim_func(x, k, v, w, out, d, g, rx, rk, eps, clamp, scale, inv_h, tokens_per_block, num_blocks).

    x, k, v as int32 words (two bf16 each); block b takes head b % hc of tokens
    [(b // hc) tpb, (b // hc + 1) tpb).  Thread tx owns the row's chunks q nt + tx, q < chunks
    (chunk set q); everything below written for set q is, at q = 0, the one-chunk kernel's code."""
    T = _tilelang.T()
    nt = config.threads
    chunks = config.chunks
    span = row_chunks(config)  # chunks of a row the CTA covers: a ring slot's chunks per operand
    stages = config.stages or FWD_STAGES
    resident = fwd_resident(config)
    interleave, streaming = config.interleave, config.streaming
    assert stages >= 2 and not config.v_once, config
    assert chunks >= 1 and nt % WARP == 0 and span <= WARP * WARP, f"at most 32 (virtual) warps: {config}"
    assert _fwd_shared_bytes(config) <= MAX_SHARED_PER_CTA, config
    unpack, block_sum, clear, load_weights = _macros(T, span // WARP, sets=chunks)
    copy_chunk, take_chunk = _ring_macros(T, span)
    chunk_sets = tuple(range(chunks))  # a Python loop: each set's code is written out
    num_tokens, heads, hv, n_w = T.dynamic("num_tokens, heads, hv, n_w")  # hv = H / 8 chunks a row

    @T.macro
    def issue_row(x, k, v, ring, t, t1, h, tx, key=None):
        # row t's chunks q nt + tx of x, k, v into ring slot key % stages (key: t, or the CTA's row count
        # when interleaved); one commit group a row, empty past the rows
        if t < t1:
            for q in chunk_sets:
                if _at(q * nt, tx) < hv:
                    slot = T.truncmod(t if key is None else key, stages) * 3
                    copy_chunk(ring, slot, _at(q * nt, tx), x[t, h, _at(q * nt, tx) * WORDS])
                    copy_chunk(ring, slot + 1, _at(q * nt, tx), k[t, h, _at(q * nt, tx) * WORDS])
                    copy_chunk(ring, slot + 2, _at(q * nt, tx), v[t, _at(q * nt, tx) * WORDS])
        T.ptx_commit_group()

    @T.macro
    def process_row(xw, kw, vw, wl, ring, out, d, g, rx, rk, t, h, tx, lane, warp, parity, red, sums, xv, kv, vv,
                    ov, eps, clamp, scale, inv_h, key=None):
        # Every word of the slot is read before the reduction's barrier, which orders these reads
        # before the cp.async that refills the slot (issued after the barrier).
        for q in chunk_sets:
            if _at(q * nt, tx) < hv:
                slot = T.truncmod(t if key is None else key, stages) * 3
                take_chunk(ring, slot, _at(q * nt, tx), xw, at=q * WORDS)
                take_chunk(ring, slot + 1, _at(q * nt, tx), kw, at=q * WORDS)
                take_chunk(ring, slot + 2, _at(q * nt, tx), vw, at=q * WORDS)
        for q in chunk_sets:
            unpack(xw, q * WORDS, xv, at=q * CHUNK)
            unpack(kw, q * WORDS, kv, at=q * CHUNK)
        for i in T.unroll(3 * chunks):
            sums[i] = T.float32(0)
        # set q's 8 terms in order into sums[3 q:3 q + 3]: the partial sums of the thread that owns
        # these chunks in a one-chunk kernel
        for q in chunk_sets:
            for e in T.unroll(CHUNK):
                sums[q * 3] = sums[q * 3] + xv[_at(q * CHUNK, e)] * xv[_at(q * CHUNK, e)]
                sums[q * 3 + 1] = sums[q * 3 + 1] + kv[_at(q * CHUNK, e)] * kv[_at(q * CHUNK, e)]
                sums[q * 3 + 2] = sums[q * 3 + 2] + (xv[_at(q * CHUNK, e)] * wl[_at(q * CHUNK, e)]) * kv[
                    _at(q * CHUNK, e)]
        block_sum(sums, 3, red, parity, lane, warp)
        r_x = T.alloc_var("float32", init=T.rsqrt(sums[0] * inv_h + eps))
        r_k = T.alloc_var("float32", init=T.rsqrt(sums[1] * inv_h + eps))
        z = T.alloc_var("float32", init=((sums[2] * r_x) * r_k) * scale)
        root = T.alloc_var("float32", init=T.sqrt(T.max(T.abs(z), clamp)))
        a = T.alloc_var("float32", init=T.if_then_else(
            z > T.float32(0), root, T.if_then_else(z < T.float32(0), -root, T.float32(0))))
        gate = T.alloc_var("float32", init=T.float32(1) / (T.float32(1) + T.exp(-a)))
        for q in chunk_sets:
            if _at(q * nt, tx) < hv:
                unpack(vw, q * WORDS, vv)
                for e in T.unroll(CHUNK):
                    ov[e] = T.Cast("bfloat16", xv[_at(q * CHUNK, e)] + gate * vv[e])
                if streaming:
                    T.call_extern("handle", _tilelang.STORE16_STREAM, T.address_of(out[t, h, _at(q * nt, tx) * CHUNK]),
                                  T.address_of(ov[0]))
                else:
                    for e in T.vectorized(CHUNK):
                        out[t, h, _at(q * nt, tx) * CHUNK + e] = ov[e]
        if tx == 0:
            d[t, h] = sums[2]
            g[t, h] = gate
            rx[t, h] = r_x
            rk[t, h] = r_k

    @T.prim_func
    def engram_gate_fwd(
        x: T.Tensor((num_tokens, heads, hv * WORDS), "int32"),
        k: T.Tensor((num_tokens, heads, hv * WORDS), "int32"),
        v: T.Tensor((num_tokens, hv * WORDS), "int32"),
        w: T.Tensor((n_w,), "float32"),
        out: T.Tensor((num_tokens, heads, hv * CHUNK), "bfloat16"),
        d: T.Tensor((num_tokens, heads), "float32"),
        g: T.Tensor((num_tokens, heads), "float32"),
        rx: T.Tensor((num_tokens, heads), "float32"),
        rk: T.Tensor((num_tokens, heads), "float32"),
        eps: T.float32,
        clamp: T.float32,
        scale: T.float32,
        inv_h: T.float32,
        tokens_per_block: T.int32,
        num_blocks: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=nt,
                      prelude=_tilelang.STORE16_STREAM_PRELUDE if streaming else None) as block:
            T.annotate_min_blocks_per_sm(resident)
            tx = T.get_thread_binding()
            lane = tx % WARP
            warp = tx // WARP
            h = T.alloc_var("int32", init=T.truncmod(block, heads))
            if interleave:
                # token block j of G takes tokens j, j + G, ... (at most tokens_per_block of them, G of
                # them at a time: tokens_per_block G >= T): t0 = j, the stride G, t1 bounds the tokens
                t0 = T.alloc_var("int32", init=T.truncdiv(block, heads))
                stride = T.alloc_var("int32", init=T.truncdiv(num_blocks, heads))
                t1 = T.alloc_var("int32", init=T.min(t0 + tokens_per_block * stride, num_tokens))
            else:
                t0 = T.alloc_var("int32", init=T.truncdiv(block, heads) * tokens_per_block)
                t1 = T.alloc_var("int32", init=T.min(t0 + tokens_per_block, num_tokens))
            red = T.alloc_shared((2 * 3 * WARP,), "float32")
            ring = T.alloc_shared((stages * 3 * span * WORDS,), "int32")  # slot (t % stages, operand, chunk)
            # chunk set q's words, weights, values at [q * 4, q * 4 + 4), [q * 8, q * 8 + 8); vv, ov: one set
            wl = T.alloc_local((CHUNK * chunks,), "float32")
            xw = T.alloc_local((WORDS * chunks,), "int32")
            kw = T.alloc_local((WORDS * chunks,), "int32")
            vw = T.alloc_local((WORDS * chunks,), "int32")
            sums = T.alloc_local((3 * chunks,), "float32")
            xv = T.alloc_local((CHUNK * chunks,), "float32")
            kv = T.alloc_local((CHUNK * chunks,), "float32")
            vv = T.alloc_local((CHUNK,), "float32")
            ov = T.alloc_local((CHUNK,), "bfloat16")
            # Chunks past the row (q nt + tx >= H / 8) stay zeros: they add nothing to the sums.
            clear((xw, kw, vw), WORDS * chunks, 0)
            clear((wl,), CHUNK * chunks, T.float32(0))
            for q in chunk_sets:
                if _at(q * nt, tx) < hv:
                    load_weights(w, wl, h, hv, _at(q * nt, tx), at=q * CHUNK)
            # The loads of the next stages - 1 rows are in flight while a row is reduced.
            if interleave:
                for s in T.unroll(stages - 1):
                    issue_row(x, k, v, ring, t0 + s * stride, t1, h, tx, key=s)
                for i in T.serial(T.ceildiv(t1 - t0, stride)):
                    issue_row(x, k, v, ring, t0 + (i + stages - 1) * stride, t1, h, tx, key=i + stages - 1)
                    T.ptx_wait_group(stages - 1)  # this thread's copies of the CTA's row i have landed
                    T.sync_warp()  # a compiler barrier: the slot's reads stay after the wait
                    process_row(xw, kw, vw, wl, ring, out, d, g, rx, rk, t0 + i * stride, h, tx, lane, warp,
                                T.truncmod(i, 2), red, sums, xv, kv, vv, ov, eps, clamp, scale, inv_h, key=i)
            else:
                for s in T.unroll(stages - 1):
                    issue_row(x, k, v, ring, t0 + s, t1, h, tx)
                for i in T.serial(t1 - t0):
                    issue_row(x, k, v, ring, t0 + i + stages - 1, t1, h, tx)
                    T.ptx_wait_group(stages - 1)  # this thread's copies of row t0 + i have landed
                    T.sync_warp()  # a compiler barrier: the slot's reads stay after the wait
                    process_row(xw, kw, vw, wl, ring, out, d, g, rx, rk, t0 + i, h, tx, lane, warp, T.truncmod(i, 2),
                                red, sums, xv, kv, vv, ov, eps, clamp, scale, inv_h)

    return engram_gate_fwd


_FWD_EXTRA = tuple(c for c in FWD_TUNE_CONFIGS if c not in GATE_CONFIGS)  # candidates no base config is already
GATE_FWD = KernelDef("engram.gate_fwd", build_gate_fwd, GATE_CONFIGS + _FWD_EXTRA,
                     candidates=tuning_only(_FWD_EXTRA, FWD_SHIPPED))
