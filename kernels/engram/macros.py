"""The TIR pieces both gate kernels share: bf16 unpacking, the CTA reduction, the cp.async ring.

Layout shared by both kernels.  A *row* is (t, h): H contiguous bf16 of x, k, grad_out.  A CTA of
``threads`` threads (128, 512 or 896, serving H <= 1024, 4096, 7168) walks rows; thread i owns
*chunk* i of every row, 8 consecutive elements = 16 bytes, so that every load and store of x, k, v,
grad_out, out, grad_x, grad_k, grad_v is one 16-byte vector (x, k, v, grad_out are read as int32
words; bf16 element 2p is the low half of word p) and a warp touches 512 contiguous bytes.  Threads
i >= H / 8 hold zeros and store nothing.  (A forward configuration may give a thread several chunks
of a row: ``chunks`` in ``configs``.)

Rows are software-pipelined through a ring of ``stages`` slots in shared memory (the forward always,
FWD_STAGES = 4; the backward up to 512 threads, BWD_STAGES = 3): before row r is reduced, each thread
issues the 16-byte cp.async copies (L2 only) of its chunks of row r + stages - 1 into slot
(row mod stages) and commits them as one group; ``cp.async.wait_group stages - 1`` then waits for
its own copies of row r (a group is committed for every row, empty past the CTA's rows, so the count
is exact), and it reads back only the chunks that it copied itself: no other thread is involved, so
no barrier is needed for the data (``__syncwarp`` after the wait keeps the compiler from hoisting the
shared loads above it).  A thread reads the whole slot into registers before the row's reduction
barrier, and the slot is refilled only after that barrier (at the next row), so the refill never
overtakes the reads.  Hence stages - 1 rows' loads are in flight across every barrier without
costing registers: the bytes in flight a CTA are (stages - 1) rows of x, k, v (forward) or grad_out,
x, k, v (backward).

Per-row sums over H are fp32: each thread adds its 8 terms in order, a butterfly of
``__shfl_xor_sync`` adds the warp's 32 partial sums, lane 0 of each warp puts its sum in shared
memory (two slots, alternating by row, so one barrier a row suffices), and after the barrier every
warp adds the (up to 32) warp sums with the same butterfly: every thread holds the same bits, and the
result never depends on scheduling.
"""

from .configs import CHUNK, WARP, WORDS


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
