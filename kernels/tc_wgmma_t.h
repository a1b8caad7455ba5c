// tc's sm_90a path for few query rows: the MMAs transposed (keys on wgmma's M), compiled to a
// trap elsewhere.
#pragma once
#include "tc_wgmma.h"

namespace verify_attn {
namespace {

// ---------------------------------------------------------------------------------------
// Why: wgmma's M is 64, so tc_attn_wg pads a group to 64 query rows; with few rows (heads 8
// or 16, short trees: 72 or 144 rows an element) a quarter to a half of every MMA is padding.
// Here the keys take M and the query rows N, which steps by 8:
//   S^T = K Q^T      A = the 64-key tile (K-major), B = Q (K-major)
//   O^T += V^T P^T   A = V^T, the same tile's latent planes read MN-major (transposed),
//                    B = P^T (K-major: a row of 64 keys a query row)
// A group holds NR = 2 NW <= 64 query rows (token-major, as the other paths): at most 64
// because the shared memory holds Q for 64 rows beside two 64-key stages (below). 72 rows
// become 2 x 48 (tc_attn_wg: 2 x 64), 144 rows 3 x 48 (3 x 64).
//
// Warps: two warpgroups, as tc_attn_wg. Warpgroup w computes S^T for all 64 keys of the tile
// and its NW query rows (columns w NW ..) over the 576 dims, takes those columns' softmax,
// writes their P^T; then O^T for its 256 latent dims (4 M-blocks of 64, planes 4 w ..
// 4 w + 3) and all NR columns: 4 NR/2 = 2 NR fp32 a thread (128 at NR = 64), no spills.
// A column's maximum runs over keys spread over the lanes (lane >> 2, 3 shuffles) and the 4
// warps of its warpgroup (shared memory); each column's rescale factor goes through shared
// memory to the other warpgroup, whose O^T holds that column too.
// Barriers a tile: 3 __syncthreads (tile landed / previous tile done; column maxima posted
// and every S^T read of the tile done; P^T and the factors visible), a 4th on the one or two
// tiles at the tree rows (the non-finite clean-up). The second is a full barrier because
// P^T is written over the tile's rope plane (dims 512..575), which only S^T reads.
//
// Shared memory (from the 1024-aligned base; 1024 bytes of slack for the alignment):
//   Q     73,728  9 planes x 64 rows x 128 B (only NR rows used)
//   KV   147,456  2 stages x 9 planes x 64 keys x 128 B; P^T lives in the rope plane of the
//                 tile being computed; at the end the output is staged over both stages
//   red    1,024  [2 warpgroups][4 warps][32 columns] maxima, at the end the row sums
//   corr/inv/lse 768  [64] each
//   mask   1,024  [2 parities][64 tokens] visibility words; BlockInfo 64
//   = 224,064 + 1,024 slack = 225,088 B; the staged parents take what is left of 232,448.
//
// The rest is tc_attn_wg's (wg::Tiles): the splits, the cp.async gather of tile j + 1 during
// tile j, the tree mask of the tail tiles, non-finite cache values zeroed on those tiles and
// their keys NaN for every row that sees them, non-finite scores NaN, a row with no visible
// key O = 0 and lse = -inf, P rounded to bf16, row sums from the unrounded probabilities.
namespace wgt {
constexpr int N = wg::N;             // 64 keys a tile: wgmma's M
constexpr int kStage = kLatent + 4;  // floats a staged output row: 516 keeps the stores conflict free
struct Smem {
  uint8_t q[wg::kTileBytes];      // the group's query rows, 9 planes of 64 rows
  uint8_t kv[2][wg::kTileBytes];  // cache tiles, 9 planes each
  float red[2][4][32];            // per warpgroup and warp: column maxima of its 16 keys; at the end row sums
  float corr[kRows];              // this tile's rescale factor of each column, from its warpgroup
  float inv[kRows];               // at the end: 1 / row sum of each column
  float lse[kRows];               // at the end: log2 lse of each column
  uint64_t mask[2][kRows];        // per tile parity: visibility word of each token
  BlockInfo info;
};
constexpr int kOffQ = offsetof(Smem, q);
constexpr int kOffKV = offsetof(Smem, kv);
constexpr int kOffRed = offsetof(Smem, red);
constexpr int kOffCorr = offsetof(Smem, corr);
constexpr int kOffInv = offsetof(Smem, inv);
constexpr int kOffLse = offsetof(Smem, lse);
constexpr int kOffParent = sizeof(Smem);
constexpr int kBaseBytes = wg::kSlack + kOffParent;
static_assert(kOffQ == wg::kOffQ && kOffKV == wg::kOffKV, "the planes where wg::Tiles puts them");
static_assert(kOffKV % 1024 == 0 && wg::kTileBytes % 1024 == 0, "wgmma's 128-byte swizzle: 1024-byte aligned planes");
static_assert(kRows * kStage * 4 <= int(sizeof(Smem::kv)), "the output staging fits over the KV stages");
static_assert(kBaseBytes == 225088 && kBaseBytes <= 232448, "the sm_90 opt-in limit (the comment above)");
}  // namespace wgt

// NW: the query rows (S^T columns) a warpgroup; the group holds NR = 2 NW.
template <int NW>
__global__ void __launch_bounds__(kThreads, 1) tc_attn_wgt(Params p, TcArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wg;
  constexpr int NR = 2 * NW;  // O^T's wgmma N
  constexpr int CS = NW / 4;  // S^T columns a thread holds (of its warpgroup's NW)
  constexpr int CO = NR / 4;  // O^T columns a thread holds (of the group's NR)
  static_assert(NW % 8 == 0 && NR <= kRows, "wgmma N: a multiple of 8; 64 rows of Q planes");
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (sbase - sraw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int w = warp >> 2, wq = warp & 3;  // warpgroup; warp within it (keys 16 wq .. of S^T)
  const int g = lane >> 2, t4 = lane & 3;
  float* s_red = reinterpret_cast<float*>(smem + wgt::kOffRed);
  float* s_corr = reinterpret_cast<float*>(smem + wgt::kOffCorr);
  float* s_inv = reinterpret_cast<float*>(smem + wgt::kOffInv);
  float* s_lse = reinterpret_cast<float*>(smem + wgt::kOffLse);

  Tiles<wgt::Smem> t(p, a, smem, sbase, tid);
  if (!t.begin(warp)) return;
  const int R0 = t.R0, rows_valid = t.rows_valid, i_lo = t.i_lo, ntiles = t.ntiles;
  t.start();

  const float qk_scale = p.scale * kLog2e;
  // S^T and O^T fragments (Mma: d[4 i + 2 h + e] is row 16 wq + g + 8 h, column 8 i + 2 t4 + e):
  // S^T row = key, column = this warpgroup's query row w NW + c; O^T row = latent dim
  // 256 w + 64 mb + .., column = the group's query row. Column slot ci = 2 i + e.
  float m_run[CS], l_run[CS];  // per S^T column: running maximum (log2 units), this thread's part of the sum
#pragma unroll
  for (int ci = 0; ci < CS; ++ci) m_run[ci] = -INFINITY, l_run[ci] = 0.f;
  float o[4][NR / 2];
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int i = 0; i < NR / 2; ++i) o[mb][i] = 0.f;
  // B of S^T: this warpgroup's NW rows of the Q planes (w NW 128 bytes in: a multiple of
  // 1024, so the swizzle phase is the planes').
  const uint64_t dq = desc(sbase + wgt::kOffQ + w * NW * 128, 16, 1024);

  for (int j = 0; j < ntiles; ++j) {
    const int buf = j & 1;
    cp_async_wait_all();
    fence_smem();
    __syncthreads();  // (1) tile j landed everywhere; everyone is done with tile j - 1
    const uint32_t sK = t.kv_buf(buf);
    const bool masked = t.tile_masked(j);
    if (masked) t.clean(j);

    // S^T = K Q^T: 64 keys x NW rows, 36 k-steps, both operands K-major (transpose bits 0),
    // SBO 1024 (8-row groups), a k-step 32 bytes into the 128-byte rows of a plane, the
    // layout tc_attn_wg's S = Q K^T reads.
    const uint64_t dk = desc(sK, 16, 1024);
    float s[NW / 2];
    fence();
#pragma unroll
    for (int kc = 0; kc < 9; ++kc)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t off = (kc * kPlane + kk * 32) >> 4;
        Mma<NW>::template run<0, 0>(s, dk + off, dq + off, kc | kk);
      }
    commit();
    t.next(j);  // tile j + 1's gather goes out while the tensor cores work
    wait_all();
    pin(s);

    // Scale to log2 units, mask, column maxima over this warp's 16 keys.
    const uint64_t bad = masked ? t.s_bad[j & 1] : 0;
#pragma unroll
    for (int i = 0; i < NW / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = 8 * i + 2 * t4 + e;
        uint64_t word = ~0ull;
        if (masked) {
          const int r = min(w * NW + c, rows_valid - 1);
          word = t.s_mask[(j & 1) * kRows + (R0 + r) / p.heads - i_lo];
        }
        float mx = -INFINITY;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v = s[4 * i + 2 * h + e] * qk_scale;
          if (!(fabsf(v) < INFINITY)) v = __int_as_float(0x7fffffff);
          if (masked) {  // the one or two tiles at the tree rows
            const int key = 16 * wq + g + 8 * h;
            if ((bad >> key) & 1) v = __int_as_float(0x7fffffff);
            if (!((word >> key) & 1)) v = -INFINITY;
          }
          s[4 * i + 2 * h + e] = v;
          mx = nan_max(mx, v);
        }
        mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        if (g == 0) s_red[(4 * w + wq) * 32 + c] = mx;
      }
    __syncthreads();  // (2) maxima posted; every S^T of tile j done (its rope plane is free)

    // New maxima, rescale factors (posted for the other warpgroup's O^T), P^T.
    float mu[CS];
#pragma unroll
    for (int ci = 0; ci < CS; ++ci) {
      const int c = 8 * (ci >> 1) + 2 * t4 + (ci & 1);
      const float* r = s_red + 4 * w * 32 + c;
      const float mn = nan_max(m_run[ci], nan_max(nan_max(r[0], r[32]), nan_max(r[64], r[96])));
      mu[ci] = mn == -INFINITY ? 0.f : mn;
      const float corr = ex2(m_run[ci] - mu[ci]);
      m_run[ci] = mn;
      l_run[ci] *= corr;
      if (wq == 0 && g == 0) s_corr[w * NW + c] = corr;
    }
    // P^T[n][key] (bf16, K-major, 128 bytes a query row, chunk x of row n at x ^ (n & 7)):
    // a thread holds keys k and k + 8 for columns (n, n + 1); lanes g and g ^ 1 (lane ^ 4) swap
    // so that the even lane stores (n; k, k + 1) and the odd one (n + 1; k - 1, k), 32 bits each.
    const uint32_t sPT = sK + 8 * kPlane;
    const bool odd = g & 1;
#pragma unroll
    for (int i = 0; i < NW / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = ex2(s[4 * i + 2 * h] - mu[2 * i]);
        const float p1 = ex2(s[4 * i + 2 * h + 1] - mu[2 * i + 1]);
        l_run[2 * i] += p0;
        l_run[2 * i + 1] += p1;
        const float y = __shfl_xor_sync(0xffffffffu, odd ? p0 : p1, 4);
        const int kp = (16 * wq + g + 8 * h) & ~1;
        const int n = w * NW + 8 * i + 2 * t4 + odd;
        st_shared_b32(sPT + n * 128 + ((((kp >> 3) ^ n) & 7) << 4) + ((kp & 7) << 1),
                      odd ? pack_bf16(y, p1) : pack_bf16(p0, y));
      }
    fence_smem();
    __syncthreads();  // (3) P^T and the factors visible to both warpgroups

    float cr[CO];
    bool change = false;
#pragma unroll
    for (int co = 0; co < CO; ++co) {
      cr[co] = s_corr[8 * (co >> 1) + 2 * t4 + (co & 1)];
      change |= cr[co] != 1.f;
    }
    if (__any_sync(0xffffffffu, change)) {  // the maxima settle early
#pragma unroll
      for (int mb = 0; mb < 4; ++mb)
#pragma unroll
        for (int i = 0; i < NR / 2; ++i) o[mb][i] *= cr[2 * (i >> 2) + (i & 1)];
    }
    // O^T += V^T P^T: A = plane 4 w + mb read MN-major (transpose bit 1: 64 dims contiguous
    // in a key's 128-byte row, 8-key groups at SBO 1024, a k-step of 16 keys 2,048 bytes on;
    // LBO, the stride to the next 64 dims, is unused at M = 64), B = P^T K-major.
    const uint64_t dv = desc(sK + 4 * w * kPlane, kPlane, 1024), dpt = desc(sPT, 16, 1024);
    fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int mb = 0; mb < 4; ++mb)
        Mma<NR>::template run<1, 0>(o[mb], dv + ((mb * kPlane + kk * 16 * 128) >> 4), dpt + ((kk * 32) >> 4), 1);
    commit();
    wait_all();
#pragma unroll
    for (int mb = 0; mb < 4; ++mb) pin(o[mb]);
  }
  cp_async_wait_all();

  // Column sums over the lanes and the 4 warps of the owning warpgroup.
#pragma unroll
  for (int ci = 0; ci < CS; ++ci) {
    float l = l_run[ci];
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    if (g == 0) s_red[(4 * w + wq) * 32 + 8 * (ci >> 1) + 2 * t4 + (ci & 1)] = l;
  }
  __syncthreads();  // sums posted; every MMA and gather done (the KV stages are free)
  if (wq == 0 && g == 0) {
#pragma unroll
    for (int ci = 0; ci < CS; ++ci) {
      const int c = 8 * (ci >> 1) + 2 * t4 + (ci & 1);
      const float* r = s_red + 4 * w * 32 + c;
      const RowEnd end = row_end(r[0] + r[32] + r[64] + r[96], m_run[ci]);
      s_inv[w * NW + c] = end.inv;
      s_lse[w * NW + c] = end.lse2;
    }
  }
  // O^T staged as rows of O (fp32, kStage floats a row) so that the stores below are rows.
  float* s_o = reinterpret_cast<float*>(smem + wgt::kOffKV);
#pragma unroll
  for (int mb = 0; mb < 4; ++mb)
#pragma unroll
    for (int i = 0; i < NR / 2; ++i)
      s_o[(8 * (i >> 2) + 2 * t4 + (i & 1)) * wgt::kStage + 256 * w + 64 * mb + 16 * wq + g + 8 * ((i >> 1) & 1)] = o[mb][i];
  __syncthreads();
  for (int n = warp; n < rows_valid; n += kWarps) {
    OutRow dst(p, a, t.wk.slot, t.wk.b, R0 + n, 0);
    const float inv = s_inv[n];
#pragma unroll
    for (int k = 0; k < kLatent / 64; ++k) {
      const int col = 64 * k + 2 * lane;
      const float2 v = *reinterpret_cast<const float2*>(s_o + n * wgt::kStage + col);
      dst.put(col, v.x * inv, v.y * inv);
    }
    if (lane == 0) dst.lse(s_lse[n]);
  }
#else
  __trap();  // launched only where the library holds sm_90a code (plan_tc checks the device)
#endif
}

}  // namespace
}  // namespace verify_attn
