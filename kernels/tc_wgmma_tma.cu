// tc's sm_90a path without a copy warpgroup (path 4, wgmma_tma): the kernels tc_attn_tma (a
// block, one key range) and tc_attn_tma_deal (dealt mode: a block, a slot's pieces) and their
// launch; compiled to a trap elsewhere.
//
// Why: beside FlashMLA under Nsight Compute, tc_attn_ws's tensor pipes were 10-15 points less
// busy per tile with 12 warps an SM where FlashMLA has 8, and every refill went through the
// producer's wake-up on an `empty` mbarrier (docs/flashmla_mainloop.md). Here the two consumer
// warpgroups of tc_attn_ws (the pair schedule, the softmax, P over the rope plane, the named
// barriers: tc_wgmma_ws.h; the loop is tc_attn_ws_deal's consume_tiles) run alone, 256
// threads, and each loads what it frees:
//
//   Refill by the last reader. After its S a consumer reads only planes_of(w, s) of a stage
//   (tc_wgmma_ws.h, "Early refill"), and it is their last reader, so the moment its wgmma wait
//   on them returns, its thread 0 issues the same planes of the stage's next tile by TMA: no
//   `empty` barrier, nobody to wake. full[s] counts two arrivals, one a half, each posted by
//   its issuer with that half's bytes (arrive.expect_tx before its boxes), so a phase completes
//   only once both halves' arrivals are in and all nine planes landed, and S waits once.
//   Phases stay exact: an issuer arrives for use u + 1 only after its own wait for use u (both
//   warpgroups wait for every use of both stages), so no arrival falls in an earlier phase, and
//   every consumer waits for each use in turn, so no wait sees a phase two ahead.
//   As in FlashMLA (its warpgroup_wait, then the TMA from the warpgroup's thread 0, no
//   barrier) and CUTLASS's cluster pipelines (PipelineTmaAsync: one signalling thread a
//   warpgroup and destination block releases a stage), the issuing thread's own wgmma wait
//   stands for its warpgroup's: a warpgroup's wgmma runs as one operation. tc_attn_ws never
//   relied on it (128 arrivals an empty barrier); the GPU parity tests are what check it.
//
//   The start. Q by cp.async from all 256 threads first (tc-early measured tiles issued
//   before Q 1-4% slower), then thread 0 issues the first two tiles that are not masked, whole.
//   The masked tiles (those at the tree rows, and a partial top tile: always the first ones of
//   the range) are gathered by cp.async with zero fill past the range, cleaned of non-finite
//   values and given their visibility words by all 256 threads before the loop (tc_attn_ws's
//   producer steps, tc_attn_wg's contract), and their phase of full[s] is completed by two
//   plain arrivals. plan_tc takes this path only where at most two tiles are masked (q_len
//   <= 65: an interval of 65 keys meets two 64-key tiles at most), on a contiguous cache
//   (every other tile by TMA); a range with a third masked tile loads nothing, its rows NaN.
//
// Shared memory: tc_attn_ws's layout (ws::Smem, its parents after it), the `empty` barriers
// unused. Registers: __launch_bounds__(256, 1), no setmaxnreg (up to 255 a thread).
#include "tc_host.h"
#include "tc_wgmma_ws.h"

namespace verify_attn {
namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace tma {
using namespace ws;
// planes_of(w, s) of a tile (row0: its first cache row) into stage s, posted on full (the
// stage's) with their bytes: four planes, five where s != w (the rope plane too).
template <int W, int S>
__device__ __forceinline__ void load_half(const CUtensorMap* map, uint32_t stage, uint32_t full, int row0) {
  constexpr int kBytes = (S != W ? 5 : 4) * kPlane;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(full), "n"(kBytes) : "memory");
  tma_half(map, stage, full, row0, W, S);
}
// consume_tiles' release (tc_wgmma_ws.h): warpgroup W is done with stage S (tile j), so its
// thread 0 (issuer) loads planes_of(W, S) of tile j + 2 there, if the range has it.
struct Refill {
  const CUtensorMap* map;
  const Stages& st;
  bool issuer;
  int ntiles, row_lo;  // row_lo: the element's first cache row
  const Block& bk;
  template <int W, int S>
  __device__ __forceinline__ void done(int j) const {
    if (issuer && j + 2 < ntiles) load_half<W, S>(map, st.stage(S), st.full0 + 8 * S, row_lo + bk.tile_t0(j + 2));
  }
};
}  // namespace tma
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace tma {
// A key range's block state: the range (bk, its element's prefix P), its masked tiles.
struct Range {
  Work wk;
  Block bk;
  int P, nmasked;
  bool unplanned;  // a third masked tile (plan_tc's bound broken): no tile taken, its rows NaN
};
// The range's block set-up, every thread alike.
__device__ __forceinline__ Range range_of(const Params& p, const TcArgs& a, const Work& wk) {
  Range r;
  r.wk = wk;
  r.bk.set_rows(p, a);
  r.P = element_prefix(p, wk.b);
  r.bk.set_range(wk, r.P);
  r.unplanned = r.bk.ntiles > 2 && r.bk.tile_masked(2);
  if (r.unplanned) r.bk.ntiles = 0;
  r.nmasked = 0;  // the masked tiles are the first ones
  while (r.nmasked < 2 && r.nmasked < r.bk.ntiles && r.bk.tile_masked(r.nmasked)) ++r.nmasked;
  return r;
}

// The start of a range, every thread: Q by cp.async (first: tc-early measured tiles issued
// before Q 1-4% slower), then thread 0's TMA of the first unmasked tiles, whole; the masked
// ones by cp.async with zero fill past the range, cleaned and masked (the tree walk, in tile
// order), their phase of full[s] completed by two plain arrivals. Before it the block's
// mbarriers are initialised and every thread is done with an earlier range's Q, stages and
// masks (whose copies all landed: each was waited for); it ends past a block-wide barrier.
__device__ __forceinline__ void start_range(const Params& p, const TcArgs& a, const Range& r, uint8_t* smem,
                                            uint32_t sbase, const CUtensorMap* map, int tid) {
  const Work& wk = r.wk;
  const Block& bk = r.bk;
  const int ntiles = bk.ntiles, nmasked = r.nmasked;
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
  const uint32_t full0 = sbase + kOffFull;  // full[s]: + 8 s
  auto stage = [&](int s) { return sbase + kOffKV + s * kTileBytes; };
  auto row0_of = [&](int j) { return wk.b * p.kv_cols + bk.tile_t0(j); };  // contiguous: < 2^31 rows
  // Row lr of a 64-row plane set at dst, 18 of its 72 chunks, from src (a valid address; 0
  // bytes read and zero filled when !ok).
  const int lr = tid >> 2;
  auto load_row = [&](uint32_t dst, const uint16_t* src, bool ok) {
#pragma unroll
    for (int k = 0; k < kChunks / 4; ++k) {
      const int c = (tid & 3) + 4 * k;
      cp_async16(dst + wg::at(kRows, lr, c), src + c * 8, ok ? 16 : 0);
    }
  };
  if (tid == 0) s_bad[0] = s_bad[1] = 0;
  if (ntiles > 0) {
    const bool ok = lr < bk.rows_valid;
    load_row(sbase + kOffQ, ok ? p.q + (int64_t(wk.b) * a.R + bk.R0 + lr) * kKeyDim : p.q, ok);
  }
  __syncthreads();  // the mbarriers initialised, s_bad cleared
  if (tid == 0) {
    for (int j = nmasked; j < min(2, ntiles); ++j) {  // whole: both halves now
      if (j == 0) {
        load_half<0, 0>(map, stage(0), full0, row0_of(0));
        load_half<1, 0>(map, stage(0), full0, row0_of(0));
      } else {
        load_half<0, 1>(map, stage(1), full0 + 8, row0_of(1));
        load_half<1, 1>(map, stage(1), full0 + 8, row0_of(1));
      }
    }
  }
  const int32_t* parent_g = p.parent + int64_t(wk.b) * p.q_len;
  int32_t* s_parent = reinterpret_cast<int32_t*>(smem + kOffParent);
  if (nmasked > 0)  // only the masks read them
    for (int i = tid; i < a.parent_cap; i += kConsumerThreads) s_parent[i] = __ldg(parent_g + i);
  for (int j = 0; j < nmasked; ++j) {
    const int t = bk.tile_t0(j) + lr;
    const int64_t row = t < wk.key_hi ? cache_row(p, wk.b, t) : int64_t(-1);
    load_row(stage(j), p.kv + (row >= 0 ? row : 0) * kKeyDim, row >= 0);
  }
  cp_async_commit();
  cp_async_wait_all();
  fence_smem();     // this thread's copies, for wgmma's reads
  __syncthreads();  // Q, the masked tiles and the parents landed and visible
  if (nmasked > 0) {
    const int ntok = (bk.R0 + bk.rows_valid - 1) / p.heads - bk.i_lo + 1;
    TreeWalk walk(tid < ntok ? bk.i_lo + tid : -1);
    for (int j = 0; j < nmasked; ++j) {  // in order: the walk resumes from tile to tile
      wg::zero_nonfinite_tile<kConsumerThreads>(smem + kOffKV + j * kTileBytes, s_bad, j, tid);
      if (tid < ntok)
        s_mask[j * kRows + tid] =
            walk.word(bk.tile_t0(j), N, bk.mask_from, r.P, wk.key_hi, a.parent_cap, s_parent, parent_g);
    }
    fence_smem();     // the zeroed values, for wgmma's reads
    __syncthreads();  // cleaned and masked
    if (tid == 0)
      for (int j = 0; j < nmasked; ++j) mbar_arrive(full0 + 8 * j), mbar_arrive(full0 + 8 * j);
  }
}

// The pairs of a started range (consume_tiles, each warpgroup refilling what it frees), then
// its rows stored (slot: the output's or a partial's). ph: the parities of the stages' uses by
// earlier ranges (bits 0, 1).
__device__ __forceinline__ void run_range(const Params& p, const TcArgs& a, const Range& r, int slot, uint32_t ph,
                                          uint8_t* smem, uint32_t sbase, const CUtensorMap* map, int tid) {
  const int lane = tid & 31, warp = tid >> 5;
  const int w = warp >> 2, wq = warp & 3;  // warpgroup (its tiles' parity, its O columns 256 w ..); warp in it
  const int g = lane >> 2, t4 = lane & 3;
  volatile uint32_t* abort = reinterpret_cast<volatile uint32_t*>(smem + kOffAbort);
  const Stages st{sbase + kOffFull, 0, 0, sbase + kOffKV, abort};  // no empty barriers
  const ConsumerSmem cs{reinterpret_cast<uint64_t*>(smem + kOffMask),
                        reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad)),
                        reinterpret_cast<float*>(smem + kOffM), reinterpret_cast<float*>(smem + kOffSc)};
  // An unplanned range: a NaN sum and maximum make its rows NaN (row_end), not the block's
  // abort flag, which would reach the slot's other pieces.
  const float m0 = r.unplanned ? __int_as_float(0x7fffffff) : -INFINITY, l0 = r.unplanned ? m0 : 0.f;
  float m_run[2] = {m0, m0}, l_run[2] = {l0, l0};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  consume_tiles(o, m_run, l_run, r.bk, ph, st, cs, desc(sbase + kOffQ, 16, 1024), p.scale * kLog2e, w, wq, g, t4,
                Refill{map, st, (tid & 127) == 0, r.bk.ntiles, r.wk.b * p.kv_cols, r.bk});
  // Row sums over the quad and the two warpgroups (both hold the same final maximum).
  float* s_l = reinterpret_cast<float*>(smem + kOffL);
  post_row_sums(s_l, l_run, w, wq, g, t4);
  bar_sync<kBarEnd, kConsumerThreads>();
  // abort: a wait timed out
  store_rows<true>(p, a, slot, r.wk.b, r.bk.R0, r.bk.rows_valid, s_l, m_run, o, abort, w, wq, g, t4);
}

// The mbarriers and the abort flag (thread 0; start_range's first barrier follows).
__device__ __forceinline__ void init_block(uint32_t sbase, uint8_t* smem, const CUtensorMap* map) {
  mbar_init(sbase + kOffFull, 2);  // a tile's two halves, each arrive.expect_tx by its issuer
  mbar_init(sbase + kOffFull + 8, 2);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  *reinterpret_cast<volatile uint32_t*>(smem + kOffAbort) = 0;
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace tma
#endif

// A block of either kernel: one key range (kDeal false: batch 1, or batches whose blocks fit
// the SMs unsplit), or its slot's pieces one after another (kDeal: a.deal, batch > 1, split;
// tc.h, deal_locate), each a range (O, m, l reset; its Q, parents, masked tiles; its partial
// slot written). The stages' uses are counted over the block (ph, as tc_attn_ws_deal's
// consumers); between pieces the pipeline drains (a piece's first tiles go out at its start).
template <bool kDeal>
__device__ __forceinline__ void tma_block(const Params& p, const TcArgs& a, const CUtensorMap* map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace tma;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint32_t sbase;
  uint8_t* smem = smem_aligned(smem_raw, sbase);
  const int tid = threadIdx.x;
  Work wk;
  if constexpr (!kDeal) {
    if (!block_work(p, a, N, reinterpret_cast<int*>(smem + kOffInfo), tid >> 5, wk)) return;
    if (tid == 0) init_block(sbase, smem, map);
    const Range r = range_of(p, a, wk);
    start_range(p, a, r, smem, sbase, map, tid);
    run_range(p, a, r, wk.slot, 0, smem, sbase, map, tid);
  } else {
    int* info = reinterpret_cast<int*>(smem + kOffInfo);
    Deal d;
    deal_block(p, a, N, info, tid >> 5, d);
    if (d.b >= p.batch) return;  // uniform: the slot holds no real tile
    if (tid == 0) init_block(sbase, smem, map);
    uint32_t ph = 0;  // bit s: the parity of stage s's uses by the earlier pieces
    while (deal_next(p, a, N, info, d, wk)) {
      const Range r = range_of(p, a, wk);
      start_range(p, a, r, smem, sbase, map, tid);
      run_range(p, a, r, wk.slot, ph, smem, sbase, map, tid);
      ph ^= (((r.bk.ntiles + 1) >> 1) & 1) | ((r.bk.ntiles >> 1) & 1) << 1;
    }
  }
#else
  __trap();  // launched only where the library holds sm_90a code (plan_tc checks the device)
#endif
}

__global__ void __launch_bounds__(ws::kConsumerThreads, 1)
    tc_attn_tma(Params p, TcArgs a, const __grid_constant__ KvMap kvm) { tma_block<false>(p, a, &kvm.map); }
__global__ void __launch_bounds__(ws::kConsumerThreads, 1)
    tc_attn_tma_deal(Params p, TcArgs a, const __grid_constant__ KvMap kvm) { tma_block<true>(p, a, &kvm.map); }

}  // namespace

int tc_launch_wgmma_tma(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  KvMap kvm = {};
  kvm.on = encode_kv_map(p, &kvm.map);
  if (!kvm.on) return int(cudaErrorNotSupported);  // plan_tc takes this path only where the map encodes
  if (layout_of(p, plan).deal) return launch_kernel<tc_attn_tma_deal>(ws::kBaseBytes, p, plan, workspace, stream, kvm);
  return launch_kernel<tc_attn_tma>(ws::kBaseBytes, p, plan, workspace, stream, kvm);
}

}  // namespace verify_attn
