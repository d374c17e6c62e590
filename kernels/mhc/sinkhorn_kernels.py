"""Sinkhorn normalisation in TileLang: the forward (mhc.sinkhorn), the backward (mhc.sinkhorn_bwd), their
wrappers and the autograd Function ``Sinkhorn``.

Contract: ``kernels/torch/mhc.py`` (and ``docs/contract/mhc.md``), fp32 only here.

sinkhorn (kernel mhc.sinkhorn)
------------------------------
One thread owns one matrix, padded to MP x MP registers (MP = 4 for m <= 4, MP = 8 for m <= 8: the
static configuration; m itself is a run-time argument).  Padding is exact: padded entries of
A = softmax + eps are 0 (not eps), so they add +0 to every real row and column sum (an exact no-op)
and stay 0 through every normalisation; padded rows and columns only ever divide 0.  A block of 128
threads loads its 128 matrices with coalesced 4-byte loads into shared memory (word w at w + w / 32:
one pad word per 32 makes the per-thread reads of m = 2, 4 conflict-free and m = 8 two-way), each
thread then reads its own matrix; the result leaves the same way.  repeat is a run-time argument.

Numerics, against the error model of tkverify/specs/mhc.py: the softmax subtracts the row max (NaN,
+inf and all -inf rows give NaN through x - max, whatever the max does with NaN, and the first column
normalisation spreads it over the matrix); exp is libdevice's expf (<= 2 ulp; tilelang compiles
without --use_fast_math); every +, * is an explicit ``_rn`` intrinsic (never contracted); a division
P / D is P * rcp(D) with rcp.approx.ftz (<= 1 ulp), so within 3 u < RHO = 16 u.  D >= eps, so rcp's
flush of a subnormal input can only matter for eps < 2^-64: for those the wrapper sets ``exact`` and
the kernel divides with ``__fdiv_rn`` instead (correct for every eps).

sinkhorn_bwd (kernel mhc.sinkhorn_bwd)
--------------------------------------
Same layout, 64 threads a block.  The reverse sweep needs, for normalisation k (k = 1 .. S =
2 repeat - 1), its output P_k and 1 / D_k.  Nothing but x comes from global memory: the forward is
replayed in the kernel, and NC checkpoints P_0, P_K, P_2K, ... (K = ceil(S / NC), NC = 8 for MP = 4,
4 for MP = 8) are kept in shared memory ([slot][element][thread], conflict-free).  Reverse step k
reloads the checkpoint below it and replays steps up to k (at most K - 1 extra), which gives bit for
bit the forward's own P_k and D_k (same operations, same order, no contraction).  Then
g <- (g - sum_axis(g P_k)) / D_k, and at the end the softmax, recomputed from x (kept in shared
memory): grad = s (g - sum_row(g s)).  Work: about S * (K + 1) / 2 steps instead of S, with on-chip
storage independent of repeat.

Launches are cut into pieces of at most MAX_MATRICES_PER_LAUNCH matrices, so that flat int32 indices
stay in range.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.

from typing import NamedTuple

import torch

from .. import _tilelang
from .._tilelang import KernelDef
from ..torch import mhc as eager_mhc
from .shared import DEFAULT_EPS, DEFAULT_REPEAT, PASS_CONFIGS, PRELUDE, _padded

# The Sinkhorn kernels place their own barriers: a thread reads and writes only its own matrix's words of
# a stage, so only the coalesced phases need one (tilelang's planner cannot see that and would add a
# barrier per unrolled row).
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


def _stage_words(count: int) -> int:
    """Shared words for `count` staged fp32 words with one pad word per 32."""
    return count + count // 32


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
