"""The Engram kernels' constants, static configurations and tuning tables, and which one a call gets.

Static configurations: gate_fwd and gate_bwd, each by threads (128, 512, 896, serving H <= 1024,
4096, 7168; the ring depths FWD_STAGES and BWD_STAGES are constants, not configurations);
grad_w_reduce one (``grad_w_reduce.ReduceConfig``).  T, hc, H, eps, clamp and the block sizes are
runtime values.

Tuning candidates (``FWD_TUNE_CONFIGS``, ``BWD_TUNE_CONFIGS``, all serving the 512-thread base
configuration, H 1025 .. 4096) vary the `GateConfig` knobs whose defaults are the base kernels: the
ring's depth, the forward's waves, the forward's interleaved token order (token block j of G takes
tokens j, j + G, ...), evict-first (st.global.cs) stores, the backward's v copied once a token, and
the forward's ``chunks`` with its ``ctas_per_sm``.  ``FWD_SHIPPED`` / ``BWD_SHIPPED`` name the
candidate each base configuration launches; ``FWD_OVERRIDES`` / ``BWD_OVERRIDES``, keyed by the base
configuration and empty unless benchmarks/tune.py fills them, name another.  None of the knobs
changes a row's arithmetic or the backward's blocks, so every output keeps its bits.

``chunks`` (forward only; 2 for rows of 1025 .. 4096 elements through FWD_SHIPPED, 1 elsewhere):
the 16-byte chunks of a row a thread owns, chunks q threads + tx for q < chunks (chunk set q; a warp
still touches 512 contiguous bytes a set), so that a CTA of threads * chunks / 32 <= 32 "virtual
warps" covers rows of up to 8 threads chunks elements with fewer threads: an SM then holds more,
smaller CTAs and has more rows in their reduction at once (the 512-thread forward has 2 an SM), for
the same bits.  Each set keeps its own 8-term partial sums, butterflied on its own; lane 0 writes set
q's warp sum at slot q threads / 32 + warp, the warp that owns those chunks in a CTA of
threads * chunks threads, and after the barrier the threads * chunks / 32 warp sums go through the
same butterfly: the tree of the one-chunk kernel of threads * chunks threads, so every output (out,
d, g, rx, rk) has its bits.  The ring's slots hold 3 operands x threads * chunks chunks (each thread
copies and reads back its own chunks only: still no barrier for the data): stages * 48 B * threads *
chunks of shared memory a CTA, besides the 768 B of reduction slots.  ``ctas_per_sm`` sets the CTAs
resident an SM (the launch bounds and the grid's waves; 0: FWD_RESIDENT[threads]).  Candidates
(ptxas, sm_90, no spills): 256 threads x 2 chunks, 2 slots, 4 an SM (48 KiB a CTA, 64 registers: at
the launch bounds' cap); 256 x 2, 3 slots, 3 an SM (72 KiB, 76 registers); 128 x 4, 2 slots, 4 an SM
(48 KiB, 120 registers).
"""

from typing import NamedTuple

from .. import _tilelang

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
# written and read again, not 16) and half the CTAs' ring fills.  The backward at T 4096, hc 4, H 4096 by
# this cap (graph replay, reports/evidence/engram.md#backward-blocks): 256 -> 221.8 us, 128 -> 216.8 us
# (80.8% of copy), 64 -> 318.0 us (half the SMs idle).
BWD_BLOCKS = 128

# The backward's rows go through a shared-memory ring of BWD_STAGES slots up to this many threads
# (a slot is 64 bytes a thread: at 512 threads 3 slots are 96 KiB, which fits beside the largest
# grad_w partials of that configuration, 8 * 4096 fp32 = 128 KiB); the largest CTA (896 threads,
# whose partials may take 224 KiB) loads each row into registers and runs them one after the other.
BWD_RING_MAX_THREADS = 512
BWD_STAGES = 3
MAX_SHARED_PER_CTA = 227 * 1024  # sm_90: what a backward tuning override's ring and partials may take


class GateConfig(NamedTuple):
    threads: int  # threads of a CTA, `chunks` 16-byte chunks of every row each: H <= 8 * threads * chunks
    # Tuning knobs (the defaults are the base kernels; see FWD_TUNE_CONFIGS, BWD_TUNE_CONFIGS):
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
    # must name it); the grid is still `waves` waves of them.
    ctas_per_sm: int = 0


GATE_CONFIGS = tuple(GateConfig(n) for n in THREAD_COUNTS)

# Candidates a GPU run (benchmarks/tune.py) times against the 512-thread base configurations
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
    # The grid's balance: at T 4096, hc 4, H 4096 the 512-thread kernel takes 125.5, 122.7, 119.2 and
    # 117.8 us in 1, 2, 4 and 8 waves, and in another measurement 117.1 us in 8 and 120.7 us in 16
    # (reports/evidence/engram.md#forward-waves): SMs that finish early take more of the shorter CTAs,
    # which pays up to 8 waves (FWD_WAVES).
    GateConfig(512, waves=1),
    GateConfig(512, waves=2),
    GateConfig(512, waves=4),
    GateConfig(512, waves=16),
    GateConfig(512, stages=3, waves=4),
    GateConfig(512, stages=3, interleave=True, waves=4),
    GateConfig(512, stages=3),
    GateConfig(512, stages=3, waves=16),
    # at 8 waves, evict-first stores take 116.5 us and 3 slots 117.2 us against 117.1 us for the 512-thread
    # kernel (reports/evidence/engram.md#forward-knobs); here both together
    GateConfig(512, stages=3, streaming=True),
    # the 512-thread base kernel itself (8 waves, 4 slots), which FWD_SHIPPED replaces: a tuning run may put it back
    GateConfig(512),
    # More rows in their reduction at once an SM (2 CTAs of 512 threads have 2): smaller CTAs, each
    # thread owning `chunks` chunks of a row, so that a row's barrier and butterflies wait on fewer threads
    # and more of them overlap; the same 4096-element rows and the same summation tree (same bits).
    # 4 CTAs of 256 an SM (1024 threads, <= 64 registers): 4 rows reduced at once, a 2-slot ring of
    # 48 KiB each (1 row of x, k, v in flight a CTA: 96 KiB an SM against the 512-thread kernel's 144 KiB)
    GateConfig(256, chunks=2, stages=2, ctas_per_sm=4),
    # 3 CTAs of 256 with 3-slot rings of 72 KiB (144 KiB in flight an SM, as at 512 threads; 3 rows reduced at once)
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
# The forward ships a tuning candidate where one is faster with the same bits: config_for_hidden's
# configuration -> the one the forward uses.  256 threads x 2 chunks, 2 slots, 4 CTAs an SM for rows of
# 1025 .. 4096 elements: at T 4096, hc 4, H 4096, 111.5 us against 116.9 us for the 512-thread base kernel
# (92.7% and 88.4% of the copy bandwidth measured beside them), every output bitwise equal
# (reports/evidence/engram.md#forward-chunks).
FWD_SHIPPED: dict[GateConfig, GateConfig] = {GateConfig(512): GateConfig(256, chunks=2, stages=2, ctas_per_sm=4)}
# Likewise the backward: v copied once a token (rows of 1025 .. 4096 elements; the base kernel, which copies
# it every row, stays a candidate in benchmarks/tune.py and the GPU tests).  At T 4096, hc 4, H 4096 (graph
# replay, two measurements): 223.3 and 217.2 us against 223.7 and 218.2 us copying it every row, bitwise
# equal (reports/evidence/engram.md#backward-v-once); it saves the copies of heads 1 .. hc - 1, a quarter of
# the v bytes through L2 and the cp.async queue at hc 4.
BWD_SHIPPED: dict[GateConfig, GateConfig] = {GateConfig(512): GateConfig(512, v_once=True)}
# The base configuration (config_for_hidden) -> the configuration to use instead (any of
# GATE_FWD.configs / GATE_BWD.configs), for a tuning run.
FWD_OVERRIDES: dict[GateConfig, GateConfig] = {}
BWD_OVERRIDES: dict[GateConfig, GateConfig] = {}


def row_chunks(config: GateConfig) -> int:
    """The 16-byte chunks of a row a CTA of `config` covers (threads * chunks): rows up to 8 times that
    many elements.  Forward tuning candidates serve the base configuration of equal coverage."""
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
