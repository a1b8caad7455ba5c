// The torch side of the extension: input checks shared by every backend.
#pragma once
#include <ATen/ATen.h>

#include "verify_attn.h"

namespace verify_attn {

// Checks shapes, dtypes, devices, layouts and size limits, naming the argument at fault,
// and returns the kernels' parameter struct. Values (tree, prefixes, indices) are checked in
// Python (verify_attn.ops.check_values) since reading them from a GPU costs a sync.
Params check_inputs(const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices,
                    const at::Tensor& parent, const at::Tensor& prefix_lens, double scale,
                    const at::Tensor& out, const at::Tensor& lse);

}  // namespace verify_attn
