// tc's portable path: mma.sync m16n8k16 from sm_80 up (the block and tile: tc.h).
#pragma once
#include "tc.h"

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
  // Shared memory; the staged parents follow it (plan_tc sizes them from what is left).
  struct Smem {
    uint8_t q[kRows][kRowBytes];       // the block's query rows, swizzled
    uint8_t kv[STAGES][N][kRowBytes];  // cache tiles, swizzled
    uint8_t p[kRows][kPRow];           // P (bf16, swizzled); with KSPLIT first the pair exchange
    float max[WC][kRows];              // each warp column's row maxima, at the end the row sums
    uint64_t mask[2][kRows];           // per tile parity: visibility word of each token
    BlockInfo info;
  };
  // Byte offsets for the 32-bit shared addresses of ldmatrix, cp.async and st.shared.
  static constexpr int kOffQ = offsetof(Smem, q);
  static constexpr int kOffKV = offsetof(Smem, kv);
  static constexpr int kOffPhi = offsetof(Smem, p);
  static constexpr int kOffMax = offsetof(Smem, max);
  static constexpr int kOffMask = offsetof(Smem, mask);
  static constexpr int kOffInfo = offsetof(Smem, info);
  static constexpr int kOffParent = sizeof(Smem);
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


// 16-byte chunk c of a swizzled 576-wide row r.
__device__ __forceinline__ int swz(int r, int c) { return (c & ~7) | ((c ^ r) & 7); }
// Chunk c of a P row r, rows of CPR chunks (CPR = 8: c ^ (r & 7); fewer: rows share a line).
template <int CPR>
__device__ __forceinline__ int pswz(int r, int c) { return c ^ ((r / (8 / CPR)) & (CPR - 1)); }

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
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + C::kOffInfo + offsetof(BlockInfo, bad));
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

}  // namespace
}  // namespace verify_attn
