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
#include "tc_wgmma_tma.h"

namespace verify_attn {
namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
namespace tma {
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
                Refill{map, st, (tid & 127) == 0, r.bk.ntiles, r.wk.b * p.kv_cols, r.bk, p.kv});
  // Row sums over the quad and the two warpgroups (both hold the same final maximum).
  float* s_l = reinterpret_cast<float*>(smem + kOffL);
  post_row_sums(s_l, l_run, w, wq, g, t4);
  bar_sync<kBarEnd, kConsumerThreads>();
  // abort: a wait timed out
  store_rows<true>(p, a, slot, r.wk.b, r.bk.R0, r.bk.rows_valid, s_l, m_run, o, abort, w, wq, g, t4);
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
    if (!block_work<ws::kTopExtraTiles>(p, a, N, reinterpret_cast<int*>(smem + kOffInfo), tid >> 5, wk)) return;
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
