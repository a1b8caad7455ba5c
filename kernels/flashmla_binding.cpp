// The torch ops of the FlashMLA peer (verify_attn/flashmla.py), compiled together with three
// files of a FlashMLA checkout: its decode scheduler, its combine kernel and its sm90 dense bf16
// split-KV decode. What FlashMLA's dense_attn_decode_interface (csrc/api/dense_decode.h) does,
// minus its allocation of the outputs: the output goes straight into ours ([batch, q_len, heads,
// 512] is FlashMLA's own [batch, q_len * heads, 512] for one KV head), the lse through a
// transpose ([batch, q_len, heads] there, [batch, heads, q_len] here; both natural log).
//
//   verify_attn_flashmla::sched(cache_seqlens, q_len, heads) -> (tile_scheduler_metadata, num_splits)
//   verify_attn_flashmla::decode(q, k_pages, block_table, cache_seqlens, metadata, num_splits, scale, out, lse)
//
// The schedule depends only on the sequence lengths and the shapes: like FlashMLA's
// get_mla_metadata it is made once and reused while they stay the same.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <tuple>

#include "params.h"
#include "sm90/decode/dense/splitkv_mla.h"
#include "smxx/decode/combine/combine.h"
#include "smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h"

namespace verify_attn_flashmla {

constexpr int kPage = 64;      // FlashMLA's page_block_size (the only one it takes)
constexpr int kHeadDimK = 576;
constexpr int kHeadDimV = 512;

// Bad input is std::invalid_argument (ValueError in Python). Numbers go through std::to_string:
// no ostream (kernels/binding.h says why), so no TORCH_CHECK with numbers either.
[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument("flashmla: " + message); }
#define FM_CHECK(cond, message) \
  do {                          \
    if (!(cond)) fail(message); \
  } while (0)

std::string str(int64_t v) { return std::to_string(v); }

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
  FM_CHECK(t.is_cuda(), std::string(name) + " must be a CUDA tensor");
  FM_CHECK(t.scalar_type() == dtype, std::string(name) + " must be " + c10::toString(dtype) + ", got " +
                                         c10::toString(t.scalar_type()));
  FM_CHECK(t.dim() == dim, std::string(name) + " must have " + str(dim) + " dimensions, got " + str(t.dim()));
}

int device_attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  cudaDeviceGetAttribute(&v, attr, device);
  return v;
}

// FlashMLA's split of the SMs among (batch element, q block) pairs, for one KV head.
int num_sm_parts(int device, int64_t q_len, int64_t heads) {
  const int64_t q_rows = q_len * heads;  // q_seq_per_hk
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount, device);
  return std::max<int>(sms / int((q_rows + 63) / 64), 1);
}

std::tuple<at::Tensor, at::Tensor> sched(const at::Tensor& cache_seqlens, int64_t q_len, int64_t heads) {
  check_tensor(cache_seqlens, "cache_seqlens", at::kInt, 1);
  FM_CHECK(cache_seqlens.is_contiguous(), "cache_seqlens must be contiguous");
  FM_CHECK(q_len >= 1 && heads >= 1, "q_len and heads must be positive");
  const c10::cuda::CUDAGuard guard(cache_seqlens.device());
  const int64_t batch = cache_seqlens.size(0);
  FM_CHECK(batch >= 1, "batch must be positive");
  const int parts = num_sm_parts(cache_seqlens.get_device(), q_len, heads);
  auto opts = cache_seqlens.options();
  at::Tensor meta = at::empty({parts, int64_t(sizeof(DecodingSchedMeta) / sizeof(int))}, opts);
  at::Tensor splits = at::empty({batch + 1}, opts);
  GetDecodeSchedMetaParams p = {int(batch), int(q_len), kPage, /*fixed_overhead_num_blocks=*/5,
                                /*topk=*/-1, /*extra_topk=*/-1, nullptr, nullptr,
                                cache_seqlens.data_ptr<int>(),
                                reinterpret_cast<DecodingSchedMeta*>(meta.data_ptr()), splits.data_ptr<int>(),
                                parts, c10::cuda::getCurrentCUDAStream().stream()};
  smxx::decode::run_get_decoding_sched_meta_kernel(p);
  return {meta, splits};
}

void decode(const at::Tensor& q, const at::Tensor& k_pages, const at::Tensor& block_table,
            const at::Tensor& cache_seqlens, const at::Tensor& meta, const at::Tensor& splits, double scale,
            at::Tensor& out, at::Tensor& lse) {
  check_tensor(q, "q", at::kBFloat16, 4);
  check_tensor(k_pages, "k_pages", at::kBFloat16, 4);
  check_tensor(block_table, "block_table", at::kInt, 2);
  check_tensor(cache_seqlens, "cache_seqlens", at::kInt, 1);
  check_tensor(meta, "tile_scheduler_metadata", at::kInt, 2);
  check_tensor(splits, "num_splits", at::kInt, 1);
  check_tensor(out, "out", at::kBFloat16, 4);
  check_tensor(lse, "lse", at::kFloat, 3);
  const int device = q.get_device();
  const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, device);
  const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor, device);
  FM_CHECK(major == 9 && minor == 0, "FlashMLA's dense decode runs on sm_90 only, this GPU is sm_" + str(major) +
                                         str(minor));
  const int64_t batch = q.size(0), q_len = q.size(1), heads = q.size(2);
  const int64_t q_rows = q_len * heads;
  FM_CHECK(q.size(3) == kHeadDimK, "q must be [batch, q_len, heads, 576]");
  FM_CHECK(q.is_contiguous(), "q must be contiguous");
  FM_CHECK(k_pages.size(1) == kPage && k_pages.size(2) == 1 && k_pages.size(3) == kHeadDimK,
           "k_pages must be [pages, 64, 1, 576]");
  FM_CHECK(k_pages.stride(3) == 1, "k_pages must have a contiguous last dimension");
  FM_CHECK(block_table.size(0) == batch && block_table.stride(1) == 1,
           "block_table must be [batch, pages per element] with a contiguous last dimension");
  FM_CHECK(cache_seqlens.size(0) == batch && cache_seqlens.is_contiguous(), "cache_seqlens must be [batch]");
  const int parts = num_sm_parts(device, q_len, heads);
  FM_CHECK(meta.size(0) == parts && meta.size(1) == int64_t(sizeof(DecodingSchedMeta) / sizeof(int)) &&
               meta.is_contiguous(),
           "tile_scheduler_metadata must come from sched() with this q_len and head count");
  FM_CHECK(splits.size(0) == batch + 1 && splits.is_contiguous(), "num_splits must be [batch + 1]");
  FM_CHECK(out.size(0) == batch && out.size(1) == q_len && out.size(2) == heads && out.size(3) == kHeadDimV &&
               out.is_contiguous(),
           "out must be a contiguous [batch, q_len, heads, 512]");
  FM_CHECK(lse.size(0) == batch && lse.size(1) == heads && lse.size(2) == q_len, "lse must be [batch, heads, q_len]");
  // TMA: 16-byte aligned bases (the strides are multiples of 16 bytes by the shapes above).
  for (const void* ptr : {q.data_ptr(), k_pages.data_ptr(), out.data_ptr()})
    FM_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "q, k_pages and out must be 16-byte aligned");
  FM_CHECK(k_pages.stride(0) % 8 == 0 && k_pages.stride(1) % 8 == 0, "k_pages strides must be multiples of 8");

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  auto fopts = q.options().dtype(at::kFloat);
  at::Tensor lse_rows = at::empty({batch, q_rows}, fopts);  // FlashMLA's [batch, q_len, heads]
  const int64_t total_splits = batch + parts;
  at::Tensor lse_accum = at::empty({total_splits, q_rows}, fopts);
  at::Tensor out_accum = at::empty({total_splits, q_rows, kHeadDimV}, fopts);

  DenseAttnDecodeParams p{};
  p.b = int(batch);
  p.s_q = int(q_len);
  p.q_seq_per_hk = int(q_rows);
  p.d = kHeadDimK;
  p.d_v = kHeadDimV;
  p.h_q = int(heads);
  p.h_k = 1;
  p.num_blocks = int(k_pages.size(0));
  p.q_head_per_hk = int(heads);
  p.is_causal = q_len > 1;  // a chain tree: query i sees the prefix and tree rows 0..i
  p.scale_softmax = float(scale);
  p.scale_softmax_log2 = float(scale * M_LOG2E);
  p.q_ptr = q.data_ptr();
  p.k_ptr = k_pages.data_ptr();
  p.o_ptr = out.data_ptr();
  p.softmax_lse_ptr = lse_rows.data_ptr<float>();
  // In elements, for FlashMLA's views q [batch, q_rows, 1, 576] and out [batch, 1, q_rows, 512].
  p.q_batch_stride = q_rows * kHeadDimK;
  p.q_row_stride = kHeadDimK;
  p.q_head_stride = kHeadDimK;
  p.k_batch_stride = k_pages.stride(0);
  p.k_row_stride = k_pages.stride(1);
  p.k_head_stride = k_pages.stride(2);
  p.o_batch_stride = q_rows * kHeadDimV;
  p.o_row_stride = kHeadDimV;
  p.o_head_stride = q_rows * kHeadDimV;
  p.block_table = block_table.data_ptr<int>();
  p.block_table_batch_stride = block_table.stride(0);
  p.page_block_size = kPage;
  p.seqlens_k_ptr = cache_seqlens.data_ptr<int>();
  p.tile_scheduler_metadata_ptr = reinterpret_cast<DecodingSchedMeta*>(meta.data_ptr());
  p.num_sm_parts = parts;
  p.num_splits_ptr = splits.data_ptr<int>();
  p.total_num_splits = int(total_splits);
  p.softmax_lseaccum_ptr = lse_accum.data_ptr<float>();
  p.oaccum_ptr = out_accum.data_ptr<float>();
  p.stream = stream;
  sm90::run_flash_splitkv_mla_kernel<cutlass::bfloat16_t>(p);

  const int row = int(heads * kHeadDimV);
  CombineParams c = {int(batch), int(q_len), int(heads), kHeadDimV,
                     p.softmax_lse_ptr, p.o_ptr, int(q_rows), int(heads), int(q_rows) * kHeadDimV, row, kHeadDimV,
                     p.softmax_lseaccum_ptr, p.oaccum_ptr, int(q_rows), int(heads), int(q_rows) * kHeadDimV, row,
                     kHeadDimV, p.tile_scheduler_metadata_ptr, p.num_splits_ptr, parts,
                     /*attn_sink=*/nullptr, stream};
  smxx::decode::run_flash_mla_combine_kernel<cutlass::bfloat16_t>(c);

  lse.copy_(lse_rows.view({batch, q_len, heads}).transpose(1, 2));
}

TORCH_LIBRARY(verify_attn_flashmla, m) {
  m.def("sched(Tensor cache_seqlens, int q_len, int heads) -> (Tensor, Tensor)");
  m.def("decode(Tensor q, Tensor k_pages, Tensor block_table, Tensor cache_seqlens, Tensor metadata, "
        "Tensor num_splits, float scale, Tensor(a!) out, Tensor(b!) lse) -> ()");
}

TORCH_LIBRARY_IMPL(verify_attn_flashmla, CUDA, m) {
  m.impl("sched", &sched);
  m.impl("decode", &decode);
}

}  // namespace verify_attn_flashmla
