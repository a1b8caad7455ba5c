// tc's portable path: the mma.sync kernel tc_attn<Config> (sm_80 and later), its three tile
// configurations and their launch (the pieces and configurations: tc_mma.h).
#include "tc_host.h"
#include "tc_mma.h"

namespace verify_attn {
namespace {

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

    // Scale to log2 units, mask, row maxima of the warp's keys. An unmasked tile (all but the
    // one or two at the tree rows) hides no key and has no cleaned row, so its scores skip
    // both tests (per score an fma and a max after the scale, not the two 64-bit bit tests,
    // their selects and the finite test): the same values, in the stretch between two block
    // barriers where the tensor cores idle.
    float mx[C::MT][2];
    if (!masked) {
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            // An attended key's non-finite score is a NaN (an inf scoring -inf must not weigh 0).
            const float v = nan_unless_finite(s[mt][nt][e] * qk_scale);
            s[mt][nt][e] = v;
            // Score e is row e >> 1's: a row's first score (e 0 or 2 of nt 0) starts its
            // maximum, as max(-inf, v) would.
            mx[mt][e >> 1] = nt == 0 && (e & 1) == 0 ? v : nan_max(mx[mt][e >> 1], v);
          }
    } else {
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt) {
        uint64_t words[2];
        const uint64_t bad = s_bad[j & 1];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // the rows' tokens (padding rows take the last one)
          const int r = min(wr * C::MT * 16 + mt * 16 + g + 8 * h, rows_valid - 1);
          words[h] = s_mask[(j & 1) * kRows + (R0 + r) / p.heads - i_lo];
        }
        mx[mt][0] = mx[mt][1] = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < C::NTS; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = wc * C::NTS * 8 + nt * 8 + 2 * t4 + (e & 1);
            float v = s[mt][nt][e] * qk_scale;
            // non-finite or a cleaned row: a NaN; a key the row must not see: -inf
            if (!(fabsf(v) < INFINITY) || ((bad >> key) & 1)) v = __int_as_float(0x7fffffff);
            if (!((words[e >> 1] >> key) & 1)) v = -INFINITY;
            s[mt][nt][e] = v;
            mx[mt][e >> 1] = nan_max(mx[mt][e >> 1], v);
          }
      }
    }
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
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

int tc_launch_mma(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  switch (plan.keys_per_tile) {
    case CfgLarge::N: return launch_kernel<tc_attn<CfgLarge>>(CfgLarge::kOffParent, p, plan, workspace, stream);
    case CfgMid::N: return launch_kernel<tc_attn<CfgMid>>(CfgMid::kOffParent, p, plan, workspace, stream);
    case CfgSmall::N: return launch_kernel<tc_attn<CfgSmall>>(CfgSmall::kOffParent, p, plan, workspace, stream);
    default: return int(cudaErrorInvalidConfiguration);
  }
}

}  // namespace verify_attn
