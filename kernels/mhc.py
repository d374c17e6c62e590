"""mHC kernels in TileLang: Sinkhorn normalisation (forward and backward) and the three mix ops.

Contracts: ``kernels/torch/mhc.py`` (Sinkhorn; fp32 only here) and the mix-op
contract of issue 6 (``pre_split_mixes``, ``pre_apply_mix``, ``post``).  Every
public function checks its arguments (TypeError / ValueError naming the
argument) before anything is launched; an empty batch returns an empty result
without a launch.

sinkhorn (kernel mhc.sinkhorn)
------------------------------
One thread owns one matrix, padded to MP x MP registers (MP = 4 for m <= 4,
MP = 8 for m <= 8: the static configuration; m itself is a run-time argument).
Padding is exact: padded entries of A = softmax + eps are 0 (not eps), so they
add +0 to every real row and column sum (an exact no-op) and stay 0 through
every normalisation; padded rows and columns only ever divide 0.  A block of
128 threads loads its 128 matrices with coalesced 4-byte loads into shared
memory (word w at w + w / 32: one pad word per 32 makes the per-thread reads
of m = 2, 4 conflict-free and m = 8 two-way), each thread then reads its own
matrix; the result leaves the same way.  repeat is a run-time argument.

Numerics, against the error model of tkverify/specs/mhc.py: the softmax
subtracts the row max (NaN, +inf and all -inf rows give NaN through x - max,
whatever the max does with NaN, and the first column normalisation spreads it
over the matrix); exp is libdevice's expf (<= 2 ulp; tilelang compiles without
--use_fast_math); every +, * is an explicit ``_rn`` intrinsic (never
contracted); a division P / D is P * rcp(D) with rcp.approx.ftz (<= 1 ulp), so
within 3 u < RHO = 16 u.  D >= eps, so rcp's flush of a subnormal input can
only matter for eps < 2^-64: for those the wrapper sets ``exact`` and the
kernel divides with ``__fdiv_rn`` instead (correct for every eps).

sinkhorn_bwd (kernel mhc.sinkhorn_bwd)
--------------------------------------
Same layout, 64 threads a block.  The reverse sweep needs, for normalisation k
(k = 1 .. S = 2 repeat - 1), its output P_k and 1 / D_k.  Nothing but x comes
from global memory: the forward is replayed in the kernel, and NC checkpoints
P_0, P_K, P_2K, ... (K = ceil(S / NC), NC = 8 for MP = 4, 4 for MP = 8) are kept
in shared memory ([slot][element][thread], conflict-free).  Reverse step k
reloads the checkpoint below it and replays steps up to k (at most K - 1
extra), which gives bit for bit the forward's own P_k and D_k (same
operations, same order, no contraction).  Then g <- (g - sum_axis(g P_k)) / D_k,
and at the end the softmax, recomputed from x (kept in shared memory):
grad = s (g - sum_row(g s)).  Work: about S * (K + 1) / 2 steps instead of S,
with on-chip storage independent of repeat.

pre_split_mixes (kernel mhc.pre_split_mixes)
--------------------------------------------
Element-wise: one thread per element of mixes (T, m(m + 2)); its segment
decides the scale and the output it goes to.  u = mixes * s + base (two
roundings), sigmoid(u) = 1 / (1 + expf(-u)) with an IEEE division: exactly 1
at +inf, exactly 0 at -inf (1 / inf), NaN for NaN.  One configuration, m a
run-time argument.

pre_apply_mix and post (kernels mhc.pre_apply_mix, mhc.post)
------------------------------------------------------------
Every global access of the bf16 tensors is a 16-byte vector (8 bf16): a warp
reads or writes 32 consecutive vectors (512 bytes) of one row.  All of a
thread's loads are issued before the first use, then the terms are added in
order, each product and sum rounded once (``__fmul_rn`` / ``__fadd_rn``), one
final round-to-nearest-even conversion to bf16.  pre_apply_mix: acc = +0, then
acc + x_i * mix_i for i = 0 .. m - 1.  post: acc = x * post_n, then
acc + comb[i, n] * residual_i for i = 0 .. m - 1.

pre_apply_mix: one thread owns one vector of a token's hidden row; a block of
128 threads takes 1024 consecutive channels of one token and loads all m rows
(up to 8 x 16 bytes in flight per thread).

post writes as much as it reads (m rows out for m + 1 in), so it needs more
bytes in flight than pre_apply_mix: a CTA of 128 threads covers `chunks` x 128
vectors of one token (chunk j of thread t is vector tile * span + j * 128 + t),
and each thread loads its x vectors and m residual vectors of every chunk
(2 x 5 x 16 bytes for m = 4) before anything else.  Only then does it stage
the token's comb and post in shared memory (threads 0 .. MP^2 + MP - 1, one
weight each) and meet the barrier, so the weights' latency hides behind the
data's; then the m outputs of each chunk are stored.  m <= MP, the loops
unrolled to MP = 4 or 8 (a static configuration, as for Sinkhorn) with uniform
guards, so that m = 4 needs 64 registers (8 CTAs, 1024 threads per SM; about
160 KB of loads in flight per SM).  The last CTA of a token may have fewer
chunks than `chunks` (every chunk is guarded); `PostConfig` holds the geometry
(`POST_TUNE_CONFIGS`: candidates a GPU run may time, `POST_OVERRIDES` selects
one).

The tail: the vectorised configurations are used when H % 8 == 0 and every bf16
tensor is 16-byte aligned; otherwise a scalar configuration (one element per
vector, every access guarded) runs the same arithmetic.  m (2 .. 8) is a
run-time argument: pre_apply_mix has two configurations (vectorised or
scalar), post three (vectorised with MP = 4 or 8, scalar with MP = 8).

All global accesses are guarded by hand (tilelang's safe-memory legalisation
is off, as in kernels/moe.py: it would add per-lane checks that block
vectorisation).  Launches are cut into pieces so that flat int32 indices and
grid sizes stay in range.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
from typing import NamedTuple

import torch

from . import _tilelang
from ._tilelang import KernelDef
from .torch import mhc as eager_mhc

# The contract's limits and defaults are the eager module's (kernels/torch/mhc.py).
MIN_M, MAX_M = eager_mhc.MIN_M, eager_mhc.MAX_M
DEFAULT_REPEAT, DEFAULT_EPS = eager_mhc.DEFAULT_REPEAT, eager_mhc.DEFAULT_EPS
# Every global access is guarded by hand.  The Sinkhorn kernels place their own barriers: a
# thread reads and writes only its own matrix's words of a stage, so only the coalesced phases
# need one (tilelang's planner cannot see that and would add a barrier per unrolled row).
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}
SINKHORN_PASS_CONFIGS = {**PASS_CONFIGS, "tl.disable_thread_storage_sync": True}

FWD_THREADS = 128
BWD_THREADS = 64
# Checkpoints kept by the backward, per padded size (shared memory: NC * MP^2 * 4 * BWD_THREADS bytes).
CHECKPOINTS = {4: 8, 8: 4}
# Below this eps, a column or row sum + eps may be subnormal, which rcp.approx.ftz would flush.
EXACT_DIVISION_BELOW = 2.0**-64
# Matrices per launch: flat fp32 indices (matrices * m * m) stay far below 2^31.
MAX_MATRICES_PER_LAUNCH = 2**24
MAX_REPEAT = 2**29  # 2 repeat - 1 normalisations fit an int32

MIX_THREADS = 128
MIX_VECTOR = 8  # bf16 per 16 bytes
ELEMENTWISE_THREADS = 256

PRELUDE = r"""
#ifndef TKM_PRELUDE
#define TKM_PRELUDE
// 1 / x within 1 ulp (rcp.approx.ftz): x is a sum + eps >= eps >= 2^-64 here, never subnormal.
__device__ __forceinline__ float tkm_rcp(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  return 1.0f / x;
#endif
}
#endif
""" + _tilelang.STORE16_STREAM_PRELUDE


def _padded(m: int) -> int:
    return 4 if m <= 4 else 8


def _stage_words(count: int) -> int:
    """Shared words for `count` staged fp32 words with one pad word per 32."""
    return count + count // 32


# ------------------------------------------------------------ Sinkhorn builders


class SinkhornConfig(NamedTuple):
    padded: int  # MP: matrices of m <= MP live in MP x MP registers


SINKHORN_CONFIGS = (SinkhornConfig(4), SinkhornConfig(8))


def _sinkhorn_macros(T, mp: int, threads: int):
    """The pieces shared by the forward and the backward kernel, for padded size mp."""

    def at(i, j):
        return i * mp + j

    def along(column, a, b):
        # element b of line a: of column a when summing columns, of row a otherwise
        return at(b, a) if column else at(a, b)

    @T.macro
    def stage_in(src, stage, base, count, tx):
        # coalesced: word w of the block's range goes to stage[w + w / 32]
        for p in T.unroll(mp * mp):
            if p * threads + tx < count:
                stage[p * threads + tx + T.shift_right(p * threads + tx, 5)] = src[base + p * threads + tx]

    @T.macro
    def stage_out(stage, dst, base, count, tx):
        for p in T.unroll(mp * mp):
            if p * threads + tx < count:
                dst[base + p * threads + tx] = stage[p * threads + tx + T.shift_right(p * threads + tx, 5)]

    @T.macro
    def read_own(stage, v, m, tx, live):
        # v <- this thread's matrix, zeros in the padding (and for threads past the last matrix)
        for i in T.unroll(mp):
            for j in T.unroll(mp):
                v[at(i, j)] = T.float32(0)
                if live and i < m and j < m:
                    v[at(i, j)] = stage[(tx * m + i) * m + j + T.shift_right((tx * m + i) * m + j, 5)]

    @T.macro
    def write_own(stage, v, m, tx, live):
        for i in T.unroll(mp):
            for j in T.unroll(mp):
                if live and i < m and j < m:
                    stage[(tx * m + i) * m + j + T.shift_right((tx * m + i) * m + j, 5)] = v[at(i, j)]

    @T.macro
    def softmax(v, s, m, row):
        # s <- softmax of the real entries of v's rows (0 in padded columns); s may be v
        for i in T.unroll(mp):
            row[0] = v[at(i, 0)]
            for j in T.unroll(1, mp):
                if j < m:
                    row[0] = T.max(row[0], v[at(i, j)])
            row[1] = T.float32(0)
            for j in T.unroll(mp):
                if j < m:
                    # x - max is NaN for a NaN or +inf entry and for a row of -inf: the row turns NaN
                    s[at(i, j)] = T.exp(v[at(i, j)] - row[0])
                    row[1] = T.ieee_add(row[1], s[at(i, j)])
                else:
                    s[at(i, j)] = T.float32(0)
            row[1] = T.call_extern("float32", "tkm_rcp", row[1])  # the sum is in [1, m]
            for j in T.unroll(mp):
                s[at(i, j)] = T.ieee_mul(s[at(i, j)], row[1])

    @T.macro
    def add_eps(s, p, m, eps):
        # A = s + eps on real entries, padding exactly 0; p may be s
        for i in T.unroll(mp):
            for j in T.unroll(mp):
                if i < m and j < m:
                    p[at(i, j)] = T.ieee_add(s[at(i, j)], eps)
                else:
                    p[at(i, j)] = T.float32(0)

    @T.macro
    def normalise(p, d, r, eps, exact, column):
        # column: D_j = sum_i P_ij + eps (sequential from row 0), else D_i along the row; P <- P / D
        for a in T.unroll(mp):
            d[a] = p[along(column, a, 0)]
            for b in T.unroll(1, mp):
                d[a] = T.ieee_add(d[a], p[along(column, a, b)])
            d[a] = T.ieee_add(d[a], eps)
            r[a] = T.call_extern("float32", "tkm_rcp", d[a])
        if exact != 0:
            for a in T.unroll(mp):
                for b in T.unroll(mp):
                    p[along(column, a, b)] = T.ieee_fdiv(p[along(column, a, b)], d[a])
        else:
            for a in T.unroll(mp):
                for b in T.unroll(mp):
                    p[along(column, a, b)] = T.ieee_mul(p[along(column, a, b)], r[a])

    return along, stage_in, stage_out, read_own, write_own, softmax, add_eps, normalise


def build_sinkhorn(config: SinkhornConfig):
    """prim_func(x f32 (total,), out f32 (total,), num_matrices, m, repeat, eps, exact): flat (n, m, m)."""
    T = _tilelang.T()
    mp, threads = config.padded, FWD_THREADS
    along, stage_in, stage_out, read_own, write_own, softmax, add_eps, normalise = _sinkhorn_macros(T, mp, threads)
    total = T.dynamic("total")

    @T.prim_func
    def sinkhorn_fwd(
        x: T.Tensor((total,), "float32"),
        out: T.Tensor((total,), "float32"),
        num_matrices: T.int32,
        m: T.int32,
        repeat: T.int32,
        eps: T.float32,
        exact: T.int32,
    ):
        T.annotate_pass_configs(SINKHORN_PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_matrices, threads), threads=threads, prelude=PRELUDE) as block:
            tx = T.get_thread_binding()
            stage = T.alloc_shared((_stage_words(threads * mp * mp),), "float32")
            p = T.alloc_local((mp * mp,), "float32")
            d = T.alloc_local((mp,), "float32")
            r = T.alloc_local((mp,), "float32")
            row = T.alloc_local((2,), "float32")
            base = T.alloc_var("int32", init=block * threads * m * m)
            count = T.alloc_var("int32", init=T.min(threads, num_matrices - block * threads) * m * m)
            live = block * threads + tx < num_matrices
            stage_in(x, stage, base, count, tx)
            T.sync_threads()
            read_own(stage, p, m, tx, live)
            softmax(p, p, m, row)
            add_eps(p, p, m, eps)
            normalise(p, d, r, eps, exact, True)
            for _ in T.serial(repeat - 1):
                normalise(p, d, r, eps, exact, False)
                normalise(p, d, r, eps, exact, True)
            write_own(stage, p, m, tx, live)
            T.sync_threads()
            stage_out(stage, out, base, count, tx)

    return sinkhorn_fwd


SINKHORN = KernelDef("mhc.sinkhorn", build_sinkhorn, SINKHORN_CONFIGS)


def build_sinkhorn_bwd(config: SinkhornConfig):
    """prim_func(grad_out, x, grad_x f32 (total,), num_matrices, m, steps, interval, slots, eps, exact)."""
    T = _tilelang.T()
    mp, threads = config.padded, BWD_THREADS
    nc = CHECKPOINTS[mp]
    along, stage_in, stage_out, read_own, write_own, softmax, add_eps, normalise = _sinkhorn_macros(T, mp, threads)
    total = T.dynamic("total")

    def at(i, j):
        return i * mp + j

    @T.macro
    def advance(p, d, r, eps, exact, first, last):
        # replay normalisations first .. last (step k sums columns when k is odd)
        for k in T.serial(first, last + 1):
            if T.truncmod(k, 2) == 1:
                normalise(p, d, r, eps, exact, True)
            else:
                normalise(p, d, r, eps, exact, False)

    @T.macro
    def reverse(g, p, d, r, row, m, exact, column):
        # g <- (g - sum_axis(g P')) / D, P' = p and D = d (1 / D = r) of the step.  Padded entries of g
        # must stay 0 (their P' is 0, so they never feed a real sum): a padded line then divides 0 by
        # eps each step, where anything else would grow by 1 / eps per step and reach inf.
        for a in T.unroll(mp):
            row[0] = T.float32(0)
            for b in T.unroll(mp):
                row[0] = T.ieee_add(row[0], T.ieee_mul(g[along(column, a, b)], p[along(column, a, b)]))
            if exact != 0:
                for b in T.unroll(mp):
                    if b < m:
                        g[along(column, a, b)] = T.ieee_fdiv(T.ieee_sub(g[along(column, a, b)], row[0]), d[a])
            else:
                for b in T.unroll(mp):
                    if b < m:
                        g[along(column, a, b)] = T.ieee_mul(T.ieee_sub(g[along(column, a, b)], row[0]), r[a])

    @T.prim_func
    def sinkhorn_bwd(
        grad_out: T.Tensor((total,), "float32"),
        x: T.Tensor((total,), "float32"),
        grad_x: T.Tensor((total,), "float32"),
        num_matrices: T.int32,
        m: T.int32,
        steps: T.int32,
        interval: T.int32,
        slots: T.int32,
        eps: T.float32,
        exact: T.int32,
    ):
        T.annotate_pass_configs(SINKHORN_PASS_CONFIGS)
        with T.Kernel(T.ceildiv(num_matrices, threads), threads=threads, prelude=PRELUDE) as block:
            tx = T.get_thread_binding()
            xs = T.alloc_shared((_stage_words(threads * mp * mp),), "float32")
            gs = T.alloc_shared((_stage_words(threads * mp * mp),), "float32")
            saved = T.alloc_shared((nc * mp * mp * threads,), "float32")
            p = T.alloc_local((mp * mp,), "float32")
            g = T.alloc_local((mp * mp,), "float32")
            d = T.alloc_local((mp,), "float32")
            r = T.alloc_local((mp,), "float32")
            row = T.alloc_local((2,), "float32")
            base = T.alloc_var("int32", init=block * threads * m * m)
            count = T.alloc_var("int32", init=T.min(threads, num_matrices - block * threads) * m * m)
            live = block * threads + tx < num_matrices
            stage_in(x, xs, base, count, tx)
            stage_in(grad_out, gs, base, count, tx)
            T.sync_threads()
            # forward, keeping P_0 (= A), P_K, P_2K, ... in shared memory
            read_own(xs, p, m, tx, live)
            softmax(p, p, m, row)
            add_eps(p, p, m, eps)
            for j in T.serial(slots):
                for e in T.unroll(mp * mp):
                    saved[(j * mp * mp + e) * threads + tx] = p[e]
                if j < slots - 1:
                    advance(p, d, r, eps, exact, j * interval + 1, (j + 1) * interval)
            read_own(gs, g, m, tx, live)
            # reverse sweep: step k from its checkpoint, then its backward
            for kk in T.serial(steps):
                for e in T.unroll(mp * mp):
                    p[e] = saved[(T.truncdiv(steps - kk - 1, interval) * mp * mp + e) * threads + tx]
                advance(p, d, r, eps, exact, T.truncdiv(steps - kk - 1, interval) * interval + 1, steps - kk - 1)
                if T.truncmod(steps - kk, 2) == 1:
                    normalise(p, d, r, eps, exact, True)
                    reverse(g, p, d, r, row, m, exact, True)
                else:
                    normalise(p, d, r, eps, exact, False)
                    reverse(g, p, d, r, row, m, exact, False)
            # softmax backward, s recomputed from x: grad = s (g - sum_row(g s))
            read_own(xs, p, m, tx, live)
            softmax(p, p, m, row)
            for i in T.unroll(mp):
                row[0] = T.float32(0)
                for j in T.unroll(mp):
                    row[0] = T.ieee_add(row[0], T.ieee_mul(g[at(i, j)], p[at(i, j)]))
                for j in T.unroll(mp):
                    g[at(i, j)] = T.ieee_mul(p[at(i, j)], T.ieee_sub(g[at(i, j)], row[0]))
            write_own(gs, g, m, tx, live)
            T.sync_threads()
            stage_out(gs, grad_x, base, count, tx)

    return sinkhorn_bwd


SINKHORN_BWD = KernelDef("mhc.sinkhorn_bwd", build_sinkhorn_bwd, SINKHORN_CONFIGS)


# ------------------------------------------------------------- mix-op builders


class MixConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: H % 8 == 0 and every tensor 16-byte aligned


MIX_CONFIGS = (MixConfig(True), MixConfig(False))


class PostConfig(NamedTuple):
    vectorized: bool  # 16-byte accesses: H % 8 == 0 and every bf16 tensor 16-byte aligned
    padded: int  # MP: the loops over m (<= MP) are unrolled to MP
    chunks: int = 2  # vectors a thread takes from each row, `threads` vectors apart
    threads: int = MIX_THREADS
    min_blocks: int = 1  # CTAs per SM promised to ptxas (caps registers at 65536 / (threads * min_blocks))
    streaming: bool = False  # outputs stored with st.global.cs (evict-first), vectorised only


# post's shipped configurations, one per (vectorized, padded): register counts from ptxas (sm_90,
# no spills): MP = 4 64 (8 CTAs, 1024 threads per SM), MP = 8 96 (5 CTAs), scalar 46.
POST_CONFIGS = (PostConfig(True, 4, min_blocks=8), PostConfig(True, 8, min_blocks=5), PostConfig(False, 8))
# Candidates a GPU run times against PostConfig(True, 4, min_blocks=8) (bitwise equal by construction):
# 4 vectors a thread (120 registers, 4 CTAs per SM), and the default geometry with streaming stores.
POST_TUNE_CONFIGS = (PostConfig(True, 4, chunks=4, min_blocks=4), PostConfig(True, 4, min_blocks=8, streaming=True))
# (vectorized, padded) -> the configuration to use instead of the shipped one (any of POST.configs),
# for a tuning run.
POST_OVERRIDES: dict[tuple[bool, int], PostConfig] = {}


def post_config(vectorized: bool, padded: int) -> PostConfig:
    """The configuration of a post call: the shipped one, unless a tuning run overrides it."""
    override = POST_OVERRIDES.get((vectorized, padded))
    if override is not None:
        return override
    return next(c for c in POST_CONFIGS if c.vectorized == vectorized and c.padded == (padded if vectorized else MAX_M))


class SplitConfig(NamedTuple):
    pass


SPLIT_CONFIGS = (SplitConfig(),)


def _sigmoid(T, u):
    # 1 / (1 + exp(-u)): exp(-inf) = 0 gives 1, exp(+inf) = inf gives 1 / inf = 0, NaN stays NaN
    return T.ieee_fdiv(T.float32(1), T.ieee_add(T.float32(1), T.exp(-u)))


def build_pre_split_mixes(config: SplitConfig):
    """prim_func(mixes (T, W), scale (3,), base (W,), pre (T, m), post (T, m), comb (T, mm), ...)."""
    T = _tilelang.T()
    threads = ELEMENTWISE_THREADS
    num_tokens, width, m, mm = T.dynamic("num_tokens, width, m, mm")

    @T.prim_func
    def pre_split_mixes(
        mixes: T.Tensor((num_tokens, width), "float32"),
        scale: T.Tensor((3,), "float32"),
        base: T.Tensor((width,), "float32"),
        pre: T.Tensor((num_tokens, m), "float32"),
        post: T.Tensor((num_tokens, m), "float32"),
        comb: T.Tensor((num_tokens, mm), "float32"),
        post_mult: T.float32,
        pre_eps: T.float32,
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            flat = T.alloc_var("int64", init=(block_offset + block) * threads + tx)
            token = T.alloc_var("int64", init=T.truncdiv(flat, width))
            e = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(flat, width)))
            u = T.alloc_var("float32", init=T.float32(0))
            if token < num_tokens:
                if e < m:
                    u = T.ieee_add(T.ieee_mul(mixes[token, e], scale[0]), base[e])
                    pre[token, e] = T.ieee_add(_sigmoid(T, u), pre_eps)
                elif e < 2 * m:
                    u = T.ieee_add(T.ieee_mul(mixes[token, e], scale[1]), base[e])
                    post[token, e - m] = T.ieee_mul(_sigmoid(T, u), post_mult)
                else:
                    comb[token, e - 2 * m] = T.ieee_add(T.ieee_mul(mixes[token, e], scale[2]), base[e])

    return pre_split_mixes


PRE_SPLIT_MIXES = KernelDef("mhc.pre_split_mixes", build_pre_split_mixes, SPLIT_CONFIGS)


def build_pre_apply_mix(config: MixConfig):
    """prim_func(x bf16 (T, m, H), mix f32 (T, m), out bf16 (T, H), num_blocks, block_offset)."""
    T = _tilelang.T()
    threads = MIX_THREADS
    vec = MIX_VECTOR if config.vectorized else 1
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")

    @T.prim_func
    def pre_apply_mix(
        x: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        mix: T.Tensor((num_tokens, m), "float32"),
        out: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_vecs, threads)
        with T.Kernel(num_blocks, threads=threads) as block:
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
            v = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * threads + tx)
            rows = T.alloc_local((MAX_M, vec), "bfloat16")
            acc = T.alloc_local((vec,), "float32")
            if token < num_tokens and v < num_vecs:
                # every row's load first, so that up to 8 x 16 bytes are in flight
                for i in T.unroll(MAX_M):
                    if i < m:
                        for k in T.vectorized(vec):
                            rows[i, k] = x[token, i, v * vec + k]
                for k in T.unroll(vec):
                    acc[k] = T.float32(0)
                for i in T.unroll(MAX_M):
                    if i < m:
                        for k in T.unroll(vec):
                            acc[k] = T.ieee_add(acc[k], T.ieee_mul(T.Cast("float32", rows[i, k]), mix[token, i]))
                for k in T.vectorized(vec):
                    out[token, v * vec + k] = T.Cast("bfloat16", acc[k])

    return pre_apply_mix


PRE_APPLY_MIX = KernelDef("mhc.pre_apply_mix", build_pre_apply_mix, MIX_CONFIGS)


def build_post(config: PostConfig):
    """prim_func(x (T, H), residual (T, m, H), post (T, m), comb (T, m, m), out (T, m, H), ...)."""
    T = _tilelang.T()
    vectorized, mp, chunks, threads, min_blocks, streaming = config
    vec = MIX_VECTOR if vectorized else 1
    span = chunks * threads  # vectors of a token one CTA covers
    assert threads >= mp * mp + mp, "one thread stages each weight"
    assert vectorized or not streaming, "streaming stores are 16-byte vectors"
    num_tokens, m, num_vecs = T.dynamic("num_tokens, m, num_vecs")

    @T.macro
    def load_inputs(x, residual, token, first, m, num_vecs, xv, rows):
        # chunk j is vector first + j * threads: a warp reads 32 consecutive vectors of a row
        for j in T.unroll(chunks):
            if first + j * threads < num_vecs:
                for k in T.vectorized(vec):
                    xv[j, k] = x[token, (first + j * threads) * vec + k]
                for i in T.unroll(mp):
                    if i < m:
                        for k in T.vectorized(vec):
                            rows[j, i, k] = residual[token, i, (first + j * threads) * vec + k]

    @T.macro
    def stage_weights(post, comb, token, m, tx, weights):
        # comb[i, n] at i * mp + n, then post[n] at mp * mp + n
        if tx < mp * mp:
            if tx // mp < m and tx % mp < m:
                weights[tx] = comb[token, tx // mp, tx % mp]
        elif tx < mp * mp + mp:
            if tx - mp * mp < m:
                weights[tx] = post[token, tx - mp * mp]

    @T.macro
    def store(out, token, n, v, acc, packed):
        if streaming:
            for k in T.vectorized(vec):
                packed[k] = T.Cast("bfloat16", acc[k])
            T.call_extern("handle", _tilelang.STORE16_STREAM, T.address_of(out[token, n, v * vec]),
                          T.address_of(packed[0]))
        else:
            for k in T.vectorized(vec):
                out[token, n, v * vec + k] = T.Cast("bfloat16", acc[k])

    @T.macro
    def mix_and_store(out, token, first, m, num_vecs, xv, rows, weights, acc, packed):
        # out_n = x * post_n, then + comb[i, n] * residual_i for i = 0 .. m - 1, each rounded once
        for j in T.unroll(chunks):
            if first + j * threads < num_vecs:
                for n in T.unroll(mp):
                    if n < m:
                        for k in T.unroll(vec):
                            acc[k] = T.ieee_mul(T.Cast("float32", xv[j, k]), weights[mp * mp + n])
                        for i in T.unroll(mp):
                            if i < m:
                                for k in T.unroll(vec):
                                    acc[k] = T.ieee_add(acc[k], T.ieee_mul(weights[i * mp + n],
                                                                           T.Cast("float32", rows[j, i, k])))
                        store(out, token, n, first + j * threads, acc, packed)

    @T.prim_func
    def post_mix(
        x: T.Tensor((num_tokens, num_vecs * vec), "bfloat16"),
        residual: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        post: T.Tensor((num_tokens, m), "float32"),
        comb: T.Tensor((num_tokens, m, m), "float32"),
        out: T.Tensor((num_tokens, m, num_vecs * vec), "bfloat16"),
        num_blocks: T.int32,
        block_offset: T.int64,
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        tiles = T.ceildiv(num_vecs, span)
        with T.Kernel(num_blocks, threads=threads, prelude=PRELUDE) as block:
            T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            logical = T.alloc_var("int64", init=block_offset + block)
            token = T.alloc_var("int64", init=T.truncdiv(logical, tiles))
            first = T.alloc_var("int32", init=T.Cast("int32", T.truncmod(logical, tiles)) * span + tx)
            weights = T.alloc_shared((mp * mp + mp,), "float32")
            xv = T.alloc_local((chunks, vec), "bfloat16")
            rows = T.alloc_local((chunks, mp, vec), "bfloat16")
            acc = T.alloc_local((vec,), "float32")
            packed = T.alloc_local((vec,), "bfloat16")
            if token < num_tokens:  # block-uniform
                # the data loads go out before the barrier: the weights' latency hides behind theirs
                load_inputs(x, residual, token, first, m, num_vecs, xv, rows)
                stage_weights(post, comb, token, m, tx, weights)
                T.sync_threads()
                mix_and_store(out, token, first, m, num_vecs, xv, rows, weights, acc, packed)

    return post_mix


POST = KernelDef("mhc.post", build_post, POST_CONFIGS + POST_TUNE_CONFIGS, candidates=POST_TUNE_CONFIGS)


# ------------------------------------------------------------------- wrappers


def _check_sinkhorn_args(x: object, repeat: object, eps: object, grad_out: object = None) -> tuple[int, float]:
    """The eager implementation's checks (same errors, same order), then what the kernels add:
    fp32 only, CUDA, repeat's int32 range."""
    eager_mhc._check_x("x", x)
    if x.dtype != torch.float32:
        raise TypeError(f"x must have dtype torch.float32 (the TileLang kernels compute in fp32), got {x.dtype}")
    if grad_out is not None:
        eager_mhc._check_x("grad_out", grad_out, x.dtype, tuple(x.shape), x.device)
    repeat, eps = _check_params(repeat, eps)
    _tilelang.require_cuda("x", x)
    return repeat, eps


def _check_params(repeat: object, eps: object) -> tuple[int, float]:
    # the eager implementation's checks and messages, plus repeat's int32 range
    repeat, eps = eager_mhc._check_params(repeat, eps)
    if repeat > MAX_REPEAT:
        raise ValueError(f"repeat must be <= {MAX_REPEAT}, got {repeat}")
    return repeat, eps


def _pieces(num_matrices: int, m: int):
    """(first element, element count, matrix count) of each launch."""
    for start in range(0, num_matrices, MAX_MATRICES_PER_LAUNCH):
        count = min(MAX_MATRICES_PER_LAUNCH, num_matrices - start)
        yield start * m * m, count * m * m, count


def sinkhorn(x: torch.Tensor, repeat: int = DEFAULT_REPEAT, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """P (..., m, m) fp32: softmax + eps, then 2 repeat - 1 column / row normalisations (kernels/torch/mhc.py)."""
    repeat, eps = _check_sinkhorn_args(x, repeat, eps)
    out = torch.empty_like(x)
    m = x.shape[-1]
    num_matrices = x.numel() // (m * m)
    if num_matrices == 0:
        return out
    kernel = _tilelang.kernel_for(SINKHORN, SinkhornConfig(_padded(m)), x.device)
    flat_x, flat_out = x.view(-1), out.view(-1)
    exact = int(eps < EXACT_DIVISION_BELOW)
    with _tilelang.device_guard(x.device):
        for first, size, count in _pieces(num_matrices, m):
            kernel(flat_x[first:first + size], flat_out[first:first + size], count, m, repeat, eps, exact)
    return out


def checkpoint_interval(steps: int, padded: int) -> tuple[int, int]:
    """(K, slots) of the backward: a checkpoint every K normalisations, `slots` of them."""
    interval = -(-steps // CHECKPOINTS[padded])
    return interval, -(-steps // interval)


def sinkhorn_bwd(grad_out: torch.Tensor, x: torch.Tensor, repeat: int = DEFAULT_REPEAT,
                 eps: float = DEFAULT_EPS) -> torch.Tensor:
    """grad_x (..., m, m) fp32: the reverse of sinkhorn's steps, recomputed from x on chip."""
    repeat, eps = _check_sinkhorn_args(x, repeat, eps, grad_out)
    grad_x = torch.empty_like(x)
    m = x.shape[-1]
    num_matrices = x.numel() // (m * m)
    if num_matrices == 0:
        return grad_x
    padded = _padded(m)
    kernel = _tilelang.kernel_for(SINKHORN_BWD, SinkhornConfig(padded), x.device)
    steps = 2 * repeat - 1
    interval, slots = checkpoint_interval(steps, padded)
    flat_g, flat_x, flat_out = grad_out.view(-1), x.view(-1), grad_x.view(-1)
    exact = int(eps < EXACT_DIVISION_BELOW)
    with _tilelang.device_guard(x.device):
        for first, size, count in _pieces(num_matrices, m):
            piece = slice(first, first + size)
            kernel(flat_g[piece], flat_x[piece], flat_out[piece], count, m, steps, interval, slots, eps, exact)
    return grad_x


# P = Sinkhorn.apply(x, repeat, eps) over the two kernels, differentiable in x; only x is saved.
Sinkhorn = eager_mhc.sinkhorn_function(sinkhorn, sinkhorn_bwd)


def _check_tokens_fit(name: str, t: torch.Tensor, per_token: int) -> None:
    # a token's elements are indexed with int32 in the kernels
    if per_token > _tilelang.MAX_DIM:
        raise ValueError(f"{name}: at most {_tilelang.MAX_DIM} elements per token, got shape {tuple(t.shape)}")


def _vectorizable(hidden: int, tensors: tuple) -> bool:
    """16-byte accesses: H % 8 == 0 and every bf16 tensor starts on a 16-byte boundary."""
    return hidden % MIX_VECTOR == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)


def _launch_mix(kernel_def: KernelDef, tokens: int, hidden: int, aligned: tuple, *args) -> None:
    """pre_apply_mix: the vectorised configuration when H % 8 == 0 and every bf16 tensor is aligned."""
    vectorized = _vectorizable(hidden, aligned)
    vec = MIX_VECTOR if vectorized else 1
    device = aligned[0].device
    kernel = _tilelang.kernel_for(kernel_def, MixConfig(vectorized), device)
    with _tilelang.device_guard(device):
        _tilelang.launch_in_pieces(kernel, tokens * -(-(hidden // vec) // MIX_THREADS), *args)


def pre_split_mixes(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, m: int, post_mult: float,
                    pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre (a, b, m, 1), post (a, b, m, 1), comb (a, b, m, m)) from mixes (a, b, m (m + 2)), all fp32.

    u = mixes * s + base (s = scale[0], scale[1], scale[2] on the three segments); pre = sigmoid(u[:m])
    + pre_eps, post = sigmoid(u[m:2m]) * post_mult, comb = u[2m:] as (m, m); sigmoid = 1 / (1 + exp(-u)).
    """
    m, post_mult, pre_eps = eager_mhc._check_pre_split_mixes_args(mixes, scale, base, m, post_mult, pre_eps)
    _tilelang.require_cuda("mixes", mixes)
    width = m * (m + 2)
    a, b = mixes.shape[:2]
    pre = torch.empty((a, b, m, 1), dtype=torch.float32, device=mixes.device)
    post = torch.empty((a, b, m, 1), dtype=torch.float32, device=mixes.device)
    comb = torch.empty((a, b, m, m), dtype=torch.float32, device=mixes.device)
    tokens = a * b
    if tokens == 0:
        return pre, post, comb
    if tokens > _tilelang.MAX_DIM:
        raise ValueError(f"mixes: at most {_tilelang.MAX_DIM} tokens (a * b), got shape {tuple(mixes.shape)}")
    kernel = _tilelang.kernel_for(PRE_SPLIT_MIXES, SPLIT_CONFIGS[0], mixes.device)
    total_blocks = -(-tokens * width // ELEMENTWISE_THREADS)
    with _tilelang.device_guard(mixes.device):
        _tilelang.launch_in_pieces(kernel, total_blocks, mixes.view(tokens, width), scale, base, pre.view(tokens, m),
                          post.view(tokens, m), comb.view(tokens, m * m), post_mult, pre_eps)
    return pre, post, comb


def pre_apply_mix(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """out bf16 (a, b, H) = sum_i x[..., i, :] * mix[..., i, 0]: fp32 from +0 in order i = 0 .. m - 1, one rounding.

    x bf16 (a, b, m, H), H >= 1, 2 <= m <= 8; mix fp32 (a, b, m, 1).
    """
    eager_mhc._check_pre_apply_mix_args(x, mix)
    _tilelang.require_cuda("x", x)
    a, b, m, hidden = x.shape
    _check_tokens_fit("x", x, m * hidden)
    out = torch.empty((a, b, hidden), dtype=torch.bfloat16, device=x.device)
    tokens = a * b
    if tokens == 0:
        return out
    _launch_mix(PRE_APPLY_MIX, tokens, hidden, (x, out), x.view(tokens, m, hidden), mix.view(tokens, m),
                out.view(tokens, hidden))
    return out


def post(x: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """out bf16 (a, b, m, H): out[..., n, :] = x * post[..., n, 0] + sum_i comb[..., i, n] * residual[..., i, :].

    fp32 from x * post_n, then the terms of i = 0 .. m - 1 in order, each rounded once; one rounding to bf16.
    x bf16 (a, b, H), residual bf16 (a, b, m, H), post fp32 (a, b, m, 1), comb fp32 (a, b, m, m).
    """
    post_weights = post
    m = eager_mhc._check_post_args(x, residual, post_weights, comb)
    _tilelang.require_cuda("x", x)
    a, b, hidden = x.shape
    _check_tokens_fit("residual", residual, m * hidden)
    out = torch.empty((a, b, m, hidden), dtype=torch.bfloat16, device=x.device)
    tokens = a * b
    if tokens == 0:
        return out
    vectorized = _vectorizable(hidden, (x, residual, out))
    config = post_config(vectorized, _padded(m))
    kernel = _tilelang.kernel_for(POST, config, x.device)
    vecs = hidden // MIX_VECTOR if vectorized else hidden
    tiles = -(-vecs // (config.chunks * config.threads))
    with _tilelang.device_guard(x.device):
        _tilelang.launch_in_pieces(kernel, tokens * tiles, x.view(tokens, hidden), residual.view(tokens, m, hidden),
                                   post_weights.view(tokens, m), comb.view(tokens, m, m),
                                   out.view(tokens, m, hidden))
    return out
