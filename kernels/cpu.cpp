// CPU versions of the kernels, so that tests, CI and the benchmark suite run with no GPU.
// Same algorithms as their CUDA twins: naive materialises each query's scores, flash
// splits the KV range, runs an online softmax over tiles and merges the splits by lse.
#include <algorithm>
#include <cmath>
#include <functional>
#include <thread>
#include <vector>

#include "verify_attn.h"

namespace verify_attn {
namespace {

constexpr int kCpuSplitKeys = 1024;  // flash: keys a split (at most 4 splits a hardware thread)
constexpr int kCpuTileKeys = 64;     // flash: keys a tile of the online softmax

int hardware_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

// Runs fn(0..n-1) on all hardware threads, each thread taking a contiguous block.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  const int64_t workers = std::min<int64_t>(n, hardware_threads());
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int64_t i = n * w / workers; i < n * (w + 1) / workers; ++i) fn(i);
    });
  for (auto& t : pool) t.join();
}

const uint16_t* q_row(const Params& p, int b, int i, int h) {
  return p.q + ((int64_t(b) * p.q_len + i) * p.heads + h) * kKeyDim;
}

float dot(const uint16_t* a, const uint16_t* b) {
  float acc = 0.f;
  for (int d = 0; d < kKeyDim; ++d) acc += bf16_to_float(a[d]) * bf16_to_float(b[d]);
  return acc;
}

bool visible(const Params& p, int b, int prefix, int i, int t) {
  return t < prefix || tree_visible(p.parent + b * p.q_len, i, t - prefix);
}

// The NaN contract (tests/test_nan.py): a non-finite score of an attended key is a NaN, so
// that an inf in q or in an attended row poisons the whole query (an inf giving a score of
// -inf would otherwise weigh 0 and leave lse finite); NaN then propagates through the max,
// the sums and the merge. Masked keys are skipped by the mask, never weighed by 0.
float attended_score(float s) { return std::isfinite(s) ? s : NAN; }

// max that returns NaN when either argument is NaN (std::max keeps or drops it by order).
float nan_max(float a, float b) { return (a != a || b != b) ? NAN : std::max(a, b); }

// exp(a - m) for the weight of a term of max m: 0 for an empty term (a = -inf), whatever m.
float weight(float a, float m) { return a == -INFINITY ? 0.f : std::exp(a - m); }

// Rows batch element b uses (its prefix and the tree), the most over the batch.
int max_kv_len(const Params& p) {
  int n = 0;
  for (int b = 0; b < p.batch; ++b) n = std::max(n, prefix_len_of(p, b) + p.q_len);
  return n;
}

}  // namespace

void naive_cpu(const Params& p) {
  parallel_for(int64_t(p.batch) * p.heads * p.q_len, [&](int64_t row) {
    const int i = int(row % p.q_len), h = int(row / p.q_len % p.heads), b = int(row / p.q_len / p.heads);
    const int prefix = prefix_len_of(p, b), kv_len = prefix + p.q_len;
    std::vector<float> s(kv_len);  // the rows this element uses, not kv_cols
    std::vector<char> vis(kv_len);
    float m = -INFINITY;
    for (int t = 0; t < kv_len; ++t) {
      vis[t] = visible(p, b, prefix, i, t);
      s[t] = vis[t] ? attended_score(dot(q_row(p, b, i, h), kv_row(p, b, t)) * p.scale) : -INFINITY;
      m = nan_max(m, s[t]);
    }
    float sum = 0.f;
    std::vector<float> acc(kLatent, 0.f);
    for (int t = 0; t < kv_len; ++t) {
      if (!vis[t]) continue;  // by the mask: a masked row's values never enter the sum
      const float e = std::exp(s[t] - m);
      sum += e;
      const uint16_t* v = kv_row(p, b, t);
      for (int d = 0; d < kLatent; ++d) acc[d] += e * bf16_to_float(v[d]);
    }
    uint16_t* out = p.out + ((int64_t(b) * p.q_len + i) * p.heads + h) * kLatent;
    for (int d = 0; d < kLatent; ++d) out[d] = float_to_bf16(acc[d] / sum);
    p.lse[row] = m + std::log(sum);  // row is (b * heads + h) * q_len + i: lse's order
  });
}

void flash_cpu(const Params& p) {
  // Splits of the rows actually used (not of kv_cols), at most 4 a hardware thread; the
  // per-split buffers are splits x rows x 513 floats.
  const int kv_used = max_kv_len(p);
  const int most = std::max(1, std::min((kv_used + kCpuSplitKeys - 1) / kCpuSplitKeys, 4 * hardware_threads()));
  const int split_keys =
      std::max(kCpuSplitKeys, ((kv_used + most - 1) / most + kCpuTileKeys - 1) / kCpuTileKeys * kCpuTileKeys);
  const int splits = std::max(1, (kv_used + split_keys - 1) / split_keys);
  const int64_t rows = int64_t(p.batch) * p.heads * p.q_len;  // lse order
  std::vector<float> part_out(size_t(splits) * rows * kLatent), part_lse(size_t(splits) * rows);

  // One task per (b, h, split) covers every query, so each key row is read once per head.
  parallel_for(int64_t(p.batch) * p.heads * splits, [&](int64_t task) {
    const int split = int(task % splits), h = int(task / splits % p.heads), b = int(task / splits / p.heads);
    const int prefix = prefix_len_of(p, b);
    const int begin = split * split_keys, end = std::min(begin + split_keys, prefix + p.q_len);
    std::vector<float> m(p.q_len, -INFINITY), l(p.q_len, 0.f), acc(size_t(p.q_len) * kLatent, 0.f);
    float s[kCpuTileKeys];
    bool vis[kCpuTileKeys];
    for (int t0 = begin; t0 < end; t0 += kCpuTileKeys) {
      const int n = std::min(kCpuTileKeys, end - t0);
      for (int i = 0; i < p.q_len; ++i) {
        float mx = -INFINITY;
        for (int k = 0; k < n; ++k) {
          const int t = t0 + k;
          vis[k] = visible(p, b, prefix, i, t);
          s[k] = vis[k] ? attended_score(dot(q_row(p, b, i, h), kv_row(p, b, t)) * p.scale) : -INFINITY;
          mx = nan_max(mx, s[k]);
        }
        const float m_new = nan_max(m[i], mx);
        if (m_new == -INFINITY) continue;  // nothing visible yet
        const float corr = weight(m[i], m_new);
        float* a = &acc[size_t(i) * kLatent];
        for (int d = 0; d < kLatent; ++d) a[d] *= corr;
        l[i] *= corr;
        for (int k = 0; k < n; ++k) {
          if (!vis[k]) continue;  // by the mask, not by a zero weight
          const float e = std::exp(s[k] - m_new);
          l[i] += e;
          const uint16_t* v = kv_row(p, b, t0 + k);
          for (int d = 0; d < kLatent; ++d) a[d] += e * bf16_to_float(v[d]);
        }
        m[i] = m_new;
      }
    }
    for (int i = 0; i < p.q_len; ++i) {
      const int64_t row = (int64_t(b) * p.heads + h) * p.q_len + i;
      const bool empty = l[i] == 0.f;  // no visible key in this split (NaN is not empty)
      const float inv = empty ? 0.f : 1.f / l[i];
      for (int d = 0; d < kLatent; ++d) part_out[(split * rows + row) * kLatent + d] = acc[size_t(i) * kLatent + d] * inv;
      part_lse[split * rows + row] = empty ? -INFINITY : m[i] + std::log(l[i]);
    }
  });

  parallel_for(rows, [&](int64_t row) {
    const int i = int(row % p.q_len), h = int(row / p.q_len % p.heads), b = int(row / p.q_len / p.heads);
    float mx = -INFINITY;
    for (int s = 0; s < splits; ++s) mx = nan_max(mx, part_lse[s * rows + row]);
    float wsum = 0.f, acc[kLatent] = {};
    for (int s = 0; s < splits; ++s) {
      if (part_lse[s * rows + row] == -INFINITY) continue;  // an empty split weighs 0
      const float w = std::exp(part_lse[s * rows + row] - mx);
      wsum += w;
      for (int d = 0; d < kLatent; ++d) acc[d] += w * part_out[(s * rows + row) * kLatent + d];
    }
    uint16_t* out = p.out + ((int64_t(b) * p.q_len + i) * p.heads + h) * kLatent;
    for (int d = 0; d < kLatent; ++d) out[d] = float_to_bf16(acc[d] / wsum);
    p.lse[row] = mx + std::log(wsum);
  });
}

}  // namespace verify_attn
