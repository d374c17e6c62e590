"""Engram gating in TileLang: the forward, the backward and the grad_w reduction.

Signatures, return conventions and argument checks are those of
``kernels/torch/engram.py`` (its module docstring is the contract; its check
functions are called here, so the same bad arguments raise the same errors),
in working precision only: x, k, v (and grad_out) bf16, w and the saved d, g,
rx, rk fp32.  float64 is refused (TypeError naming the argument; the eager
module's float64 mode exists for tkverify's consistency check, not for
kernels).  In addition every tensor must be on one CUDA device, H a multiple
of 8 with 8 <= H <= 7168 and 1 <= hc <= 8 (ValueError otherwise).  T = 0
returns empty outputs (grad_w zeros) without a launch.  How the outputs are
judged: ``tkverify/specs/engram.py``.

Layout shared by both kernels
-----------------------------
A *row* is (t, h): H contiguous bf16 of x, k, grad_out.  A CTA of ``threads``
threads (the static configuration: 128, 512 or 896, serving H <= 1024, 4096,
7168) walks rows; thread i owns *chunk* i of every row, 8 consecutive
elements = 16 bytes, so that every load and store of x, k, v, grad_out, out,
grad_x, grad_k, grad_v is one 16-byte vector (x, k, v, grad_out are read as
int32 words; bf16 element 2p is the low half of word p) and a warp touches
512 contiguous bytes.  Threads i >= H / 8 hold zeros and store nothing.  (A forward
tuning candidate may give a thread several chunks of a row: see ``chunks`` under Static
configurations; the shipped kernels own one.)

Rows are software-pipelined through a ring of ``stages`` slots in shared
memory (the forward always, FWD_STAGES = 4; the backward up to 512 threads,
BWD_STAGES = 3): before row r is reduced, each thread issues the 16-byte
cp.async copies (L2 only) of its chunks of row r + stages - 1 into slot
(row mod stages) and commits them as one group; ``cp.async.wait_group
stages - 1`` then waits for its own copies of row r (a group is committed for
every row, empty past the CTA's rows, so the count is exact), and it reads
back only the chunks that it copied itself: no other thread is involved, so
no barrier is needed for the data (``__syncwarp`` after the wait keeps the
compiler from hoisting the shared loads above it).  A thread reads the whole
slot into registers before the row's reduction barrier, and the slot is
refilled only after that barrier (at the next row), so the refill never
overtakes the reads.  Hence stages - 1 rows' loads are in flight across every
barrier without costing registers: the bytes in flight a CTA are
(stages - 1) rows of x, k, v (forward) or grad_out, x, k, v (backward).
Per-row sums over H are fp32: each thread adds its 8 terms in order, a
butterfly of ``__shfl_xor_sync`` adds the warp's 32 partial sums, lane 0 of
each warp puts its sum in shared memory (two slots, alternating by row, so
one barrier a row suffices), and after the barrier every warp adds the
(up to 32) warp sums with the same butterfly: every thread holds the same
bits, and the result never depends on scheduling.

Forward (kernel engram.gate_fwd)
--------------------------------
(Rows of 1025 .. 4096 elements ship with 256-thread CTAs of 2 chunks a thread, 2 ring slots and 4
CTAs an SM, FWD_SHIPPED: the same arithmetic and bits as the 512-thread CTA described here, whose
rows are reduced 2 at a time an SM; see ``chunks`` under Static configurations.)
CTA (token block, head h): the rows (t, h) of ``tokens_per_block``
consecutive tokens; w[h] stays in registers (8 fp32 a thread) for the whole
CTA, and the hc CTAs of one token block are adjacent in launch order, so v
is read from DRAM about once (the other heads find it in L2).  Per row:
sums x^2, k^2 and x w k (products (x w) k, each rounded), then, in fp32,
rx = rsqrt(sum x^2 * (1/H) + eps) (CUDA rsqrtf), rk likewise,
z = ((d rx) rk) s with s = fp32(1/sqrt(H)), a = sign(z) sqrt(max(|z|, c))
(IEEE sqrtf; a = 0 at z = 0, so g = 1/2 exactly there),
g = 1 / (1 + expf(-a)) (libdevice's accurate expf, IEEE division: a -> -inf
gives exactly 0), out = x + g v in fp32 rounded once to bf16 (RN).  Thread 0
writes d, g, rx, rk.  The grid is ``FWD_WAVES`` waves of resident CTAs
(``FWD_RESIDENT`` an SM, asked for through the launch bounds: at most 64
registers a thread; ptxas, sm_90: 56 at 128 and 512 threads, 57 at 896, no
spills), which the ring's shared memory admits: 4 slots of 48 bytes a thread
are 24, 96 and 168 KiB a CTA (8, 2 and 1 an SM: 192, 194 and 169 KiB with
the reduction slots); the results do not depend on it.

Backward (kernel engram.gate_bwd)
---------------------------------
CTA b: the rows of tokens [b tpb, (b + 1) tpb), all heads, in memory order
(t, h).  Per row: gg = sum G v (one CTA reduction), then from the saved row
scalars z = ((d rx) rk) s (the forward's own z), live = |z| >= c,
da/dz = 0.5 rsqrt(max(|z|, c)) where live and exactly 0 elsewhere (no
0 * inf), gz = (gg (g (1 - g))) da/dz, gd = ((gz rx) rk) s, A = gz z,
cx = ((A rx) rx) (1/H), ck likewise; per element
grad_x = G + (gd w) k - cx x, grad_k = (gd w) x - ck k (fp32, rounded once
to bf16), grad_v += G g over the token's heads in head order (rounded to
bf16 after the last head), and the grad_w partial P[h, i] += (gd x) k.
P lives in shared memory (hc H fp32, sized at launch: at most 224 KiB), each
element owned by one thread (no synchronisation, no atomics), stored as two
planes of float4 so that a warp's accesses are conflict-free.  At the end of
its tokens the CTA writes P to partials[b] (num_blocks, hc, H) fp32.
w and the row's saved scalars are read per row from L1 / L2 (hc H fp32 is
small and shared by every CTA), issued before the reduction that they wait
behind.  Tensors are passed flat, with int64 offsets computed once a row.
The ring (3 slots of 64 bytes a thread: 24 KiB at 128 threads, 96 KiB at
512) sits beside P: at 512 threads and hc H = 8 * 4096 the CTA takes
96 KiB + 256 B + 128 KiB = 224.25 KiB of the 227 KiB a CTA may have.  The
896-thread CTA (P up to 224 KiB, no room for a ring) loads each row into
registers and runs the rows one after the other.
The 512-thread backward ships with v copied into the ring at a token's head 0 only and kept in
registers for its other heads (BWD_SHIPPED: the v_once knob; the same bits).
Registers (ptxas, sm_90): 126 a thread at 512 threads (one CTA an SM, which
the shared memory imposes anyway at the benchmark's hc H = 4 * 4096: 160 KiB),
164 at 128, 72 at 896 (unpipelined; 8 bytes of spills).

grad_w (kernel engram.grad_w_reduce): grad_w[j] = sum over b of
partials[b, j], j = h H + i, in a fixed order: a CTA of 8 warps takes 128
consecutive j (a float4 per lane), warp q adds the partials
b = q, q + 8, q + 16, ... in increasing b, and the 8 warp sums are added in
warp order.  The number of blocks is a function of T alone
(``backward_blocks``), so grad_w is bitwise reproducible run to run and
device to device.  Its error stays within the spec's gamma(T - 1) bound:
every path from a term to the result has at most T - 1 additions.

No fast math: tilelang compiles without --use_fast_math, so sqrtf and the
division are IEEE, expf is libdevice's, subnormals are kept; rsqrtf is
rsqrt.approx (within the spec's 2^-20).  nvcc may contract a * b + c into
an FMA, which rounds once instead of twice and stays inside the spec's
intervals.  Every global access is guarded by hand (tilelang's safe-memory
legalisation is disabled, as in the other families).

Static configurations: gate_fwd and gate_bwd, each by threads (128, 512,
896; the ring depths are constants, not configurations); grad_w_reduce one.  T, hc, H, eps, clamp,
the block sizes are runtime values.  Tuning candidates (`FWD_TUNE_CONFIGS`, `BWD_TUNE_CONFIGS`, all
serving the shipped 512-thread configuration, H 1025 .. 4096; not used unless `FWD_OVERRIDES` /
`BWD_OVERRIDES`, keyed by the shipped configuration, name one: benchmarks/tune.py times them) vary
the GateConfig knobs whose defaults are the shipped kernels above: the ring's depth, the forward's
waves, the forward's interleaved token order (token block j of G takes tokens j, j + G, ...),
evict-first (st.global.cs) stores, the backward's v copied once a token, and the forward's
``chunks`` with its ``ctas_per_sm``.

``chunks`` (forward only; 2 ships for rows of 1025 .. 4096 elements, FWD_SHIPPED, 1 elsewhere): the 16-byte chunks of a row a thread owns, chunks
q threads + tx for q < chunks (chunk set q; a warp still touches 512 contiguous bytes a set), so
a CTA of threads * chunks / 32 <= 32 "virtual warps" covers rows of up to 8 threads chunks
elements with fewer threads: an SM then holds more, smaller CTAs and has more rows in their
reduction at once (the shipped 512-thread forward has 2 an SM), for the same bits.  Each set keeps
its own 8-term partial sums, butterflied on its own; lane 0 writes set q's warp sum at slot
q threads / 32 + warp, the warp that owns those chunks in a CTA of threads * chunks threads, and
after the barrier the threads * chunks / 32 warp sums go through the same butterfly: the tree of
the one-chunk kernel of threads * chunks threads, so every output (out, d, g, rx, rk) has its bits.
The ring's slots hold 3 operands x threads * chunks chunks (each thread copies and reads back its
own chunks only: still no barrier for the data): stages * 48 B * threads * chunks of shared memory
a CTA, besides the 768 B of reduction slots.  ``ctas_per_sm`` sets the CTAs resident an SM (the
launch bounds and the grid's waves; 0: FWD_RESIDENT[threads]).  Candidates (ptxas, sm_90, no
spills): 256 threads x 2 chunks, 2 slots, 4 an SM (48 KiB a CTA, 64 registers: at the launch
bounds' cap); 256 x 2, 3 slots, 3 an SM (72 KiB, 76 registers); 128 x 4, 2 slots, 4 an SM (48 KiB,
120 registers).  None of the knobs changes a row's arithmetic or the backward's blocks, so every
output keeps its bits.
"""

# No `from __future__ import annotations` here: tilelang evaluates the
# prim_func parameter annotations, which name the builders' local symbolic sizes.
import functools
import math
from typing import NamedTuple

import torch

from . import _tilelang
from ._tilelang import KernelDef, tuning_only
from .torch import engram as eager

WARP = 32
CHUNK = 8  # bf16 elements per 16-byte chunk (4 int32 words)
WORDS = CHUNK // 2
MAX_HEADS = 8
MAX_HIDDEN = 7168
THREAD_COUNTS = (128, 512, 896)  # threads of a CTA: rows up to 8 * threads elements
# Every global access is guarded by hand, and every barrier placed by hand (the reduction's
# alternating slots need one a row; the automatic insertion would add a second).
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_thread_storage_sync": True}

# Forward CTAs of each configuration resident on one SM (asked for through the launch bounds);
# the forward's grid is FWD_WAVES such waves of shorter CTAs, so that SMs that finish early take more
# (a host-side choice: the kernel is the same, and the results do not depend on it).
FWD_RESIDENT = {128: 8, 512: 2, 896: 1}
FWD_WAVES = 8
# Rows whose loads are in flight, per CTA, while one is reduced: stages - 1 (a shared-memory ring
# of cp.async copies, each thread reading back only its own chunks).
FWD_STAGES = 4
# Backward: at most this many token blocks (grad_w partials), a function of T only.  128: at the bench's
# T 4096 one wave of 32-token CTAs (one an SM) instead of 256 x 16 in two, so half the partials (8 MiB
# written and read again, not 16) and half the CTAs' ring fills; H200 run 24 (scripts/engram_bwd_blocks.py,
# graph replay): 256 -> 221.8 us, 132 and 128 -> 216.8 us (80.8% of copy), 64 -> 318.0 us (half the SMs).
BWD_BLOCKS = 128

# The backward's rows go through a shared-memory ring of BWD_STAGES slots up to this many threads
# (a slot is 64 bytes a thread: at 512 threads 3 slots are 96 KiB, which fits beside the largest
# grad_w partials of that configuration, 8 * 4096 fp32 = 128 KiB); the largest CTA (896 threads,
# whose partials may take 224 KiB) loads each row into registers and runs them one after the other.
BWD_RING_MAX_THREADS = 512
BWD_STAGES = 3
MAX_SHARED_PER_CTA = 227 * 1024  # sm_90: what a backward tuning override's ring and partials may take

REDUCE_THREADS = 256
REDUCE_WARPS = REDUCE_THREADS // WARP
REDUCE_COLUMNS = WARP * 4  # grad_w elements a reduce CTA takes (a float4 per lane)



class GateConfig(NamedTuple):
    threads: int  # threads of a CTA, `chunks` 16-byte chunks of every row each: H <= 8 * threads * chunks
    # Tuning knobs (the defaults are the shipped kernels; see FWD_TUNE_CONFIGS, BWD_TUNE_CONFIGS):
    stages: int = 0  # ring slots; 0: the kernel's own (FWD_STAGES, BWD_STAGES)
    interleave: bool = False  # forward: token block j takes tokens j, j + G, j + 2G, ... (G blocks)
    waves: int = 0  # forward: the grid is this many waves of resident CTAs; 0: FWD_WAVES
    streaming: bool = False  # out (forward), grad_x, grad_k, grad_v (backward) stored with st.global.cs
    v_once: bool = False  # backward: v copied at a token's head 0 only, kept in registers for its other heads
    # forward: 16-byte chunks of a row a thread owns, chunks q * threads + tx for q < chunks (a warp still
    # touches 512 contiguous bytes a set); each set keeps its own partial sums, reduced as the warp
    # q * threads / 32 + warp of a threads * chunks CTA would (the same bits); threads * chunks <= 1024
    chunks: int = 1
    # forward: CTAs resident an SM, asked for through the launch bounds (registers <= 65536 / (threads
    # * ctas_per_sm)) and the grid's waves; 0: FWD_RESIDENT[threads] (a candidate of another thread count
    # must name it).  Not the persistent-grid `resident` knob removed before: the grid is still `waves` waves.
    ctas_per_sm: int = 0


class ReduceConfig(NamedTuple):
    pass


GATE_CONFIGS = tuple(GateConfig(n) for n in THREAD_COUNTS)
REDUCE_CONFIGS = (ReduceConfig(),)

# Candidates a GPU run (benchmarks/tune.py) times against the shipped 512-thread configurations
# (H 1025 .. 4096; the benchmark's T 4096, hc 4, H 4096), bitwise equal by construction: every row's
# arithmetic is the same, only the rows' placement, the loads in flight and the store kind change.
FWD_TUNE_CONFIGS = (
    # sweep order: all CTAs work on ~G consecutive tokens at a time, like a copy kernel's grid, not G
    # streams 2 MiB apart (DRAM page locality; v's reuse by the hc heads is closest in time)
    GateConfig(512, interleave=True),
    # out written once, never read again: evict-first from L2 (leaves L2 to v, read by hc CTAs)
    GateConfig(512, streaming=True),
    GateConfig(512, interleave=True, streaming=True),
    # 3 slots: 2 x 2 rows (96 KiB) in flight, if the 4-slot ring over-subscribes DRAM queues
    GateConfig(512, stages=3, interleave=True),
    # The grid's balance.  H200 runs 12 and 14 (T 4096, hc 4, H 4096): 1, 2, 4 and 8 waves took 125.5,
    # 122.7, 119.2 and 117.8 us (run 14): SMs that finish early take more of the shorter CTAs; 8 ships
    # (FWD_WAVES).  1 is the grid shipped before; 16 went finer (run 16: 120.7 us).  Gone: 32 waves (133.8 us)
    # and one CTA an SM with 8 ring slots (131.1, 131.2 and 151.4 us in runs 12, 14, 16).
    GateConfig(512, waves=1),
    GateConfig(512, waves=2),
    GateConfig(512, waves=4),
    GateConfig(512, waves=16),
    GateConfig(512, stages=3, waves=4),
    GateConfig(512, stages=3, interleave=True, waves=4),
    GateConfig(512, stages=3),
    GateConfig(512, stages=3, waves=16),
    # H200 run 16 at 8 waves: evict-first stores 116.5 us and 3 slots 117.2 us against 117.1 shipped; both
    GateConfig(512, stages=3, streaming=True),
    # the 512-thread kernel itself, shipped before FWD_SHIPPED named the 256 x 2 candidate (8 waves)
    GateConfig(512),
    # More rows in their reduction at once an SM (the shipped 2 CTAs of 512 have 2): smaller CTAs, each
    # thread owning `chunks` chunks of a row, so that a row's barrier and butterflies wait on fewer threads
    # and more of them overlap; the same 4096-element rows and the same summation tree (same bits).
    # 4 CTAs of 256 an SM (1024 threads, <= 64 registers): 4 rows reduced at once, a 2-slot ring of
    # 48 KiB each (1 row of x, k, v in flight a CTA: 96 KiB an SM against the shipped 144 KiB)
    GateConfig(256, chunks=2, stages=2, ctas_per_sm=4),
    # 3 CTAs of 256 with 3-slot rings of 72 KiB (the shipped 144 KiB in flight an SM, 3 rows reduced at once)
    GateConfig(256, chunks=2, stages=3, ctas_per_sm=3),
    # 4 CTAs of 128 (4 warps), 4 chunks a thread, 2-slot rings of 48 KiB: 4 rows at once, each reduced
    # over 4 warps only (512 threads an SM: up to 128 registers a thread)
    GateConfig(128, chunks=4, stages=2, ctas_per_sm=4),
)
BWD_TUNE_CONFIGS = (
    # 4 slots: 3 rows (96 KiB) in flight instead of 2 (the CTA is alone on its SM); the ring then
    # takes 128 KiB, which leaves hc H <= 25280 fp32 of partials (hc <= 6 at H 4096; checked at launch)
    GateConfig(512, stages=4),
    # v copied once a token, not hc times: a quarter fewer bytes through L2 and cp.async at hc 4
    GateConfig(512, v_once=True),
    # grad_x, grad_k, grad_v written once: evict-first from L2
    GateConfig(512, streaming=True),
    GateConfig(512, stages=4, v_once=True, streaming=True),
)
# The forward ships a tuning candidate where one was faster with the same bits: config_for_hidden's
# configuration -> the one the forward uses.  256 threads x 2 chunks, 2 slots, 4 CTAs an SM for rows of
# 1025 .. 4096 elements: H200 run 19 (T 4096, hc 4, H 4096), 111.5 us against 116.9 us for the 512-thread
# kernel shipped before (92.7% and 88.4% of that run's copy bandwidth), every output bitwise equal.
FWD_SHIPPED: dict[GateConfig, GateConfig] = {GateConfig(512): GateConfig(256, chunks=2, stages=2, ctas_per_sm=4)}
# Likewise the backward: v copied once a token (rows of 1025 .. 4096 elements; the base kernel, which copies
# it every row, stays a candidate in benchmarks/tune.py and the GPU tests).  H200 runs 16 and 25 (T 4096,
# hc 4, H 4096, graph replay): 223.3 and 217.2 us against 223.7 and 218.2 us copying it every row, bitwise
# equal; a quarter of the v bytes through L2 and the cp.async queue (the copies of heads 1 .. hc - 1).
BWD_SHIPPED: dict[GateConfig, GateConfig] = {GateConfig(512): GateConfig(512, v_once=True)}
# The shipped configuration (config_for_hidden) -> the configuration to use instead (any of
# GATE_FWD.configs / GATE_BWD.configs), for a tuning run.
FWD_OVERRIDES: dict[GateConfig, GateConfig] = {}
BWD_OVERRIDES: dict[GateConfig, GateConfig] = {}


def row_chunks(config: GateConfig) -> int:
    """The 16-byte chunks of a row a CTA of `config` covers (threads * chunks): rows up to 8 times that
    many elements.  Forward tuning candidates serve the shipped configuration of equal coverage."""
    return config.threads * config.chunks


def fwd_resident(config: GateConfig) -> int:
    """Forward CTAs of `config` resident an SM: its ctas_per_sm, else FWD_RESIDENT[threads]."""
    return config.ctas_per_sm or FWD_RESIDENT[config.threads]


def _fwd_shared_bytes(config: GateConfig) -> int:
    """The forward's shared memory a CTA: the ring (stages x 3 operands x 16-byte chunks) and the
    reduction slots (2 parities x 3 sums x 32 warps of fp32)."""
    return (config.stages or FWD_STAGES) * 3 * row_chunks(config) * 16 + 2 * 3 * WARP * 4


def config_for_hidden(hidden: int) -> GateConfig:
    """The smallest CTA whose threads cover a row of H elements, a 16-byte chunk each."""
    for threads in THREAD_COUNTS:
        if hidden <= CHUNK * threads:
            return GateConfig(threads)
    raise ValueError(f"H = {hidden} exceeds the largest configuration ({CHUNK * THREAD_COUNTS[-1]})")


# ------------------------------------------------------------------ TIR helpers


def _lo(T, word):
    """fp32 value of the bf16 in the low half of an int32 word (element 2p)."""
    return T.reinterpret(T.shift_left(T.Cast("uint32", word), T.uint32(16)), "float32")


def _hi(T, word):
    """fp32 value of the bf16 in the high half of an int32 word (element 2p + 1)."""
    return T.reinterpret(T.bitwise_and(T.Cast("uint32", word), T.uint32(0xFFFF0000)), "float32")


def _at(offset: int, index):
    """offset + index, or index itself at offset 0 (no `0 + i` in the IR: chunk set 0 of a
    several-chunk kernel is written exactly as the one-chunk kernel's only set).  The macros repeat
    `_at(q * nt, tx)` rather than name it: a name assigned in a macro becomes a variable of the
    generated CUDA, which would change the shipped kernels' source (and their cached binaries)."""
    return index if offset == 0 else offset + index


def _macros(T, nw, sets=1):
    """(unpack, block_sum, clear, load_weights) macros.

    unpack(words, base, vals, at=0): vals[at:at + 8] <- the 8 bf16 of words[base:base + 4], as fp32.
    clear(bufs, n, value): bufs[i][0:n] <- value, for each buffer of the tuple bufs.
    load_weights(w, wl, head, hv, tx, at=0): wl[at:at + 8] <- chunk tx of row `head` of the flat w,
    as two float4.
    block_sum(values, count, red, parity, lane, warp): sums each of values[0:count] over the CTA.

    Warp butterflies, lane 0 of each warp into red[parity, slot, warp], one barrier, then the
    nw warp sums (padded with zeros to a warp) through the same butterfly in every warp: every
    thread gets the same bits.  `red` has 2 * count * 32 fp32 (two parities).

    With sets > 1 (the forward's `chunks`: a thread holds `sets` chunk sets of a row) values holds
    sets * count partial sums, set q's at [q * count, (q + 1) * count); each is butterflied on its
    own and lane 0 writes set q's warp sum at the slot of warp q * (nw / sets) + warp (the warp of
    a CTA of nw warps that would own those chunks), and after the barrier the nw warp sums go
    through the same butterfly: the same tree, hence the same bits, as a CTA of nw warps."""
    assert nw <= WARP and nw % sets == 0, (nw, sets)
    set_warps = nw // sets
    chunk_sets = tuple(range(sets))

    @T.macro
    def unpack(words, base, vals, at=0):
        for p in T.unroll(WORDS):
            vals[_at(at, 2 * p)] = _lo(T, words[base + p])
            vals[_at(at, 2 * p + 1)] = _hi(T, words[base + p])

    @T.macro
    def block_sum(values, count, red, parity, lane, warp):
        for q in chunk_sets:
            for i in T.unroll(count):
                for s in T.unroll(5):
                    values[_at(q * count, i)] = values[_at(q * count, i)] + T.shfl_xor(values[_at(q * count, i)],
                                                                                       16 >> s)
        if lane == 0:
            for q in chunk_sets:
                for i in T.unroll(count):
                    red[(parity * count + i) * WARP + _at(q * set_warps, warp)] = values[_at(q * count, i)]
        T.sync_threads()
        for i in T.unroll(count):
            values[i] = T.if_then_else(lane < nw, red[(parity * count + i) * WARP + lane], T.float32(0))
            for s in T.unroll(5):
                values[i] = values[i] + T.shfl_xor(values[i], 16 >> s)

    @T.macro
    def clear(bufs, n, value):
        for buf in bufs:
            for e in T.unroll(n):
                buf[e] = value

    @T.macro
    def load_weights(w, wl, head, hv, tx, at=0):
        for half in T.unroll(2):
            for e in T.vectorized(CHUNK // 2):
                wl[_at(at, half * (CHUNK // 2) + e)] = w[(head * hv + tx) * CHUNK + half * (CHUNK // 2) + e]

    return unpack, block_sum, clear, load_weights


def _ring_macros(T, nt):
    """(copy_chunk, take_chunk) macros over a shared ring of 16-byte chunks, nt a slot.

    copy_chunk(ring, slot, tx, src): cp.async (16 bytes, L2 only) of the 4 int32 words at the
    global element src into chunk tx of ring slot `slot`.
    take_chunk(ring, slot, tx, words, at=0): words[at:at + 4] <- chunk tx of slot `slot` (one
    16-byte load).
    A thread reads only the chunks that it copied itself, so its own cp.async.wait_group orders
    them; no other thread's progress is involved.  A warp's 32 chunks are 512 contiguous bytes
    (conflict-free)."""

    @T.macro
    def copy_chunk(ring, slot, tx, src):
        T.ptx_cp_async(T.access_ptr(ring[(slot * nt + tx) * WORDS], "w", extent=WORDS),
                       T.access_ptr(src, "r", extent=WORDS), WORDS)

    @T.macro
    def take_chunk(ring, slot, tx, words, at=0):
        for e in T.vectorized(WORDS):
            words[_at(at, e)] = ring[(slot * nt + tx) * WORDS + e]

    return copy_chunk, take_chunk


# ------------------------------------------------------------------ forward


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


# ------------------------------------------------------------------ backward


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


# ------------------------------------------------------------------ grad_w reduction


def build_grad_w_reduce(config: ReduceConfig):
    """prim_func(partials (P, n), grad_w (n,)): grad_w[j] = sum over b of partials[b, j], fixed order.

    n = hc H (a multiple of 4): CTA c takes j in [128 c, 128 c + 128), a float4 per lane; warp q
    adds b = q, q + 8, ... in increasing order (sixteen loads in flight), then the 8 warp sums are
    added in warp order."""
    T = _tilelang.T()
    num_parts, n4 = T.dynamic("num_parts, n4")
    # float4 loads in flight a lane: 16, so that at the benchmark's 128 partials (8 MiB) each warp issues
    # all of its 16 before its first add, one DRAM round trip (8 took 8.3 us for 256 partials, run 23's ncu).
    # The adds keep their order (increasing b), so the bits do not depend on it.
    unroll = 16

    @T.prim_func
    def engram_grad_w_reduce(
        partials: T.Tensor((num_parts, n4 * 4), "float32"),
        grad_w: T.Tensor((n4 * 4,), "float32"),
    ):
        T.annotate_pass_configs(PASS_CONFIGS)
        with T.Kernel(T.ceildiv(n4, WARP), threads=REDUCE_THREADS) as block:
            tx = T.get_thread_binding()
            lane = tx % WARP
            warp = tx // WARP
            col = T.alloc_var("int32", init=block * WARP + lane)  # float4 column
            red = T.alloc_shared((REDUCE_WARPS * REDUCE_COLUMNS,), "float32")
            acc = T.alloc_local((4,), "float32")
            tmp = T.alloc_local((unroll, 4), "float32")
            for e in T.unroll(4):
                acc[e] = T.float32(0)
            if col < n4:
                for it in T.serial(T.ceildiv(num_parts, REDUCE_WARPS * unroll)):
                    for u in T.unroll(unroll):
                        if (it * unroll + u) * REDUCE_WARPS + warp < num_parts:
                            for e in T.vectorized(4):
                                tmp[u, e] = partials[(it * unroll + u) * REDUCE_WARPS + warp, col * 4 + e]
                    for u in T.unroll(unroll):
                        if (it * unroll + u) * REDUCE_WARPS + warp < num_parts:
                            for e in T.unroll(4):
                                acc[e] = acc[e] + tmp[u, e]
            for e in T.vectorized(4):
                red[warp * REDUCE_COLUMNS + lane * 4 + e] = acc[e]
            T.sync_threads()
            if tx < REDUCE_COLUMNS:
                if block * REDUCE_COLUMNS + tx < n4 * 4:
                    acc[0] = red[tx]
                    for q in T.unroll(1, REDUCE_WARPS):
                        acc[0] = acc[0] + red[q * REDUCE_COLUMNS + tx]
                    grad_w[block * REDUCE_COLUMNS + tx] = acc[0]

    return engram_grad_w_reduce


GRAD_W_REDUCE = KernelDef("engram.grad_w_reduce", build_grad_w_reduce, REDUCE_CONFIGS)


# ------------------------------------------------------------------ wrappers


def _check_working_precision(name: str, t: object) -> None:
    """The eager checks accept an all-float64 call; the kernels do not."""
    if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
        raise TypeError(f"{name} must have dtype torch.bfloat16, got {t.dtype} "
                        "(the TileLang kernels run in working precision only)")


def _check_kernel_domain(named: tuple[tuple[str, torch.Tensor], ...], tokens: int, heads: int, hidden: int) -> None:
    """What the kernels add to the eager checks: CUDA, int32 sizes, H % 8 == 0, H and hc bounds."""
    for name, t in named:
        _tilelang.check_tensor(name, t)
        _tilelang.check_dims_fit_int32(name, t)
    if hidden % CHUNK != 0 or hidden > MAX_HIDDEN:
        raise ValueError(f"x: the TileLang kernels need H a multiple of {CHUNK} and at most {MAX_HIDDEN} "
                         f"(16-byte rows, one chunk a thread), got H = {hidden}")
    if heads > MAX_HEADS:
        raise ValueError(f"x: the TileLang kernels support hc <= {MAX_HEADS} heads, got hc = {heads}")
    if tokens * heads > _tilelang.MAX_DIM:
        raise ValueError(f"x: T * hc must be at most {_tilelang.MAX_DIM} (int32 row indices), got {tokens * heads}")


def _words(t: torch.Tensor) -> torch.Tensor:
    """A bf16 tensor as int32 words (two elements each), last axis halved."""
    return _tilelang.aligned(t).view(torch.int32)


def _row_constants(hidden: int) -> tuple[float, float]:
    """(s, 1 / H): the fp32 scale 1 / sqrt(H) and reciprocal of H (each rounded once, from float64)."""
    return 1.0 / math.sqrt(hidden), 1.0 / hidden


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count



def forward_tokens_per_block(tokens: int, heads: int, resident: int, multiprocessors: int, waves: int = 0) -> int:
    """Tokens a forward CTA takes: about `waves` (0: FWD_WAVES) waves of `resident` CTAs an SM (the
    configuration's fwd_resident; the results do not depend on it)."""
    blocks = max(1, (multiprocessors * resident * (waves or FWD_WAVES)) // heads)
    return max(1, -(-tokens // blocks))


def fwd_config(hidden: int) -> GateConfig:
    """The forward's configuration for H: the shipped one (FWD_SHIPPED's, else config_for_hidden's), unless a
    tuning run overrides it (FWD_OVERRIDES, keyed by config_for_hidden's) with one whose threads * chunks
    cover H (otherwise the shipped one); its thread count may differ."""
    return _tilelang.chosen_config(config_for_hidden(hidden), FWD_SHIPPED, FWD_OVERRIDES,
                                   lambda override: CHUNK * row_chunks(override) >= hidden)


def bwd_config(hidden: int, heads: int) -> GateConfig:
    """The backward's configuration for (H, hc): the shipped one (BWD_SHIPPED's, else config_for_hidden's),
    unless a tuning run overrides it (BWD_OVERRIDES, keyed by config_for_hidden's) with one whose shared
    memory fits at this hc H (otherwise the shipped one)."""
    return _tilelang.chosen_config(config_for_hidden(hidden), BWD_SHIPPED, BWD_OVERRIDES,
                                   lambda override: _bwd_shared_bytes(override, heads * hidden) <= MAX_SHARED_PER_CTA)



def _bwd_shared_bytes(config: GateConfig, elements: int) -> int:
    """The backward's shared memory at hc H = elements: ring, reduction slots, grad_w partials."""
    ring = (config.stages or BWD_STAGES) * 4 * config.threads * 16 if config.threads <= BWD_RING_MAX_THREADS else 16
    return ring + 2 * WARP * 4 + elements * 4


def backward_blocks(tokens: int) -> tuple[int, int]:
    """(tokens per block, blocks) of the backward: at most BWD_BLOCKS blocks, a function of T only,
    so that grad_w's summation order (and bits) never depends on the device."""
    per_block = max(1, -(-tokens // BWD_BLOCKS))
    return per_block, -(-tokens // per_block)


def engram_gate_fwd(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                    eps: float = 1e-6, clamp: float = 1e-6):
    """(out bf16 (T, hc, H), d, g, rx, rk fp32 (T, hc)); see kernels/torch/engram.py."""
    _check_working_precision("x", x)
    _, eps, clamp = eager._check_inputs(x, k, v, w, eps, clamp)
    tokens, heads, hidden = x.shape
    _check_kernel_domain((("x", x), ("k", k), ("v", v), ("w", w)), tokens, heads, hidden)
    out = torch.empty_like(x)
    saved = [torch.empty((tokens, heads), dtype=torch.float32, device=x.device) for _ in range(4)]
    if tokens == 0:
        return (out, *saved)
    config = fwd_config(hidden)
    kernel = _tilelang.kernel_for(GATE_FWD, config, x.device)
    scale, inv_h = _row_constants(hidden)
    per_block = forward_tokens_per_block(tokens, heads, fwd_resident(config), _multiprocessors(x.device.index or 0),
                                         config.waves)
    num_blocks = -(-tokens // per_block) * heads
    with _tilelang.device_guard(x.device):
        kernel(_words(x), _words(k), _words(v), _tilelang.aligned(w).view(-1), out, *saved, eps, clamp, scale,
               inv_h, per_block, num_blocks)
    return (out, *saved)


def engram_gate_bwd(grad_out: torch.Tensor, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                    d: torch.Tensor, g: torch.Tensor, rx: torch.Tensor, rk: torch.Tensor,
                    eps: float = 1e-6, clamp: float = 1e-6):
    """(grad_x, grad_k bf16 (T, hc, H), grad_v bf16 (T, H), grad_w fp32 (hc, H)); see kernels/torch/engram.py.

    grad_w is deterministic: per-block fp32 partial sums reduced in a fixed order."""
    _check_working_precision("x", x)
    (act, acc), _, clamp = eager._check_inputs(x, k, v, w, eps, clamp)
    tokens, heads, hidden = x.shape
    eager._check_tensor("grad_out", grad_out, act, (tokens, heads, hidden), x.device, "(T, hc, H)")
    for name, saved in (("d", d), ("g", g), ("rx", rx), ("rk", rk)):
        eager._check_tensor(name, saved, acc, (tokens, heads), x.device, "(T, hc)")
    # x first: the eager checks put every tensor on x's device, so x names a wrong one.
    _check_kernel_domain((("x", x), ("grad_out", grad_out), ("k", k), ("v", v), ("w", w), ("d", d), ("g", g),
                          ("rx", rx), ("rk", rk)), tokens, heads, hidden)
    grad_x = torch.empty_like(x)
    grad_k = torch.empty_like(k)
    grad_v = torch.empty_like(v)
    if tokens == 0:
        return grad_x, grad_k, grad_v, torch.zeros((heads, hidden), dtype=torch.float32, device=x.device)
    grad_w = torch.empty((heads, hidden), dtype=torch.float32, device=x.device)
    config = bwd_config(hidden, heads)
    target = _tilelang.target_for(x.device)
    kernel = _tilelang.compiled_kernel(GATE_BWD, config, target)
    reduce = _tilelang.compiled_kernel(GRAD_W_REDUCE, ReduceConfig(), target)
    scale, inv_h = _row_constants(hidden)
    per_block, num_blocks = backward_blocks(tokens)
    partials = torch.empty((num_blocks, heads, hidden), dtype=torch.float32, device=x.device)
    flat = [_words(t).view(-1) for t in (grad_out, x, k, v)]
    flat += [_tilelang.aligned(t).view(-1) for t in (w, d, g, rx, rk)]
    with _tilelang.device_guard(x.device):
        kernel(*flat, grad_x.view(-1), grad_k.view(-1), grad_v.view(-1), partials.view(-1), tokens, heads,
               hidden // CHUNK, clamp, scale, inv_h, per_block, num_blocks)
        reduce(partials.view(num_blocks, heads * hidden), grad_w.view(heads * hidden))
    return grad_x, grad_k, grad_v, grad_w


# out = EngramGate.apply(x, k, v, w, eps, clamp) over the TileLang kernels, differentiable in x, k, v and w.
EngramGate = eager.gate_function(engram_gate_fwd, engram_gate_bwd)


def engram_gate(x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, wh: torch.Tensor, we: torch.Tensor,
                eps: float = 1e-6, clamp: float = 1e-6) -> torch.Tensor:
    """Engram gating with the unfused weights: w = wh * we (fp32), through `EngramGate`."""
    return eager.apply_unfused(EngramGate, x, k, v, wh, we, eps, clamp)
