// tc's host side shared by its files: the plan's derived layout, the kernel arguments, one
// kernel's launch, and the launchers of the paths, each in a .cu of its own (tc_mma.cu,
// tc_wgmma.cu, tc_wgmma_t.cu, tc_wgmma_ws.cu, tc_wgmma_tma.cu) so that nvcc compiles them
// in parallel; tc.cu plans, picks the path's launcher and merges the splits.
#pragma once
#include <cuda_runtime.h>

#include "tc.h"

namespace verify_attn {

// The path's kernel for the plan (blocks, threads and shared memory from it); 0 or a cudaError_t.
int tc_launch_mma(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream);
int tc_launch_wgmma(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream);
int tc_launch_wgmma_t(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream);
int tc_launch_wgmma_ws(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream);
int tc_launch_wgmma_tma(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream);

namespace {

// tc's paths (Plan::path; verify_attn/registry.py names them): mma.sync runs from sm_80 up,
// wgmma, wgmma_t (the transposed MMAs for few rows), wgmma_ws (warp-specialized: a
// producer warpgroup and two consumers on alternate tiles) and wgmma_tma (the same two
// consumers alone, each refilling by TMA what it frees) on compute capability 9.0 alone,
// where the build compiles sm_90a. mma_mid and mma_small are mma.sync in the configuration a
// smaller part's shared memory gives (an A100's 163 KB a block, an sm_89 or sm_120 card's 99 KB),
// pinned only, so that a GPU with more memory checks what those parts run.
constexpr int kPathMma = 0;
constexpr int kPathWgmma = 1;
constexpr int kPathWgmmaT = 2;
constexpr int kPathWgmmaWs = 3;
constexpr int kPathWgmmaTma = 4;
constexpr int kPathMmaMid = 5;
constexpr int kPathMmaSmall = 6;
// The opt-in shared memory a block of those parts (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr int kOptinMid = 166912, kOptinSmall = 101376;

inline int64_t align16(int64_t x) { return (x + 15) / 16 * 16; }

struct Layout {  // the plan's derived values, recomputed identically by plan and launch
  int R, groups, group_rows;
  int slots;        // partial slots in the workspace (0: none, written directly)
  int deal;         // dealt mode: S slots of concatenated tiles (wgmma_ws or wgmma_tma, batch > 1, splits > 1); else 0
  int grid_y;       // blocks a m-group
  int merge_parts;  // warps the merge gives a row (1, 2 or kMergeRowWarps: tc_merge_rows)
  int64_t ws_o_bytes, ws_lse_bytes, meta_bytes;
};

inline Layout layout_of(const Params& p, const Plan& plan) {
  Layout l;
  l.R = p.heads * p.q_len;
  l.groups = (l.R + kRows - 1) / kRows;
  l.group_rows = ((l.R + l.groups - 1) / l.groups + 15) / 16 * 16;
  // wgmma_ws and wgmma_tma with batch > 1 deal num_splits slots over the concatenated elements (tc.h,
  // deal_locate): piece (s, b) writes partial s + b, so S + batch of them; every other split
  // plan gives each element num_splits slots of its own.
  l.deal = (plan.path == kPathWgmmaWs || plan.path == kPathWgmmaTma) && p.batch > 1 && plan.num_splits > 1
               ? plan.num_splits
               : 0;
  l.slots = l.deal ? l.deal + p.batch : plan.num_splits > 1 ? plan.num_splits * p.batch : 0;
  l.grid_y = l.deal ? l.deal : l.slots ? l.slots : p.batch;
  l.ws_o_bytes = align16(int64_t(l.slots) * l.R * kLatent * 4);
  l.ws_lse_bytes = align16(int64_t(l.slots) * l.R * 4);
  l.meta_bytes = l.slots ? align16(int64_t(p.batch) * 8) : 0;
  // Few rows and many splits: a warp a row leaves the merge latency-bound on few SMs, so up to
  // 1,024 rows a row's columns are shared out over 2 warps, and up to 512 its splits over the
  // kMergeRowWarps of a block (tc_merge_rows); many rows already fill the GPU (and each part
  // repeats the row's weights).
  const int64_t rows = int64_t(l.R) * p.batch;
  l.merge_parts = rows * 2 <= kMergeWarpsWanted ? (rows * 4 <= kMergeWarpsWanted ? kMergeRowWarps : 2) : 1;
  return l;
}

// off_parent: where the kernel's staged parents start (the rest of plan.smem_bytes holds them).
inline TcArgs tc_args(const Params& p, const Plan& plan, void* workspace, int off_parent) {
  const Layout l = layout_of(p, plan);
  TcArgs a;
  a.R = l.R;
  a.group_rows = l.group_rows;
  a.slots = l.slots;
  a.deal = l.deal;
  a.parent_cap = (plan.smem_bytes - off_parent) / 4;
  a.merge_parts = l.merge_parts;
  char* ws = static_cast<char*>(workspace);
  a.ws_o = l.slots ? reinterpret_cast<float*>(ws) : nullptr;
  a.ws_lse = l.slots ? reinterpret_cast<float*>(ws + l.ws_o_bytes) : nullptr;
  a.meta = l.slots ? reinterpret_cast<int2*>(ws + l.ws_o_bytes + l.ws_lse_bytes) : nullptr;
  return a;
}

using KvMapEncode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
// The driver's cuTensorMapEncodeTiled, fetched once a process (no link against libcuda); null
// where the driver lacks it.
inline KvMapEncode kv_map_encoder() {
  static const KvMapEncode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<KvMapEncode>(fn);
  }();
  return encode;
}
// Whether kv can be a tensor map (KvMap): a contiguous cache, 16-byte aligned, under 2^31 rows,
// and a driver with the encoder. plan_tc asks it for the path that loads every unmasked tile by
// TMA (wgmma_tma).
inline bool kv_map_fits(const Params& p) {
  return kv_map_encoder() != nullptr && p.kv_indices == nullptr && (reinterpret_cast<uintptr_t>(p.kv) & 15) == 0 &&
         p.pool_rows > 0 && p.pool_rows <= INT32_MAX;
}
// m.map for a contiguous cache (KvMap); false where kv_map_fits is not: cp.async then.
inline bool encode_kv_map(const Params& p, CUtensorMap* map) {
  if (!kv_map_fits(p)) return false;
  const cuuint64_t dims[2] = {kKeyDim, cuuint64_t(p.pool_rows)};  // innermost first
  const cuuint64_t strides[1] = {kRowBytes};                      // bytes from one row to the next
  const cuuint32_t box[2] = {64, 64}, steps[2] = {1, 1};           // a plane: 64 dims (128 B) x 64 rows
  return kv_map_encoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(p.kv), dims, strides, box,
                          steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// kernel<<<grid, threads, smem, stream>>>(p, a, extra...), launched so that it may overlap the stream's
// previous grid where the GPU can (programmatic dependent launch, compute capability 9.0 on;
// the kernel waits in grid_dependency_wait before touching memory).
template <class... Extra>
int launch_overlapped(void (*kernel)(Params, TcArgs, Extra...), dim3 grid, int threads, int smem, cudaStream_t stream,
                      const Params& p, const TcArgs& a, const Extra&... extra) {
  static int major_of[64] = {};  // a device's compute capability, read once (0: not yet)
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return int(err);
  int major = dev >= 0 && dev < 64 ? major_of[dev] : 0;
  if (major == 0) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (err != cudaSuccess) return int(err);
    if (dev >= 0 && dev < 64) major_of[dev] = major;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = major >= 9 ? 1 : 0;
  err = cudaLaunchKernelEx(&cfg, kernel, p, a, extra...);
  return int(err != cudaSuccess ? err : cudaGetLastError());
}

template <auto Kernel, class... Extra>
int launch_kernel(int off_parent, const Params& p, const Plan& plan, void* workspace, cudaStream_t stream,
                  const Extra&... extra) {
  // Opt in to the dynamic shared memory once per device (legal during graph capture).
  static int set_bytes[64] = {};
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return int(err);
  if (dev < 0 || dev >= 64 || set_bytes[dev] < plan.smem_bytes) {
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, plan.smem_bytes);
    if (err != cudaSuccess) return int(err);
    if (dev >= 0 && dev < 64) set_bytes[dev] = plan.smem_bytes;
  }
  const Layout l = layout_of(p, plan);
  const dim3 grid(l.groups, l.grid_y);
  return launch_overlapped(Kernel, grid, plan.threads, plan.smem_bytes, stream, p, tc_args(p, plan, workspace, off_parent),
                           extra...);
}

}  // namespace
}  // namespace verify_attn
