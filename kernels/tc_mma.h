// tc's portable path: mma.sync m16n8k16 from sm_80 up, its tile configurations and pieces
// (the kernel: tc_mma.cu; the block and tile: tc.h).
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

// One k-step of S += Q K^T: A of MTA m16 tiles from qa (16 rows apart), B of NT n8 key tiles
// from ka (one: ldmatrix x2; pairs of two: x4, 16 rows apart), into s[mt][0 .. NT - 1].
template <int MTA, int NT, int MT, int NS>
__device__ __forceinline__ void qk_step(float (&s)[MT][NS][4], uint32_t qa, uint32_t ka) {
  uint32_t af[MTA][4];
#pragma unroll
  for (int mt = 0; mt < MTA; ++mt) ldsm_x4(af[mt], qa + mt * 16 * kRowBytes);
  uint32_t bf[NT][2];
  if constexpr (NT == 1) {
    ldsm_x2(bf[0], ka);
  } else {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t x[4];
      ldsm_x4(x, ka + np * 16 * kRowBytes);
      bf[2 * np][0] = x[0];
      bf[2 * np][1] = x[1];
      bf[2 * np + 1][0] = x[2];
      bf[2 * np + 1][1] = x[3];
    }
  }
#pragma unroll
  for (int mt = 0; mt < MTA; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_bf16(s[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
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
    for (int k = 0; k < 4; ++k) qk_step<MTA, C::NTS>(s, qoff[k] + kg * 128, koff[k] + kg * 128);
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
    for (int kk = 0; kk < 2; ++kk) qk_step<MTA, 2 * C::NTS>(s, qoff[kk] + kg * 128, koff[kk] + kg * 128);
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

}  // namespace
}  // namespace verify_attn
