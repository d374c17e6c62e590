// How fast can an H200 write DRAM, and does the way the writes are issued change it?
//
//   nvcc -O3 -arch=sm_90 -o write_rate scripts/write_rate.cu && ./write_rate [MiB]
//
// The bench divides expand_to_fused's bytes (90% of them writes) by the copy bandwidth, and measures
// the write-only rate with torch's fill_.  If fill_ is not the ceiling, a kernel that writes some
// other way could beat it.  Each line: a way of writing (or reading) a buffer of MiB (default 2048),
// the median of 20 timed launches (CUDA events, after 3 untimed), the bytes moved over that time.
//   st.v4       16-byte stores of noise, grid-stride, at several grids
//   st.cs.v4    the same with the evict-first hint
//   bulk        TMA bulk stores (cp.async.bulk.global.shared::cta) of a shared buffer of noise
//   *zero       the same writing zeros, and memset: for contrast (run 19: the same rates as noise)
//   copy        16-byte loads and stores of noise, read + write counted (what the bench's copy measures)
//   read        16-byte loads, summed (read-only)
//   fanout8     expand's shape: each 16-byte unit read once, written to 8 places (read + 8 writes)
//   rows8-*     expand's shape by rows, as its row kernel moves them: 16384 rows of 7168 bf16 (896 units), a
//               CTA of 128 threads a 128-unit tile of a row, one unit a thread, written to the row's 8
//               destination rows from a table: "streams" 8 contiguous streams (row r -> rows j R + r, as
//               fanout8), "experts" the layout expand_to_fused writes (8 distinct experts of 256 a row at
//               random, rows in (row, slot) order inside each expert's segment, no padding), "shuffled" a
//               random permutation of the 8 R rows.  Does scattering the rows cost, or the row kernel?
//   w8-*, fanout8-*, fanout8c*, fanout8free, fanout8l1, fanout8na, fanout8tma, fanout8pf*, fanout8q-*, w8q-*
//               what costs a unit read once and written 8 times (H200 runs 35-38): 8 write streams with no reads,
//               powers of two apart or not; sources kept in L2 or L1; stores that do not wait for the load; loads
//               skipping L1 or made by TMA; the source prefetched to L2 in bursts; persistent CTAs taking work in
//               order with loads 1-4 deep.  rows8u*, rows8q-*, rows8tma*, rows8l2-*: the same questions for rows8
//   gather8-*   the "experts" layout written the other way round: a CTA per destination row, which reads its
//               source row (7 units a thread, loads before stores), CTAs in the order named: "dst" position
//               order (one sequential write stream; each source row read 8 times, far apart), "src" the
//               rows8 order (row by row), "chunkC" chunk-major (C source rows at a time, their destination
//               rows in position order: within a chunk, one run of rows an expert, and a source row's 8
//               reads close together, from L2 once its chunk is in it).  Can the write order beat rows8?
//               gather8keep-*, gather8pass-*, gather8keeppass-*: with L2 hints, loads evict_last (a source row
//               stays for its 8 reads) and stores evict_first (run 39: chunk-major with both, 3.90 TB/s)
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); std::exit(1); } } while (0)

// A 16-byte unit no compressor could shrink, so that a fast rate cannot come from writing zeros.  (Run 17's
// Nsight Compute pass seemed to say zeros were compressed: 1047 MB of DRAM writes a fill of 2 GiB.  It was
// torch splitting the fill of 2^31 bytes into two launches of 1 GiB; run 19 wrote zeros and noise at one rate.)
__device__ __forceinline__ uint4 noise(size_t i, unsigned salt) {
  unsigned a = (unsigned)i * 0x9E3779B9u ^ salt, b = (unsigned)(i >> 32) + salt * 0x85EBCA6Bu;
  a ^= a >> 16; a *= 0x7FEB352Du; a ^= a >> 15; a *= 0x846CA68Bu; a ^= a >> 16;
  return make_uint4(a, a * 0x27D4EB2Fu + b, a ^ 0x165667B1u, (a + b) * 0xC2B2AE35u);
}

__global__ void st_v4(uint4* p, size_t n, unsigned salt) {  // salt 0: zeros
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = salt ? noise(i, salt) : make_uint4(0, 0, 0, 0);
}

__global__ void st_cs_v4(uint4* p, size_t n, unsigned salt) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = noise(i, salt);
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p + i), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
}

// Each CTA stores `chunk` bytes of zeros from shared memory at a time, CTA b taking chunks b, b + grid, ...
__global__ void bulk_store(char* p, size_t bytes, unsigned chunk, unsigned salt) {
  extern __shared__ __align__(128) char zeros[];  // noise unless salt is 0
  for (unsigned i = threadIdx.x; i < chunk / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(zeros)[i] = salt ? noise(blockIdx.x * (size_t)chunk / 16 + i, salt) : make_uint4(0, 0, 0, 0);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(zeros));
    for (size_t off = blockIdx.x * (size_t)chunk; off < bytes; off += (size_t)gridDim.x * chunk) {
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" :: "l"(p + off), "r"(s), "r"(chunk)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      asm volatile("cp.async.bulk.wait_group.read 8;" ::: "memory");  // at most 8 in flight a CTA
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
}

__global__ void copy_v4(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}

__global__ void read_v4(const uint4* __restrict__ s, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = s[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads
}

// n units of the source, each written to 8 destinations n units apart (expand's shape: a row read once,
// written to K rows; every warp's stores coalesced).
__global__ void fanout8(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = s[i];
#pragma unroll
    for (int j = 0; j < 8; ++j) d[j * n + i] = v;
  }
}

// The read/write mix, one unit a thread.  Write-only: unit i of the noise written to 8 places `stride`
// units apart (8 write streams, no reads).
__global__ void w8(uint4* __restrict__ d, size_t n8, size_t stride, unsigned salt) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n8) return;
  uint4 v = noise(i, salt);
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j * stride + i] = v;
}

// fanout8 with the 8 streams `stride` units apart and the source read at i & mask (a mask of a few MiB keeps
// the source in L2, so that DRAM sees the writes alone).
__global__ void fanout8s(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n8, size_t stride, size_t mask) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n8) return;
  uint4 v = s[i & mask];
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j * stride + i] = v;
}

// One read stream and one write stream at 1:8: CTA b reads blockDim units, writes them to the next 8 blockDim
// units of one contiguous output.
__global__ void fanout8c(const uint4* __restrict__ s, uint4* __restrict__ d, size_t mask) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  uint4 v = s[i & mask];
  uint4* to = d + blockIdx.x * (size_t)blockDim.x * 8 + threadIdx.x;
#pragma unroll
  for (int j = 0; j < 8; ++j) to[j * blockDim.x] = v;
}

// rows8 reading source row row & mask_rows (L2-resident for a small mask): expand's scatter without DRAM reads.
__global__ void rows8m(const uint4* __restrict__ s, uint4* __restrict__ d, const int* __restrict__ dst, int units,
                       size_t mask_rows) {
  int tiles = (units + blockDim.x - 1) / blockDim.x;
  size_t row = blockIdx.x / tiles;
  int u = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  uint4 v = s[(row & mask_rows) * units + u];
#pragma unroll
  for (int j = 0; j < 8; ++j) d[(size_t)dst[row * 8 + j] * units + u] = v;
}

// Is it the wait for the load, or the loads among the stores?  w8 that spins `spin` cycles before its
// stores (no loads), and fanout8 whose stores do not wait for its load (noise stored, the load kept by a sink).
__global__ void w8spin(uint4* __restrict__ d, size_t n8, unsigned salt, long long spin) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n8) return;
  long long t0 = clock64();
  while (clock64() - t0 < spin) {}
  uint4 v = noise(i, salt);
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j * n8 + i] = v;
}

__global__ void fanout8free(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n8, unsigned salt,
                            unsigned* sink) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n8) return;
  uint4 r = s[i];
  uint4 v = noise(i, salt);
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j * n8 + i] = v;
  if ((r.x ^ r.y ^ r.z ^ r.w) == 0x12345678u) *sink = r.x;
}

// Persistent CTAs that take work in launch order from a counter (so the write frontier stays as compact as a
// one-shot grid's) and load the next DEPTH units a thread before storing the current ones.  Work item g: the
// units [g DEPTH blockDim, (g + 1) DEPTH blockDim) of the source; write-only when s is null.
template <int DEPTH>
__global__ void fanout8q(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n8, unsigned* counter,
                         unsigned salt) {
  __shared__ unsigned item[2];
  const unsigned items = (unsigned)(n8 / (DEPTH * blockDim.x));
  if (threadIdx.x == 0) item[0] = atomicAdd(counter, 1);
  __syncthreads();
  unsigned g = item[0];
  uint4 v[DEPTH];
  auto load = [&](unsigned it, uint4* w) {
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) {
      size_t i = ((size_t)it * DEPTH + q) * blockDim.x + threadIdx.x;
      w[q] = s ? s[i] : noise(i, salt);
    }
  };
  if (g < items) load(g, v);
  for (int parity = 1; g < items; parity ^= 1) {
    if (threadIdx.x == 0) item[parity] = atomicAdd(counter, 1);
    __syncthreads();
    unsigned g1 = item[parity];
    uint4 w[DEPTH];
    if (g1 < items) load(g1, w);
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) {
      size_t i = ((size_t)g * DEPTH + q) * blockDim.x + threadIdx.x;
#pragma unroll
      for (int j = 0; j < 8; ++j) d[j * n8 + i] = v[q];
    }
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) v[q] = w[q];
    g = g1;
  }
}

// rows8 (expand's rows, 8 destination rows each from dst) as fanout8q: item g holds DEPTH tiles of blockDim
// units, tile t = (row t / tiles, units from (t % tiles) blockDim), in row order.
template <int DEPTH>
__global__ void rows8q(const uint4* __restrict__ s, uint4* __restrict__ d, const int* __restrict__ dst, int units,
                       int rows, unsigned* counter) {
  __shared__ unsigned item[2];
  const int tiles = (units + blockDim.x - 1) / blockDim.x;
  const unsigned items = (unsigned)(((size_t)rows * tiles + DEPTH - 1) / DEPTH);
  if (threadIdx.x == 0) item[0] = atomicAdd(counter, 1);
  __syncthreads();
  unsigned g = item[0];
  uint4 v[DEPTH];
  auto load = [&](unsigned it, uint4* w) {
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) {
      size_t t = (size_t)it * DEPTH + q, row = t / tiles;
      int u = (int)(t % tiles) * blockDim.x + threadIdx.x;
      if (row < (size_t)rows && u < units) w[q] = s[row * units + u];
    }
  };
  if (g < items) load(g, v);
  for (int parity = 1; g < items; parity ^= 1) {
    if (threadIdx.x == 0) item[parity] = atomicAdd(counter, 1);
    __syncthreads();
    unsigned g1 = item[parity];
    uint4 w[DEPTH];
    if (g1 < items) load(g1, w);
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) {
      size_t t = (size_t)g * DEPTH + q, row = t / tiles;
      int u = (int)(t % tiles) * blockDim.x + threadIdx.x;
      if (row < (size_t)rows && u < units) {
#pragma unroll
        for (int j = 0; j < 8; ++j) d[(size_t)dst[row * 8 + j] * units + u] = v[q];
      }
    }
#pragma unroll
    for (int q = 0; q < DEPTH; ++q) v[q] = w[q];
    g = g1;
  }
}

// Row r of `units` 16-byte units, read once and written to rows dst[8 r + j]; CTA (row, tile of UNITS blockDim
// units), all loaded before the first store.  rows8u<1> is rows8 (a unit a thread), rows8u<2> the row kernel
// expand shipped until 838f763.  PASS: stores with the L2 evict_first policy (as gather8's HINT 2).
template <int UNITS, bool PASS = false>
__global__ void rows8u(const uint4* __restrict__ s, uint4* __restrict__ d, const int* __restrict__ dst, int units) {
  unsigned long long pass;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pass));
  const int span = UNITS * blockDim.x, tiles = (units + span - 1) / span;
  size_t row = blockIdx.x / tiles;
  int u0 = (blockIdx.x % tiles) * span + threadIdx.x;
  uint4 v[UNITS];
#pragma unroll
  for (int q = 0; q < UNITS; ++q)
    if (u0 + q * (int)blockDim.x < units) v[q] = s[row * units + u0 + q * blockDim.x];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    size_t to = (size_t)dst[row * 8 + j] * units;
#pragma unroll
    for (int q = 0; q < UNITS; ++q)
      if (u0 + q * (int)blockDim.x < units) {
        uint4* p = d + to + u0 + q * blockDim.x;
        if (PASS)
          asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                       :: "l"(p), "r"(v[q].x), "r"(v[q].y), "r"(v[q].z), "r"(v[q].w), "l"(pass) : "memory");
        else
          *p = v[q];
      }
  }
}

// Which loads cost the stores?  fanout8 with loads that skip L1 (ld.global.nc.L1::no_allocate), loads that
// always hit L1 (the CTA's first units, so nothing reaches L2), and loads by the copy engine (TMA): thread 0
// bulk-copies the CTA's blockDim units to shared memory, an mbarrier says when they are there.
__global__ void fanout8na(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n8) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n8) return;
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(s + i));
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j * n8 + i] = v;
}

__global__ void fanout8l1(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n8) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n8) return;
  uint4 v = s[threadIdx.x];
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j * n8 + i] = v;
}

__device__ __forceinline__ void tma_load(void* to, const void* from, unsigned bytes, unsigned long long* bar) {
  unsigned t = static_cast<unsigned>(__cvta_generic_to_shared(to));
  unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(t), "l"(from), "r"(bytes), "r"(b) : "memory");
}

__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
  unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar)), done = 0;
  while (!done)
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(b), "r"(parity) : "memory");
}

__device__ __forceinline__ void mbarrier_init(unsigned long long* bar) {
  if (threadIdx.x == 0) {
    unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(bar));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

__global__ void fanout8tma(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n8) {
  extern __shared__ __align__(128) uint4 staged[];
  __shared__ unsigned long long bar;
  mbarrier_init(&bar);
  size_t first = blockIdx.x * (size_t)blockDim.x;
  if (threadIdx.x == 0) tma_load(staged, s + first, blockDim.x * 16, &bar);
  mbarrier_wait(&bar, 0);
  uint4 v = staged[threadIdx.x];
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j * n8 + first + threadIdx.x] = v;
}

// rows8 with the tile (UNITS blockDim units of a row) loaded by TMA.
template <int UNITS>
__global__ void rows8tma(const uint4* __restrict__ s, uint4* __restrict__ d, const int* __restrict__ dst, int units) {
  extern __shared__ __align__(128) uint4 staged[];
  __shared__ unsigned long long bar;
  const int span = UNITS * blockDim.x, tiles = (units + span - 1) / span;
  size_t row = blockIdx.x / tiles;
  int u0 = (blockIdx.x % tiles) * span, n = min(span, units - u0);
  mbarrier_init(&bar);
  if (threadIdx.x == 0) tma_load(staged, s + row * units + u0, n * 16, &bar);
  mbarrier_wait(&bar, 0);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    uint4* to = d + (size_t)dst[row * 8 + j] * units + u0;
#pragma unroll
    for (int q = 0; q < UNITS; ++q)
      if (q * (int)blockDim.x + (int)threadIdx.x < n) to[q * blockDim.x + threadIdx.x] = staged[q * blockDim.x + threadIdx.x];
  }
}

// DRAM turns between reads and writes.  fanout8 trickles its reads among 8 times as many writes; does reading
// the source in bursts help?  fanout8 whose CTA b (b % per_chunk == 0) first asks L2 to prefetch the source chunk
// `dist` chunks ahead (cp.async.bulk.prefetch, 32 KiB a thread), so that the units' own loads hit L2.
template <bool STREAM>
__global__ void fanout8pf(const uint4* __restrict__ s, uint4* __restrict__ d, size_t n8, unsigned per_chunk,
                          unsigned dist) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (blockIdx.x % per_chunk == 0) {
    size_t chunk_units = (size_t)per_chunk * blockDim.x, first = (blockIdx.x / per_chunk + dist) * chunk_units;
    for (size_t u = first + threadIdx.x * 2048; u < first + chunk_units && u < n8; u += blockDim.x * 2048)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], 32768;" :: "l"(s + u) : "memory");
  }
  if (i >= n8) return;
  uint4 v = s[i];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (STREAM)
      asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(d + j * n8 + i), "r"(v.x), "r"(v.y), "r"(v.z),
                   "r"(v.w) : "memory");
    else
      d[j * n8 + i] = v;
  }
}

// CTA i copies source row src[i] to destination row dst[i], `units` 16-byte units, loads before stores.  With
// L2 hints: loads kept (evict_last) so that a chunk's source rows stay in L2 for their 8 reads, stores passed
// through (evict_first) so that they do not push the source out.  HINT bit 0: loads, bit 1: stores.
template <int PER_THREAD, int HINT = 0>
__global__ void gather8(const uint4* __restrict__ s, uint4* __restrict__ d, const int* __restrict__ dst,
                        const int* __restrict__ src, int units) {
  const uint4* from = s + (size_t)src[blockIdx.x] * units;
  uint4* to = d + (size_t)dst[blockIdx.x] * units;
  unsigned long long keep, pass;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pass));
  uint4 v[PER_THREAD];
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    int u = k * blockDim.x + threadIdx.x;
    if (u < units) {
      if (HINT & 1)
        asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w) : "l"(from + u), "l"(keep));
      else
        v[k] = from[u];
    }
  }
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    int u = k * blockDim.x + threadIdx.x;
    if (u < units) {
      if (HINT & 2)
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;"
                     :: "l"(to + u), "r"(v[k].x), "r"(v[k].y), "r"(v[k].z), "r"(v[k].w), "l"(pass) : "memory");
      else
        to[u] = v[k];
    }
  }
}

// (destination, source) rows of the 8 R copies in gather8's launch order `order` (see the header),
// from a rows8 table: position p = table[8 r + j] holds source row r.
static void gather8_order(const std::vector<int>& table, const char* order, std::vector<int>& dst,
                          std::vector<int>& src) {
  size_t n = table.size();
  std::vector<size_t> pairs(n);  // indices 8 r + j
  for (size_t i = 0; i < n; ++i) pairs[i] = i;
  if (order[0] == 'd') {
    std::sort(pairs.begin(), pairs.end(), [&](size_t a, size_t b) { return table[a] < table[b]; });
  } else if (order[0] == 'c') {
    size_t chunk = (size_t)std::atoi(order + 5);
    std::sort(pairs.begin(), pairs.end(), [&](size_t a, size_t b) {
      size_t ca = a / 8 / chunk, cb = b / 8 / chunk;
      return ca != cb ? ca < cb : table[a] < table[b];
    });
  }
  dst.resize(n);
  src.resize(n);
  for (size_t i = 0; i < n; ++i) { dst[i] = table[pairs[i]]; src[i] = (int)(pairs[i] / 8); }
}

// The destination rows of rows8's three layouts (see the header), R source rows.
static std::vector<int> rows8_table(const char* layout, int rows) {
  std::vector<int> dst(8 * (size_t)rows);
  unsigned state = 12345;
  auto next = [&] { state = state * 1664525u + 1013904223u; return state >> 8; };
  if (layout[0] == 's' && layout[1] == 't') {
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < 8; ++j) dst[8 * (size_t)r + j] = j * rows + r;
  } else if (layout[0] == 'e') {
    const int experts = 256;
    std::vector<int> expert(dst.size()), count(experts, 0), start(experts, 0);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < 8; ++j) {
        int e;
        do { e = next() % experts; } while (std::find(&expert[8 * (size_t)r], &expert[8 * (size_t)r + j], e) !=
                                            &expert[8 * (size_t)r + j]);
        expert[8 * (size_t)r + j] = e;
        ++count[e];
      }
    for (int e = 1; e < experts; ++e) start[e] = start[e - 1] + count[e - 1];
    for (size_t p = 0; p < dst.size(); ++p) dst[p] = start[expert[p]]++;
  } else {
    for (size_t p = 0; p < dst.size(); ++p) dst[p] = (int)p;
    for (size_t p = dst.size() - 1; p > 0; --p) std::swap(dst[p], dst[next() % (p + 1)]);
  }
  return dst;
}

template <class F>
static double median_us(F launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.0f);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

static void line(const char* what, int grid, int threads, double bytes, double us) {
  std::printf("%-10s grid %6d x %4d  %9.1f us  %6.3f TB/s\n", what, grid, threads, us, bytes / us / 1e6);
}

// The rows8 layout `table` checked in b after a kernel wrote it: the 8 destination rows of sampled source rows
// of a hold them.
static void rows8_check(const char* what, const std::vector<int>& table, const uint4* a, const uint4* b, int rows,
                        int row_units) {
  CHECK(cudaDeviceSynchronize());
  std::vector<uint4> got(row_units), want(row_units);
  size_t wrong = 0, checked = 0;
  for (int r = 0; r < rows; r += 1021)
    for (int j = 0; j < 8; ++j, ++checked) {
      CHECK(cudaMemcpy(got.data(), b + (size_t)table[8 * (size_t)r + j] * row_units, row_units * 16,
                       cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(want.data(), a + (size_t)r * row_units, row_units * 16, cudaMemcpyDeviceToHost));
      wrong += std::memcmp(got.data(), want.data(), row_units * 16) != 0;
    }
  std::printf("# %s check: %zu wrong rows of %zu sampled\n", what, wrong, checked);
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2048;
  size_t bytes = mib << 20, n = bytes / 16;
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# %s, %d SMs, L2 %d MiB, buffer %zu MiB\n", prop.name, sms, prop.l2CacheSize >> 20, mib);
  char *a, *b;
  unsigned* sink;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&sink, 4));
  st_v4<<<sms * 8, 256>>>((uint4*)a, n, 7);  // the source of copy, read and fanout8: noise
  CHECK(cudaDeviceSynchronize());
  const unsigned salt = 11;  // every timed store writes noise unless its line says zeros
  for (int threads : {256, 512, 1024})
    for (int per_sm : {1, 2, 4, 8}) {
      int grid = sms * per_sm;
      if (threads * per_sm > 2048) continue;
      line("st.v4", grid, threads, bytes, median_us([&] { st_v4<<<grid, threads>>>((uint4*)b, n, salt); }));
    }
  line("st.v4", (int)(n / 256), 256, bytes,  // one unit a thread, no loop
       median_us([&] { st_v4<<<(unsigned)(n / 256), 256>>>((uint4*)b, n, salt); }));
  line("st.v4zero", sms * 4, 256, bytes, median_us([&] { st_v4<<<sms * 4, 256>>>((uint4*)b, n, 0); }));
  line("st.v4zero", (int)(n / 256), 256, bytes,
       median_us([&] { st_v4<<<(unsigned)(n / 256), 256>>>((uint4*)b, n, 0); }));
  for (int per_sm : {4, 8})
    line("st.cs.v4", sms * per_sm, 256, bytes, median_us([&] { st_cs_v4<<<sms * per_sm, 256>>>((uint4*)b, n, salt); }));
  CHECK(cudaFuncSetAttribute(bulk_store, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
  for (unsigned chunk : {4096u, 16384u, 65536u})
    for (int per_sm : {1, 2, 4}) {
      int grid = sms * per_sm;
      if (chunk * per_sm > 200 * 1024) continue;
      char what[32];
      std::snprintf(what, sizeof what, "bulk%uK", chunk / 1024);
      line(what, grid, 32, bytes, median_us([&] { bulk_store<<<grid, 32, chunk>>>(b, bytes, chunk, salt); }));
    }
  line("bulkzero16K", sms, 32, bytes, median_us([&] { bulk_store<<<sms, 32, 16384>>>(b, bytes, 16384, 0); }));
  line("memsetzero", 0, 0, bytes, median_us([&] { CHECK(cudaMemsetAsync(b, 0, bytes)); }));
  line("memset0x5A", 0, 0, bytes, median_us([&] { CHECK(cudaMemsetAsync(b, 0x5A, bytes)); }));
  for (int per_sm : {4, 8})
    line("copy", sms * per_sm, 256, 2.0 * bytes,
         median_us([&] { copy_v4<<<sms * per_sm, 256>>>((const uint4*)a, (uint4*)b, n); }));
  line("copy", (int)(n / 256), 256, 2.0 * bytes,
       median_us([&] { copy_v4<<<(unsigned)(n / 256), 256>>>((const uint4*)a, (uint4*)b, n); }));
  line("cudaMemcpy", 0, 0, 2.0 * bytes, median_us([&] { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }));
  for (int per_sm : {4, 8})
    line("read", sms * per_sm, 256, bytes,
         median_us([&] { read_v4<<<sms * per_sm, 256>>>((const uint4*)a, n, sink); }));
  size_t n8 = n / 8;  // source units whose 8 copies fill the buffer
  for (int per_sm : {4, 8, 16})
    line("fanout8", sms * per_sm, 256, bytes + bytes / 8.0,
         median_us([&] { fanout8<<<sms * per_sm, 256>>>((const uint4*)a, (uint4*)b, n8); }));
  line("fanout8", (int)(n8 / 256), 256, bytes + bytes / 8.0,
       median_us([&] { fanout8<<<(unsigned)(n8 / 256), 256>>>((const uint4*)a, (uint4*)b, n8); }));
  // The mix: is it the 8 streams, their power-of-two spacing, or the reads among the writes?
  {
    const size_t all = ~(size_t)0, l2 = ((size_t)8 << 20) / 16 - 1;  // the whole source, or its first 8 MiB
    const size_t skew = n8 - 1999;                                      // streams spaced by a non-power of two
    const unsigned g8 = (unsigned)(n8 / 256);
    line("w8-pow2", g8, 256, bytes, median_us([&] { w8<<<g8, 256>>>((uint4*)b, n8, n8, salt); }));
    line("w8-skew", g8 - 8, 256, 8.0 * (n8 - 2048) * 16,
         median_us([&] { w8<<<g8 - 8, 256>>>((uint4*)b, n8 - 2048, skew, salt); }));
    line("fanout8-pow2", g8, 256, bytes + bytes / 8.0,
         median_us([&] { fanout8s<<<g8, 256>>>((const uint4*)a, (uint4*)b, n8, n8, all); }));
    line("fanout8-skew", g8 - 8, 256, 9.0 * (n8 - 2048) * 16,
         median_us([&] { fanout8s<<<g8 - 8, 256>>>((const uint4*)a, (uint4*)b, n8 - 2048, skew, all); }));
    line("fanout8-l2src", g8, 256, bytes + bytes / 8.0,
         median_us([&] { fanout8s<<<g8, 256>>>((const uint4*)a, (uint4*)b, n8, n8, l2); }));
    line("fanout8-l2skew", g8 - 8, 256, 9.0 * (n8 - 2048) * 16,
         median_us([&] { fanout8s<<<g8 - 8, 256>>>((const uint4*)a, (uint4*)b, n8 - 2048, skew, l2); }));
    for (int threads : {128, 256, 1024}) {
      unsigned g = (unsigned)(n8 / threads);
      line("fanout8c", g, threads, bytes + bytes / 8.0,
           median_us([&] { fanout8c<<<g, threads>>>((const uint4*)a, (uint4*)b, all); }));
    }
    line("fanout8c-l2src", g8, 256, bytes + bytes / 8.0,
         median_us([&] { fanout8c<<<g8, 256>>>((const uint4*)a, (uint4*)b, l2); }));
  }
  {
    const unsigned g8 = (unsigned)(n8 / 256);
    for (long long spin : {1000LL, 3000LL})
      line(spin == 1000 ? "w8-spin1k" : "w8-spin3k", g8, 256, bytes,
           median_us([&] { w8spin<<<g8, 256>>>((uint4*)b, n8, salt, spin); }));
    line("fanout8free", g8, 256, bytes + bytes / 8.0,
         median_us([&] { fanout8free<<<g8, 256>>>((const uint4*)a, (uint4*)b, n8, salt, sink); }));
    unsigned* counter;
    CHECK(cudaMalloc(&counter, 4));
    auto queued = [&](const char* what, int per_sm, int threads, bool write_only, auto kernel) {
      int grid = sms * per_sm;
      line(what, grid, threads, write_only ? bytes : bytes + bytes / 8.0, median_us([&] {
             CHECK(cudaMemsetAsync(counter, 0, 4));
             kernel<<<grid, threads>>>(write_only ? nullptr : (const uint4*)a, (uint4*)b, n8, counter, salt);
           }));
    };
    queued("w8q-d1", 8, 256, true, fanout8q<1>);
    queued("w8q-d2", 8, 256, true, fanout8q<2>);
    for (int per_sm : {4, 8}) {
      queued("fanout8q-d1", per_sm, 256, false, fanout8q<1>);
      queued("fanout8q-d2", per_sm, 256, false, fanout8q<2>);
      queued("fanout8q-d4", per_sm, 256, false, fanout8q<4>);
    }
    CHECK(cudaFree(counter));
  }
  {
    const unsigned g8 = (unsigned)(n8 / 256);
    line("fanout8na", g8, 256, bytes + bytes / 8.0,
         median_us([&] { fanout8na<<<g8, 256>>>((const uint4*)a, (uint4*)b, n8); }));
    line("fanout8l1", g8, 256, bytes + bytes / 8.0,
         median_us([&] { fanout8l1<<<g8, 256>>>((const uint4*)a, (uint4*)b, n8); }));
    for (int threads : {128, 256, 512}) {
      unsigned g = (unsigned)(n8 / threads);
      line("fanout8tma", g, threads, bytes + bytes / 8.0,
           median_us([&] { fanout8tma<<<g, threads, threads * 16>>>((const uint4*)a, (uint4*)b, n8); }));
    }
  }
  {
    const unsigned g8 = (unsigned)(n8 / 256);
    for (size_t mib : {1, 4})
      line(mib == 1 ? "fanout8-l2src1M" : "fanout8-l2src4M", g8, 256, bytes + bytes / 8.0, median_us([&] {
             fanout8s<<<g8, 256>>>((const uint4*)a, (uint4*)b, n8, n8, (mib << 20) / 16 - 1);
           }));
    for (unsigned kib : {256u, 1024u, 4096u})
      for (unsigned dist : {1u, 2u}) {
        unsigned per_chunk = kib * 1024 / 16 / 256;
        char what[40];
        std::snprintf(what, sizeof what, "fanout8pf%uK-d%u", kib, dist);
        line(what, g8, 256, bytes + bytes / 8.0, median_us([&] {
               fanout8pf<false><<<g8, 256>>>((const uint4*)a, (uint4*)b, n8, per_chunk, dist);
             }));
        std::snprintf(what, sizeof what, "fanout8pfcs%uK-d%u", kib, dist);
        line(what, g8, 256, bytes + bytes / 8.0, median_us([&] {
               fanout8pf<true><<<g8, 256>>>((const uint4*)a, (uint4*)b, n8, per_chunk, dist);
             }));
      }
  }
  const int row_units = 896, rows = 16384, tile = 128;
  if ((size_t)rows * 8 * row_units * 16 <= bytes) {
    int* dst;
    CHECK(cudaMalloc(&dst, 8 * (size_t)rows * sizeof(int)));
    for (const char* layout : {"streams", "experts", "shuffled"}) {
      std::vector<int> table = rows8_table(layout, rows);
      CHECK(cudaMemcpy(dst, table.data(), table.size() * sizeof(int), cudaMemcpyHostToDevice));
      char what[32];
      std::snprintf(what, sizeof what, "rows8-%s", layout);
      int grid = rows * ((row_units + tile - 1) / tile);
      line(what, grid, tile, 9.0 * rows * row_units * 16,
           median_us([&] { rows8u<1><<<grid, tile>>>((const uint4*)a, (uint4*)b, dst, row_units); }));
      if (layout[0] == 'e') {  // the shipped kernel's shape, and the queued pipeline, on expand's layout
        int grid2 = rows * ((row_units + 2 * tile - 1) / (2 * tile));
        line("rows8u2-experts", grid2, tile, 9.0 * rows * row_units * 16,
             median_us([&] { rows8u<2><<<grid2, tile>>>((const uint4*)a, (uint4*)b, dst, row_units); }));
        int grid1 = rows * ((row_units + tile - 1) / tile);
        line("rows8u1pass-experts", grid1, tile, 9.0 * rows * row_units * 16,
             median_us([&] { rows8u<1, true><<<grid1, tile>>>((const uint4*)a, (uint4*)b, dst, row_units); }));
        line("rows8u2pass-experts", grid2, tile, 9.0 * rows * row_units * 16,
             median_us([&] { rows8u<2, true><<<grid2, tile>>>((const uint4*)a, (uint4*)b, dst, row_units); }));
        unsigned* counter;
        CHECK(cudaMalloc(&counter, 4));
        for (int per_sm : {8, 16}) {
          int gq = sms * per_sm;
          auto run = [&](const char* name, auto kernel) {
            line(name, gq, tile, 9.0 * rows * row_units * 16, median_us([&] {
                   CHECK(cudaMemsetAsync(counter, 0, 4));
                   kernel<<<gq, tile>>>((const uint4*)a, (uint4*)b, dst, row_units, rows, counter);
                 }));
          };
          run("rows8q-d1-experts", rows8q<1>);
          run("rows8q-d2-experts", rows8q<2>);
          run("rows8q-d4-experts", rows8q<4>);
        }
        // rows8q checked: the 8 destination rows of sampled source rows hold them
        CHECK(cudaMemset(b, 0, bytes));
        CHECK(cudaMemset(counter, 0, 4));
        rows8q<4><<<sms * 16, tile>>>((const uint4*)a, (uint4*)b, dst, row_units, rows, counter);
        rows8_check("rows8q", table, (const uint4*)a, (const uint4*)b, rows, row_units);
        CHECK(cudaFree(counter));
      }
      if (layout[0] == 'e') {  // the tile loaded by TMA
        for (int u : {1, 2, 7}) {
          int g = rows * ((row_units + u * tile - 1) / (u * tile));
          char name[32];
          std::snprintf(name, sizeof name, "rows8tma%d-experts", u);
          auto kernel = u == 1 ? rows8tma<1> : u == 2 ? rows8tma<2> : rows8tma<7>;
          line(name, g, tile, 9.0 * rows * row_units * 16,
               median_us([&] { kernel<<<g, tile, u * tile * 16>>>((const uint4*)a, (uint4*)b, dst, row_units); }));
        }
        CHECK(cudaMemset(b, 0, bytes));
        rows8tma<2><<<rows * 4, tile, 2 * tile * 16>>>((const uint4*)a, (uint4*)b, dst, row_units);
        rows8_check("rows8tma2", table, (const uint4*)a, (const uint4*)b, rows, row_units);
      }
      std::snprintf(what, sizeof what, "rows8l2-%s", layout);  // the source's first 512 rows (7 MiB), in L2
      line(what, grid, tile, 9.0 * rows * row_units * 16,
           median_us([&] { rows8m<<<grid, tile>>>((const uint4*)a, (uint4*)b, dst, row_units, 511); }));
    }
    // gather8 over the experts layout, in several launch orders
    std::vector<int> table = rows8_table("experts", rows), gdst, gsrc;
    int *d_dst, *d_src;
    CHECK(cudaMalloc(&d_dst, table.size() * sizeof(int)));
    CHECK(cudaMalloc(&d_src, table.size() * sizeof(int)));
    for (const char* order : {"dst", "src", "chunk256", "chunk512", "chunk1024", "chunk2048", "chunk4096"}) {
      gather8_order(table, order, gdst, gsrc);
      CHECK(cudaMemcpy(d_dst, gdst.data(), gdst.size() * sizeof(int), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(d_src, gsrc.data(), gsrc.size() * sizeof(int), cudaMemcpyHostToDevice));
      char what[32];
      std::snprintf(what, sizeof what, "gather8-%s", order);
      int grid = (int)table.size();
      line(what, grid, 128, 9.0 * rows * row_units * 16,
           median_us([&] { gather8<7><<<grid, 128>>>((const uint4*)a, (uint4*)b, d_dst, d_src, row_units); }));
    }
    for (const char* order : {"src", "chunk64", "chunk256", "chunk512", "chunk1024"}) {
      gather8_order(table, order, gdst, gsrc);
      CHECK(cudaMemcpy(d_dst, gdst.data(), gdst.size() * sizeof(int), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(d_src, gsrc.data(), gsrc.size() * sizeof(int), cudaMemcpyHostToDevice));
      int grid = (int)table.size();
      char what[40];
      const char* hints[] = {"", "keep", "pass", "keeppass"};
      auto kernels = {gather8<7, 1>, gather8<7, 2>, gather8<7, 3>};
      int h = 1;
      for (auto kernel : kernels) {
        std::snprintf(what, sizeof what, "gather8%s-%s", hints[h++], order);
        line(what, grid, 128, 9.0 * rows * row_units * 16,
             median_us([&] { kernel<<<grid, 128>>>((const uint4*)a, (uint4*)b, d_dst, d_src, row_units); }));
      }
    }
    // the last order, checked: every destination row holds its source row
    std::vector<uint4> got(row_units), want(row_units);
    size_t wrong = 0;
    for (size_t i = 0; i < gdst.size(); i += 4099) {
      CHECK(cudaMemcpy(got.data(), (uint4*)b + (size_t)gdst[i] * row_units, row_units * 16, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(want.data(), (uint4*)a + (size_t)gsrc[i] * row_units, row_units * 16, cudaMemcpyDeviceToHost));
      wrong += std::memcmp(got.data(), want.data(), row_units * 16) != 0;
    }
    std::printf("# gather8 check: %zu wrong rows of %zu sampled\n", wrong, (gdst.size() + 4098) / 4099);
    CHECK(cudaFree(d_dst));
    CHECK(cudaFree(d_src));
    CHECK(cudaFree(dst));
  }
  // The same checked: the bulk stores wrote zeros everywhere.
  CHECK(cudaMemset(b, 0xAB, bytes));
  bulk_store<<<sms, 32, 16384>>>(b, bytes, 16384, 0);
  CHECK(cudaDeviceSynchronize());
  std::vector<unsigned char> host(bytes);
  CHECK(cudaMemcpy(host.data(), b, bytes, cudaMemcpyDeviceToHost));
  size_t bad = std::count_if(host.begin(), host.end(), [](unsigned char c) { return c != 0; });
  std::printf("# bulk store check: %zu nonzero bytes of %zu\n", bad, bytes);
  return 0;
}
