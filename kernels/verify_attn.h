// The MLA verify attention of tree speculative decoding: shared definitions.
//
// Plain C++ (no CUDA, no torch) so that the CPU kernels, the CUDA kernels and the torch
// binding all include it, and nvcc can compile each kernel file on its own.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define VA_HD __host__ __device__ __forceinline__
#else
#define VA_HD inline
#endif

// Same spelling as CUDA's own typedef, so launchers can be declared without CUDA headers.
typedef struct CUstream_st* cudaStream_t;

namespace verify_attn {

constexpr int kLatent = 512;              // Dl: latent width, also the value width
constexpr int kRope = 64;                 // Dr: rope width
constexpr int kKeyDim = kLatent + kRope;  // one cache row: latent || rope

// Limits every implementation accepts; the binding rejects larger inputs by name.
constexpr int kMaxQLen = 1024;
constexpr int kMaxKvLen = 1 << 24;

// One plain struct for every kernel. bf16 tensors are passed as their 16-bit patterns.
struct Params {
  const uint16_t* q;           // batch x q_len x heads x 576
  const uint16_t* kv;          // contiguous: batch x kv_cols x 576; paged: pool_rows x 576
  const int32_t* kv_indices;   // batch x kv_cols rows of the pool, or nullptr (contiguous)
  const int32_t* parent;       // batch x q_len, parent[0] = -1, parent[i] < i
  const int32_t* prefix_lens;  // batch; element b uses kv rows [0, prefix_lens[b] + q_len)
  uint16_t* out;               // batch x q_len x heads x 512
  float* lse;                  // batch x heads x q_len, natural log
  float scale;
  int batch;
  int heads;
  int q_len;
  int kv_cols;        // kv rows per batch element in the tensor (>= every prefix_len + q_len)
  int64_t pool_rows;  // paged: rows in the pool; contiguous: batch * kv_cols
};

VA_HD float bf16_to_float(uint16_t x) {
  union { uint32_t u; float f; } v;
  v.u = uint32_t(x) << 16;
  return v.f;
}

// Round to nearest even; NaN stays NaN.
VA_HD uint16_t float_to_bf16(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return uint16_t((v.u >> 16) | 0x40);
  return uint16_t((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

// Kernels never trust the values they are given (the Python entry point checks them): a
// prefix or an index out of range is clamped so that no call can read outside its tensors.
VA_HD int prefix_len_of(const Params& p, int b) {
  int n = p.prefix_lens[b];
  int hi = p.kv_cols - p.q_len;
  return n < 0 ? 0 : (n > hi ? hi : n);
}

VA_HD const uint16_t* kv_row(const Params& p, int b, int t) {
  int64_t row = int64_t(b) * p.kv_cols + t;
  if (p.kv_indices != nullptr) {
    row = p.kv_indices[row];
    if (row < 0 || row >= p.pool_rows) row = 0;
  }
  return p.kv + row * kKeyDim;
}

// Query i sees tree row j when j is i or one of its ancestors. parent[k] < k, so walking up
// from i meets j exactly when j is an ancestor; a parent that breaks the rule ends the walk,
// so a malformed tree can give a wrong mask but never a hang.
VA_HD bool tree_visible(const int32_t* parent, int i, int j) {
  int k = i;
  while (k > j) {
    int pk = parent[k];
    if (pk >= k) return false;
    k = pk;
  }
  return k == j;
}

// How a CUDA kernel divides the work, chosen on the host from the shapes and the SM count
// alone (no values are read, so planning never syncs). Recorded with every timing, so that a
// plan change shows in the history next to the time it explains.
struct Plan {
  int blocks = 0;              // thread blocks of the main kernel
  int threads = 0;             // threads a block
  int smem_bytes = 0;          // shared memory a block, static + dynamic
  int num_splits = 1;          // KV splits, merged by log-sum-exp when > 1
  int split_len = 0;           // keys a split
  int rows_per_block = 0;      // query rows (token x head pairs) a block computes
  int keys_per_tile = 0;       // cache rows a shared-memory tile
  int64_t workspace_bytes = 0; // scratch the launch needs (partial outputs, scores)
  int path = 0;                // which of the implementation's kernels runs (registry: Impl.paths)
};

// The path argument of a plan: kAnyPath lets the plan choose the best path for this GPU; a
// path number asks for that path, and a plan that cannot run it here returns blocks = 0.
constexpr int kAnyPath = -1;

// The launcher contract. For every implementation NAME of the registry
// (verify_attn/registry.py) that has CUDA sources, those sources define
//   Plan plan_NAME(const Params& p, int num_sms, int path);
//   int launch_NAME(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream);
// launch returns a cudaError_t as int; workspace holds plan.workspace_bytes (16-byte aligned).
// The plan decides the path, once; launch runs plan.path and decides nothing.
// A CPU twin, where there is one, is  void NAME_cpu(const Params& p);
// The binding that registers them as torch ops is generated from the registry (build.py).

}  // namespace verify_attn
