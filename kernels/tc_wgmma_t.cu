// tc's transposed sm_90a path: the kernel tc_attn_wgt<NW> for each group size and its launch
// (the design and layout: tc_wgmma_t.h); compiled to a trap elsewhere.
#include "tc_host.h"
#include "tc_wgmma_t.h"

namespace verify_attn {
namespace {

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
  uint32_t sbase;
  uint8_t* smem = smem_aligned(smem_raw, sbase);
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
    float s[NW / 2];
    issue_qk<NW>(s, desc(sK, 16, 1024), dq);
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
          float v = nan_unless_finite(s[4 * i + 2 * h + e] * qk_scale);
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

int tc_launch_wgmma_t(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  switch (plan.rows_per_block) {  // the group's rows, 2 x a warpgroup's
    case 16: return launch_kernel<tc_attn_wgt<8>>(wgt::kBaseBytes, p, plan, workspace, stream);
    case 32: return launch_kernel<tc_attn_wgt<16>>(wgt::kBaseBytes, p, plan, workspace, stream);
    case 48: return launch_kernel<tc_attn_wgt<24>>(wgt::kBaseBytes, p, plan, workspace, stream);
    case 64: return launch_kernel<tc_attn_wgt<32>>(wgt::kBaseBytes, p, plan, workspace, stream);
    default: return int(cudaErrorInvalidConfiguration);
  }
}

}  // namespace verify_attn
