// Input checks and the check op. Each implementation is its own op with one schema
// (kOpArgs in binding.h), generated from the registry:
//   verify_attn::<impl>(q, kv, kv_indices, parent, prefix_lens, scale, out!, lse!)
// writing out [batch, q_len, heads, 512] bf16 and lse [batch, heads, q_len] fp32.
#include <torch/library.h>

#include "binding.h"

namespace verify_attn {
namespace {

// "[2, 17, 16, 576]", built without an ostream (see text() in binding.h).
std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int dim, const at::Tensor& q) {
  VA_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  VA_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions, got shape ", shape_of(t));
  VA_CHECK(t.device() == q.device(), name, " must be on ", q.device(), " like q, got ", t.device());
  VA_CHECK(t.is_contiguous(), name, " must be contiguous");
  VA_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " must be 16-byte aligned");
}

void check_size(const at::Tensor& t, const char* name, int d, int64_t want, const char* what) {
  VA_CHECK(t.size(d) == want, name, ".shape[", d, "] must be ", what, " = ", want, ", got shape ", shape_of(t));
}

}  // namespace

Params check_inputs(const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices,
                    const at::Tensor& parent, const at::Tensor& prefix_lens, double scale,
                    const at::Tensor& out, const at::Tensor& lse) {
  check_tensor(q, "q", at::kBFloat16, 4, q);
  VA_CHECK(q.size(3) == kKeyDim, "q must be [batch, q_len, heads, ", kKeyDim, "], got shape ", shape_of(q));
  const int64_t batch = q.size(0), q_len = q.size(1), heads = q.size(2);
  VA_CHECK(batch >= 1 && q_len >= 1 && heads >= 1, "q must have batch, q_len and heads >= 1, got shape ", shape_of(q));
  VA_CHECK(q_len <= kMaxQLen, "q_len = ", q_len, " exceeds the supported maximum of ", kMaxQLen);
  VA_CHECK(batch * heads <= 65535, "batch * heads = ", batch * heads, " exceeds the supported maximum of 65535");
  VA_CHECK(std::isfinite(scale) && scale > 0, "scale must be a positive finite number, got ", scale);

  const bool paged = kv_indices.has_value();
  int64_t kv_cols, pool_rows;
  if (paged) {
    check_tensor(kv, "kv", at::kBFloat16, 2, q);
    VA_CHECK(kv.size(1) == kKeyDim, "kv (paged) must be [rows, ", kKeyDim, "], got shape ", shape_of(kv));
    check_tensor(*kv_indices, "kv_indices", at::kInt, 2, q);
    check_size(*kv_indices, "kv_indices", 0, batch, "batch");
    kv_cols = kv_indices->size(1);
    pool_rows = kv.size(0);
    VA_CHECK(pool_rows >= 1, "kv (paged) must hold at least one row");
  } else {
    check_tensor(kv, "kv", at::kBFloat16, 3, q);
    VA_CHECK(kv.size(2) == kKeyDim, "kv must be [batch, kv_len, ", kKeyDim, "], got shape ", shape_of(kv));
    check_size(kv, "kv", 0, batch, "batch");
    kv_cols = kv.size(1);
    pool_rows = batch * kv_cols;
  }
  VA_CHECK(kv_cols >= q_len, "kv holds ", kv_cols, " rows per batch element, fewer than q_len = ", q_len,
              " (it needs prefix_len + q_len)");
  VA_CHECK(kv_cols <= kMaxKvLen, "kv_len = ", kv_cols, " exceeds the supported maximum of ", kMaxKvLen);

  check_tensor(parent, "parent", at::kInt, 2, q);
  check_size(parent, "parent", 0, batch, "batch");
  check_size(parent, "parent", 1, q_len, "q_len");
  check_tensor(prefix_lens, "prefix_lens", at::kInt, 1, q);
  check_size(prefix_lens, "prefix_lens", 0, batch, "batch");
  check_tensor(out, "out", at::kBFloat16, 4, q);
  check_size(out, "out", 0, batch, "batch");
  check_size(out, "out", 1, q_len, "q_len");
  check_size(out, "out", 2, heads, "heads");
  check_size(out, "out", 3, kLatent, "the latent width");
  check_tensor(lse, "lse", at::kFloat, 3, q);
  check_size(lse, "lse", 0, batch, "batch");
  check_size(lse, "lse", 1, heads, "heads");
  check_size(lse, "lse", 2, q_len, "q_len");

  Params p;
  p.q = reinterpret_cast<const uint16_t*>(q.data_ptr());
  p.kv = reinterpret_cast<const uint16_t*>(kv.data_ptr());
  p.kv_indices = paged ? kv_indices->data_ptr<int32_t>() : nullptr;
  p.parent = parent.data_ptr<int32_t>();
  p.prefix_lens = prefix_lens.data_ptr<int32_t>();
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.lse = lse.data_ptr<float>();
  p.scale = float(scale);
  p.batch = int(batch);
  p.heads = int(heads);
  p.q_len = int(q_len);
  p.kv_cols = int(kv_cols);
  p.pool_rows = pool_rows;
  return p;
}

namespace {

void check_only(const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices,
                const at::Tensor& parent, const at::Tensor& prefix_lens, double scale, const at::Tensor& out,
                const at::Tensor& lse) {
  check_inputs(q, kv, kv_indices, parent, prefix_lens, scale, out, lse);
}

}  // namespace

// The checks alone, so that every implementation (the Python ones too) shares them. The
// implementations' own ops are defined by the generated impls.cpp.
TORCH_LIBRARY(verify_attn, m) {
  m.def(
      "check(Tensor q, Tensor kv, Tensor? kv_indices, Tensor parent, Tensor prefix_lens, float scale, "
      "Tensor out, Tensor lse) -> ()");
}

TORCH_LIBRARY_IMPL(verify_attn, CPU, m) { m.impl("check", &check_only); }
TORCH_LIBRARY_IMPL(verify_attn, CUDA, m) { m.impl("check", &check_only); }

}  // namespace verify_attn
