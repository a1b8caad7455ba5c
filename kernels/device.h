// Device helpers every CUDA kernel of the library shares: constants, the NaN-aware max,
// cp.async, exp2 and bf16 packing, the non-finite test of stored bf16 values.
//
// Included by the .cu files only (nvcc); each kernel file compiles on its own.
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace verify_attn {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// max that returns NaN when either argument is NaN (fmaxf would return the other one).
// Written in plain C: naive keeps this form, so the baseline every ratio divides by stays
// the code it was measured as.
__device__ __forceinline__ float nan_max_plain(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}
// The same, one instruction from sm_80 on.
__device__ __forceinline__ float nan_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return nan_max_plain(a, b);
#endif
}

// x where x is finite, else a NaN, in one instruction: x * 0 is +-0 for a finite x (x + +-0
// is x, exactly, zeros and subnormals included: no ftz) and a NaN for an inf or a NaN. In
// asm so that no x * 0 -> 0 folding can drop the test.
__device__ __forceinline__ float nan_unless_finite(float x) {
  float r;
  asm("fma.rn.f32 %0, %1, 0f00000000, %1;" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float ex2(float x) {  // 2^x, -inf -> +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// (lo, hi) -> bf16x2, lo in the low half; round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// Zeroes the non-finite bf16 halves of a word (exponent all ones); returns whether there were any.
__device__ __forceinline__ bool zero_nonfinite(uint32_t& w) {
  const bool lo = (w & 0x7f80u) == 0x7f80u, hi = (w & 0x7f800000u) == 0x7f800000u;
  if (lo) w &= 0xffff0000u;
  if (hi) w &= 0x0000ffffu;
  return lo || hi;
}

// Programmatic dependent launch (compute capability 9.0 on; tc_host.h launches tc's grids so):
// a grid's blocks may start while the stream's previous grid drains. Each waits here for that
// grid's end and its writes before touching memory. No-op on older GPUs and in a grid launched
// plainly. (No explicit launch_dependents: docs/tc.md, "Launch and merge", says why.)
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; src_bytes 0 zero fills (src must still be valid).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v));
}
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

}  // namespace verify_attn
