// The tc kernel: the verify attention on tensor cores (bf16 operands, fp32 accumulation).
// Two paths, one contract, chosen at run time (plan_tc): mma.sync m16n8k16 for sm_80 and
// every later architecture, and on compute capability 9.0 (built as sm_90a) warpgroup MMAs
// (tc_attn_wg, further down). Both share the rows, the splits, the gather, the tree mask,
// the NaN handling and the merge described here.
//
// In MLA every head reads the same cache row, so a block takes up to 64 query rows, the
// (token, head) pairs of one batch element in token-major order (row = i * heads + h), and
// streams the element's cache rows through shared memory once for all of them:
//   S = Q K^T   over the 576 dims of a row (latent || rope)
//   O += P V    with V the first 512 dims of the same shared-memory tile
// Per tile of N cache rows, 8 warps in a WR x WC grid: warp (wr, wc) computes the scores of
// its 64/WR rows for N/WC of the keys, and the output of the same rows for 512/WC of the
// columns, so O stays in registers (128 fp32 a thread). The row maxima of the WC warps that
// share rows are exchanged through shared memory, the probabilities too (every warp needs the
// whole tile's P of its rows for PV). P goes to the tensor cores as plain bf16 (each
// probability moves by at most 2^-9 relative; the project's tolerance allows for it).
//
// With N = 64 the scores are split over the dims as well: the two warps (wc = 2 kq + dh) of a
// pair compute the same 32 rows x 32 keys, warp dh over half of the 36 k-steps, and swap halves
// through shared memory (the P buffer, free at that point), so each ends with its own 32 x 16
// of full scores. That reads 2/3 of the Q and K bytes of the plain split (ldmatrix bandwidth
// is the wall of QK^T) and gives each warp 8 accumulator chains instead of 4.
// The k-step groups of QK^T are unrolled by 3 and the k16 steps of PV by 2 so that ldmatrix
// results of the next group are in flight during this group's mma (the kernel is latency
// bound: 2 warps a scheduler). The row maxima and P are exchanged on a named barrier per row
// group; one __syncthreads a tile remains (the buffer the next tile is loaded into).
//
// Shared memory is chosen at plan time from the device's opt-in limit:
//   227 KB (sm_90):      N = 64, 2 stages
//   163 KB (sm_80):      N = 32, 2 stages
//    99 KB (sm_86/89/120): N = 16, 1 stage
// Cache rows come through cp.async 16 B (one thread group per row, the row offset in int64,
// fetched a tile ahead) into a swizzled layout (16-byte chunk c of row r at c ^ (r & 7)
// within its 128-byte group), so ldmatrix reads are conflict free. Rows past the range are
// zero filled from a valid address.
//
// Tiles run from the top of a block's key range down. The tree mask is needed only on tiles
// that reach the tree rows [prefix, prefix + q_len) (or the end of the range); for those a
// 64-bit visibility word per token is built from the parent array by a walk that resumes
// from tile to tile (tiles descend, so every ancestor is visited once over the whole range).
//
// When batch x m-groups cannot fill the SMs the keys are split: the splits of all elements
// are dealt out by work (tiles + a fixed overhead each) from the prefix lengths on the device,
// so ragged batches stay balanced, and a second kernel merges the partials by log-sum-exp.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <cstdlib>

#include "verify_attn.h"

#ifndef VA_TC_QK_UNROLL
#define VA_TC_QK_UNROLL 3  // unroll of the 9 groups of 4 k-steps of the dim-split QK^T
#endif
#ifndef VA_TC_PV_UNROLL
#define VA_TC_PV_UNROLL 2  // unroll of the k16 steps of PV
#endif

namespace verify_attn {
namespace {

constexpr int kQkUnroll = VA_TC_QK_UNROLL;
constexpr int kPvUnroll = VA_TC_PV_UNROLL;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64;                  // query rows a block (m-group), at most
constexpr int kChunks = kKeyDim / 8;       // 72 chunks of 16 bytes a cache row
constexpr int kRowBytes = kKeyDim * 2;     // 1152
constexpr int kKSteps = kKeyDim / 16;      // 36 k-steps of QK^T
constexpr int kInfoBytes = 64;
constexpr int kSplitOverheadTiles = 4;     // cost of a split beyond its tiles, in tiles
constexpr int kMaxSplits = 128;
constexpr int kMergeWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// WR x WC warps; MT m16 tiles a warp (rows 16*MT); NTS n8 tiles of scores a warp.
// KSPLIT: QK^T of a warp pair split over the dims (see the top of the file).
template <int WR_, int WC_, int MT_, int NTS_, int STAGES_, bool KSPLIT_>
struct Config {
  static constexpr int WR = WR_, WC = WC_, MT = MT_, NTS = NTS_, STAGES = STAGES_;
  static constexpr bool KSPLIT = KSPLIT_;
  static constexpr int kXchFloats = MT * NTS * 4;  // floats a lane sends to its pair
  static constexpr int N = WC * NTS * 8;           // keys a tile
  static constexpr int ON = kLatent / (WC * 8);    // n8 tiles of O a warp
  static constexpr int TPR = kThreads / N;         // threads a cache row when loading
  static constexpr int kPRow = N * 2;              // bytes of a P row
  static constexpr int kOffQ = 0;
  static constexpr int kOffKV = kRows * kRowBytes;
  static constexpr int kOffPhi = kOffKV + STAGES * N * kRowBytes;
  static constexpr int kOffMax = kOffPhi + kRows * kPRow;
  static constexpr int kOffMask = kOffMax + WC * kRows * 4;
  static constexpr int kOffInfo = kOffMask + 2 * kRows * 8;
  static constexpr int kOffParent = kOffInfo + kInfoBytes;
  static_assert(WR * WC == kWarps, "8 warps");
  static_assert(WR * MT * 16 == kRows, "64 rows");
  static_assert(ON * WC * 8 == kLatent && ON % 8 == 0, "O columns: whole 128-byte groups a warp");
  static_assert(N * TPR == kThreads && N % 16 == 0, "tile rows");
  static_assert(NTS == 1 || NTS % 2 == 0, "score tiles");
  static_assert(!KSPLIT || (WC % 2 == 0 && (WR * WC / 2) * 32 * kXchFloats * 4 <= kRows * kPRow),
                "pair exchange fits in the P buffer");
  static_assert(kOffMask % 16 == 0, "alignment");
};
using CfgLarge = Config<2, 4, 2, 2, 2, true>;    // N = 64, 2 stages, dim-split QK^T: 227 KB parts
using CfgMid = Config<2, 4, 2, 1, 2, false>;     // N = 32, 2 stages: 163 KB parts
using CfgSmall = Config<4, 2, 1, 1, 1, false>;   // N = 16, 1 stage: 99 KB parts

// Derived from the plan on the host; the same for every block.
struct TcArgs {
  int R;           // query rows an element: heads * q_len
  int group_rows;  // rows an m-group (multiple of 16, <= 64)
  int slots;       // 0: one block per (m-group, element), written directly; else partial slots
  int parent_cap;  // parent entries staged in shared memory
  float* ws_o;     // slots x R x 512, normalised partial outputs
  float* ws_lse;   // slots x R, log2 units
  int2* meta;      // batch: (first slot, splits) of each element
};

// ---------------------------------------------------------------------------------------
// Small device helpers.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte chunk c of a swizzled 576-wide row r.
__device__ __forceinline__ int swz(int r, int c) { return (c & ~7) | ((c ^ r) & 7); }
// Chunk c of a P row r, rows of CPR chunks (CPR = 8: c ^ (r & 7); fewer: rows share a line).
template <int CPR>
__device__ __forceinline__ int pswz(int r, int c) { return c ^ ((r / (8 / CPR)) & (CPR - 1)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
}
// max that returns NaN when either argument is NaN (fmaxf would return the other one).
__device__ __forceinline__ float nan_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

// Zeroes the non-finite bf16 halves of a word (exponent all ones); returns whether there were any.
__device__ __forceinline__ bool zero_nonfinite(uint32_t& w) {
  const bool lo = (w & 0x7f80u) == 0x7f80u, hi = (w & 0x7f800000u) == 0x7f800000u;
  if (lo) w &= 0xffff0000u;
  if (hi) w &= 0x0000ffffu;
  return lo || hi;
}

__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ float ex2(float x) {  // 2^x, -inf -> +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// (lo, hi) -> bf16x2, lo in the low half; round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Keys an element attends to: its prefix and its tree rows, never past the tensor.
__device__ __forceinline__ int element_prefix(const Params& p, int b) {
  const int n = prefix_len_of(p, b);
  return n < 0 ? 0 : n;
}
__device__ __forceinline__ int element_keys(const Params& p, int b) {
  return min(element_prefix(p, b) + p.q_len, p.kv_cols);
}
// The cache row of key t of element b, as kv_row does (indices clamped), in int64.
__device__ __forceinline__ int64_t cache_row(const Params& p, int b, int t) {
  int64_t row = int64_t(b) * p.kv_cols + t;
  if (p.kv_indices != nullptr) {
    const int64_t r = p.kv_indices[row];
    row = (r < 0 || r >= p.pool_rows) ? 0 : r;
  }
  return row;
}

// Split mode: which element and key range slot `slot` covers. Every element gets at least
// one split and the rest in proportion to its work; run by one warp, result in info[0..5]:
// element (-1: none), key begin, key end, the element's first slot, its splits, this split.
__device__ void locate(const Params& p, const TcArgs& a, int slot, int N, int* info) {
  const int lane = threadIdx.x & 31;
  auto work = [&](int b) -> int64_t { return (element_keys(p, b) + N - 1) / N + kSplitOverheadTiles; };
  int64_t total = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32)
    if (b0 + lane < p.batch) total += work(b0 + lane);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  const int64_t extra = a.slots - p.batch;
  if (lane == 0) info[0] = -1;
  __syncwarp();
  int base = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    const int n = b < p.batch ? 1 + int(extra * work(b) / total) : 0;
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int first = base + incl - n;
    if (n > 0 && slot >= first && slot < first + n) {
      const int k = slot - first;
      const int keys = element_keys(p, b);
      const int64_t tiles = (keys + N - 1) / N;
      const int64_t lo = int64_t(k) * tiles / n, hi = int64_t(k + 1) * tiles / n;
      info[0] = b;
      info[1] = int(lo * N);
      info[2] = int(min(hi * N, int64_t(keys)));
      info[3] = first;
      info[4] = n;
      info[5] = k;
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
}

// Which element and which keys a block covers.
struct Work {
  int b, key_lo, key_hi, slot;
};
// False when the block's slot is one no element needed (uniform: the whole block leaves).
__device__ __forceinline__ bool block_work(const Params& p, const TcArgs& a, int N, int* info, int warp, Work& w) {
  w.key_lo = 0;
  w.slot = 0;
  if (a.slots == 0) {
    w.b = blockIdx.y;
    w.key_hi = element_keys(p, w.b);
    return true;
  }
  w.slot = blockIdx.y;
  if (warp == 0) locate(p, a, w.slot, N, info);
  __syncthreads();
  w.b = info[0];
  if (w.b < 0) return false;
  w.key_lo = info[1];
  w.key_hi = info[2];
  if (threadIdx.x == 0 && blockIdx.x == 0 && info[5] == 0) a.meta[w.b] = make_int2(info[3], info[4]);
  return true;
}

// One token's walk up the tree, resumed from tile to tile (tiles descend, so every ancestor
// is visited once over the whole range).
struct TreeWalk {
  int k;
  __device__ explicit TreeWalk(int start) : k(start) {}
  // The token's visibility word for keys [t0, t0 + n): bit i <-> key t0 + i.
  __device__ uint64_t word(int t0, int n, int mask_from, int P, int key_hi, int parent_cap, const int32_t* s_parent,
                           const int32_t* parent_g) {
    uint64_t word = 0;
    const int pre_hi = min(t0 + n, mask_from);
    if (pre_hi > t0) word = pre_hi - t0 >= 64 ? ~0ull : (1ull << (pre_hi - t0)) - 1;
    const int w0 = max(t0, P) - P, w1 = min(t0 + n, key_hi) - P;
    if (w1 > w0) {
      int kk = k;
      while (kk >= w0) {
        if (kk < w1) word |= 1ull << (kk + P - t0);
        const int pk = kk < parent_cap ? s_parent[kk] : __ldg(parent_g + kk);
        kk = pk < kk ? pk : -1;
      }
      k = kk;
    }
    return word;
  }
};

// A row's normaliser and log2 lse from its sum and maximum; no visible key: O = 0, lse = -inf
// (a NaN sum is not empty).
struct RowEnd {
  float inv, lse2;
};
__device__ __forceinline__ RowEnd row_end(float l, float m) {
  const bool empty = l == 0.f;
  return {empty ? 0.f : 1.f / l, empty ? -INFINITY : m + log2f(l)};
}

// Where a block writes query row rg from column col on: the output (bf16, natural-log lse)
// or, when the keys are split, the split's partial slot (fp32, log2 lse).
struct OutRow {
  uint16_t* out = nullptr;
  float* part = nullptr;
  float* lse_dst;
  __device__ OutRow(const Params& p, const TcArgs& a, int slot, int b, int rg, int col) {
    if (a.slots == 0) {
      out = p.out + (int64_t(b) * a.R + rg) * kLatent + col;
      const int i = rg / p.heads, hd = rg - i * p.heads;
      lse_dst = p.lse + (int64_t(b) * p.heads + hd) * p.q_len + i;
    } else {
      part = a.ws_o + (int64_t(slot) * a.R + rg) * kLatent + col;
      lse_dst = a.ws_lse + int64_t(slot) * a.R + rg;
    }
  }
  __device__ void put(int n, float v0, float v1) {
    if (out) *reinterpret_cast<uint32_t*>(out + n) = pack_bf16(v0, v1);
    else *reinterpret_cast<float2*>(part + n) = make_float2(v0, v1);
  }
  __device__ void lse(float lse2) { *lse_dst = out ? lse2 * kLn2 : lse2; }
};

// ---------------------------------------------------------------------------------------
// The block's pieces.

// Issue the cp.async of one tile row (the thread's share of it) into a swizzled buffer.
template <class C>
__device__ __forceinline__ void load_tile_row(uint32_t s_buf, const uint16_t* kv, int64_t row, int tid) {
  const int r = tid / C::TPR;
  const bool ok = row >= 0;
  const uint16_t* src = ok ? kv + row * kKeyDim : kv;
  const int bytes = ok ? 16 : 0;
  const uint32_t dst = s_buf + r * kRowBytes;
#pragma unroll
  for (int c = tid % C::TPR; c < kChunks; c += C::TPR)
    cp_async16(dst + swz(r, c) * 16, ok ? src + c * 8 : src, bytes);
}

// S = Q K^T for the warp's MTA m16 tiles and NTS n8 key tiles over all 576 dims. The
// swizzle repeats every 4 k-steps (one 128-byte group), so the addresses are 4 per-lane
// offsets plus the group; the outer loop is kept rolled to bound the registers in flight.
template <class C, int MTA>
__device__ __forceinline__ void qk_tile(float (&s)[C::MT][C::NTS][4], uint32_t sQ, uint32_t sK, int wr,
                                        int wc, int lane) {
  const int qrow = wr * C::MT * 16 + (lane & 15);
  const int qhi = lane >> 4;
  const int krow = wc * C::NTS * 8 + (lane & 7) + (C::NTS >= 2 ? ((lane >> 4) << 3) : 0);
  const int khi = (lane >> 3) & 1;
  uint32_t qoff[4], koff[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    qoff[k] = sQ + qrow * kRowBytes + (((2 * k + qhi) ^ qrow) & 7) * 16;
    koff[k] = sK + krow * kRowBytes + (((2 * k + khi) ^ krow) & 7) * 16;
  }
#pragma unroll 1
  for (int kg = 0; kg < kKSteps / 4; ++kg) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t af[MTA][4];
#pragma unroll
      for (int mt = 0; mt < MTA; ++mt) ldsm_x4(af[mt], qoff[k] + kg * 128 + mt * 16 * kRowBytes);
      uint32_t bf[C::NTS][2];
      if constexpr (C::NTS == 1) {
        ldsm_x2(bf[0], koff[k] + kg * 128);
      } else {
#pragma unroll
        for (int np = 0; np < C::NTS / 2; ++np) {
          uint32_t x[4];
          ldsm_x4(x, koff[k] + kg * 128 + np * 16 * kRowBytes);
          bf[2 * np][0] = x[0];
          bf[2 * np][1] = x[1];
          bf[2 * np + 1][0] = x[2];
          bf[2 * np + 1][1] = x[3];
        }
      }
#pragma unroll
      for (int mt = 0; mt < MTA; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt) mma_bf16(s[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
  }
}

// KSPLIT: the pair's partial S = Q K^T for the warp's MTA m16 tiles and the pair's 2 NTS n8
// key tiles (keys 2 NTS * 8 * kq ...), over the k-steps 4 kg + 2 kk + dh (half of the 36).
template <class C, int MTA>
__device__ __forceinline__ void qk_tile_half(float (&s)[C::MT][2 * C::NTS][4], uint32_t sQ, uint32_t sK,
                                             int wr, int kq, int dh, int lane) {
  const int qrow = wr * C::MT * 16 + (lane & 15);
  const int qhi = lane >> 4;
  const int krow = kq * 2 * C::NTS * 8 + (lane & 7) + ((lane >> 4) << 3);
  const int khi = (lane >> 3) & 1;
  uint32_t qoff[2], koff[2];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const int k = 2 * kk + dh;
    qoff[kk] = sQ + qrow * kRowBytes + (((2 * k + qhi) ^ qrow) & 7) * 16;
    koff[kk] = sK + krow * kRowBytes + (((2 * k + khi) ^ krow) & 7) * 16;
  }
#pragma unroll kQkUnroll
  for (int kg = 0; kg < kKSteps / 4; ++kg) {
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      uint32_t af[MTA][4];
#pragma unroll
      for (int mt = 0; mt < MTA; ++mt) ldsm_x4(af[mt], qoff[kk] + kg * 128 + mt * 16 * kRowBytes);
      uint32_t bf[2 * C::NTS][2];
#pragma unroll
      for (int np = 0; np < C::NTS; ++np) {
        uint32_t x[4];
        ldsm_x4(x, koff[kk] + kg * 128 + np * 16 * kRowBytes);
        bf[2 * np][0] = x[0];
        bf[2 * np][1] = x[1];
        bf[2 * np + 1][0] = x[2];
        bf[2 * np + 1][1] = x[3];
      }
#pragma unroll
      for (int mt = 0; mt < MTA; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2 * C::NTS; ++nt) mma_bf16(s[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
    }
  }
}

// KSPLIT: swap halves with the pair through shared memory (the slot is lane-linear, so
// conflict free), two steps on the pair's named barrier: dh 1 sends the tiles dh 0 keeps,
// then dh 0 sends the others. s ends with the warp's own NTS tiles of full scores.
template <class C>
__device__ __forceinline__ void pair_exchange(float (&sf)[C::MT][2 * C::NTS][4], float (&s)[C::MT][C::NTS][4],
                                              uint32_t slot, int bar_id, int dh, int lane) {
  constexpr int NTS = C::NTS;
  const uint32_t base = slot + lane * 16;
  auto put = [&](int half) {
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NTS; ++nt) {
        const float* v = sf[mt][half * NTS + nt];
        asm volatile("st.shared.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"r"(base + (mt * NTS + nt) * 512), "f"(v[0]),
                     "f"(v[1]), "f"(v[2]), "f"(v[3]) : "memory");
      }
  };
  auto add = [&](int half) {
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NTS; ++nt) {
        float v[4];
        asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n"
                     : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(base + (mt * NTS + nt) * 512) : "memory");
#pragma unroll
        for (int e = 0; e < 4; ++e) sf[mt][half * NTS + nt][e] += v[e];
      }
  };
  if (dh) put(0);
  named_barrier(bar_id, 64);
  if (!dh) {
    add(0);
    put(1);
  }
  named_barrier(bar_id, 64);
  if (dh) add(1);
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTS; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = dh ? sf[mt][NTS + nt][e] : sf[mt][nt][e];
}

// O += P V for the warp's MTA m16 tiles and its ON n8 column tiles, P from shared memory.
template <class C, int MTA>
__device__ __forceinline__ void pv_tile(float (&o)[C::MT][C::ON][4], uint32_t sPhi, uint32_t sV, int wr,
                                        int wc, int lane) {
  constexpr int CPR = C::N / 8;
  const int prow = wr * C::MT * 16 + (lane & 15);
  const int phi = lane >> 4;
  const int vrow = (lane & 7) + (((lane >> 3) & 1) << 3);
  const int vhi = lane >> 4;
#pragma unroll kPvUnroll
  for (int kk = 0; kk < C::N / 16; ++kk) {
    uint32_t ah[MTA][4];
#pragma unroll
    for (int mt = 0; mt < MTA; ++mt) {
      const int r = prow + mt * 16;
      const int c = 2 * kk + phi;
      ldsm_x4(ah[mt], sPhi + r * C::kPRow + pswz<CPR>(r, c) * 16);
    }
    const uint32_t vbase = sV + (16 * kk + vrow) * kRowBytes + wc * C::ON * 16;
#pragma unroll
    for (int np = 0; np < C::ON / 2; ++np) {
      uint32_t x[4];
      ldsm_x4_t(x, vbase + (np >> 2) * 128 + (((2 * (np & 3) + vhi) ^ vrow) & 7) * 16);
#pragma unroll
      for (int mt = 0; mt < MTA; ++mt) {
        mma_bf16(o[mt][2 * np], ah[mt], x[0], x[1]);
        mma_bf16(o[mt][2 * np + 1], ah[mt], x[2], x[3]);
      }
    }
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads, 1) tc_attn(Params p, TcArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sbase = smem_u32(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wr = warp / C::WC, wc = warp % C::WC;
  const int g = lane >> 2, t4 = lane & 3;
  int* info = reinterpret_cast<int*>(smem + C::kOffInfo);
  int32_t* s_parent = reinterpret_cast<int32_t*>(smem + C::kOffParent);
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + C::kOffMask);
  // Per tile parity: the tile's rows that held a non-finite value (bit k <-> key t0 + k).
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + C::kOffInfo + 32);
  float* s_max = reinterpret_cast<float*>(smem + C::kOffMax);
  const uint32_t sQ = sbase + C::kOffQ;
  const uint32_t sPhi = sbase + C::kOffPhi;

  Work wk;
  if (!block_work(p, a, C::N, info, warp, wk)) return;
  const int b = wk.b, key_lo = wk.key_lo, key_hi = wk.key_hi;
  const int R = a.R, R0 = blockIdx.x * a.group_rows;
  const int P = element_prefix(p, b);
  const int rows_valid = min(a.group_rows, R - R0);
  const int mt_act = min(max((rows_valid + 15) / 16 - wr * C::MT, 0), C::MT);
  const int i_lo = R0 / p.heads;
  const int ntok = (R0 + rows_valid - 1) / p.heads - i_lo + 1;
  const int ntiles = key_hi > key_lo ? (key_hi - key_lo + C::N - 1) / C::N : 0;
  const int mask_from = min(P, key_hi);  // keys below this need no mask
  const int32_t* parent_g = p.parent + int64_t(b) * p.q_len;

  auto tile_t0 = [&](int j) { return key_lo + (ntiles - 1 - j) * C::N; };
  auto tile_masked = [&](int j) { return tile_t0(j) + C::N > mask_from; };
  auto row_for = [&](int j) -> int64_t {
    const int t = tile_t0(j) + tid / C::TPR;
    return t < key_hi ? cache_row(p, b, t) : int64_t(-1);
  };
  auto kv_buf = [&](int s) -> uint32_t { return sbase + C::kOffKV + s * (C::N * kRowBytes); };

  // Visibility words of tile j, one per token: bit k <-> key tile_t0(j) + k.
  TreeWalk walk(tid < ntok ? i_lo + tid : -1);
  auto build_mask = [&](int j) {
    if (tid == 0) s_bad[j & 1] = 0;
    if (tid < ntok)
      s_mask[(j & 1) * kRows + tid] =
          walk.word(tile_t0(j), C::N, mask_from, P, key_hi, a.parent_cap, s_parent, parent_g);
  };

  // Prologue: parents, Q and the first tile in flight.
  for (int i = tid; i < a.parent_cap; i += kThreads) s_parent[i] = __ldg(parent_g + i);
  {
    const int r = tid >> 2;
    const bool ok = r < rows_valid;
    const uint16_t* src = ok ? p.q + (int64_t(b) * R + R0 + r) * kKeyDim : p.q;
#pragma unroll
    for (int k = 0; k < kChunks / 4; ++k) {
      const int c = (tid & 3) + 4 * k;
      cp_async16(sQ + r * kRowBytes + swz(r, c) * 16, ok ? src + c * 8 : src, ok ? 16 : 0);
    }
  }
  if (ntiles > 0) load_tile_row<C>(kv_buf(0), p.kv, row_for(0), tid);
  cp_async_commit();
  int64_t row_next = (C::STAGES == 2 && ntiles > 1) ? row_for(1) : int64_t(-1);
  __syncthreads();  // parents visible
  if (ntiles > 0 && tile_masked(0)) build_mask(0);

  const float qk_scale = p.scale * kLog2e;
  float m_run[C::MT][2], l_run[C::MT][2];
  float o[C::MT][C::ON][4];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) m_run[mt][h] = -INFINITY, l_run[mt][h] = 0.f;
#pragma unroll
    for (int n = 0; n < C::ON; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] = 0.f;
  }

  for (int j = 0; j < ntiles; ++j) {
    const int buf = C::STAGES == 2 ? (j & 1) : 0;
    cp_async_wait_all();
    __syncthreads();  // tile j landed everywhere; everyone is done with tile j - 1
    if (C::STAGES == 2 && j + 1 < ntiles) {
      load_tile_row<C>(kv_buf(buf ^ 1), p.kv, row_next, tid);
      cp_async_commit();
      if (j + 2 < ntiles) row_next = row_for(j + 2);
      if (tile_masked(j + 1)) build_mask(j + 1);
    }
    const uint32_t sK = kv_buf(buf);
    const bool masked = tile_masked(j);
    if (masked) {
      // A masked tile may hold a row that some query must not see (a sibling's tree row),
      // and P V multiplies every row of the tile, 0 * NaN included. So its non-finite values
      // are zeroed here, and a query that does attend such a row gets a NaN score below: the
      // NaN contract (docs/op.md). Only the one or two tiles at the tree rows pay for this.
      uint4* rows = reinterpret_cast<uint4*>(smem + C::kOffKV + buf * (C::N * kRowBytes));
      for (int c = tid; c < C::N * kChunks; c += kThreads) {
        uint4 v = rows[c];
        const bool bad = zero_nonfinite(v.x) | zero_nonfinite(v.y) | zero_nonfinite(v.z) | zero_nonfinite(v.w);
        if (bad) {
          rows[c] = v;
          atomicOr(reinterpret_cast<unsigned long long*>(&s_bad[j & 1]), 1ull << (c / kChunks));
        }
      }
      __syncthreads();
    }

    float s[C::MT][C::NTS][4];
    if constexpr (C::KSPLIT) {
      float sf[C::MT][2 * C::NTS][4];
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2 * C::NTS; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sf[mt][nt][e] = 0.f;
      const int kq = wc >> 1, dh = wc & 1;
      if (mt_act == C::MT) qk_tile_half<C, C::MT>(sf, sQ, sK, wr, kq, dh, lane);
      else if (C::MT > 1 && mt_act > 0) qk_tile_half<C, 1>(sf, sQ, sK, wr, kq, dh, lane);
      // The P buffer is free: every warp is past the PV of the previous tile (barrier above).
      const int pair = wr * (C::WC / 2) + kq;
      pair_exchange<C>(sf, s, sPhi + pair * (32 * C::kXchFloats * 4), 3 + pair, dh, lane);
    } else {
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
      if (mt_act == C::MT) qk_tile<C, C::MT>(s, sQ, sK, wr, wc, lane);
      else if (C::MT > 1 && mt_act > 0) qk_tile<C, 1>(s, sQ, sK, wr, wc, lane);
    }

    // Scale to log2 units, mask, row maxima of the warp's keys.
    float mx[C::MT][2];
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
      uint64_t words[2] = {~0ull, ~0ull};
      const uint64_t bad = masked ? s_bad[j & 1] : 0;
      if (masked) {  // the rows' tokens (padding rows take the last one)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = min(wr * C::MT * 16 + mt * 16 + g + 8 * h, rows_valid - 1);
          words[h] = s_mask[(j & 1) * kRows + (R0 + r) / p.heads - i_lo];
        }
      }
      mx[mt][0] = mx[mt][1] = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < C::NTS; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = wc * C::NTS * 8 + nt * 8 + 2 * t4 + (e & 1);
          float v = s[mt][nt][e] * qk_scale;
          // An attended key's non-finite score is a NaN (an inf scoring -inf must not weigh 0).
          if (!(fabsf(v) < INFINITY) || ((bad >> key) & 1)) v = __int_as_float(0x7fffffff);
          if (!((words[e >> 1] >> key) & 1)) v = -INFINITY;
          s[mt][nt][e] = v;
          mx[mt][e >> 1] = nan_max(mx[mt][e >> 1], v);
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[mt][h] = nan_max(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 1));
        mx[mt][h] = nan_max(mx[mt][h], __shfl_xor_sync(0xffffffffu, mx[mt][h], 2));
        if (t4 == 0) s_max[wc * kRows + wr * C::MT * 16 + mt * 16 + g + 8 * h] = mx[mt][h];
      }
    }
    // Maxima visible to the row group; its warps are past their reads of the pair slots.
    named_barrier(1 + wr, C::WC * 32);

    constexpr int CPR = C::N / 8;
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
      float corr[2], mu[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wr * C::MT * 16 + mt * 16 + g + 8 * h;
        float mn = m_run[mt][h];
#pragma unroll
        for (int w = 0; w < C::WC; ++w) mn = nan_max(mn, s_max[w * kRows + r]);
        mu[h] = mn == -INFINITY ? 0.f : mn;  // nothing visible yet: p = 0, no NaN; a NaN stays
        corr[h] = ex2(m_run[mt][h] - mu[h]);
        m_run[mt][h] = mn;
        l_run[mt][h] *= corr[h];
      }
#pragma unroll
      for (int n = 0; n < C::ON; ++n) {
        o[mt][n][0] *= corr[0];
        o[mt][n][1] *= corr[0];
        o[mt][n][2] *= corr[1];
        o[mt][n][3] *= corr[1];
      }
#pragma unroll
      for (int nt = 0; nt < C::NTS; ++nt) {
        const int c = wc * C::NTS + nt;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p0 = ex2(s[mt][nt][2 * h] - mu[h]);
          const float p1 = ex2(s[mt][nt][2 * h + 1] - mu[h]);
          l_run[mt][h] += p0 + p1;
          const int r = wr * C::MT * 16 + mt * 16 + g + 8 * h;
          st_shared_b32(sPhi + r * C::kPRow + pswz<CPR>(r, c) * 16 + t4 * 4, pack_bf16(p0, p1));
        }
      }
    }
    named_barrier(1 + wr, C::WC * 32);  // P of the row group visible to its warps

    if (mt_act == C::MT) pv_tile<C, C::MT>(o, sPhi, sK, wr, wc, lane);
    else if (C::MT > 1 && mt_act > 0) pv_tile<C, 1>(o, sPhi, sK, wr, wc, lane);

    if (C::STAGES == 1 && j + 1 < ntiles) {
      __syncthreads();  // everyone is done with the single buffer
      load_tile_row<C>(kv_buf(0), p.kv, row_for(j + 1), tid);
      cp_async_commit();
      if (tile_masked(j + 1)) build_mask(j + 1);
    }
  }
  cp_async_wait_all();

  // Row sums over the quad and the WC warps of the row.
  __syncthreads();  // every warp is past its last read of s_max
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (t4 == 0) s_max[wc * kRows + wr * C::MT * 16 + mt * 16 + g + 8 * h] = l;
    }
  __syncthreads();

#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wr * C::MT * 16 + mt * 16 + g + 8 * h;
      if (r >= rows_valid) continue;
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < C::WC; ++w) l += s_max[w * kRows + r];
      const RowEnd end = row_end(l, m_run[mt][h]);
      OutRow dst(p, a, wk.slot, b, R0 + r, wc * C::ON * 8 + 2 * t4);
#pragma unroll
      for (int n = 0; n < C::ON; ++n) dst.put(n * 8, o[mt][n][2 * h] * end.inv, o[mt][n][2 * h + 1] * end.inv);
      if (wc == 0 && t4 == 0) dst.lse(end.lse2);
    }
}

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
constexpr int kOffQ = 0;                        // from the 1024-aligned base
constexpr int kOffKV = kOffQ + kTileBytes;
constexpr int kOffP = kOffKV + 2 * kTileBytes;  // 64 rows x 64 keys bf16, one plane
constexpr int kOffMax = kOffP + kPlane;         // 2 x 64 floats: each warpgroup's row maxima / sums
constexpr int kOffMask = kOffMax + 2 * kRows * 4;
constexpr int kOffInfo = kOffMask + 2 * kRows * 8;
constexpr int kOffParent = kOffInfo + kInfoBytes;
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
// D[64x32] (+)= A[64x16] B[16x32], both K-major in shared memory (the scores).
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}
// D[64x256] (+)= A[64x16] (K-major) B[16x256] (N-major: V rows as stored), the output.
__device__ __forceinline__ void wgmma_n256_vt(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(accumulate));
}
#endif
}  // namespace wg

__global__ void __launch_bounds__(kThreads, 1) tc_attn_wg(Params p, TcArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wg;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (sbase - sraw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int w = warp >> 2, wq = warp & 3;  // warpgroup; warp within it (rows 16 wq ..)
  const int g = lane >> 2, t4 = lane & 3;
  int* info = reinterpret_cast<int*>(smem + kOffInfo);
  int32_t* s_parent = reinterpret_cast<int32_t*>(smem + kOffParent);
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + 32);
  float* s_max = reinterpret_cast<float*>(smem + kOffMax);
  const uint32_t sQ = sbase + kOffQ, sP = sbase + kOffP;
  auto kv_buf = [&](int s) -> uint32_t { return sbase + kOffKV + s * kTileBytes; };

  Work wk;
  if (!block_work(p, a, N, info, warp, wk)) return;
  const int b = wk.b, key_lo = wk.key_lo, key_hi = wk.key_hi;
  const int R = a.R, R0 = blockIdx.x * a.group_rows;
  const int P = element_prefix(p, b);
  const int rows_valid = min(a.group_rows, R - R0);
  const int i_lo = R0 / p.heads;
  const int ntok = (R0 + rows_valid - 1) / p.heads - i_lo + 1;
  const int ntiles = key_hi > key_lo ? (key_hi - key_lo + N - 1) / N : 0;
  const int mask_from = min(P, key_hi);
  const int32_t* parent_g = p.parent + int64_t(b) * p.q_len;
  auto tile_t0 = [&](int j) { return key_lo + (ntiles - 1 - j) * N; };
  auto tile_masked = [&](int j) { return tile_t0(j) + N > mask_from; };
  const int lr = tid >> 2;  // the row this thread loads, 18 of its 72 chunks
  auto row_for = [&](int j) -> int64_t {
    const int t = tile_t0(j) + lr;
    return t < key_hi ? cache_row(p, b, t) : int64_t(-1);
  };
  // src: the row, or for a row out of range the tensor's first row (a valid address, 0 bytes
  // read, zero filled); either way chunk c is at src + 8 c, an immediate offset.
  auto load_row = [&](uint32_t dst, int rows, const uint16_t* src, bool ok) {
    const int bytes = ok ? 16 : 0;
#pragma unroll
    for (int k = 0; k < kChunks / 4; ++k) {
      const int c = (tid & 3) + 4 * k;
      cp_async16(dst + at(rows, lr, c), src + c * 8, bytes);
    }
  };
  TreeWalk walk(tid < ntok ? i_lo + tid : -1);
  auto build_mask = [&](int j) {
    if (tid == 0) s_bad[j & 1] = 0;
    if (tid < ntok)
      s_mask[(j & 1) * kRows + tid] =
          walk.word(tile_t0(j), N, mask_from, P, key_hi, a.parent_cap, s_parent, parent_g);
  };

  for (int i = tid; i < a.parent_cap; i += kThreads) s_parent[i] = __ldg(parent_g + i);
  {
    const bool ok = lr < rows_valid;
    load_row(sQ, kRows, ok ? p.q + (int64_t(b) * R + R0 + lr) * kKeyDim : p.q, ok);
  }
  if (ntiles > 0) {
    const int64_t row = row_for(0);
    load_row(kv_buf(0), N, p.kv + (row >= 0 ? row : 0) * kKeyDim, row >= 0);
  }
  cp_async_commit();
  int64_t row_next = ntiles > 1 ? row_for(1) : int64_t(-1);
  __syncthreads();  // parents visible
  if (ntiles > 0 && tile_masked(0)) build_mask(0);

  const float qk_scale = p.scale * kLog2e;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const uint64_t dq = desc(sQ, 16, 1024), dp = desc(sP, 16, 1024);

  for (int j = 0; j < ntiles; ++j) {
    const int buf = j & 1;
    cp_async_wait_all();
    fence_smem();
    __syncthreads();  // tile j landed everywhere; everyone is done with tile j - 1
    const uint32_t sK = kv_buf(buf);
    const bool masked = tile_masked(j);
    if (masked) {  // as in tc_attn: non-finite values zeroed, their keys marked
      uint4* rows = reinterpret_cast<uint4*>(smem + kOffKV + buf * kTileBytes);
      for (int c = tid; c < N * kChunks; c += kThreads) {
        uint4 v = rows[c];
        const bool bad = zero_nonfinite(v.x) | zero_nonfinite(v.y) | zero_nonfinite(v.z) | zero_nonfinite(v.w);
        if (bad) {
          rows[c] = v;
          atomicOr(reinterpret_cast<unsigned long long*>(&s_bad[j & 1]), 1ull << ((c >> 3) & (N - 1)));
        }
      }
      fence_smem();
      __syncthreads();
    }

    // S = Q K^T: this warpgroup's 32 keys, 36 k-steps. Descriptors advance by adding the
    // offset (in 16-byte units) to the address field: no carry below 256 KB.
    const uint64_t dk = desc(sK + w * 32 * 128, 16, 1024);
    float s[16];
    fence();
#pragma unroll
    for (int kc = 0; kc < 9; ++kc)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t off = (kc * kPlane + kk * 32) >> 4;
        wgmma_n32(s, dq + off, dk + off, kc | kk);
      }
    commit();
    // The next tile's gather goes out while the tensor cores work (before QK^T, the stalls of
    // a full cp.async queue would hold the MMAs back).
    if (j + 1 < ntiles) {
      load_row(kv_buf(buf ^ 1), N, p.kv + (row_next >= 0 ? row_next : 0) * kKeyDim, row_next >= 0);
      cp_async_commit();
      if (j + 2 < ntiles) row_next = row_for(j + 2);
      if (tile_masked(j + 1)) build_mask(j + 1);
    }
    wait_all();
    pin(s);

    // Scale to log2 units, mask, row maxima (accumulator layout: s[4 i + e] is row
    // 16 wq + g + 8 (e >> 1), key 32 w + 8 i + 2 t4 + (e & 1)).
    const uint64_t bad = masked ? s_bad[j & 1] : 0;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint64_t word = ~0ull;
      if (masked) {
        const int r = min(16 * wq + g + 8 * h, rows_valid - 1);
        word = s_mask[(j & 1) * kRows + (R0 + r) / p.heads - i_lo];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = s[4 * i + 2 * h + e] * qk_scale;
          if (!(fabsf(v) < INFINITY)) v = __int_as_float(0x7fffffff);
          if (masked) {  // the one or two tiles at the tree rows
            const int key = 32 * w + 8 * i + 2 * t4 + e;
            if ((bad >> key) & 1) v = __int_as_float(0x7fffffff);
            if (!((word >> key) & 1)) v = -INFINITY;
          }
          s[4 * i + 2 * h + e] = v;
          mx[h] = nan_max(mx[h], v);
        }
      mx[h] = nan_max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = nan_max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (t4 == 0) s_max[w * kRows + 16 * wq + g + 8 * h] = mx[h];
    }
    __syncthreads();  // both warpgroups' maxima visible

    float corr[2], mu[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wq + g + 8 * h;
      const float mn = nan_max(m_run[h], nan_max(s_max[r], s_max[kRows + r]));
      mu[h] = mn == -INFINITY ? 0.f : mn;
      corr[h] = ex2(m_run[h] - mu[h]);
      m_run[h] = mn;
      l_run[h] *= corr[h];
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {  // the maxima settle early
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= corr[(i >> 1) & 1];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = ex2(s[4 * i + 2 * h] - mu[h]);
        const float p1 = ex2(s[4 * i + 2 * h + 1] - mu[h]);
        l_run[h] += p0 + p1;
        const int r = 16 * wq + g + 8 * h;
        st_shared_b32(sP + r * 128 + ((((4 * w + i) ^ r) & 7) << 4) + t4 * 4, pack_bf16(p0, p1));
      }
    fence_smem();
    __syncthreads();  // P visible to both warpgroups

    // O += P V: this warpgroup's 256 columns (planes 4 w .. 4 w + 3), 4 k-steps of 16 keys.
    const uint64_t dv = desc(sK + 4 * w * kPlane, kPlane, 1024);
    fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_n256_vt(o, dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4), 1);
    commit();
    wait_all();
    pin(o);
  }
  cp_async_wait_all();

  // Row sums over the quad and the two warpgroups.
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t4 == 0) s_max[w * kRows + 16 * wq + g + 8 * h] = l;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * wq + g + 8 * h;
    if (r >= rows_valid) continue;
    const RowEnd end = row_end(s_max[r] + s_max[kRows + r], m_run[h]);
    const int rg = R0 + r;
    OutRow dst(p, a, wk.slot, b, rg, 256 * w + 2 * t4);
#pragma unroll
    for (int i = 0; i < 32; ++i) dst.put(8 * i, o[4 * i + 2 * h] * end.inv, o[4 * i + 2 * h + 1] * end.inv);
    if (w == 0 && t4 == 0) dst.lse(end.lse2);
  }
#else
  __trap();  // launched only where the library holds sm_90a code (plan_tc checks the device)
#endif
}

// One warp per output row: the element's splits weighted by 2^(lse_s - max).
__global__ void __launch_bounds__(kMergeWarps * 32) tc_merge(Params p, TcArgs a) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kMergeWarps + (threadIdx.x >> 5);
  const int b = blockIdx.y;
  if (r >= a.R) return;
  const int2 meta = a.meta[b];
  const int first = meta.x, n = meta.y;
  const float* lse_col = a.ws_lse + r;
  float m = -INFINITY;
  for (int s = lane; s < n; s += 32) m = nan_max(m, lse_col[int64_t(first + s) * a.R]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  if (m != -INFINITY) {
    for (int s = 0; s < n; ++s) {
      const float w = ex2(lse_col[int64_t(first + s) * a.R] - m);
      if (w == 0.f) continue;  // an empty split (uniform over the warp); NaN goes on
      wsum += w;
      const float4* src = reinterpret_cast<const float4*>(a.ws_o + (int64_t(first + s) * a.R + r) * kLatent);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 v = src[lane + 32 * k];
        acc[k].x = fmaf(w, v.x, acc[k].x);
        acc[k].y = fmaf(w, v.y, acc[k].y);
        acc[k].z = fmaf(w, v.z, acc[k].z);
        acc[k].w = fmaf(w, v.w, acc[k].w);
      }
    }
  }
  const float inv = wsum == 0.f ? 0.f : 1.f / wsum;
  uint16_t* dst = p.out + (int64_t(b) * a.R + r) * kLatent;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint2 v;
    v.x = pack_bf16(acc[k].x * inv, acc[k].y * inv);
    v.y = pack_bf16(acc[k].z * inv, acc[k].w * inv);
    reinterpret_cast<uint2*>(dst)[lane + 32 * k] = v;
  }
  if (lane == 0) {
    const int i = r / p.heads, hd = r - i * p.heads;
    p.lse[(int64_t(b) * p.heads + hd) * p.q_len + i] = wsum == 0.f ? -INFINITY : (m + log2f(wsum)) * kLn2;
  }
}

// ---------------------------------------------------------------------------------------
// Host side.

int64_t align16(int64_t x) { return (x + 15) / 16 * 16; }

struct Layout {  // the plan's derived values, recomputed identically by plan and launch
  int R, groups, group_rows, slots;
  int64_t ws_o_bytes, ws_lse_bytes, meta_bytes;
};

Layout layout_of(const Params& p, const Plan& plan) {
  Layout l;
  l.R = p.heads * p.q_len;
  l.groups = (l.R + kRows - 1) / kRows;
  l.group_rows = ((l.R + l.groups - 1) / l.groups + 15) / 16 * 16;
  l.slots = plan.num_splits > 1 ? plan.num_splits * p.batch : 0;
  l.ws_o_bytes = align16(int64_t(l.slots) * l.R * kLatent * 4);
  l.ws_lse_bytes = align16(int64_t(l.slots) * l.R * 4);
  l.meta_bytes = l.slots ? align16(int64_t(p.batch) * 8) : 0;
  return l;
}

// tc's paths (Plan::path; verify_attn/registry.py names them): mma.sync runs from sm_80 up,
// wgmma on compute capability 9.0 alone, where the build compiles sm_90a.
constexpr int kPathMma = 0;
constexpr int kPathWgmma = 1;

bool has_wgmma(int dev) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

// off_parent: where the kernel's staged parents start (the rest of plan.smem_bytes holds them).
template <void (*Kernel)(Params, TcArgs)>
int launch_kernel(int off_parent, const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  // Opt in to the dynamic shared memory once per device (legal during graph capture).
  static int set_bytes[64] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return int(err);
  if (dev < 0 || dev >= 64 || set_bytes[dev] < plan.smem_bytes) {
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem_bytes);
    if (err != cudaSuccess) return int(err);
    if (dev >= 0 && dev < 64) set_bytes[dev] = plan.smem_bytes;
  }
  const Layout l = layout_of(p, plan);
  TcArgs a;
  a.R = l.R;
  a.group_rows = l.group_rows;
  a.slots = l.slots;
  a.parent_cap = (plan.smem_bytes - off_parent) / 4;
  char* ws = static_cast<char*>(workspace);
  a.ws_o = l.slots ? reinterpret_cast<float*>(ws) : nullptr;
  a.ws_lse = l.slots ? reinterpret_cast<float*>(ws + l.ws_o_bytes) : nullptr;
  a.meta = l.slots ? reinterpret_cast<int2*>(ws + l.ws_o_bytes + l.ws_lse_bytes) : nullptr;
  const dim3 grid(l.groups, l.slots ? l.slots : p.batch);
  Kernel<<<grid, kThreads, plan.smem_bytes, stream>>>(p, a);
  if (l.slots) {
    const dim3 mgrid((l.R + kMergeWarps - 1) / kMergeWarps, p.batch);
    tc_merge<<<mgrid, kMergeWarps * 32, 0, stream>>>(p, a);
  }
  return int(cudaGetLastError());
}

}  // namespace

Plan plan_tc(const Params& p, int num_sms, int path) {
  Plan plan;
  if (p.batch <= 0 || p.heads <= 0 || p.q_len <= 0) return plan;
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    optin = 48 * 1024;
  const bool wgmma = has_wgmma(dev) && optin >= wg::kBaseBytes;
  if (path == kAnyPath) path = wgmma ? kPathWgmma : kPathMma;
  if ((path == kPathWgmma && !wgmma) || (path != kPathWgmma && path != kPathMma)) return plan;  // not here
  plan.path = path;
  int base = 0, n = 0;
  if (path == kPathWgmma) base = wg::kBaseBytes, n = wg::N;
  else if (optin >= CfgLarge::kOffParent) base = CfgLarge::kOffParent, n = CfgLarge::N;
  else if (optin >= CfgMid::kOffParent) base = CfgMid::kOffParent, n = CfgMid::N;
  else if (optin >= CfgSmall::kOffParent) base = CfgSmall::kOffParent, n = CfgSmall::N;
  else return plan;  // no configuration fits: blocks = 0, launch refuses
  const int parent_cap = min(p.q_len, (optin - base) / 4);
  plan.threads = kThreads;
  plan.keys_per_tile = n;
  plan.smem_bytes = base + 4 * parent_cap;

  const int R = p.heads * p.q_len;
  const int groups = (R + kRows - 1) / kRows;
  plan.rows_per_block = ((R + groups - 1) / groups + 15) / 16 * 16;
  // One element: split until the (m-group, split) blocks fill the SMs once (one block an SM).
  // Several: the prefixes are ragged (the plan cannot read them), and a block that holds a
  // whole long element while the short ones are done sets the time (measured: 4.9 ms for a
  // batch of 8, heads 16, q_len 33, prefixes 1K-64K, with one split an element). So deal
  // about four waves of slots, which the kernel hands out in proportion to each element's work.
  const int64_t base_blocks = int64_t(p.batch) * groups;
  const int waves = p.batch > 1 ? 4 : 1;
  int splits = 1;
  if (base_blocks < int64_t(waves) * num_sms) {
    const int max_tiles = (p.kv_cols + n - 1) / n;
    splits = int((int64_t(waves) * num_sms + base_blocks - 1) / base_blocks);
    if (p.batch == 1) splits = int(num_sms / base_blocks);
    splits = min(splits, max(1, max_tiles / 2));
    splits = min(splits, kMaxSplits);
  }
  plan.num_splits = splits;
  const int len = (p.kv_cols + splits - 1) / splits;  // nominal: splits are dealt out by work
  plan.split_len = (len + n - 1) / n * n;
  plan.blocks = int(base_blocks * splits);
  const Layout l = layout_of(p, plan);
  plan.workspace_bytes = l.ws_o_bytes + l.ws_lse_bytes + l.meta_bytes;
  return plan;
}

int launch_tc(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  if (p.batch <= 0 || p.heads <= 0 || p.q_len <= 0) return int(cudaSuccess);
  if (plan.num_splits > 1 && workspace == nullptr) return int(cudaErrorInvalidValue);
  if (plan.path == kPathWgmma) return launch_kernel<tc_attn_wg>(wg::kBaseBytes, p, plan, workspace, stream);
  switch (plan.keys_per_tile) {
    case CfgLarge::N: return launch_kernel<tc_attn<CfgLarge>>(CfgLarge::kOffParent, p, plan, workspace, stream);
    case CfgMid::N: return launch_kernel<tc_attn<CfgMid>>(CfgMid::kOffParent, p, plan, workspace, stream);
    case CfgSmall::N: return launch_kernel<tc_attn<CfgSmall>>(CfgSmall::kOffParent, p, plan, workspace, stream);
    default: return int(cudaErrorInvalidConfiguration);
  }
}

}  // namespace verify_attn
