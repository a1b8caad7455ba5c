// The CUDA side of an implementation's op: plan, workspace from torch's caching allocator,
// launch on the current stream, so the ops work inside CUDA graph capture and torch.compile.
#pragma once
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <vector>

#include "binding.h"

namespace verify_attn {

using PlanFn = Plan (*)(const Params&, int, int);
using LaunchFn = int (*)(const Params&, const Plan&, void*, cudaStream_t);

inline int num_sms(const at::Tensor& q) {
  int n = 0;
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, q.device().index());
  return n;
}

inline void run_cuda(PlanFn plan_fn, LaunchFn launch_fn, int path, const char* impl, const at::Tensor& q,
                     const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices, const at::Tensor& parent,
                     const at::Tensor& prefix_lens, double scale, at::Tensor& out, at::Tensor& lse) {
  const Params p = check_inputs(q, kv, kv_indices, parent, prefix_lens, scale, out, lse);
  const c10::cuda::CUDAGuard guard(q.device());
  const Plan plan = plan_fn(p, num_sms(q), path);
  // A plan without blocks has no path for this GPU (a variant pinned to another architecture's path).
  if (plan.blocks == 0)
    throw std::runtime_error(std::string("verify_attn::") + impl + ": " +
                             (path == kAnyPath ? std::string("no kernel path") : "kernel path " + std::to_string(path)) +
                             " of it runs on this GPU");
  at::Tensor ws;
  if (plan.workspace_bytes > 0) ws = at::empty({plan.workspace_bytes}, q.options().dtype(at::kByte));
  const int err = launch_fn(p, plan, ws.defined() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream());
  // A failed launch is not bad input: RuntimeError in Python, not ValueError.
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("verify_attn::") + impl + " launch failed: " +
                             cudaGetErrorString(cudaError_t(err)));
}

inline std::vector<int64_t> plan_cuda(PlanFn plan_fn, int path, const at::Tensor& q, const at::Tensor& kv,
                                      const c10::optional<at::Tensor>& kv_indices, const at::Tensor& parent,
                                      const at::Tensor& prefix_lens, double scale, const at::Tensor& out,
                                      const at::Tensor& lse) {
  const Params p = check_inputs(q, kv, kv_indices, parent, prefix_lens, scale, out, lse);
  const c10::cuda::CUDAGuard guard(q.device());
  const Plan s = plan_fn(p, num_sms(q), path);
  return {s.blocks, s.threads, s.smem_bytes, s.num_splits, s.split_len, s.rows_per_block, s.keys_per_tile,
          s.workspace_bytes, s.path};
}

}  // namespace verify_attn
