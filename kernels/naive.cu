// The baseline: attention written the obvious way, a few plain kernels per chunk of keys.
//
// The keys are taken in chunks of at most chunk_keys columns (chosen by the plan so that
// the scores workspace stays near 32 MiB). Per chunk:
//   1. scores[b, h, i, t] = scale * q . k_t, one thread per score, masked scores = -inf
//   2. softmax update, one block per (b, h, i): the chunk's max and sum are folded into the
//      running max m and sum l (the online softmax), the scores become exp(s - m), and the
//      factor corr = exp(m_old - m) the earlier chunks' sums are rescaled by is kept
//   3. output update: acc[b, h, i, d] = corr * acc + sum_t p_t * v_t[d], one thread per
//      output element
// The first chunk starts the running values, the last writes out = acc / l and
// lse = m + log(l). The workspace (scores of one
// chunk, the fp32 accumulator and m, l, corr per row) does not grow with kv_cols, so every
// size runs, prefix 65,536 and huge index tables included; nothing is tiled, fused or
// vectorised, and the launch count grows with kv_cols (3 per chunk).
//
// Non-finite input (tests/test_nan.py): an attended key's non-finite score is a NaN and
// the max and sums propagate NaN, so exactly the queries that attend a non-finite row (or
// have a non-finite q) get NaN; masked keys and rows past the element's rows are skipped
// by the mask in the output sum, never multiplied by a zero weight.
#include <cuda_runtime.h>
#include <math.h>

#include "device.h"
#include "verify_attn.h"

namespace verify_attn {
namespace {

constexpr int kScoreThreads = 256;
constexpr int kSoftmaxThreads = 256;
constexpr int64_t kScoreBudget = int64_t(32) << 20;  // bytes of scores a chunk, at most (above 256 keys)

__device__ bool visible(const Params& p, int b, int prefix, int i, int t) {
  return t < prefix || (t < prefix + p.q_len && tree_visible(p.parent + b * p.q_len, i, t - prefix));
}

// Rows of the workspace are (b * heads + h) * q_len + i: lse's order.
struct Workspace {
  float* scores;  // rows x chunk_keys
  float* acc;     // rows x 512
  float* m;       // rows: running max
  float* l;       // rows: running sum
  float* corr;    // rows: exp(m before this chunk - m)
};

Workspace carve(const Params& p, int chunk_keys, void* base) {
  const int64_t rows = int64_t(p.batch) * p.heads * p.q_len;
  float* f = static_cast<float*>(base);
  Workspace w;
  w.scores = f;
  w.acc = w.scores + rows * chunk_keys;
  w.m = w.acc + rows * kLatent;
  w.l = w.m + rows;
  w.corr = w.l + rows;
  return w;
}

int chunk_keys_of(const Params& p) {
  const int64_t rows = int64_t(p.batch) * p.heads * p.q_len > 0 ? int64_t(p.batch) * p.heads * p.q_len : 1;
  int64_t k = kScoreBudget / int64_t(sizeof(float)) / rows / kScoreThreads * kScoreThreads;
  const int64_t all = (int64_t(p.kv_cols) + kScoreThreads - 1) / kScoreThreads * kScoreThreads;
  if (k < kScoreThreads) k = kScoreThreads;
  return int(k < all ? k : all);
}

__global__ void __launch_bounds__(kScoreThreads)
    naive_scores(Params p, Workspace w, int chunk0, int chunk_keys) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = chunk0 + c;
  const int i = blockIdx.y;
  const int b = blockIdx.z / p.heads;
  const int h = blockIdx.z % p.heads;
  if (c >= chunk_keys) return;
  float* dst = w.scores + ((int64_t(b) * p.heads + h) * p.q_len + i) * chunk_keys + c;
  const int prefix = prefix_len_of(p, b);
  if (!visible(p, b, prefix, i, t)) {  // masked, or past the element's rows
    *dst = -INFINITY;
    return;
  }
  const uint16_t* q = p.q + ((int64_t(b) * p.q_len + i) * p.heads + h) * kKeyDim;
  const uint16_t* k = kv_row(p, b, t);
  float acc = 0.f;
  for (int d = 0; d < kKeyDim; ++d) acc += bf16_to_float(q[d]) * bf16_to_float(k[d]);
  acc *= p.scale;
  *dst = isfinite(acc) ? acc : __int_as_float(0x7fffffff);  // an attended non-finite score is NaN
}

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float partial[kSoftmaxThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    float x = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? nan_max_plain(v, x) : v + x;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = partial[0];
  for (int x = 1; x < kSoftmaxThreads / 32; ++x) v = is_max ? nan_max_plain(v, partial[x]) : v + partial[x];
  return v;
}

__global__ void __launch_bounds__(kSoftmaxThreads)
    naive_softmax(Params p, Workspace w, int chunk0, int chunk_keys, bool last) {
  const int row = blockIdx.x;  // (b * heads + h) * q_len + i
  const int b = row / (p.heads * p.q_len);
  const int kv_len = prefix_len_of(p, b) + p.q_len;
  const int n = min(chunk_keys, max(0, kv_len - chunk0));  // the chunk's columns this element uses
  float* s = w.scores + int64_t(row) * chunk_keys;
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < n; c += blockDim.x) mx = nan_max_plain(mx, s[c]);
  mx = block_reduce(mx, true);
  const float m_old = chunk0 == 0 ? -INFINITY : w.m[row];
  const float m = nan_max_plain(m_old, mx);  // -inf while nothing is visible, NaN once a NaN is seen
  float sum = 0.f;
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const float e = s[c] == -INFINITY ? 0.f : expf(s[c] - m);  // masked: 0 (the sum skips it anyway)
    s[c] = e;
    sum += e;
  }
  sum = block_reduce(sum, false);
  if (threadIdx.x == 0) {
    const float corr = m_old == -INFINITY ? 0.f : expf(m_old - m);  // nothing before: nothing to rescale
    const float l = (chunk0 == 0 ? 0.f : w.l[row] * corr) + sum;
    w.corr[row] = corr;
    w.l[row] = l;
    w.m[row] = m;
    if (last) p.lse[row] = m + logf(l);  // lse is batch x heads x q_len: the rows' order
  }
}

__global__ void __launch_bounds__(kLatent)
    naive_output(Params p, Workspace w, int chunk0, int chunk_keys, bool last) {
  const int d = threadIdx.x;
  const int i = blockIdx.x % p.q_len;
  const int h = (blockIdx.x / p.q_len) % p.heads;
  const int b = blockIdx.x / (p.q_len * p.heads);
  const int64_t row = (int64_t(b) * p.heads + h) * p.q_len + i;
  const int prefix = prefix_len_of(p, b);
  const int n = min(chunk_keys, max(0, prefix + p.q_len - chunk0));
  const float* prob = w.scores + row * chunk_keys;
  float acc = chunk0 == 0 ? 0.f : w.acc[row * kLatent + d] * w.corr[row];
  for (int c = 0; c < n; ++c) {
    if (!visible(p, b, prefix, i, chunk0 + c)) continue;  // by the mask, not by a zero weight
    acc += prob[c] * bf16_to_float(kv_row(p, b, chunk0 + c)[d]);
  }
  if (last) p.out[((int64_t(b) * p.q_len + i) * p.heads + h) * kLatent + d] = float_to_bf16(acc / w.l[row]);
  else w.acc[row * kLatent + d] = acc;
}

}  // namespace

Plan plan_naive(const Params& p, int /*num_sms*/, int path) {
  Plan plan;
  if (path != kAnyPath && path != 0) return plan;  // one path
  const int64_t rows = int64_t(p.batch) * p.heads * p.q_len;
  const int chunk = chunk_keys_of(p);
  plan.num_splits = (p.kv_cols + chunk - 1) / chunk;  // chunks, taken one after another
  plan.split_len = chunk;
  plan.blocks = chunk / kScoreThreads * p.q_len * p.batch * p.heads;  // score kernel, a chunk
  plan.threads = kScoreThreads;
  plan.rows_per_block = 1;
  plan.workspace_bytes = (rows * chunk + rows * (kLatent + 3)) * int64_t(sizeof(float));
  return plan;
}

int launch_naive(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  const int chunk = plan.split_len;
  const Workspace w = carve(p, chunk, workspace);
  const int64_t rows = int64_t(p.batch) * p.heads * p.q_len;
  const dim3 score_grid(chunk / kScoreThreads, p.q_len, p.batch * p.heads);
  for (int chunk0 = 0; chunk0 < p.kv_cols; chunk0 += chunk) {
    naive_scores<<<score_grid, kScoreThreads, 0, stream>>>(p, w, chunk0, chunk);
    const bool last = chunk0 + chunk >= p.kv_cols;
    naive_softmax<<<int(rows), kSoftmaxThreads, 0, stream>>>(p, w, chunk0, chunk, last);
    naive_output<<<int(rows), kLatent, 0, stream>>>(p, w, chunk0, chunk, last);
  }
  return int(cudaGetLastError());
}

}  // namespace verify_attn
