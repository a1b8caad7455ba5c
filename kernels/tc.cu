// tc's host side: the plan (path, tile, splits, shared memory) and the launch.
// The kernel and its design: tc.h.
#include <cuda_runtime.h>

#include <cstdlib>

#include "tc.h"
#include "tc_merge.h"
#include "tc_mma.h"
#include "tc_wgmma.h"
#include "tc_wgmma_t.h"
#include "tc_wgmma_ws.h"

namespace verify_attn {
namespace {

// Host side.

int64_t align16(int64_t x) { return (x + 15) / 16 * 16; }

struct Layout {  // the plan's derived values, recomputed identically by plan and launch
  int R, groups, group_rows, slots;
  int64_t ws_o_bytes, ws_lse_bytes, meta_bytes;
};

Layout layout_of(const Params& p, const Plan& plan) {
  Layout l;
  l.R = p.heads * p.q_len;
  l.groups = (l.R + kRows - 1) / kRows;
  l.group_rows = ((l.R + l.groups - 1) / l.groups + 15) / 16 * 16;
  l.slots = plan.num_splits > 1 ? plan.num_splits * p.batch : 0;
  l.ws_o_bytes = align16(int64_t(l.slots) * l.R * kLatent * 4);
  l.ws_lse_bytes = align16(int64_t(l.slots) * l.R * 4);
  l.meta_bytes = l.slots ? align16(int64_t(p.batch) * 8) : 0;
  return l;
}

// tc's paths (Plan::path; verify_attn/registry.py names them): mma.sync runs from sm_80 up,
// wgmma, wgmma_t (the transposed MMAs for few rows) and wgmma_ws (warp-specialized: a
// producer warpgroup and two consumers on alternate tiles) on compute capability 9.0 alone,
// where the build compiles sm_90a.
constexpr int kPathMma = 0;
constexpr int kPathWgmma = 1;
constexpr int kPathWgmmaT = 2;
constexpr int kPathWgmmaWs = 3;

// On compute capability 9.0 the plan takes wgmma_ws but at the shortest ranges. Measured on an H200
// (`python -m verify_attn measure`, chain tree, 15 samples with the kernels alternating, one
// process): heads 64 q_len 9 prefix 65,536 wgmma_ws 0.156 ms against wgmma 0.252 (FlashMLA
// 0.135); q_len 65 0.946 against 1.601 (FlashMLA 0.799); at prefix 2,048 0.026 against 0.029
// and 0.058 against 0.077. wgmma_t (query rows on N, no padding of groups <= 48 rows) was
// slower than wgmma where it was meant to win: heads 8 q_len 9 prefix 65,536 0.0966 against
// 0.0824 ms, heads 16 0.1215 against 0.1021. Where every element's keys fit in two tiles
// (kv_cols bounds every prefix + q_len: the tree alone, the shortest prefixes) wgmma_ws's
// set-up (384 threads, four mbarriers, the register handover) is not paid back: at prefix 0
// the recorded suite of effa37c read tc 3.2-5.5% slower than at 785a436 (wgmma), x anchor,
// at six of the grid's twelve (heads, q_len) points, so the plan keeps wgmma there. wgmma_t stays, taken only when pinned.

bool has_wgmma(int dev) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

// off_parent: where the kernel's staged parents start (the rest of plan.smem_bytes holds them).
template <void (*Kernel)(Params, TcArgs)>
int launch_kernel(int off_parent, const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
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
  TcArgs a;
  a.R = l.R;
  a.group_rows = l.group_rows;
  a.slots = l.slots;
  a.parent_cap = (plan.smem_bytes - off_parent) / 4;
  char* ws = static_cast<char*>(workspace);
  a.ws_o = l.slots ? reinterpret_cast<float*>(ws) : nullptr;
  a.ws_lse = l.slots ? reinterpret_cast<float*>(ws + l.ws_o_bytes) : nullptr;
  a.meta = l.slots ? reinterpret_cast<int2*>(ws + l.ws_o_bytes + l.ws_lse_bytes) : nullptr;
  const dim3 grid(l.groups, l.slots ? l.slots : p.batch);
  Kernel<<<grid, plan.threads, plan.smem_bytes, stream>>>(p, a);
  if (l.slots) {
    const dim3 mgrid((l.R + kMergeWarps - 1) / kMergeWarps, p.batch);
    tc_merge<<<mgrid, kMergeWarps * 32, 0, stream>>>(p, a);
  }
  return int(cudaGetLastError());
}

}  // namespace

Plan plan_tc(const Params& p, int num_sms, int path) {
  Plan plan;
  if (p.batch <= 0 || p.heads <= 0 || p.q_len <= 0) return plan;
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    optin = 48 * 1024;
  const int R = p.heads * p.q_len;
  const int groups = (R + kRows - 1) / kRows;
  const int group_rows = ((R + groups - 1) / groups + 15) / 16 * 16;
  const bool sm90a = has_wgmma(dev);
  const bool wgmma = sm90a && optin >= wg::kBaseBytes, wgmma_t = sm90a && optin >= wgt::kBaseBytes;
  const bool wgmma_ws = sm90a && optin >= ws::kBaseBytes;
  const bool short_range = p.kv_cols <= 2 * ws::N;
  if (path == kAnyPath) path = wgmma_ws && !short_range ? kPathWgmmaWs : wgmma ? kPathWgmma : kPathMma;
  if ((path == kPathWgmma && !wgmma) || (path == kPathWgmmaT && !wgmma_t) || (path == kPathWgmmaWs && !wgmma_ws) ||
      (path != kPathMma && path != kPathWgmma && path != kPathWgmmaT && path != kPathWgmmaWs))
    return plan;  // not here
  plan.path = path;
  plan.rows_per_block = group_rows;
  int base = 0, n = 0;
  if (path == kPathWgmma) base = wg::kBaseBytes, n = wg::N;
  else if (path == kPathWgmmaT) base = wgt::kBaseBytes, n = wgt::N;
  else if (path == kPathWgmmaWs) base = ws::kBaseBytes, n = ws::N;
  else if (optin >= CfgLarge::kOffParent) base = CfgLarge::kOffParent, n = CfgLarge::N;
  else if (optin >= CfgMid::kOffParent) base = CfgMid::kOffParent, n = CfgMid::N;
  else if (optin >= CfgSmall::kOffParent) base = CfgSmall::kOffParent, n = CfgSmall::N;
  else return plan;  // no configuration fits: blocks = 0, launch refuses
  const int parent_cap = min(p.q_len, (optin - base) / 4);
  plan.threads = path == kPathWgmmaWs ? ws::kThreads : kThreads;
  plan.keys_per_tile = n;
  plan.smem_bytes = base + 4 * parent_cap;

  // One element: split until the (m-group, split) blocks fill the SMs once (one block an SM).
  // Several: the prefixes are ragged (the plan cannot read them), and a block that holds a
  // whole long element while the short ones are done sets the time (measured: 4.9 ms for a
  // batch of 8, heads 16, q_len 33, prefixes 1K-64K, with one split an element). So deal
  // about four waves of slots, which the kernel hands out in proportion to each element's work.
  const int64_t base_blocks = int64_t(p.batch) * groups;
  const int waves = p.batch > 1 ? 4 : 1;
  int splits = 1;
  if (base_blocks < int64_t(waves) * num_sms) {
    const int max_tiles = (p.kv_cols + n - 1) / n;
    splits = int((int64_t(waves) * num_sms + base_blocks - 1) / base_blocks);
    if (p.batch == 1) splits = int(num_sms / base_blocks);
    splits = min(splits, max(1, max_tiles / 2));
    splits = min(splits, kMaxSplits);
  }
  plan.num_splits = splits;
  const int len = (p.kv_cols + splits - 1) / splits;  // nominal: splits are dealt out by work
  plan.split_len = (len + n - 1) / n * n;
  plan.blocks = int(base_blocks * splits);
  const Layout l = layout_of(p, plan);
  plan.workspace_bytes = l.ws_o_bytes + l.ws_lse_bytes + l.meta_bytes;
  return plan;
}

int launch_tc(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  if (p.batch <= 0 || p.heads <= 0 || p.q_len <= 0) return int(cudaSuccess);
  if (plan.num_splits > 1 && workspace == nullptr) return int(cudaErrorInvalidValue);
  if (plan.path == kPathWgmma) return launch_kernel<tc_attn_wg>(wg::kBaseBytes, p, plan, workspace, stream);
  if (plan.path == kPathWgmmaWs) return launch_kernel<tc_attn_ws>(ws::kBaseBytes, p, plan, workspace, stream);
  if (plan.path == kPathWgmmaT) {
    switch (plan.rows_per_block) {  // the group's rows, 2 x a warpgroup's
      case 16: return launch_kernel<tc_attn_wgt<8>>(wgt::kBaseBytes, p, plan, workspace, stream);
      case 32: return launch_kernel<tc_attn_wgt<16>>(wgt::kBaseBytes, p, plan, workspace, stream);
      case 48: return launch_kernel<tc_attn_wgt<24>>(wgt::kBaseBytes, p, plan, workspace, stream);
      case 64: return launch_kernel<tc_attn_wgt<32>>(wgt::kBaseBytes, p, plan, workspace, stream);
      default: return int(cudaErrorInvalidConfiguration);
    }
  }
  switch (plan.keys_per_tile) {
    case CfgLarge::N: return launch_kernel<tc_attn<CfgLarge>>(CfgLarge::kOffParent, p, plan, workspace, stream);
    case CfgMid::N: return launch_kernel<tc_attn<CfgMid>>(CfgMid::kOffParent, p, plan, workspace, stream);
    case CfgSmall::N: return launch_kernel<tc_attn<CfgSmall>>(CfgSmall::kOffParent, p, plan, workspace, stream);
    default: return int(cudaErrorInvalidConfiguration);
  }
}

}  // namespace verify_attn
