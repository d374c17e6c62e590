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
//   gather8-*   the "experts" layout written the other way round: a CTA per destination row, which reads its
//               source row (7 units a thread, loads before stores), CTAs in the order named: "dst" position
//               order (one sequential write stream; each source row read 8 times, far apart), "src" the
//               rows8 order (row by row), "chunkC" chunk-major (C source rows at a time, their destination
//               rows in position order: within a chunk, one run of rows an expert, and a source row's 8
//               reads close together, from L2 once its chunk is in it).  Can the write order beat rows8?
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

// Row r of `units` 16-byte units, read once and written to rows dst[8 r + j]; CTA (row, tile of blockDim).
__global__ void rows8(const uint4* __restrict__ s, uint4* __restrict__ d, const int* __restrict__ dst, int units) {
  int tiles = (units + blockDim.x - 1) / blockDim.x;
  size_t row = blockIdx.x / tiles;
  int u = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
  if (u >= units) return;
  uint4 v = s[row * units + u];
#pragma unroll
  for (int j = 0; j < 8; ++j) d[(size_t)dst[row * 8 + j] * units + u] = v;
}

// CTA i copies source row src[i] to destination row dst[i], `units` 16-byte units, loads before stores.
template <int PER_THREAD>
__global__ void gather8(const uint4* __restrict__ s, uint4* __restrict__ d, const int* __restrict__ dst,
                        const int* __restrict__ src, int units) {
  const uint4* from = s + (size_t)src[blockIdx.x] * units;
  uint4* to = d + (size_t)dst[blockIdx.x] * units;
  uint4 v[PER_THREAD];
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    int u = k * blockDim.x + threadIdx.x;
    if (u < units) v[k] = from[u];
  }
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    int u = k * blockDim.x + threadIdx.x;
    if (u < units) to[u] = v[k];
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
           median_us([&] { rows8<<<grid, tile>>>((const uint4*)a, (uint4*)b, dst, row_units); }));
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
