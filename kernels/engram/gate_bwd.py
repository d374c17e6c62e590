"""The Engram backward kernel (engram.gate_bwd): grad_x, grad_k, grad_v and per-block grad_w partials.

CTA b: the rows of tokens [b tpb, (b + 1) tpb), all heads, in memory order (t, h).  Per row:
gg = sum G v (one CTA reduction), then from the saved row scalars z = ((d rx) rk) s (the forward's
own z), live = |z| >= c, da/dz = 0.5 rsqrt(max(|z|, c)) where live and exactly 0 elsewhere (no
0 * inf), gz = (gg (g (1 - g))) da/dz, gd = ((gz rx) rk) s, A = gz z, cx = ((A rx) rx) (1/H), ck
likewise; per element grad_x = G + (gd w) k - cx x, grad_k = (gd w) x - ck k (fp32, rounded once to
bf16), grad_v += G g over the token's heads in head order (rounded to bf16 after the last head), and
the grad_w partial P[h, i] += (gd x) k.

P lives in shared memory (hc H fp32, sized at launch: at most 224 KiB), each element owned by one
thread (no synchronisation, no atomics), stored as two planes of float4 so that a warp's accesses are
conflict-free.  At the end of its tokens the CTA writes P to partials[b] (num_blocks, hc, H) fp32,
which ``grad_w_reduce`` sums.  w and the row's saved scalars are read per row from L1 / L2 (hc H fp32
is small and shared by every CTA), issued before the reduction that they wait behind.  Tensors are
passed flat, with int64 offsets computed once a row.

The ring (3 slots of 64 bytes a thread: 24 KiB at 128 threads, 96 KiB at 512) sits beside P: at 512
threads and hc H = 8 * 4096 the CTA takes 96 KiB + 256 B + 128 KiB = 224.25 KiB of the 227 KiB a CTA
may have.  The 896-thread CTA (P up to 224 KiB, no room for a ring) loads each row into registers and
runs the rows one after the other.  The 512-thread backward launches with v copied into the ring at a
token's head 0 only and kept in registers for its other heads (``BWD_SHIPPED``: the v_once knob; the
same bits).  Registers (ptxas, sm_90): 126 a thread at 512 threads (one CTA an SM, which the shared
memory imposes anyway at the benchmark's hc H = 4 * 4096: 160 KiB), 164 at 128, 72 at 896
(unpipelined; 8 bytes of spills).
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from .. import _tilelang
from .._tilelang import KernelDef, tuning_only
from .configs import (BWD_RING_MAX_THREADS, BWD_SHIPPED, BWD_STAGES, BWD_TUNE_CONFIGS, CHUNK, GATE_CONFIGS,
                      PASS_CONFIGS, WARP, WORDS, GateConfig)
from .macros import _hi, _lo, _macros, _ring_macros


# One TileLang kernel body with its macros, which close over the configuration's static values: one function.
def build_gate_bwd(config: GateConfig):
    """prim_func(grad_out, x, k, v, w, d, g, rx, rk, grad_x, grad_k, grad_v, partials, num_tokens, heads, hv,
    clamp, scale, inv_h, tokens_per_block, num_blocks), every tensor flat (hv = H / 8).

    grad_out, x, k, v as int32 words; block b takes every row of tokens [b tpb, (b + 1) tpb) and
    writes its grad_w partial sums to partials[b]."""
    T = _tilelang.T()
    nt = config.threads
    ringed = nt <= BWD_RING_MAX_THREADS
    stages = config.stages or BWD_STAGES
    v_once, streaming = config.v_once, config.streaming
    assert stages >= 2 and (ringed or not (v_once or config.stages)), config
    assert not (config.interleave or config.waves or config.chunks != 1 or config.ctas_per_sm), \
        f"forward-only knobs: {config}"
    unpack, block_sum, clear, load_weights = _macros(T, nt // WARP)
    copy_chunk, take_chunk = _ring_macros(T, nt)
    n_rows, n_words, n_v, n_w, n_parts = T.dynamic("n_rows, n_words, n_v, n_w, n_parts")

    @T.macro
    def load_row(grad_out, x, k, v, gw, xw, kw, vw, row, tok, tx, hv):
        # the row's chunk tx (int64 offsets: T hc H may exceed 2^31)
        if tx < hv:
            base = T.Cast("int64", row) * hv + tx
            vbase = T.Cast("int64", tok) * hv + tx
            for e in T.vectorized(WORDS):
                gw[e] = grad_out[base * WORDS + e]
            for e in T.vectorized(WORDS):
                xw[e] = x[base * WORDS + e]
            for e in T.vectorized(WORDS):
                kw[e] = k[base * WORDS + e]
            for e in T.vectorized(WORDS):
                vw[e] = v[vbase * WORDS + e]

    @T.macro
    def issue_row(grad_out, x, k, v, ring, row, r1, heads, tx, hv):
        # row's chunk tx of grad_out, x, k and its token's v into its ring slot; one commit group
        # a row, empty past the rows
        if row < r1:
            if tx < hv:
                base = T.Cast("int64", row) * hv + tx
                vbase = T.Cast("int64", T.truncdiv(row, heads)) * hv + tx
                slot = T.truncmod(row, stages) * 4
                copy_chunk(ring, slot, tx, grad_out[base * WORDS])
                copy_chunk(ring, slot + 1, tx, x[base * WORDS])
                copy_chunk(ring, slot + 2, tx, k[base * WORDS])
                if v_once:
                    if T.truncmod(row, heads) == 0:  # the token's other heads keep it in registers
                        copy_chunk(ring, slot + 3, tx, v[vbase * WORDS])
                else:
                    copy_chunk(ring, slot + 3, tx, v[vbase * WORDS])
        T.ptx_commit_group()

    @T.macro
    def take_row(ring, gw, xw, kw, vw, row, tx, hv, head=None):
        # Every word of the slot is read here, before the row's reduction barrier, which orders
        # these reads before the cp.async that refills the slot (issued after the barrier).
        if tx < hv:
            slot = T.truncmod(row, stages) * 4
            take_chunk(ring, slot, tx, gw)
            take_chunk(ring, slot + 1, tx, xw)
            take_chunk(ring, slot + 2, tx, kw)
            if v_once:
                if head == 0:  # vw holds the token's v from its head 0 row otherwise
                    take_chunk(ring, slot + 3, tx, vw)
            else:
                take_chunk(ring, slot + 3, tx, vw)

    @T.macro
    def process_row(gw, xw, kw, vw, w, d, g, rx, rk, grad_x, grad_k, grad_v, part, red, row, tok, head, tx, lane,
                    warp, parity, wl, sc, sums, pw, gvacc, ox, ok, heads, hv, clamp, scale, inv_h):
        # w and the saved scalars are needed only after the reduction: their loads (L1 / L2) overlap it.
        if tx < hv:
            load_weights(w, wl, head, hv, tx)
        sc[0] = d[row]
        sc[1] = g[row]
        sc[2] = rx[row]
        sc[3] = rk[row]
        sums[0] = T.float32(0)
        for p in T.unroll(WORDS):
            sums[0] = sums[0] + _lo(T, gw[p]) * _lo(T, vw[p])
            sums[0] = sums[0] + _hi(T, gw[p]) * _hi(T, vw[p])
        block_sum(sums, 1, red, parity, lane, warp)
        z = T.alloc_var("float32", init=((sc[0] * sc[2]) * sc[3]) * scale)
        dadz = T.alloc_var("float32", init=T.if_then_else(
            T.abs(z) >= clamp, T.float32(0.5) * T.rsqrt(T.max(T.abs(z), clamp)), T.float32(0)))
        gz = T.alloc_var("float32", init=(sums[0] * (sc[1] * (T.float32(1) - sc[1]))) * dadz)
        gd = T.alloc_var("float32", init=((gz * sc[2]) * sc[3]) * scale)
        big_a = T.alloc_var("float32", init=gz * z)
        cx = T.alloc_var("float32", init=((big_a * sc[2]) * sc[2]) * inv_h)
        ck = T.alloc_var("float32", init=((big_a * sc[3]) * sc[3]) * inv_h)
        if tx < hv:
            base = T.Cast("int64", row) * hv + tx
            if head == 0:
                clear((gvacc,), CHUNK, T.float32(0))
            for p in T.unroll(WORDS):
                for half in T.unroll(2):
                    ge = T.if_then_else(half == 0, _lo(T, gw[p]), _hi(T, gw[p]))
                    xe = T.if_then_else(half == 0, _lo(T, xw[p]), _hi(T, xw[p]))
                    ke = T.if_then_else(half == 0, _lo(T, kw[p]), _hi(T, kw[p]))
                    gwe = gd * wl[2 * p + half]
                    ox[2 * p + half] = T.Cast("bfloat16", (ge + gwe * ke) - cx * xe)
                    ok[2 * p + half] = T.Cast("bfloat16", gwe * xe - ck * ke)
                    gvacc[2 * p + half] = gvacc[2 * p + half] + ge * sc[1]
                    pw[2 * p + half] = (gd * xe) * ke
            if streaming:
                T.call_extern("handle", _tilelang.STORE16_STREAM, T.address_of(grad_x[base * CHUNK]), T.address_of(ox[0]))
                T.call_extern("handle", _tilelang.STORE16_STREAM, T.address_of(grad_k[base * CHUNK]), T.address_of(ok[0]))
            else:
                for e in T.vectorized(CHUNK):
                    grad_x[base * CHUNK + e] = ox[e]
                for e in T.vectorized(CHUNK):
                    grad_k[base * CHUNK + e] = ok[e]
            # grad_w partial: two float4 planes per (head, chunk), owned by this thread
            for p in T.unroll(2):
                for e in T.vectorized(CHUNK // 2):
                    part[((head * 2 + p) * hv + tx) * 4 + e] = part[((head * 2 + p) * hv + tx) * 4 + e] + pw[p * 4 + e]
            if head == heads - 1:
                for e in T.unroll(CHUNK):
                    ox[e] = T.Cast("bfloat16", gvacc[e])
                if streaming:
                    T.call_extern("handle", _tilelang.STORE16_STREAM,
                                  T.address_of(grad_v[(T.Cast("int64", tok) * hv + tx) * CHUNK]), T.address_of(ox[0]))
                else:
                    for e in T.vectorized(CHUNK):
                        grad_v[(T.Cast("int64", tok) * hv + tx) * CHUNK + e] = ox[e]

    @T.prim_func
    def engram_gate_bwd(
        grad_out: T.Tensor((n_words,), "int32"),
        x: T.Tensor((n_words,), "int32"),
        k: T.Tensor((n_words,), "int32"),
        v: T.Tensor((n_v,), "int32"),
        w: T.Tensor((n_w,), "float32"),
        d: T.Tensor((n_rows,), "float32"),
        g: T.Tensor((n_rows,), "float32"),
        rx: T.Tensor((n_rows,), "float32"),
        rk: T.Tensor((n_rows,), "float32"),
        grad_x: T.Tensor((2 * n_words,), "bfloat16"),
        grad_k: T.Tensor((2 * n_words,), "bfloat16"),
        grad_v: T.Tensor((2 * n_v,), "bfloat16"),
        partials: T.Tensor((n_parts,), "float32"),
        num_tokens: T.int32,
        heads: T.int32,
        hv: T.int32,
        clamp: T.float32,
        scale: T.float32,
        inv_h: T.float32,
        tokens_per_block: T.int32,
        num_blocks: T.int32,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=nt,
                      prelude=_tilelang.STORE16_STREAM_PRELUDE if streaming else None) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            warp = tx // WARP
            t0 = T.alloc_var("int32", init=block * tokens_per_block)
            t1 = T.alloc_var("int32", init=T.min(t0 + tokens_per_block, num_tokens))
            r0 = T.alloc_var("int32", init=t0 * heads)
            r1 = T.alloc_var("int32", init=t1 * heads)
            red = T.alloc_shared((2 * WARP,), "float32")
            part = T.alloc_shared((heads * hv * CHUNK,), "float32")  # sized at launch: hc H fp32
            # slot (row % stages, operand, thread); one chunk when the rows run unpipelined (unused)
            ring = T.alloc_shared((stages * 4 * nt * WORDS if ringed else WORDS,), "int32")
            ga = T.alloc_local((WORDS,), "int32")
            xa = T.alloc_local((WORDS,), "int32")
            ka = T.alloc_local((WORDS,), "int32")
            va = T.alloc_local((WORDS,), "int32")
            wl = T.alloc_local((CHUNK,), "float32")
            sc = T.alloc_local((4,), "float32")
            sums = T.alloc_local((1,), "float32")
            pw = T.alloc_local((CHUNK,), "float32")
            gvacc = T.alloc_local((CHUNK,), "float32")
            ox = T.alloc_local((CHUNK,), "bfloat16")
            ok = T.alloc_local((CHUNK,), "bfloat16")
            # Threads past the row (tx >= H / 8) keep zeros: they add nothing to the sums.
            clear((ga, xa, ka, va), WORDS, 0)
            clear((wl, gvacc), CHUNK, T.float32(0))
            if tx < hv:
                for hh in T.serial(heads):
                    for p in T.unroll(2):
                        for e in T.vectorized(CHUNK // 2):
                            part[((hh * 2 + p) * hv + tx) * 4 + e] = T.float32(0)
            # (token, head) of the row being processed
            ta = T.alloc_var("int32", init=t0)
            ha = T.alloc_var("int32", init=0)
            if ringed:
                # The loads of the next stages - 1 rows are in flight while a row is reduced.
                for s in T.unroll(stages - 1):
                    issue_row(grad_out, x, k, v, ring, r0 + s, r1, heads, tx, hv)
                for i in T.serial(r1 - r0):
                    issue_row(grad_out, x, k, v, ring, r0 + i + stages - 1, r1, heads, tx, hv)
                    T.ptx_wait_group(stages - 1)  # this thread's copies of row r0 + i have landed
                    T.sync_warp()  # a compiler barrier: the slot's reads stay after the wait
                    if v_once:
                        take_row(ring, ga, xa, ka, va, r0 + i, tx, hv, head=ha)
                    else:
                        take_row(ring, ga, xa, ka, va, r0 + i, tx, hv)
                    process_row(ga, xa, ka, va, w, d, g, rx, rk, grad_x, grad_k, grad_v, part, red, r0 + i, ta, ha,
                                tx, lane, warp, T.truncmod(i, 2), wl, sc, sums, pw, gvacc, ox, ok, heads, hv, clamp,
                                scale, inv_h)
                    ta = T.if_then_else(ha + 1 == heads, ta + 1, ta)
                    ha = T.if_then_else(ha + 1 == heads, 0, ha + 1)
            else:
                for rr in T.serial(r1 - r0):
                    load_row(grad_out, x, k, v, ga, xa, ka, va, r0 + rr, ta, tx, hv)
                    process_row(ga, xa, ka, va, w, d, g, rx, rk, grad_x, grad_k, grad_v, part, red, r0 + rr, ta, ha,
                                tx, lane, warp, rr % 2, wl, sc, sums, pw, gvacc, ox, ok, heads, hv, clamp, scale,
                                inv_h)
                    ta = T.if_then_else(ha + 1 == heads, ta + 1, ta)
                    ha = T.if_then_else(ha + 1 == heads, 0, ha + 1)
            if tx < hv:
                for hh in T.serial(heads):
                    for p in T.unroll(2):
                        for e in T.vectorized(CHUNK // 2):
                            partials[((T.Cast("int64", block) * heads + hh) * hv + tx) * CHUNK + p * 4 + e] = part[
                                ((hh * 2 + p) * hv + tx) * 4 + e]

    return engram_gate_bwd


GATE_BWD = KernelDef("engram.gate_bwd", build_gate_bwd, GATE_CONFIGS + BWD_TUNE_CONFIGS,
                     candidates=tuning_only(BWD_TUNE_CONFIGS, BWD_SHIPPED))
