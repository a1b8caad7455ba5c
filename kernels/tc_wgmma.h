// tc's sm_90a wgmma path: the layout of tc_attn_wg (the kernel: tc_wgmma.cu) and what the sm_90a
// kernels share.
#pragma once
#include "tc.h"
#include "tc_wgmma_mma.h"

namespace verify_attn {
namespace {

// ---------------------------------------------------------------------------------------
// The sm_90a path: the same block and tile (64 query rows, 64 keys, 2 stages, cp.async
// gather) on warpgroup MMAs, which read both operands from shared memory once per warpgroup
// instead of once per warp through ldmatrix (the wall of the mma.sync path). Tiles are stored
// chunk-major, the layout wgmma's 128-byte swizzle expects: plane c8 holds dims 64 c8 ..
// 64 c8 + 63 of every row, 128 bytes a row, 16-byte chunk x of row r at x ^ (r & 7), planes
// and the buffers 1024-byte aligned. The same planes are the K-major B of S = Q K^T and the
// N-major B of O += P V (V = the first 8 planes). Warpgroup w computes S for keys 32 w ..
// 32 w + 31 over all 576 dims and O for columns 256 w .. 256 w + 255 (128 fp32 a thread);
// the two exchange row maxima and write P (bf16, K-major, swizzled) to shared memory for PV.
namespace wg {
constexpr int N = 64;
constexpr int kPlane = N * 128;                 // one 64-dim plane of a 64-row tile
constexpr int kTileBytes = 9 * kPlane;          // 73,728
// Shared memory from the 1024-aligned base; the staged parents follow it.
struct Smem {
  uint8_t q[kTileBytes];      // the block's query rows, 9 planes
  uint8_t kv[2][kTileBytes];  // cache tiles, 9 planes each
  uint8_t p[kPlane];          // P: 64 rows x 64 keys bf16, one plane
  float max[2][kRows];        // each warpgroup's row maxima, at the end the row sums
  uint64_t mask[2][kRows];    // per tile parity: visibility word of each token
  BlockInfo info;
};
constexpr int kOffQ = offsetof(Smem, q);
constexpr int kOffKV = offsetof(Smem, kv);
constexpr int kOffP = offsetof(Smem, p);
constexpr int kOffMax = offsetof(Smem, max);
constexpr int kOffMask = offsetof(Smem, mask);
constexpr int kOffInfo = offsetof(Smem, info);
constexpr int kOffParent = sizeof(Smem);
static_assert(kOffKV % 1024 == 0 && kOffP % 1024 == 0 && kTileBytes % 1024 == 0, "wgmma's 128-byte swizzle: 1024-byte aligned planes");
constexpr int kSlack = 1024;                    // the dynamic base is aligned up to 1024 at run time
constexpr int kBaseBytes = kSlack + kOffParent;
static_assert(kRows == 64 && kThreads == 256, "two warpgroups, 64 rows");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte offset of 16-byte chunk c (0..71) of row r in a chunk-major swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t at(int rows, int r, int c) {
  return (c >> 3) * (rows * 128) + r * 128 + (((c ^ r) & 7) << 4);
}
// The shared-memory matrix descriptor: 128-byte swizzle, byte offsets LBO and SBO.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | uint64_t((lbo & 0x3FFFF) >> 4) << 16 |
         uint64_t((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma's reads.
__device__ __forceinline__ void fence_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator reads above the wait.
template <int K>
__device__ __forceinline__ void pin(float (&d)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The dynamic shared memory from its first 1024-aligned byte (the planes' swizzle phase):
// returns it as a pointer, sbase as a 32-bit shared address.
__device__ __forceinline__ uint8_t* smem_aligned(uint8_t* raw, uint32_t& sbase) {
  const uint32_t sraw = smem_u32(raw);
  sbase = (sraw + 1023) & ~1023u;
  return raw + (sbase - sraw);
}
// D = A B^T over all 576 dims, 36 k-steps of m64nCk16, A and B K-major chunk-major planes
// (issued and committed, not waited). Descriptors advance by adding the offset (in 16-byte
// units) to the address field: no carry below 256 KB.
template <int C>
__device__ __forceinline__ void issue_qk(float (&d)[C / 2], uint64_t da, uint64_t db) {
  fence();
#pragma unroll
  for (int kc = 0; kc < 9; ++kc)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t off = (kc * kPlane + kk * 32) >> 4;
      Mma<C>::template run<0, 0>(d, da + off, db + off, kc | kk);
    }
  commit();
}
// A tile at the tree rows cleaned in shared memory: non-finite values zeroed (a key a row cannot
// see must not reach its output through 0 * inf) and their keys marked in *bad (bit k <-> the
// tile's key k: a row that sees one gets NaN). Chunk-major planes (at()); thread t of the
// Step cleaning threads takes chunks t, t + Step, ...; bad[s]: the tile's word.
template <int Step>
__device__ __forceinline__ void zero_nonfinite_tile(uint8_t* tile, uint64_t* bad, int s, int t) {
  uint4* rows = reinterpret_cast<uint4*>(tile);
  for (int c = t; c < N * kChunks; c += Step) {
    uint4 v = rows[c];
    const bool nonfinite = zero_nonfinite(v.x) | zero_nonfinite(v.y) | zero_nonfinite(v.z) | zero_nonfinite(v.w);
    if (nonfinite) {
      rows[c] = v;
      atomicOr(reinterpret_cast<unsigned long long*>(&bad[s]), 1ull << ((c >> 3) & (N - 1)));
    }
  }
}
// The block's keys and their gather, shared by the sm_90a kernels (tc_attn_wg, tc_attn_wgt):
// the work (block_work), the group's query rows loaded once, tiles of N keys walked from the
// top of the range down, each gathered by cp.async into the chunk-major planes above (one row
// a 4-thread group, the row offset in int64 fetched a tile ahead; rows past the range zero
// filled from a valid address), the tree mask of the tiles at the tree rows, and the
// non-finite clean-up of those tiles. S: the kernel's shared memory (members q, kv, mask, info;
// the staged parents follow it); the Q and KV planes are 64 rows each in both kernels.
template <class S>
struct Tiles {
  const Params& p;
  const TcArgs& a;
  uint8_t* smem;
  uint32_t sbase;
  int tid, lr;  // lr: the row this thread loads, 18 of its 72 chunks
  Work wk;
  int R0, P, rows_valid, i_lo, ntok, ntiles, mask_from;
  const int32_t* parent_g;
  int32_t* s_parent;
  uint64_t* s_mask;  // [2][kRows]: per tile parity, the visibility word of each token
  uint64_t* s_bad;   // [2]: per tile parity, the tile's rows that held a non-finite value
  TreeWalk walk;
  int64_t row_next;

  static constexpr int kOffQ = offsetof(S, q), kOffKV = offsetof(S, kv), kOffMask = offsetof(S, mask),
                       kOffInfo = offsetof(S, info), kOffParent = sizeof(S);
  __device__ Tiles(const Params& p_, const TcArgs& a_, uint8_t* smem_, uint32_t sbase_, int tid_)
      : p(p_), a(a_), smem(smem_), sbase(sbase_), tid(tid_), walk(-1) {}
  __device__ uint32_t kv_buf(int s) const { return sbase + kOffKV + s * kTileBytes; }
  __device__ int tile_t0(int j) const { return wk.key_lo + (ntiles - 1 - j) * N; }
  __device__ bool tile_masked(int j) const { return tile_t0(j) + N > mask_from; }
  __device__ int64_t row_for(int j) const {
    const int t = tile_t0(j) + lr;
    return t < wk.key_hi ? cache_row(p, wk.b, t) : int64_t(-1);
  }
  // src: the row, or for a row out of range the tensor's first row (a valid address, 0 bytes
  // read, zero filled); either way chunk c is at src + 8 c, an immediate offset. Keys: a key
  // row, read once by this block (evict first from L2).
  template <bool Keys>
  __device__ void load_row(uint32_t dst, int rows, const uint16_t* src, bool ok) const {
    const int bytes = ok ? 16 : 0;
#pragma unroll
    for (int k = 0; k < kChunks / 4; ++k) {
      const int c = (tid & 3) + 4 * k;
      if constexpr (Keys)
        cp_async16_hint(dst + at(rows, lr, c), src + c * 8, bytes, l2_evict_first());
      else
        cp_async16(dst + at(rows, lr, c), src + c * 8, bytes);
    }
  }
  __device__ void build_mask(int j) {
    if (tid == 0) s_bad[j & 1] = 0;
    if (tid < ntok)
      s_mask[(j & 1) * kRows + tid] =
          walk.word(tile_t0(j), N, mask_from, P, wk.key_hi, a.parent_cap, s_parent, parent_g);
  }
  // The block's work; false: the block has none (uniform, the caller returns).
  __device__ bool begin(int warp) {
    int* info = reinterpret_cast<int*>(smem + kOffInfo);
    if (!block_work(p, a, N, info, warp, wk)) return false;
    lr = tid >> 2;
    s_parent = reinterpret_cast<int32_t*>(smem + kOffParent);
    s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
    s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
    R0 = blockIdx.x * a.group_rows;
    P = element_prefix(p, wk.b);
    rows_valid = min(a.group_rows, a.R - R0);
    i_lo = R0 / p.heads;
    ntok = (R0 + rows_valid - 1) / p.heads - i_lo + 1;
    ntiles = wk.key_hi > wk.key_lo ? (wk.key_hi - wk.key_lo + N - 1) / N : 0;
    mask_from = min(P, wk.key_hi);
    parent_g = p.parent + int64_t(wk.b) * p.q_len;
    return true;
  }
  // Parents staged, the query rows and tile 0 in flight, tile 0's mask; ends on a barrier.
  __device__ void start() {
    walk = TreeWalk(tid < ntok ? i_lo + tid : -1);
    for (int i = tid; i < a.parent_cap; i += kThreads) s_parent[i] = __ldg(parent_g + i);
    {
      const bool ok = lr < rows_valid;
      load_row<false>(sbase + kOffQ, kRows, ok ? p.q + (int64_t(wk.b) * a.R + R0 + lr) * kKeyDim : p.q, ok);
    }
    if (ntiles > 0) {
      const int64_t row = row_for(0);
      load_row<true>(kv_buf(0), N, p.kv + (row >= 0 ? row : 0) * kKeyDim, row >= 0);
    }
    cp_async_commit();
    row_next = ntiles > 1 ? row_for(1) : int64_t(-1);
    __syncthreads();  // parents visible
    if (ntiles > 0 && tile_masked(0)) build_mask(0);
  }
  // During tile j: tile j + 1's gather goes out, tile j + 2's row offset is fetched.
  __device__ void next(int j) {
    if (j + 1 < ntiles) {
      load_row<true>(kv_buf((j & 1) ^ 1), N, p.kv + (row_next >= 0 ? row_next : 0) * kKeyDim, row_next >= 0);
      cp_async_commit();
      if (j + 2 < ntiles) row_next = row_for(j + 2);
      if (tile_masked(j + 1)) build_mask(j + 1);
    }
  }
  // On a masked tile j, after the barrier that saw it land: non-finite values zeroed (a key a
  // row cannot see must not reach its output through 0 * inf), their keys marked in s_bad
  // (a row that sees one gets NaN); ends on a barrier. The same contract as tc_attn.
  __device__ void clean(int j) {
    zero_nonfinite_tile<kThreads>(smem + kOffKV + (j & 1) * kTileBytes, s_bad, j & 1, tid);
    fence_smem();
    __syncthreads();
  }
};
#endif
}  // namespace wg

}  // namespace
}  // namespace verify_attn
