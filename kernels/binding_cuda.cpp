// The CUDA backend: workspaces from torch's caching allocator and launches on the current
// stream, so the ops work inside CUDA graph capture and torch.compile.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include "binding.h"

namespace verify_attn {
namespace {

at::Tensor workspace(const at::Tensor& like, int64_t floats) {
  return at::empty({std::max<int64_t>(floats, 1)}, like.options().dtype(at::kFloat));
}

// A failed launch is not bad input: RuntimeError in Python, not ValueError.
void check_launch(int err, const char* impl) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("verify_attn::") + impl +
                             " launch failed: " + cudaGetErrorString(cudaError_t(err)));
}

void naive_cuda(const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices,
                const at::Tensor& parent, const at::Tensor& prefix_lens, double scale, at::Tensor& out, at::Tensor& lse) {
  const Params p = check_inputs(q, kv, kv_indices, parent, prefix_lens, scale, out, lse);
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor ws = workspace(q, naive_workspace_floats(p));
  check_launch(launch_naive(p, ws.data_ptr<float>(), at::cuda::getCurrentCUDAStream()), "naive");
}

void flash_cuda(const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices,
                const at::Tensor& parent, const at::Tensor& prefix_lens, double scale, at::Tensor& out, at::Tensor& lse) {
  const Params p = check_inputs(q, kv, kv_indices, parent, prefix_lens, scale, out, lse);
  const c10::cuda::CUDAGuard guard(q.device());
  const FlashPlan plan = plan_flash(p, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  at::Tensor ws = workspace(q, flash_workspace_floats(p, plan));
  check_launch(launch_flash(p, plan, ws.data_ptr<float>(), at::cuda::getCurrentCUDAStream()), "flash");
}

}  // namespace

TORCH_LIBRARY_IMPL(verify_attn, CUDA, m) {
  m.impl("naive", &naive_cuda);
  m.impl("flash", &flash_cuda);
}

}  // namespace verify_attn
