// The baseline: attention written the obvious way, one kernel per step.
//
//   1. scores[b, h, i, t] = scale * q . k_t, one thread per score, masked scores = -inf
//   2. softmax over t in place, one block per (b, h, i), which also writes the lse
//   3. out[b, i, h, d] = sum_t p_t * v_t[d], one thread per output element
//
// The scores live in a global workspace (batch x heads x q_len x kv_cols fp32), so every
// size runs, prefix 65,536 included; nothing is tiled, fused or vectorised.
#include <cuda_runtime.h>
#include <math.h>

#include "verify_attn.h"

namespace verify_attn {
namespace {

constexpr int kScoreThreads = 256;
constexpr int kSoftmaxThreads = 256;

__global__ void __launch_bounds__(kScoreThreads) naive_scores(Params p, float* scores) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int i = blockIdx.y;
  const int b = blockIdx.z / p.heads;
  const int h = blockIdx.z % p.heads;
  if (t >= p.kv_cols) return;
  float* dst = scores + ((int64_t(b) * p.heads + h) * p.q_len + i) * p.kv_cols + t;
  const int prefix = prefix_len_of(p, b);
  const bool visible =
      t < prefix || (t < prefix + p.q_len && tree_visible(p.parent + b * p.q_len, i, t - prefix));
  if (!visible) {
    *dst = -INFINITY;
    return;
  }
  const uint16_t* q = p.q + ((int64_t(b) * p.q_len + i) * p.heads + h) * kKeyDim;
  const uint16_t* k = kv_row(p, b, t);
  float acc = 0.f;
  for (int d = 0; d < kKeyDim; ++d) acc += bf16_to_float(q[d]) * bf16_to_float(k[d]);
  *dst = acc * p.scale;
}

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float partial[kSoftmaxThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < kSoftmaxThreads / 32; ++w) v = is_max ? fmaxf(v, partial[w]) : v + partial[w];
  return v;
}

__global__ void __launch_bounds__(kSoftmaxThreads) naive_softmax(Params p, float* scores) {
  const int row = blockIdx.x;  // (b * heads + h) * q_len + i
  const int b = row / (p.heads * p.q_len);
  const int kv_len = prefix_len_of(p, b) + p.q_len;
  float* s = scores + int64_t(row) * p.kv_cols;
  float m = -INFINITY;
  for (int t = threadIdx.x; t < kv_len; t += blockDim.x) m = fmaxf(m, s[t]);
  m = block_reduce(m, true);  // finite: every query sees itself
  float sum = 0.f;
  for (int t = threadIdx.x; t < kv_len; t += blockDim.x) sum += expf(s[t] - m);
  sum = block_reduce(sum, false);
  for (int t = threadIdx.x; t < kv_len; t += blockDim.x) s[t] = expf(s[t] - m) / sum;
  if (threadIdx.x == 0) p.lse[row] = m + logf(sum);  // lse is batch x heads x q_len: same order
}

__global__ void __launch_bounds__(kLatent) naive_output(Params p, const float* probs) {
  const int d = threadIdx.x;
  const int i = blockIdx.x % p.q_len;
  const int h = (blockIdx.x / p.q_len) % p.heads;
  const int b = blockIdx.x / (p.q_len * p.heads);
  const int kv_len = prefix_len_of(p, b) + p.q_len;
  const float* prob = probs + ((int64_t(b) * p.heads + h) * p.q_len + i) * p.kv_cols;
  float acc = 0.f;
  for (int t = 0; t < kv_len; ++t) acc += prob[t] * bf16_to_float(kv_row(p, b, t)[d]);
  p.out[((int64_t(b) * p.q_len + i) * p.heads + h) * kLatent + d] = float_to_bf16(acc);
}

}  // namespace

Plan plan_naive(const Params& p, int /*num_sms*/) {
  Plan plan;
  plan.blocks = (p.kv_cols + kScoreThreads - 1) / kScoreThreads * p.q_len * p.batch * p.heads;
  plan.threads = kScoreThreads;
  plan.split_len = p.kv_cols;
  plan.rows_per_block = 1;
  plan.workspace_bytes = int64_t(p.batch) * p.heads * p.q_len * p.kv_cols * int64_t(sizeof(float));
  return plan;
}

int launch_naive(const Params& p, const Plan& /*plan*/, void* workspace_bytes, cudaStream_t stream) {
  float* workspace = static_cast<float*>(workspace_bytes);
  dim3 score_grid((p.kv_cols + kScoreThreads - 1) / kScoreThreads, p.q_len, p.batch * p.heads);
  naive_scores<<<score_grid, kScoreThreads, 0, stream>>>(p, workspace);
  naive_softmax<<<p.batch * p.heads * p.q_len, kSoftmaxThreads, 0, stream>>>(p, workspace);
  naive_output<<<p.batch * p.heads * p.q_len, kLatent, 0, stream>>>(p, workspace);
  return int(cudaGetLastError());
}

}  // namespace verify_attn
