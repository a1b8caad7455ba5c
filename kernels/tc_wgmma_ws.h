// tc's warp-specialized sm_90a path: a cp.async producer warpgroup and two consumer
// warpgroups that take alternate tiles (ping-pong) (the kernel: tc_wgmma_ws.cu).
// What tc runs on compute capability 9.0 (path 3) but where every element's keys fit in two
// tiles (kernels/tc.cu says why, with the H200's measurements).
#pragma once
#include "tc_wgmma_rows.h"

namespace verify_attn {
namespace {

// ---------------------------------------------------------------------------------------
// Why: in tc_attn_wg both warpgroups are in the same phase at once, so the tensor cores idle
// during the softmax and a quarter of the warp samples wait on wgmma results (ncu, H200).
// Here the same block (64 query rows of one element, its keys in 64-key tiles from the top
// of its range down, splits merged by tc_merge) runs on three warpgroups, 384 threads:
//
//   WG0, WG1 (consumers, setmaxnreg 224): WG w takes the tiles of parity w. Pair k holds
//     tiles a = 2k (stage 0, WG0) and b = 2k + 1 (stage 1, WG1). A consumer computes S of its
//     whole tile (64 rows x 64 keys over 576 dims: 36 m64n64k16, 32 fp32 a thread) and that
//     tile's softmax, and O for its half of the 512 columns (WG0 0..255, WG1 256..511, 128
//     fp32 a thread) from BOTH tiles' P: its own P from registers (RS wgmma), the other's P
//     from shared memory (SS), written over the rope plane (dims 512..575) of that tile's
//     stage, which only its own S reads (FlashMLA's "seesaw" without Q's rope in registers).
//   WG2 (producer, setmaxnreg 56): the cp.async gather (Q once, then tile after tile into the
//     two stages, 36 x 16 bytes a thread a tile), signalled by cp.async.mbarrier.arrive.noinc
//     on the stage's `full` mbarrier; on the tiles at the tree rows it waits for its copies,
//     zeroes non-finite values, marks their keys and builds the visibility words (tc_attn_wg's
//     contract, wg::Tiles::clean and build_mask), then arrives plainly. It reuses a stage when
//     both consumers have arrived on its `empty` mbarrier.
//   Registers: 2 x 128 x 224 + 128 x 56 = 64,512 = 384 x 168, what __launch_bounds__(384, 1)
//     gives at launch (setmaxnreg moves registers within the block's allocation; asking for
//     more than the launch gave would block setmaxnreg.inc forever). ptxas (CUDA 13.0,
//     sm_90a): 168 registers at launch, 8 named barriers, 0 spills, no wgmma serialization;
//     the SASS uses R0..R221 in the consumers (of 224), R0..R42 in the producer (of 56).
//
// The running maximum is one chain: tile a's softmax starts from the maximum after tile b of
// the previous pair, tile b's from the maximum after tile a (the two alternate), so both
// warpgroups' O halves and row sums always refer to the same maximum. Per pair (m: running
// max, sc = 2^(m_old - m_new), P = 2^(S - m_new) in bf16, l from the unrounded P):
//   WG0: wait full[0]; S_a = Q K_a^T; [b] arrive S0; softmax_a from m; O_L *= sc_a; P_a ->
//        stage 0's rope plane, (m_a, sc_a) -> smem; arrive P0; O_L += P_a V_a[:, 0:256] (RS);
//        wait; arrive empty[0]; [b] sync P1; O_L *= sc_b; wait full[1];
//        O_L += P_b V_b[:, 0:256] (SS); wait; arrive empty[1]
//   WG1: [b] sync S0; wait full[1]; issue S_b = Q K_b^T; sync P0; O_R *= sc_a; wait full[0];
//        O_R += P_a V_a[:, 256:512] (SS); [b] wait for S_b (PV_a in flight); softmax_b from
//        m_a; P_b -> stage 1's rope plane, (m_b, sc_b) -> smem; arrive P1; wait for PV_a;
//        arrive empty[0]; O_R *= sc_b; O_R += P_b V_b[:, 256:512] (RS); wait; arrive empty[1]
// so WG1's QK^T runs during WG0's softmax and both PV's during WG1's softmax. Barriers a pair
// of tiles: mbarriers full[0], full[1] (each consumer thread waits), empty[0], empty[1] (256
// arrivals each, the producer waits), named barriers S0, P0 and P1 (256: one warpgroup
// arrives, the other syncs; bar.arrive orders the arriving threads' shared-memory writes before the
// syncing threads' reads), a 128-thread named barrier in the writing warpgroup before it
// overwrites the rope plane its own S read. A named barrier instance cannot be arrived at
// twice before it completes: WG0 arrives at P0 (and S0) of pair k + 1 only after the sync at
// P1 of pair k, which WG1 arrives at after its syncs at S0 and P0 of pair k; WG1 arrives at
// P1 of pair k + 1 only after its sync at P0 of pair k + 1, which WG0 arrives at after its
// sync at P1 of pair k. S0 is used only in pairs with a tile b, on both sides.
// The last pair of an odd count has no tile b: WG0 skips its [b] steps, WG1 runs only
// "sync P0 .. PV_a .. arrive empty[0]". Neither mbarrier phase can run two ahead: the
// producer reloads a stage only after both consumers released it, and a consumer can release
// use u + 1 only after waiting for full use u + 1.
//
// The NaN contract is tc_attn_wg's, line by line: non-finite scores NaN; on the tiles at the
// tree rows, keys holding a non-finite cache value NaN for every row that sees them and the
// value zeroed (a row that must not see it is unaffected), invisible keys -inf; a row with no
// visible key O = 0 and lse = -inf; NaN maxima propagate (max.NaN) into O, l and lse.
//
// Shared memory (from the 1024-aligned base; 1024 bytes of slack for the alignment):
//   Q      73,728  9 planes x 64 rows x 128 B
//   KV    147,456  2 stages x 9 planes x 64 keys x 128 B; P of a stage's tile over its plane 8
//   m, sc   1,024  [2 warpgroups][64 rows] the running max after its tile, the rescale factor
//   l         512  [2][64] at the end, each warpgroup's row sums
//   mask    1,024  [2 stages][64 tokens] visibility words
//   full, empty 32 four mbarriers; abort 8 (a wait timed out); BlockInfo 64 (s_bad: per
//                 stage, non-finite keys)
//   = 223,848 + 1,024 slack = 224,872 B; the staged parents take what is left of 232,448
//   (1,894 entries: every q_len the op accepts, <= 1,024).
namespace ws {
using wg::kPlane;
using wg::kTileBytes;
constexpr int N = wg::N;                  // 64 keys a tile
constexpr int kConsumerThreads = 256;     // WG0, WG1
constexpr int kThreads = 384;             // + the producer warpgroup
constexpr int kRegsConsumer = 224, kRegsProducer = 56;
static_assert(2 * 128 * kRegsConsumer + 128 * kRegsProducer == kThreads * 168,
              "setmaxnreg within the launch allocation (tests/test_resources.py: 168 at launch)");
// Named barriers (0 is __syncthreads).
constexpr int kBarP0 = 1;    // WG0's P, m, sc of tile a posted (WG0 arrives, WG1 syncs)
constexpr int kBarP1 = 2;    // WG1's of tile b (WG1 arrives, WG0 syncs)
constexpr int kBarEnd = 3;   // both consumers' row sums posted
constexpr int kBarProd = 4;  // the producer warpgroup (parents staged; a masked tile landed)
constexpr int kBarWg = 5;    // 5 + w: consumer warpgroup w alone
constexpr int kBarS0 = 7;    // WG0's S of tile a is done (WG0 arrives, WG1 syncs; pairs with a tile b only)
struct Smem {
  uint8_t q[wg::kTileBytes];      // the group's query rows, 9 planes
  uint8_t kv[2][wg::kTileBytes];  // stages, 9 planes each; plane 8 holds the tile's P once its S is done
  float m[2][kRows];              // per warpgroup: the running max after its tile (log2 units)
  float sc[2][kRows];             // per warpgroup: its tile's rescale factor
  float l[2][kRows];              // at the end: each warpgroup's row sums
  uint64_t mask[2][kRows];        // per stage: visibility word of each token
  uint64_t full[2];               // per stage: the tile landed (and cleaned, masked)
  uint64_t empty[2];              // per stage: both consumers are done with it
  uint32_t abort[2];              // [0]: a wait timed out (mbar_wait); [1] unused
  BlockInfo info;
};
constexpr int kOffQ = offsetof(Smem, q);
constexpr int kOffKV = offsetof(Smem, kv);
constexpr int kOffM = offsetof(Smem, m);
constexpr int kOffSc = offsetof(Smem, sc);
constexpr int kOffL = offsetof(Smem, l);
constexpr int kOffMask = offsetof(Smem, mask);
constexpr int kOffFull = offsetof(Smem, full);
constexpr int kOffEmpty = offsetof(Smem, empty);
constexpr int kOffAbort = offsetof(Smem, abort);
constexpr int kOffInfo = offsetof(Smem, info);
constexpr int kOffParent = sizeof(Smem);
constexpr int kBaseBytes = wg::kSlack + kOffParent;
static_assert(kOffKV % 1024 == 0 && wg::kTileBytes % 1024 == 0 && wg::kPlane % 1024 == 0,
              "wgmma's 128-byte swizzle: 1024-byte aligned planes");
static_assert(kOffFull % 8 == 0 && kOffEmpty % 8 == 0, "mbarriers: 8-byte aligned");
static_assert(kBaseBytes == 224872 && kBaseBytes + 4 * kMaxQLen <= 232448,
              "the sm_90 opt-in limit with every q_len's parents staged (the comment above)");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
using wg::commit;
using wg::desc;
using wg::exp_pair;
using wg::fence;
using wg::fence_smem;
using wg::issue_qk;
using wg::Mma;
using wg::mma_rs256;
using wg::pin;
using wg::post_row_sums;
using wg::quad_max;
using wg::rescale;
using wg::scale_row;
using wg::smem_aligned;
using wg::store_rows;
using wg::wait_all;
// mbarrier and named-barrier PTX (PTX ISA: mbarrier, cp.async.mbarrier.arrive, bar/barrier,
// setmaxnreg; the same forms as CUTLASS include/cutlass/arch/barrier.h and reg_reconfig.h).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival (release, CTA scope): this thread's earlier writes are visible to a waiter.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival when every cp.async this thread issued so far has completed; noinc: the arrival
// is one of the count given at init (not added to it).
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.b32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Waits for the completion of the phase of parity `parity` (acquire). A wait that lasts 4 s
// is a bug (every wait of this kernel is for work that takes microseconds): rather than hang,
// it raises the block's abort flag and returns, and so does every later wait that does not
// succeed at once, so the block finishes (its rows NaN: the check fails instead of the GPU
// hanging). Not a trap: a trap in the consumers' code makes ptxas give up their setmaxnreg
// budget (CUDA 13.0: 1,208 bytes of spills and serialized wgmma; this form: none).
// The clock is read only once the first try has failed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity, volatile uint32_t* abort) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = global_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (*abort) return;
    if (global_ns() - t0 > 4000000000ull) {
      *abort = 1;
      return;
    }
  }
}
// Barrier and thread count as immediates: every site names constants.
template <int Id, int Count>
__device__ __forceinline__ void bar_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(Id), "n"(Count) : "memory");
}
template <int Id, int Count>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(Id), "n"(Count) : "memory");
}
// cp.async.wait_all: commits this thread's pending cp.async and waits for all of them.
__device__ __forceinline__ void cp_async_wait_every() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void wait_one() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// What a consumer knows of the block (the same for both warpgroups).
struct Block {
  int R0, rows_valid, i_lo, heads, key_lo, ntiles, mask_from;
  __device__ int tile_t0(int j) const { return key_lo + (ntiles - 1 - j) * N; }
  __device__ bool tile_masked(int j) const { return tile_t0(j) + N > mask_from; }
};

// One tile's softmax in a consumer warpgroup: s[32] is S of the tile (accumulator layout:
// s[4 i + 2 h + e] is row 16 wq + g + 8 h, key 8 i + 2 t4 + e), the chain's maximum before
// it m_prev. Out: the maximum after it mn (possibly -inf or NaN), the rescale factor sc of
// what came before, this thread's part of the tile's row sums, P as the RS A fragments of the
// 4 k-steps (pa[4 kk + ..]: keys 16 kk ..) and stored bf16 in the swizzled, K-major plane sP
// (after the warpgroup's barrier: sP is the rope plane that the warpgroup's own S read).
// The same arithmetic as tc_attn_wg (the maxima of one row are within a quad here: a
// warpgroup holds all 64 keys of its tile).
__device__ __forceinline__ void softmax_tile(float (&s)[32], const float (&m_prev)[2], float (&mn)[2], float (&sc)[2],
                                             float (&sum)[2], uint32_t (&pa)[16], const Block& bk, int j,
                                             const uint64_t* s_mask, const uint64_t* s_bad, float qk_scale,
                                             uint32_t sP, int w, int wq, int g, int t4) {
  const bool masked = bk.tile_masked(j);
  const uint64_t bad = masked ? *s_bad : 0;
  float mu[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx;
    if (masked) {  // two instances, so that the unmasked tiles run no mask test
      const int r = min(16 * wq + g + 8 * h, bk.rows_valid - 1);
      mx = scale_row(s, h, qk_scale, true, s_mask[(bk.R0 + r) / bk.heads - bk.i_lo], bad, 0, t4);
    } else {
      mx = scale_row(s, h, qk_scale, false, ~0ull, 0, 0, t4);
    }
    mx = quad_max(mx);
    mn[h] = nan_max(m_prev[h], mx);
    mu[h] = mn[h] == -INFINITY ? 0.f : mn[h];
    sc[h] = ex2(m_prev[h] - mu[h]);
    sum[h] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) pa[4 * (i >> 1) + 2 * (i & 1) + h] = exp_pair(s, i, h, mu[h], sum[h]);
  // Every warp's S of the tile is done: its rope plane is free.
  if (w == 0) bar_sync<kBarWg, 128>();
  else bar_sync<kBarWg + 1, 128>();
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wq + g + 8 * h;
      st_shared_b32(sP + r * 128 + (((i ^ r) & 7) << 4) + t4 * 4, pa[4 * (i >> 1) + 2 * (i & 1) + h]);
    }
}

// O += P V over this warpgroup's 256 columns (planes 4 w .. 4 w + 3 of stage sK): P from
// registers (pa) or from the swizzled plane sP.
__device__ __forceinline__ void issue_pv_rs(float (&o)[128], const uint32_t (&pa)[16], uint32_t sK, int w) {
  const uint64_t dv = desc(sK + 4 * w * wg::kPlane, wg::kPlane, 1024);
  fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    mma_rs256<1>(o, pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3], dv + ((kk * 16 * 128) >> 4));
  commit();
}
__device__ __forceinline__ void issue_pv_ss(float (&o)[128], uint32_t sP, uint32_t sK, int w) {
  const uint64_t dv = desc(sK + 4 * w * wg::kPlane, wg::kPlane, 1024), dp = desc(sP, 16, 1024);
  fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) Mma<256>::run<0, 1>(o, dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4), 1);
  commit();
}
// The other warpgroup's tile into this warpgroup's O columns: its factor and maximum once
// posted (named barrier Bar; s_m, s_sc: that warpgroup's rows), then O += P V from the rope
// plane sP of its stage sK once the stage is full (issued, not waited).
template <int Bar>
__device__ __forceinline__ void issue_peer_pv(float (&o)[128], float (&m_run)[2], float (&l_run)[2], float (&sc)[2],
                                              const float* s_m, const float* s_sc, uint32_t full, uint32_t par,
                                              volatile uint32_t* abort, uint32_t sP, uint32_t sK, int w, int wq, int g) {
  bar_sync<Bar, kConsumerThreads>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * wq + g + 8 * h;
    sc[h] = s_sc[r];
    m_run[h] = s_m[r];
    l_run[h] *= sc[h];
  }
  rescale(o, sc);
  mbar_wait(full, par, abort);
  fence_smem();
  issue_pv_ss(o, sP, sK, w);
}
#endif
}  // namespace ws

}  // namespace
}  // namespace verify_attn
