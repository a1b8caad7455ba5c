// The torch side of the extension: input checks shared by every backend.
#pragma once
#include <ATen/ATen.h>

#include <sstream>
#include <stdexcept>

#include "verify_attn.h"

namespace verify_attn {

// Input errors are thrown as std::invalid_argument, which torch raises in Python as
// ValueError, the type Python gives to bad arguments.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream message;
  (message << ... << args);
  throw std::invalid_argument(message.str());
}
#define VA_CHECK(cond, ...) \
  do {                      \
    if (!(cond)) ::verify_attn::fail(__VA_ARGS__); \
  } while (0)

// Checks shapes, dtypes, devices, layouts and size limits, naming the argument at fault,
// and returns the kernels' parameter struct. Values (tree, prefixes, indices) are checked in
// Python (verify_attn.ops.check_values) since reading them from a GPU costs a sync.
Params check_inputs(const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices,
                    const at::Tensor& parent, const at::Tensor& prefix_lens, double scale,
                    const at::Tensor& out, const at::Tensor& lse);

}  // namespace verify_attn
