// The flash kernel: the seed's v6 design on CUDA cores, fp32 arithmetic.
//
// One block per (head, KV split, query tile, batch element), 256 threads. Per tile of 16
// cache rows (one 16-byte cp.async per chunk into shared memory):
//   scores   one warp per key: each lane holds 18 of the 576 dims of two keys and of the
//            query (pre-scaled, fp32 in shared memory), then a warp reduction per query
//   softmax  online (running max and sum per query), base 2
//   output   each thread owns 2 of the 512 output dims for every query of the tile
// The KV range is split across blocks so that short batches still fill the GPU; the splits'
// normalised partial outputs are merged by log-sum-exp in a second kernel.
//
// Non-finite input (tests/test_nan.py): a non-finite score of an attended key is a NaN, and
// the running max, the sums and the merge propagate NaN, so that exactly the queries that
// attend a non-finite row (or have a non-finite q) get NaN. Masked keys get weight 0; the
// only masked rows a tile can hold are tree rows (prefix rows are seen by every query, rows
// past the end are zero-filled), so in the few tiles that hold tree rows non-finite values
// are read as 0: a masked sibling's NaN never reaches the sum as 0 * NaN, and a query that
// attends such a row is NaN already through its score.
#include <cuda_runtime.h>
#include <math.h>

#include "device.h"
#include "verify_attn.h"

namespace verify_attn {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kKeysPerWarp = 2;
constexpr int kTileKeys = kWarps * kKeysPerWarp;  // 16 keys a tile
constexpr int kQTile = 12;                        // queries a block, at most
constexpr int kRowChunks = kKeyDim * 2 / 16;      // 72 chunks of 16 bytes a cache row
constexpr int kMinSplitKeys = 512;                // a split shorter than this costs more to merge
constexpr int kMaxSplits = 64;
constexpr int kMergeThreads = kLatent / 4;

// Lane l owns latent chunks l and l + 32 (elements 8l..8l+7, 256+8l..256+8l+7) and rope
// elements 2l, 2l+1: consecutive lanes read consecutive 16-byte words, no bank conflicts.
static_assert(kLatent == 2 * 32 * 8 && kRope == 2 * 32, "lane layout assumes 512 + 64");
static_assert(kLatent == 2 * kThreads, "each thread owns two output dims");
static_assert(kKeysPerWarp == 2, "the warp reduction below pairs two keys");
static_assert(32 % kTileKeys == 0 && kQTile * kTileKeys <= kThreads, "softmax thread layout");

struct __align__(16) FlashSmem {
  float4 q_lat[kQTile][4][32];  // queries' latent, fp32, pre-scaled by scale * log2(e)
  float2 q_rope[kQTile][32];    // queries' rope
  uint4 k[kTileKeys][kRowChunks];  // the tile's cache rows, bf16 as stored
  float p[kTileKeys][kQTile];   // scores, then probabilities
  float corr[kQTile];           // rescale of the running output when the max moves
  float inv_l[kQTile];
  float lse[kQTile];
};

// A non-finite value read as 0 (bf16 pair packed in a word, either half).
__device__ __forceinline__ float finite_or_zero(float x) { return fabsf(x) < INFINITY ? x : 0.f; }

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ void unpack8(uint4 c, float* f) {
  f[0] = bf_lo(c.x); f[1] = bf_hi(c.x); f[2] = bf_lo(c.y); f[3] = bf_hi(c.y);
  f[4] = bf_lo(c.z); f[5] = bf_hi(c.z); f[6] = bf_lo(c.w); f[7] = bf_hi(c.w);
}

// A lane's 18 dims of one cache or query row.
__device__ __forceinline__ void load_lane_dims(const uint4* row, int lane, float* f) {
  unpack8(row[lane], f);
  unpack8(row[lane + 32], f + 8);
  const uint32_t r = reinterpret_cast<const uint32_t*>(row)[kLatent / 2 + lane];
  f[16] = bf_lo(r);
  f[17] = bf_hi(r);
}

__device__ __forceinline__ float dot18(const float* k, const float4 (&q)[4], float2 r) {
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s = fmaf(k[4 * j + 0], q[j].x, s);
    s = fmaf(k[4 * j + 1], q[j].y, s);
    s = fmaf(k[4 * j + 2], q[j].z, s);
    s = fmaf(k[4 * j + 3], q[j].w, s);
  }
  s = fmaf(k[16], r.x, s);
  return fmaf(k[17], r.y, s);
}

// acc[i] += p[key][i] * v[key] over the tile's keys, for this thread's two output dims.
template <bool kTreeTile>
__device__ __forceinline__ void accumulate(float (&acc)[kQTile][2], const FlashSmem& sm, int tid) {
#pragma unroll 4
  for (int kk = 0; kk < kTileKeys; ++kk) {
    const uint32_t v = reinterpret_cast<const uint32_t*>(sm.k[kk])[tid];
    float v0 = bf_lo(v), v1 = bf_hi(v);
    if (kTreeTile) {
      v0 = finite_or_zero(v0);
      v1 = finite_or_zero(v1);
    }
    float pr[kQTile];
#pragma unroll
    for (int j = 0; j < kQTile / 4; ++j) {
      const float4 w = reinterpret_cast<const float4*>(sm.p[kk])[j];
      pr[4 * j] = w.x; pr[4 * j + 1] = w.y; pr[4 * j + 2] = w.z; pr[4 * j + 3] = w.w;
    }
#pragma unroll
    for (int i = 0; i < kQTile; ++i) {
      acc[i][0] = fmaf(pr[i], v0, acc[i][0]);
      acc[i][1] = fmaf(pr[i], v1, acc[i][1]);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 2)
    flash_split(Params p, Plan plan, float* ws_out, float* ws_lse) {
  __shared__ FlashSmem sm;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int h = blockIdx.x;
  const int q_tiles = (p.q_len + plan.rows_per_block - 1) / plan.rows_per_block;
  const int split = blockIdx.y / q_tiles;
  const int q0 = (blockIdx.y % q_tiles) * plan.rows_per_block;
  const int nq = min(plan.rows_per_block, p.q_len - q0);
  const int b = blockIdx.z;
  const int prefix = prefix_len_of(p, b);
  const int key_begin = split * plan.split_len;
  const int key_end = min(key_begin + plan.split_len, prefix + p.q_len);
  const int32_t* parent = p.parent + b * p.q_len;

  // Queries to shared memory as fp32 in the lanes' layout, pre-scaled for exp2.
  const float qscale = p.scale * kLog2e;
  for (int idx = tid; idx < kQTile * 32; idx += kThreads) {
    const int i = idx / 32, l = idx % 32;
    float f[18];
    if (i < nq) {
      const uint16_t* q = p.q + ((int64_t(b) * p.q_len + q0 + i) * p.heads + h) * kKeyDim;
      load_lane_dims(reinterpret_cast<const uint4*>(q), l, f);
    }
#pragma unroll
    for (int j = 0; j < 18; ++j) f[j] = i < nq ? f[j] * qscale : 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) sm.q_lat[i][j][l] = make_float4(f[4 * j], f[4 * j + 1], f[4 * j + 2], f[4 * j + 3]);
    sm.q_rope[i][l] = make_float2(f[16], f[17]);
  }

  // Softmax state: thread (sm_i, sm_t) handles query sm_i and key sm_t of each tile; the
  // 16 threads of one query hold identical copies of its running max and sum.
  const int sm_i = tid / kTileKeys, sm_t = tid % kTileKeys;
  const bool softmax_thread = tid < kQTile * kTileKeys;
  float m_run = -INFINITY, l_run = 0.f;
  float acc[kQTile][2];
#pragma unroll
  for (int i = 0; i < kQTile; ++i) acc[i][0] = acc[i][1] = 0.f;

  for (int t0 = key_begin; t0 < key_end; t0 += kTileKeys) {
    for (int c = tid; c < kTileKeys * kRowChunks; c += kThreads) {
      const int r = c / kRowChunks, col = c % kRowChunks;
      const bool valid = t0 + r < key_end;  // rows past the end are zero-filled
      const uint16_t* src = valid ? kv_row(p, b, t0 + r) + col * 8 : p.kv;
      cp_async16(smem_u32(&sm.k[r][col]), src, valid ? 16 : 0);
    }
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    {  // scores: warp w owns keys 2w and 2w+1 of the tile
      float k0[18], k1[18];
      load_lane_dims(sm.k[warp * kKeysPerWarp], lane, k0);
      load_lane_dims(sm.k[warp * kKeysPerWarp + 1], lane, k1);
      const bool upper = lane & 16;
      const int kk = warp * kKeysPerWarp + (upper ? 1 : 0);  // the key this lane ends with
      const int t = t0 + kk;
      for (int i = 0; i < nq; ++i) {
        float4 qa[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) qa[j] = sm.q_lat[i][j][lane];
        const float2 qr = sm.q_rope[i][lane];
        const float s0 = dot18(k0, qa, qr), s1 = dot18(k1, qa, qr);
        // Reduce both sums at once: lanes 0-15 keep key 0's, lanes 16-31 key 1's.
        float s = upper ? s1 : s0;
        s += __shfl_xor_sync(0xffffffffu, upper ? s0 : s1, 16);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((lane & 15) == 0) {
          const bool visible =
              t < key_end && (t < prefix || tree_visible(parent, q0 + i, t - prefix));
          // An attended key's non-finite score is a NaN (an inf scoring -inf must not weigh 0).
          sm.p[kk][i] = visible ? (fabsf(s) < INFINITY ? s : __int_as_float(0x7fffffff)) : -INFINITY;
        }
      }
    }
    __syncthreads();

    if (softmax_thread) {
      const float s = sm_i < nq ? sm.p[sm_t][sm_i] : -INFINITY;
      float mx = s;
#pragma unroll
      for (int o = kTileKeys / 2; o > 0; o >>= 1) mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = nan_max(m_run, mx);
      float prob = 0.f, corr = 1.f;
      if (m_new != -INFINITY) {  // true for NaN: prob and corr become NaN
        prob = exp2f(s - m_new);
        corr = exp2f(m_run - m_new);
      }
      float sum = prob;
#pragma unroll
      for (int o = kTileKeys / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l_run = l_run * corr + sum;
      m_run = m_new;
      sm.p[sm_t][sm_i] = prob;
      if (sm_t == 0) sm.corr[sm_i] = corr;
    }
    __syncthreads();

    {  // output: thread owns dims 2*tid and 2*tid+1 of every query
#pragma unroll
      for (int i = 0; i < kQTile; ++i) {
        acc[i][0] *= sm.corr[i];
        acc[i][1] *= sm.corr[i];
      }
      // A tile of prefix rows only (all but the last few) is seen by every query as is; a
      // tile holding tree rows may hold a masked sibling's non-finite values: read as 0.
      if (t0 + kTileKeys <= prefix) accumulate<false>(acc, sm, tid);
      else accumulate<true>(acc, sm, tid);
    }
    __syncthreads();  // the next tile overwrites sm.k and sm.p
  }

  if (softmax_thread && sm_t == 0) {
    const bool empty = l_run == 0.f;  // a split with no visible key (NaN is not empty)
    sm.inv_l[sm_i] = empty ? 0.f : 1.f / l_run;
    sm.lse[sm_i] = empty ? -INFINITY : (m_run + log2f(l_run)) * kLn2;
  }
  __syncthreads();

  const bool direct = plan.num_splits == 1;
#pragma unroll
  for (int i = 0; i < kQTile; ++i) {
    if (i >= nq) break;
    const int64_t row = (int64_t(b) * p.q_len + q0 + i) * p.heads + h;
    const float o0 = acc[i][0] * sm.inv_l[i], o1 = acc[i][1] * sm.inv_l[i];
    if (direct) {
      const uint32_t packed = float_to_bf16(o0) | (uint32_t(float_to_bf16(o1)) << 16);
      reinterpret_cast<uint32_t*>(p.out + row * kLatent)[tid] = packed;
    } else {
      const int64_t split_rows = int64_t(p.batch) * p.q_len * p.heads;
      reinterpret_cast<float2*>(ws_out + (split * split_rows + row) * kLatent)[tid] = make_float2(o0, o1);
    }
  }
  if (tid < nq) {
    const int64_t at = (int64_t(b) * p.heads + h) * p.q_len + q0 + tid;
    if (direct) p.lse[at] = sm.lse[tid];
    else ws_lse[int64_t(split) * p.batch * p.heads * p.q_len + at] = sm.lse[tid];
  }
}

// One block per output row (b, i, h): weights exp(lse_s - max) over the splits.
__global__ void __launch_bounds__(kMergeThreads)
    flash_merge(Params p, int num_splits, const float* ws_out, const float* ws_lse) {
  const int64_t row = blockIdx.x;  // (b * q_len + i) * heads + h
  const int h = int(row % p.heads);
  const int i = int((row / p.heads) % p.q_len);
  const int b = int(row / (int64_t(p.heads) * p.q_len));
  const int64_t lse_at = (int64_t(b) * p.heads + h) * p.q_len + i;
  const int64_t lse_stride = int64_t(p.batch) * p.heads * p.q_len;
  const int64_t out_stride = lse_stride * kLatent;
  float m = -INFINITY;
  for (int s = 0; s < num_splits; ++s) m = nan_max(m, ws_lse[s * lse_stride + lse_at]);
  // m is finite or NaN: the split holding the query's own tree row saw at least that row.
  // NaN in any split makes m, every weight and so the output NaN.
  float wsum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < num_splits; ++s) {
    const float lse_s = ws_lse[s * lse_stride + lse_at];
    const float w = lse_s == -INFINITY ? 0.f : expf(lse_s - m);  // an empty split weighs 0
    if (w == 0.f) continue;  // (a finite split whose weight underflows adds nothing either)
    const float4 o = reinterpret_cast<const float4*>(ws_out + s * out_stride + row * kLatent)[threadIdx.x];
    wsum += w;
    acc.x = fmaf(w, o.x, acc.x);
    acc.y = fmaf(w, o.y, acc.y);
    acc.z = fmaf(w, o.z, acc.z);
    acc.w = fmaf(w, o.w, acc.w);
  }
  const float inv = 1.f / wsum;
  uint2 packed;
  packed.x = float_to_bf16(acc.x * inv) | (uint32_t(float_to_bf16(acc.y * inv)) << 16);
  packed.y = float_to_bf16(acc.z * inv) | (uint32_t(float_to_bf16(acc.w * inv)) << 16);
  reinterpret_cast<uint2*>(p.out + row * kLatent)[threadIdx.x] = packed;
  if (threadIdx.x == 0) p.lse[lse_at] = m + logf(wsum);
}

}  // namespace

Plan plan_flash(const Params& p, int num_sms, int path) {
  Plan plan;
  if (path != kAnyPath && path != 0) return plan;  // one path
  const int q_tiles = (p.q_len + kQTile - 1) / kQTile;
  plan.rows_per_block = (p.q_len + q_tiles - 1) / q_tiles;
  plan.threads = kThreads;
  plan.keys_per_tile = kTileKeys;
  plan.smem_bytes = int(sizeof(FlashSmem));
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, flash_split, kThreads, 0) != cudaSuccess || per_sm < 1)
    per_sm = 1;
  // Pick the split count whose waves of resident blocks give the least time per key, with a
  // small charge per split for the partial outputs it writes and the merge reads.
  const int64_t resident = int64_t(num_sms) * per_sm;
  const int64_t blocks = int64_t(p.batch) * p.heads * q_tiles;
  const int max_splits = max(1, min(kMaxSplits, p.kv_cols / kMinSplitKeys));
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= max_splits; ++s) {
    const int64_t waves = (blocks * s + resident - 1) / resident;
    const double cost = double(waves) / s + 0.002 * s;
    if (cost < best_cost) best_cost = cost, best = s;
  }
  const int len = (p.kv_cols + best - 1) / best;
  plan.split_len = (len + kTileKeys - 1) / kTileKeys * kTileKeys;
  plan.num_splits = (p.kv_cols + plan.split_len - 1) / plan.split_len;
  plan.blocks = int(blocks * plan.num_splits);
  if (plan.num_splits > 1)
    plan.workspace_bytes = int64_t(plan.num_splits) * p.batch * p.q_len * p.heads * (kLatent + 1) * int64_t(sizeof(float));
  return plan;
}

int launch_flash(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  float* ws_out = static_cast<float*>(workspace);
  float* ws_lse = ws_out == nullptr ? nullptr : ws_out + int64_t(plan.num_splits) * p.batch * p.q_len * p.heads * kLatent;
  const int q_tiles = (p.q_len + plan.rows_per_block - 1) / plan.rows_per_block;
  const dim3 grid(p.heads, plan.num_splits * q_tiles, p.batch);
  flash_split<<<grid, kThreads, 0, stream>>>(p, plan, ws_out, ws_lse);
  if (plan.num_splits > 1)
    flash_merge<<<int64_t(p.batch) * p.q_len * p.heads, kMergeThreads, 0, stream>>>(p, plan.num_splits, ws_out, ws_lse);
  return int(cudaGetLastError());
}

}  // namespace verify_attn
