// tc's merge of the key splits' partial outputs, shared by every path.
#pragma once
#include "tc.h"

namespace verify_attn {
namespace {

// One warp per output row: the element's splits weighted by 2^(lse_s - max).
__global__ void __launch_bounds__(kMergeWarps * 32) tc_merge(Params p, TcArgs a) {
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.x * kMergeWarps + (threadIdx.x >> 5);
  const int b = blockIdx.y;
  grid_dependency_wait();  // the attention grid's partials
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

}  // namespace
}  // namespace verify_attn
