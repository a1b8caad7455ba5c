// The per-row softmax and epilogue of the sm_90a consumers whose accumulators hold query rows
// (tc_attn_wg: tc_wgmma.cu, tc_attn_ws: tc_wgmma_ws.cu). Layout (wgmma's, wg::Mma): a thread
// holds rows 16 wq + g + 8 h (h = 0, 1) of its warp wq; s[4 i + 2 h + e] is key
// kw + 8 i + 2 t4 + e of row h, o[4 i + 2 h + e] column 8 i + 2 t4 + e of its O columns.
#pragma once
#include "tc_wgmma.h"

namespace verify_attn {
namespace {
namespace wg {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Row h of this thread's scores s (keys kw + 8 i + 2 t4 + e, i < K / 4): to log2 units,
// non-finite scores NaN; masked (the one or two tiles at the tree rows), keys with a
// non-finite cache value (bad) NaN and keys the row cannot see (word) -inf. Returns this
// thread's maximum of the row (max.NaN). A constant `masked` drops the mask test.
template <int K>
__device__ __forceinline__ float scale_row(float (&s)[K], int h, float qk_scale, bool masked, uint64_t word,
                                           uint64_t bad, int kw, int t4) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < K / 4; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = nan_unless_finite(s[4 * i + 2 * h + e] * qk_scale);
      if (masked) {
        const int key = kw + 8 * i + 2 * t4 + e;
        if ((bad >> key) & 1) v = __int_as_float(0x7fffffff);
        if (!((word >> key) & 1)) v = -INFINITY;
      }
      s[4 * i + 2 * h + e] = v;
      mx = nan_max(mx, v);
    }
  return mx;
}
// The maximum over the quad that holds a row (max.NaN).
__device__ __forceinline__ float quad_max(float mx) {
  mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  return nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
}
// P of keys 8 i + 2 t4 + (0, 1) of row h from the maximum mu, added unrounded to sum;
// returns them as bf16 pair.
template <int K>
__device__ __forceinline__ uint32_t exp_pair(const float (&s)[K], int i, int h, float mu, float& sum) {
  const float p0 = ex2(s[4 * i + 2 * h] - mu);
  const float p1 = ex2(s[4 * i + 2 * h + 1] - mu);
  sum += p0 + p1;
  return pack_bf16(p0, p1);
}
// O *= sc per row (skipped when no factor of the warp differs from 1: the maxima settle early).
__device__ __forceinline__ void rescale(float (&o)[128], const float (&sc)[2]) {
  if (__any_sync(0xffffffffu, sc[0] != 1.f || sc[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= sc[(i >> 1) & 1];
  }
}
// This thread's row sums, summed over the quad, posted to s_l[w][row] (the caller's barrier
// makes them visible to the other warpgroup).
__device__ __forceinline__ void post_row_sums(float* s_l, const float (&l_run)[2], int w, int wq, int g, int t4) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t4 == 0) s_l[w * kRows + 16 * wq + g + 8 * h] = l;
  }
}
// Rows R0 + r of O (this warpgroup's 256 columns) normalised by both warpgroups' row sums in
// s_l, and their lse, stored. kAbort: a raised *abort makes every value NaN (never a
// plausible result).
template <bool kAbort>
__device__ __forceinline__ void store_rows(const Params& p, const TcArgs& a, int slot, int b, int R0, int rows_valid,
                                           const float* s_l, const float (&m_run)[2], const float (&o)[128],
                                           volatile uint32_t* abort, int w, int wq, int g, int t4) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * wq + g + 8 * h;
    if (r >= rows_valid) continue;
    const RowEnd e = row_end(s_l[r] + s_l[kRows + r], m_run[h]);
    float lse2 = e.lse2, inv = e.inv;
    if (kAbort && *abort) inv = lse2 = __int_as_float(0x7fffffff);
    OutRow dst(p, a, slot, b, R0 + r, 256 * w + 2 * t4);
#pragma unroll
    for (int i = 0; i < 32; ++i) dst.put(8 * i, o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
    if (w == 0 && t4 == 0) dst.lse(lse2);
  }
}
#endif
}  // namespace wg
}  // namespace
}  // namespace verify_attn
