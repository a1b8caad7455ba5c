// tc's host side: the plan (path, tile, splits, shared memory), the launch of the path's
// launcher (one .cu a path: tc_host.h) and the merge of the splits. The kernel and its design: tc.h.
#include <cuda_runtime.h>

#include <cstdlib>

#include "tc_host.h"
#include "tc_merge.h"
#include "tc_mma.h"
#include "tc_wgmma.h"
#include "tc_wgmma_t.h"
#include "tc_wgmma_ws.h"

namespace verify_attn {
namespace {

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
// at six of the grid's twelve (heads, q_len) points, so the plan keeps wgmma there; ffa97079's
// suite read them 3.7-6.1% faster again. wgmma_t stays, taken only when pinned.

// Every split writes a partial output (rows x 512 fp32) that the merge reads back, so a split
// takes at least two key tiles, three on wgmma_ws: at heads 64, q_len 9, prefix 2,048 (33
// tiles) its 11 splits of 3 tiles took 3.4% less time than 14 of 2-3 (`python -m verify_attn
// ab`, H200, 20 pairs, 0 slower; the other Quick points, whose floor does not bind, within
// 0.5%). FlashMLA's scheduler deals about as many (11 of 3 tiles there).
int min_split_tiles(int path) { return path == kPathWgmmaWs || path == kPathWgmmaTma ? 3 : 2; }

// A ragged batch's splits an element: with ceil(waves x SMs / blocks) of them, the fewest
// waves (1..kMaxWaves) whose splits reach kMinRaggedSplits, else kMaxWaves'. Fewer than six
// split ragged prefixes (1K-64K) unevenly: two to four an element at batch 8 and 32 took
// 1.02-1.65x longer than eight. Six in one wave rather than 22 in four took batch 8, heads
// 16, q_len 9 1.42-1.44x faster, six rather than eight 0.9-2.2% at heads 64 q_len 9 and heads
// 16 q_len 33 (`ab --points serving` and `serving_chain`, H200, 20 pairs each); a floor of
// eight gained 1.28x at the first and nothing elsewhere.
constexpr int kMaxWaves = 4, kMinRaggedSplits = 6;
int ragged_splits(int64_t base_blocks, int num_sms) {
  int splits = 1;
  for (int waves = 1; waves <= kMaxWaves; ++waves) {
    splits = int((int64_t(waves) * num_sms + base_blocks - 1) / base_blocks);
    if (splits >= kMinRaggedSplits) break;
  }
  return splits;
}

bool has_wgmma(int dev) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
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
  const bool wgmma_ws = sm90a && optin >= ws::kBaseBytesDeal;
  // wgmma_tma: a contiguous cache (every unmasked tile by TMA), at most two masked tiles a
  // range (the tree rows: q_len <= 65, tc_wgmma_tma.cu); paged caches stay on wgmma_ws.
  const bool wgmma_tma = wgmma_ws && p.q_len <= ws::N + 1 && kv_map_fits(p);
  // Where it takes both, the plan picks wgmma_tma only where it measured faster than wgmma_ws
  // (ab on the H200): batches (dealt: 3.4-5.8% at ServingChain) and one element of four
  // m-groups or more whose tree rows sit in one tile (heads 64 x q_len 9, heads 16 x q_len 33
  // at 16K: 3-4%). Its start is serial (Q, then its first tiles; the masked ones gathered by
  // all threads before the loop), which the two masked tiles of q_len 65 and the short splits
  // of two or three m-groups (heads 8 and 16 x q_len 9 at 16K) pay: 1.2-3.6% slower there.
  const bool tma_pays = p.q_len < ws::N && (p.batch > 1 || groups >= 4);
  const bool short_range = p.kv_cols <= 2 * ws::N;
  if (path == kAnyPath)
    path = wgmma_ws && !short_range ? (wgmma_tma && tma_pays ? kPathWgmmaTma : kPathWgmmaWs)
           : wgmma                  ? kPathWgmma
                                    : kPathMma;
  if ((path == kPathWgmma && !wgmma) || (path == kPathWgmmaT && !wgmma_t) || (path == kPathWgmmaWs && !wgmma_ws) ||
      (path == kPathWgmmaTma && !wgmma_tma) || path < kPathMma || path > kPathMmaSmall)
    return plan;  // not here
  // A smaller part's configuration: plan as that part would, from its shared memory.
  if (path == kPathMmaMid || path == kPathMmaSmall) optin = min(optin, path == kPathMmaMid ? kOptinMid : kOptinSmall);
  plan.path = path;
  plan.rows_per_block = group_rows;
  int base = 0, n = 0;
  if (path == kPathWgmma) base = wg::kBaseBytes, n = wg::N;
  else if (path == kPathWgmmaT) base = wgt::kBaseBytes, n = wgt::N;
  else if (path == kPathWgmmaWs || path == kPathWgmmaTma) base = ws::kBaseBytes, n = ws::N;
  else if (optin >= CfgLarge::kOffParent) base = CfgLarge::kOffParent, n = CfgLarge::N;
  else if (optin >= CfgMid::kOffParent) base = CfgMid::kOffParent, n = CfgMid::N;
  else if (optin >= CfgSmall::kOffParent) base = CfgSmall::kOffParent, n = CfgSmall::N;
  else return plan;  // no configuration fits: blocks = 0, launch refuses
  const int parent_cap = min(p.q_len, (optin - base) / 4);
  plan.threads = path == kPathWgmmaWs ? ws::kThreads : kThreads;  // wgmma_tma: 256, its two consumers
  plan.keys_per_tile = n;
  plan.smem_bytes = base + 4 * parent_cap;

  // One element: split until the (m-group, split) blocks fill the SMs once (one block an SM).
  // Several: the prefixes are ragged (the plan cannot read them), and a block that holds a
  // whole long element while the short ones are done sets the time, so the kernel hands slots
  // out in proportion to each element's work. Slots are not free either (each writes a partial
  // output that the merge reads back): take the fewest waves of blocks, up to four, that give
  // kMinRaggedSplits slots an element (ragged_splits).
  const int64_t base_blocks = int64_t(p.batch) * groups;
  int splits = 1;
  if (base_blocks < (p.batch > 1 ? kMaxWaves : 1) * int64_t(num_sms)) {
    const int max_tiles = (p.kv_cols + n - 1) / n;
    splits = p.batch == 1 ? int(num_sms / base_blocks) : ragged_splits(base_blocks, num_sms);
    splits = min(splits, max(1, max_tiles / min_split_tiles(path)));
    splits = min(splits, kMaxSplits);
  }
  // wgmma_ws and wgmma_tma, several elements, split: FlashMLA's dealing instead (tc.h, deal_locate). The
  // elements' tiles (and a fixed cost each) are concatenated and dealt to S slots, a slot's
  // block walking the elements it touches, so S = SMs / m-groups gives one wave of equal
  // work (at least 2: layout_of reads num_splits > 1 as dealt). num_splits is S here, and
  // split_len the nominal keys a slot. Not more slots than min_split_tiles' floor allows
  // at the longest prefix (short caches: fewer, longer pieces). Dealt too: an unsplit batch
  // whose blocks outnumber the SMs, where the longest element's block would otherwise run all
  // its tiles alone at the end (batch 32, heads 64, q_len 33: 1,056 blocks, one of 1,024
  // tiles).
  const bool dealt =
      (path == kPathWgmmaWs || path == kPathWgmmaTma) && p.batch > 1 && (splits > 1 || base_blocks > num_sms);
  if (dealt) {
    const int64_t max_tiles = (p.kv_cols + n - 1) / n;
    splits = int(max(int64_t(2), min(int64_t(num_sms / groups), p.batch * max(int64_t(1), max_tiles / min_split_tiles(path)))));
    // tc_attn_ws_deal's shared memory holds more before the parents (tc_attn_tma_deal's does not)
    if (path == kPathWgmmaWs)
      plan.smem_bytes = ws::kBaseBytesDeal + 4 * min(p.q_len, (optin - ws::kBaseBytesDeal) / 4);
  }
  plan.num_splits = splits;
  const int64_t keys_all = dealt ? int64_t(p.batch) * p.kv_cols : p.kv_cols;
  const int64_t len = (keys_all + splits - 1) / splits;  // nominal: splits are dealt out by work
  plan.split_len = int((len + n - 1) / n * n);
  plan.blocks = int((dealt ? groups : base_blocks) * splits);
  const Layout l = layout_of(p, plan);
  plan.workspace_bytes = l.ws_o_bytes + l.ws_lse_bytes + l.meta_bytes;
  return plan;
}

int launch_tc(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  if (p.batch <= 0 || p.heads <= 0 || p.q_len <= 0) return int(cudaSuccess);
  if (plan.num_splits > 1 && workspace == nullptr) return int(cudaErrorInvalidValue);
  int err = plan.path == kPathWgmma     ? tc_launch_wgmma(p, plan, workspace, stream)
            : plan.path == kPathWgmmaWs ? tc_launch_wgmma_ws(p, plan, workspace, stream)
            : plan.path == kPathWgmmaTma ? tc_launch_wgmma_tma(p, plan, workspace, stream)
            : plan.path == kPathWgmmaT  ? tc_launch_wgmma_t(p, plan, workspace, stream)
                                        : tc_launch_mma(p, plan, workspace, stream);
  const Layout l = layout_of(p, plan);
  if (err != int(cudaSuccess) || !l.slots) return err;
  if (l.merge_parts == kMergeRowWarps)
    return launch_overlapped(tc_merge_rows, dim3(l.R, p.batch), kMergeRowWarps * 32, 0, stream, p,
                             tc_args(p, plan, workspace, 0));
  const dim3 mgrid((l.R * l.merge_parts + kMergeWarps - 1) / kMergeWarps, p.batch);
  auto merge = l.merge_parts == 2 ? tc_merge<2> : tc_merge<4>;
  return launch_overlapped(merge, mgrid, kMergeWarps * 32, 0, stream, p, tc_args(p, plan, workspace, 0));
}

}  // namespace verify_attn
