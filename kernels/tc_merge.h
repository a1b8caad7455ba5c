// tc's merge of the key splits' partial outputs, shared by every path.
#pragma once
#include "tc.h"

namespace verify_attn {
namespace {

template <int Per>
__device__ __forceinline__ void add_split(float4 (&acc)[Per], float w, const float4 (&v)[Per]) {
#pragma unroll
  for (int k = 0; k < Per; ++k) {
    acc[k].x = fmaf(w, v[k].x, acc[k].x);
    acc[k].y = fmaf(w, v[k].y, acc[k].y);
    acc[k].z = fmaf(w, v[k].z, acc[k].z);
    acc[k].w = fmaf(w, v[k].w, acc[k].w);
  }
}

// The maximum of an element's n split lse values of row r (lse_col: row r's column, stride R), over
// the warp: NaN if any is NaN, -inf where n == 0.
__device__ __forceinline__ float splits_max(const float* lse_col, int first, int n, int R, int lane) {
  float m = -INFINITY;
  for (int s = lane; s < n; s += 32) m = nan_max(m, lse_col[int64_t(first + s) * R]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = nan_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}
// Merged row r of element b's natural-log lse from the maximum m (log2 units) and the weights' sum.
__device__ __forceinline__ void store_lse(const Params& p, int b, int r, float m, float wsum) {
  const int i = r / p.heads, hd = r - i * p.heads;
  p.lse[(int64_t(b) * p.heads + hd) * p.q_len + i] = wsum == 0.f ? -INFINITY : (m + log2f(wsum)) * kLn2;
}

// kMergeParts / Per warps per output row (a.merge_parts), each lane over Per float4 columns
// of it, 32 lanes apart: the element's splits weighted by 2^(lse_s - max), added in ascending
// split order. The loads of kMergeParts / Per splits are issued before any of them is added,
// so with several warps a row every lane has 4 float4 loads in flight (with few rows and many
// splits a warp a row leaves the merge waiting on the L2, on few SMs).
template <int Per>
__global__ void __launch_bounds__(kMergeWarps * 32) tc_merge(Params p, TcArgs a) {
  constexpr int kParts = kMergeParts / Per, kBatch = kMergeParts / Per;
  const int lane = threadIdx.x & 31;
  const int gw = blockIdx.x * kMergeWarps + (threadIdx.x >> 5);
  const int r = gw / kParts, part = gw - r * kParts;
  const int b = blockIdx.y;
  grid_dependency_wait();  // the attention grid's partials
  if (r >= a.R) return;
  const int2 meta = a.meta[b];
  const int first = meta.x, n = meta.y;
  const float* lse_col = a.ws_lse + r;
  const float m = splits_max(lse_col, first, n, a.R, lane);
  const float4* src = reinterpret_cast<const float4*>(a.ws_o + (int64_t(first) * a.R + r) * kLatent) + part * 32 * Per + lane;
  const int64_t stride4 = int64_t(a.R) * (kLatent / 4);  // one split to the next, in float4s
  float4 acc[Per];
#pragma unroll
  for (int k = 0; k < Per; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  if (m != -INFINITY) {
    if constexpr (kBatch == 1) {
      // A warp a row: one split's loads at a time (ptxas unrolls this loop over the splits
      // and hoists their lse loads; the batched form below measured 2-3% slower here).
      for (int s = 0; s < n; ++s) {
        const float w = ex2(lse_col[int64_t(first + s) * a.R] - m);
        if (w == 0.f) continue;  // an empty split (uniform over the warp); NaN goes on
        wsum += w;
        float4 v[Per];
#pragma unroll
        for (int k = 0; k < Per; ++k) v[k] = src[s * stride4 + 32 * k];
        add_split(acc, w, v);
      }
    } else {
      for (int s0 = 0; s0 < n; s0 += kBatch) {
        float w[kBatch];
        float4 v[kBatch][Per];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) w[u] = s0 + u < n ? ex2(lse_col[int64_t(first + s0 + u) * a.R] - m) : 0.f;
        // An empty split (w == 0, uniform over the warp) is neither read nor added; NaN goes on.
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
#pragma unroll
          for (int k = 0; k < Per; ++k) v[u][k] = w[u] != 0.f ? src[(s0 + u) * stride4 + 32 * k] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (w[u] == 0.f) continue;
          wsum += w[u];
          add_split(acc, w[u], v[u]);
        }
      }
    }
  }
  const float inv = wsum == 0.f ? 0.f : 1.f / wsum;
  uint2* dst = reinterpret_cast<uint2*>(p.out + (int64_t(b) * a.R + r) * kLatent) + part * 32 * Per + lane;
#pragma unroll
  for (int k = 0; k < Per; ++k) {
    uint2 o;
    o.x = pack_bf16(acc[k].x * inv, acc[k].y * inv);
    o.y = pack_bf16(acc[k].z * inv, acc[k].w * inv);
    dst[32 * k] = o;
  }
  if (part == 0 && lane == 0) store_lse(p, b, r, m, wsum);
}

// Few rows (a.merge_parts == kMergeRowWarps): a block a row, its kMergeRowWarps warps sharing
// out the element's splits (warp w: splits w, w + kMergeRowWarps, ..., four at a time, each
// lane over the whole 512 columns), then summed over the warps in shared memory. With a warp
// or four a row the splits were added one batch of loads after another: at heads 8, q_len 9
// (72 rows, 66 splits) about 17 round trips to the L2 in a row, 15 us of a 59 us call.
__global__ void __launch_bounds__(kMergeRowWarps * 32, 2) tc_merge_rows(Params p, TcArgs a) {
  constexpr int kW = kMergeRowWarps, kPer = kLatent / 128, kB = 4;  // float4s a lane; splits a batch
  __shared__ float4 s_acc[kW][kLatent / 4];
  __shared__ float s_wsum[kW];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int r = blockIdx.x, b = blockIdx.y;
  grid_dependency_wait();  // the attention grid's partials
  const int2 meta = a.meta[b];
  const int first = meta.x, n = meta.y;
  const float* lse_col = a.ws_lse + r;
  const float4* src = reinterpret_cast<const float4*>(a.ws_o + (int64_t(first) * a.R + r) * kLatent) + lane;
  const int64_t stride4 = int64_t(a.R) * (kLatent / 4);
  // A batch of the warp's splits from s0 (split s0 + u kW): their lse and partial rows. Every
  // slot below n exists, so an empty split's row is read too (not added: its weight is 0).
  float lv[kB];
  float4 v[kB][kPer];
  auto load = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int s = s0 + u * kW;
      lv[u] = s < n ? lse_col[int64_t(first + s) * a.R] : -INFINITY;
#pragma unroll
      for (int k = 0; k < kPer; ++k) v[u][k] = s < n ? src[s * stride4 + 32 * k] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load(w);  // the first batch goes out beside the maximum's loads: it does not depend on it
  const float m = splits_max(lse_col, first, n, a.R, lane);
  float4 acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;
  if (m != -INFINITY) {
    for (int s0 = w;;) {
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        const float wt = ex2(lv[u] - m);
        if (wt == 0.f) continue;  // an empty split or past n (uniform over the warp); NaN goes on
        wsum += wt;
        add_split(acc, wt, v[u]);
      }
      s0 += kW * kB;
      if (s0 >= n) break;
      load(s0);
    }
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) s_acc[w][32 * k + lane] = acc[k];
  if (lane == 0) s_wsum[w] = wsum;
  __syncthreads();
  // Thread t: float4 column t of the row (128 of them), the warps' sums in warp order.
  const int t = threadIdx.x;
  if (t >= kLatent / 4) return;
  float total = 0.f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int u = 0; u < kW; ++u) {
    total += s_wsum[u];
    const float4 x = s_acc[u][t];
    o.x += x.x, o.y += x.y, o.z += x.z, o.w += x.w;
  }
  const float inv = total == 0.f ? 0.f : 1.f / total;
  uint2 packed;
  packed.x = pack_bf16(o.x * inv, o.y * inv);
  packed.y = pack_bf16(o.z * inv, o.w * inv);
  reinterpret_cast<uint2*>(p.out + (int64_t(b) * a.R + r) * kLatent)[t] = packed;
  if (t == 0) store_lse(p, b, r, m, total);
}

}  // namespace
}  // namespace verify_attn
