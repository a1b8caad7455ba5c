// The torch side of the extension: input checks shared by every backend.
#pragma once
#include <ATen/ATen.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "verify_attn.h"

namespace verify_attn {

// The pieces of an error message as text. No ostream: on the H200's torch 2.11 build, any
// number streamed into an ostringstream inside this extension crashed the process (strings
// and dtypes streamed fine), so numbers go through std::to_string / snprintf.
inline std::string text(const char* s) { return s; }
inline std::string text(const std::string& s) { return s; }
inline std::string text(at::ScalarType t) { return c10::toString(t); }
inline std::string text(const c10::Device& d) { return d.str(); }
inline std::string text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
std::string text(T v) { return std::to_string(v); }

// Input errors are thrown as std::invalid_argument, which torch raises in Python as
// ValueError, the type Python gives to bad arguments.
template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  std::string message;
  (message.append(text(args)), ...);
  throw std::invalid_argument(message);
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

// Every implementation's op has this schema; the registry's ops are generated from it
// (verify_attn/build.py writes impls.cpp and impls_cuda.cpp into the build).
constexpr const char* kOpArgs =
    "(Tensor q, Tensor kv, Tensor? kv_indices, Tensor parent, Tensor prefix_lens, float scale, "
    "Tensor(a!) out, Tensor(b!) lse) -> ()";
// NAME_plan: the launch plan a CUDA implementation would use for these inputs, as
// [blocks, threads, smem_bytes, num_splits, split_len, rows_per_block, keys_per_tile, workspace_bytes].
constexpr const char* kPlanArgs =
    "(Tensor q, Tensor kv, Tensor? kv_indices, Tensor parent, Tensor prefix_lens, float scale, "
    "Tensor out, Tensor lse) -> int[]";

// A CPU twin as an op body.
template <void (*Kernel)(const Params&)>
void run_cpu(const at::Tensor& q, const at::Tensor& kv, const c10::optional<at::Tensor>& kv_indices,
             const at::Tensor& parent, const at::Tensor& prefix_lens, double scale, at::Tensor& out, at::Tensor& lse) {
  Kernel(check_inputs(q, kv, kv_indices, parent, prefix_lens, scale, out, lse));
}

}  // namespace verify_attn
