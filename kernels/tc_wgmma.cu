// tc's sm_90a wgmma path: the kernel tc_attn_wg and its launch (the layout and the pieces
// shared with the other sm_90a kernels: tc_wgmma.h); compiled to a trap elsewhere.
#include "tc_host.h"
#include "tc_wgmma_rows.h"

namespace verify_attn {
namespace {

__global__ void __launch_bounds__(kThreads, 1) tc_attn_wg(Params p, TcArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wg;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint32_t sbase;
  uint8_t* smem = smem_aligned(smem_raw, sbase);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int w = warp >> 2, wq = warp & 3;  // warpgroup; warp within it (rows 16 wq ..)
  const int g = lane >> 2, t4 = lane & 3;
  float* s_max = reinterpret_cast<float*>(smem + kOffMax);
  const uint32_t sQ = sbase + kOffQ, sP = sbase + kOffP;

  Tiles<Smem> t(p, a, smem, sbase, tid);
  if (!t.begin(warp)) return;
  const int R0 = t.R0, rows_valid = t.rows_valid, i_lo = t.i_lo, ntiles = t.ntiles;
  uint64_t* s_mask = t.s_mask;
  uint64_t* s_bad = t.s_bad;
  t.start();

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
    const uint32_t sK = t.kv_buf(buf);
    const bool masked = t.tile_masked(j);
    if (masked) t.clean(j);

    // S = Q K^T: this warpgroup's 32 keys.
    float s[16];
    issue_qk<32>(s, dq, desc(sK + w * 32 * 128, 16, 1024));
    // The next tile's gather goes out while the tensor cores work (before QK^T, the stalls of
    // a full cp.async queue would hold the MMAs back).
    t.next(j);
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
      mx[h] = quad_max(scale_row(s, h, qk_scale, masked, word, bad, 32 * w, t4));
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
    rescale(o, corr);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t pp = exp_pair(s, i, h, mu[h], l_run[h]);
        const int r = 16 * wq + g + 8 * h;
        st_shared_b32(sP + r * 128 + ((((4 * w + i) ^ r) & 7) << 4) + t4 * 4, pp);
      }
    fence_smem();
    __syncthreads();  // P visible to both warpgroups

    // O += P V: this warpgroup's 256 columns (planes 4 w .. 4 w + 3), 4 k-steps of 16 keys.
    const uint64_t dv = desc(sK + 4 * w * kPlane, kPlane, 1024);
    fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) Mma<256>::run<0, 1>(o, dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4), 1);
    commit();
    wait_all();
    pin(o);
  }
  cp_async_wait_all();

  // Row sums over the quad and the two warpgroups.
  __syncthreads();
  post_row_sums(s_max, l_run, w, wq, g, t4);
  __syncthreads();
  store_rows<false>(p, a, t.wk.slot, t.wk.b, R0, rows_valid, s_max, m_run, o, nullptr, w, wq, g, t4);
#else
  __trap();  // launched only where the library holds sm_90a code (plan_tc checks the device)
#endif
}

}  // namespace

int tc_launch_wgmma(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  return launch_kernel<tc_attn_wg>(wg::kBaseBytes, p, plan, workspace, stream);
}

}  // namespace verify_attn
