// tc's warp-specialized sm_90a path: a cp.async producer warpgroup and two consumer
// warpgroups that take alternate tiles (ping-pong) (the kernel: tc_wgmma_ws.cu).
// What tc runs on compute capability 9.0 (path 3) for paged caches (and trees over 65
// tokens), but where every element's keys fit in two tiles (kernels/tc.cu says why, with the
// H200's measurements); a contiguous cache runs its consumers alone (tc_wgmma_tma.cu, path 4).
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
//     contract, wg::Tiles::clean and build_mask), then arrives plainly. On a contiguous cache
//     the other tiles come by TMA from its thread 0 (tc_attn_ws only). A stage is released by
//     halves (below, "Early refill"): a cp.async tile waits for both halves, a TMA tile
//     loads each half once it is free.
//   Registers: 2 x 128 x 224 + 128 x 56 = 64,512 = 384 x 168, what __launch_bounds__(384, 1)
//     gives at launch (setmaxnreg moves registers within the block's allocation; asking for
//     more than the launch gave would block setmaxnreg.inc forever). ptxas (CUDA 13.0,
//     sm_90a): 168 registers at launch, 8 named barriers, 0 spills, no wgmma serialization;
//     the SASS uses R0..R221 in the consumers (of 224), R0..R45 in the producer (of 56);
//     tc_attn_ws_deal takes the same 168, 0 spills.
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
//        arrive empty1[0]; O_R *= sc_b; O_R += P_b V_b[:, 256:512] (RS); wait; arrive empty1[1]
// so WG1's QK^T runs during WG0's softmax and both PV's during WG1's softmax. Barriers a pair
// of tiles: mbarriers full[0], full[1] (each consumer thread waits), empty[0], empty[1] (WG0's
// 128 threads arrive) and empty1[0], empty1[1] (WG1's; the producer waits), named barriers
// S0, P0 and P1 (256: one warpgroup arrives, the other syncs; bar.arrive orders the arriving
// threads' shared-memory writes before the syncing threads' reads), a 128-thread named barrier
// in the writing warpgroup before it overwrites the rope plane its own S read. A named
// barrier instance cannot be arrived at twice before it completes: WG0 arrives at P0 (and S0)
// of pair k + 1 only after the sync at P1 of pair k, which WG1 arrives at after its syncs at
// S0 and P0 of pair k; WG1 arrives at P1 of pair k + 1 only after its sync at P0 of pair
// k + 1, which WG0 arrives at after its sync at P1 of pair k. S0 is used only in pairs with a
// tile b, on both sides.
// The last pair of an odd count has no tile b: WG0 skips its [b] steps, WG1 runs only
// "sync P0 .. PV_a .. arrive empty1[0]".
//
// Early refill (as FlashMLA: the next tile starts loading one PV half early). After its S a
// consumer reads only its half of a stage: stage 0 (tile a) WG0 planes 0-3 (PV_a, RS), WG1
// planes 4-7 and P_a in plane 8 (SS); stage 1 (tile b) WG1 planes 4-7 (RS), WG0 planes 0-3
// and P_b in plane 8. Each S is complete before its tile's P is written (the writer's
// 128-thread barrier), so before the other warpgroup's reads begin. So WG w's release of stage
// s (empty[s] for WG0, empty1[s] for WG1) frees planes_of(w, s): planes 4w..4w+3, and plane 8
// where s != w (the peer reads P there last). A TMA tile's thread 0, once WG0 released the
// stage, posts the whole tile's bytes on full[s] (arrive.expect_tx) and issues planes_of(0, s),
// then waits for WG1's release and issues planes_of(1, s); the other 127 producer threads
// arrive plainly after WG0's release. full[s] completes only once all 9 planes landed (its
// tx-count stays positive until then), so no consumer starts a tile before both released the
// previous one. Stage 0's planes 0-3 thus load during WG1's softmax of tile b. A cp.async tile
// (every plane by every thread; masks, s_bad) waits for both releases. Plane 8 is freed by
// P's reader, not its writer: the writer's generic stores are followed by its
// fence.proxy.async before it arrives at P0/P1, and the reader's release (after its sync there
// and its wgmma's reads) orders them before the TMA that overwrites the plane.
// Phases stay exact. A producer thread arrives on full[s] for use u + 1 only after waiting for
// WG0's release of use u, which follows full use u: each arrival falls in its own phase. WG w
// releases use u + 1 only after waiting for full use u + 1, which needs every producer
// thread's arrival and all 9 planes, each after that thread's waits on the releases of use u:
// neither empty barrier runs two phases ahead of the producer's waits. And full use u + 1
// needs both releases of use u, each after that consumer waited for full use u.
//
// Pieces (tc_attn_ws_deal, dealt mode, TcArgs::deal: batch > 1; tc.h, deal_locate): a block runs the pieces of
// its slot one after another, each the scheme above on one element's tile range (O, m, l reset;
// its Q and parents; its partial slot s + b written). Pairs restart at every piece (tile j on
// stage j & 1), and the phases are counted over the block: pair k of a piece is use u_s + k
// of stage s, u_s the uses of stage s by the earlier pieces (the producer and the consumers
// each keep u_s's parity; the producer also whether a stage was used yet). The producer loads
// a later piece's Q only once stage 0's previous use is released by both: that is the previous
// piece's last pair, and both consumers release it after their last S of the piece (WG1 waits
// for S_b before it arrives at empty1[0]), so no S reads Q while it changes; its copies then
// complete before tile 0's arrival. The parents are restaged after a producer barrier (every
// producer thread done with the previous piece's walk); masks and s_bad are per stage and
// written after both releases of the stage, as within a piece. The named barriers keep their
// order across pieces (a piece's last pair leaves P0/P1/S0 completed; WG0 arrives at the next
// piece's only after the piece's end barrier, which WG1 reaches after its last sync); the row
// sums alternate between two s_l buffers by piece parity, since one warpgroup may post the
// next piece's sums while the other still reads the previous ones. The producer's thread 0
// walks the deal and posts each piece in Smem::piece (its 56 registers do not hold the piece
// across the tile loop); the consumers walk it themselves (deal_next).
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
//   full, empty, empty1 48 six mbarriers; abort 8 (a wait timed out); BlockInfo 64 (s_bad:
//                 per stage, non-finite keys)
//   = 223,864 + 1,024 slack = 224,888 B; the staged parents take what is left of 232,448
//   (1,890 entries: every q_len the op accepts, <= 1,024). tc_attn_ws_deal adds SmemDeal
//   before its parents (a second l, by a piece's parity, and the producer's piece: 576 B):
//   225,464 B and 1,746 entries.
namespace ws {
using wg::kPlane;
using wg::kTileBytes;
constexpr int N = wg::N;                  // 64 keys a tile
constexpr int kConsumerThreads = 256;     // WG0, WG1
constexpr int kThreads = 384;             // + the producer warpgroup
constexpr int kRegsConsumer = 224, kRegsProducer = 56;
// Both paths start a range on its top tile, the masked one, gathered, cleaned and masked before
// the next tile's load is issued: the split that holds it counts this many tiles more (locate).
constexpr int kTopExtraTiles = 4;
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
  float l[2][kRows];              // at the end: each warpgroup's row sums (tc_attn_ws_deal: a piece's of even parity)
  uint64_t mask[2][kRows];        // per stage: visibility word of each token
  uint64_t full[2];               // per stage: the tile landed (and cleaned, masked)
  uint64_t empty[2];              // per stage: WG0 is done with it (frees planes_of(0, s))
  uint64_t empty1[2];             // per stage: WG1 is done with it (frees planes_of(1, s))
  uint32_t abort[2];              // [0]: a wait timed out (mbar_wait); [1] unused
  BlockInfo info;
};
// tc_attn_ws_deal's own, after Smem (so tc_attn_ws keeps its layout): a piece's row sums of
// odd parity (one warpgroup may post the next piece's while the other still reads the
// previous ones) and the producer's piece.
struct SmemDeal {
  float l[2][kRows];
  int piece[16];  // the producer's piece (kPc*) and its walk's cursor
};
constexpr int kOffQ = offsetof(Smem, q);
constexpr int kOffKV = offsetof(Smem, kv);
constexpr int kOffM = offsetof(Smem, m);
constexpr int kOffSc = offsetof(Smem, sc);
constexpr int kOffL = offsetof(Smem, l);
constexpr int kOffMask = offsetof(Smem, mask);
constexpr int kOffFull = offsetof(Smem, full);
constexpr int kOffEmpty = offsetof(Smem, empty);
constexpr int kOffEmpty1 = offsetof(Smem, empty1);
constexpr int kOffAbort = offsetof(Smem, abort);
constexpr int kOffInfo = offsetof(Smem, info);
constexpr int kOffL1 = sizeof(Smem) + offsetof(SmemDeal, l);
constexpr int kOffPiece = sizeof(Smem) + offsetof(SmemDeal, piece);
// Smem::piece: element (-1: no more pieces), key range, tiles, mask begin, tiles masked, the
// element's prefix; the deal's cursor (Deal).
constexpr int kPcB = 0, kPcKeyLo = 1, kPcKeyHi = 2, kPcTiles = 3, kPcMaskFrom = 4, kPcMasked = 5, kPcP = 6,
              kPcCurB = 7, kPcCurC = 8;
constexpr int kOffParent = sizeof(Smem);
constexpr int kBaseBytes = wg::kSlack + kOffParent;
constexpr int kOffParentDeal = sizeof(Smem) + sizeof(SmemDeal);
constexpr int kBaseBytesDeal = wg::kSlack + kOffParentDeal;
static_assert(kOffKV % 1024 == 0 && wg::kTileBytes % 1024 == 0 && wg::kPlane % 1024 == 0,
              "wgmma's 128-byte swizzle: 1024-byte aligned planes");
static_assert(kOffFull % 8 == 0 && kOffEmpty % 8 == 0 && kOffEmpty1 % 8 == 0, "mbarriers: 8-byte aligned");
static_assert(kBaseBytes == 224888 && kBaseBytesDeal == 225464 && kBaseBytesDeal + 4 * kMaxQLen <= 232448,
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
// A tile of the contiguous cache by TMA, in two halves (tc_attn_ws's thread 0; "Early refill"
// above). tma_expect: the caller's arrival, posting the whole tile's transaction bytes before
// any box is issued, so that bar's phase (with the other 127 producer threads' plain
// arrivals) completes only once all nine planes landed, however far apart the halves go.
__device__ __forceinline__ void tma_expect(uint32_t bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "n"(kTileBytes) : "memory");
}
// L2 policy of a key tile's boxes: evict first, as FlashMLA's CacheHintSm90::EVICT_FIRST. A
// block streams its keys once; the hint keeps them from displacing lines still to be read.
constexpr uint64_t kEvictFirst = 0x12F0000000000000ull;
// How many tiles past the one a stage is being loaded with go to L2 ahead of their TMA load:
// with two stages only one tile is in flight while the other is read, so at few m-groups (each
// tile read by two or three blocks) its DRAM latency is not covered.
constexpr int kPrefetchTiles = 4;
// Thread pt's share (of 128) of a whole tile of a contiguous cache (64 rows from row0, 576
// lines of 128 bytes) into L2 by the load units, not the TMA unit the stages' loads queue on.
__device__ __forceinline__ void prefetch_tile_l2(const uint16_t* kv, int64_t row0, int pt) {
  const char* base = reinterpret_cast<const char*>(kv + row0 * kKeyDim);
#pragma unroll
  for (int i = 0; i < 5; ++i)
    if (pt + 128 * i < kTileBytes / 128) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(base + (pt + 128 * i) * 128));
}
// One box: plane kc of the tile (64 dims x 64 rows from cache row row0) into the stage at dst,
// counted on bar's transaction bytes. map: a __grid_constant__ argument's address
// (KvMap::map), read in place by the TMA unit.
__device__ __forceinline__ void tma_plane(const CUtensorMap* map, uint32_t dst, uint32_t bar, int row0, int kc) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst + kc * kPlane),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(kc * 64), "r"(row0), "r"(bar), "l"(kEvictFirst)
      : "memory");
}
// The boxes of planes_of(w, s): planes 4w..4w+3, and the rope plane where s != w (it holds P
// of WG s's tile, which WG 1 - s reads last).
__device__ __forceinline__ void tma_half(const CUtensorMap* map, uint32_t dst, uint32_t bar, int row0, int w, int s) {
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) tma_plane(map, dst, bar, row0, 4 * w + kc);
  if (s != w) tma_plane(map, dst, bar, row0, 8);
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
  // The block's rows (its m-group): the same for every key range it runs.
  __device__ void set_rows(const Params& p, const TcArgs& a) {
    R0 = blockIdx.x * a.group_rows;
    rows_valid = min(a.group_rows, a.R - R0);
    heads = p.heads;
    i_lo = R0 / p.heads;
  }
  // A key range of element wk.b, whose prefix is P.
  __device__ void set_range(const Work& wk, int P) {
    key_lo = wk.key_lo;
    ntiles = wk.key_hi > wk.key_lo ? (wk.key_hi - wk.key_lo + N - 1) / N : 0;
    mask_from = min(P, wk.key_hi);
  }
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

// ---- What tc_attn_ws_deal runs (tc_attn_ws keeps its own code: on these helpers it measured
// 1.4-1.7% slower at q_len 65, prefix 2,048 on the H200) ----------------------------------
// The stages and barriers of a block, in shared memory.
struct Stages {
  uint32_t full0, empty0, empty1;  // full[s], empty[s] (WG0's release), empty1[s] (WG1's): + 8 s
  uint32_t kv0;            // stage s's planes: + s kTileBytes
  volatile uint32_t* abort;
  __device__ uint32_t stage(int s) const { return kv0 + s * kTileBytes; }
  // The phase of parity `parity` of stage s released by both consumers.
  __device__ void wait_released(int s, uint32_t parity) const {
    mbar_wait(empty0 + 8 * s, parity, abort);
    mbar_wait(empty1 + 8 * s, parity, abort);
  }
};

// Producer: row rg + 16 i of a 64-row plane set at dst, 9 x 16 bytes (its chunk x of each
// plane), from base's row row[i] (-1: 0 bytes read and zero filled).
__device__ __forceinline__ void load_rows(uint32_t dst, const int64_t (&row)[4], const uint16_t* base, int rg, int x) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = rg + 16 * i;
    const bool ok = row[i] >= 0;
    const uint16_t* src = base + (ok ? row[i] : 0) * kKeyDim + x * 8;
    const uint32_t d = dst + r * 128 + (((x ^ r) & 7) << 4);
#pragma unroll
    for (int kc = 0; kc < 9; ++kc) cp_async16(d + kc * kPlane, src + kc * 64, ok ? 16 : 0);
  }
}

// Producer, a tile at the tree rows on stage s: wait for it, zero its non-finite values and
// mark their keys, build its tokens' visibility words (word(): wg::Tiles::clean and
// build_mask), then arrive (release: those writes are visible to the consumers that wait).
template <class Word>
__device__ __forceinline__ void clean_tile(uint8_t* smem, const Stages& st, int s, int pt, int ntok, uint64_t* s_bad,
                                           uint64_t* s_mask, Word word) {
  if (pt == 0) s_bad[s] = 0;
  cp_async_wait_every();
  bar_sync<kBarProd, 128>();  // every copy of the tile landed; s_bad cleared
  wg::zero_nonfinite_tile<128>(smem + kOffKV + s * kTileBytes, s_bad, s, pt);
  if (pt < ntok) s_mask[s * kRows + pt] = word();
  fence_smem();  // the zeroed values, for wgmma's reads
  mbar_arrive(st.full0 + 8 * s);
}

// What a consumer warpgroup reads of the shared state (the same for both).
struct ConsumerSmem {
  const uint64_t* mask;
  const uint64_t* bad;
  float* m;   // [2][kRows]
  float* sc;  // [2][kRows]
};

// A consumer's release of a stage: warpgroup W is done with stage S, which held tile j
// (planes_of(W, S) are free). tc_attn_ws_deal arrives on the stage's empty barrier for the
// producer; tc_attn_tma refills them itself.
struct ReleaseToProducer {
  const Stages& st;
  template <int W, int S>
  __device__ __forceinline__ void done(int) const {
    mbar_arrive((W == 0 ? st.empty0 : st.empty1) + 8 * S);
  }
};

// Consumers: the tiles of one key range (bk) in pairs, O, m_run and l_run carried. Pair k is
// use u_0 + k of stage 0 and u_1 + k of stage 1, u_s the stage's earlier uses by the block
// (their parities: bits 0 and 1 of ph; 0 in a block of one range). rel: each release
// (ReleaseToProducer).
template <class Release>
__device__ __forceinline__ void consume_tiles(float (&o)[128], float (&m_run)[2], float (&l_run)[2], const Block& bk,
                                              uint32_t ph, const Stages& st, const ConsumerSmem& cs, uint64_t dq,
                                              float qk_scale, int w, int wq, int g, int t4, const Release& rel) {
  const int ntiles = bk.ntiles;
  const uint32_t sP0 = st.stage(0) + 8 * kPlane, sP1 = st.stage(1) + 8 * kPlane;  // P over each stage's rope plane
  for (int k = 0; 2 * k < ntiles; ++k) {
    const uint32_t par0 = (ph ^ k) & 1, par1 = ((ph >> 1) ^ k) & 1;  // tiles 2k, 2k + 1
    const bool has_b = 2 * k + 1 < ntiles;
    float s[32], mn[2], sc[2], sum[2];
    uint32_t pa[16];
    if (w == 0) {
      // Tile a: S, softmax from the chain's maximum, P posted, PV from registers.
      mbar_wait(st.full0, par0, st.abort);
      fence_smem();
      issue_qk<64>(s, dq, desc(st.stage(0), 16, 1024));  // S of the whole tile
      wait_all();
      pin(s);
      if (has_b) bar_arrive<kBarS0, kConsumerThreads>();  // the tensor cores are WG1's for S of tile b
      softmax_tile(s, m_run, mn, sc, sum, pa, bk, 2 * k, cs.mask, cs.bad, qk_scale, sP0, 0, wq, g, t4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * wq + g + 8 * h;
        if (t4 == 0) cs.m[r] = mn[h], cs.sc[r] = sc[h];
        l_run[h] = l_run[h] * sc[h] + sum[h];
        m_run[h] = mn[h];
      }
      fence_smem();
      bar_arrive<kBarP0, kConsumerThreads>();  // P_a, m_a, sc_a visible to WG1
      rescale(o, sc);
      issue_pv_rs(o, pa, st.stage(0), 0);
      wait_all();
      pin(o);
      rel.template done<0, 0>(2 * k);
      if (has_b) {
        // Tile b (WG1's): its factor, then P_b from stage 1's rope plane.
        issue_peer_pv<kBarP1>(o, m_run, l_run, sc, cs.m + kRows, cs.sc + kRows, st.full0 + 8, par1, st.abort, sP1,
                              st.stage(1), 0, wq, g);
        wait_all();
        pin(o);
        rel.template done<0, 1>(2 * k + 1);
      }
    } else if (has_b) {
      // S of tile b goes to the tensor cores during WG0's softmax of tile a: once S of tile a
      // is done, so that the two do not share the tensor cores and delay WG0's softmax (the
      // head of the chain).
      bar_sync<kBarS0, kConsumerThreads>();
      mbar_wait(st.full0 + 8, par1, st.abort);
      fence_smem();
      issue_qk<64>(s, dq, desc(st.stage(1), 16, 1024));
      // Tile a (WG0's): its factor, then P_a from stage 0's rope plane.
      issue_peer_pv<kBarP0>(o, m_run, l_run, sc, cs.m, cs.sc, st.full0, par0, st.abort, sP0, st.stage(0), 1, wq, g);
      // Tile b: softmax from m_a while PV of tile a runs (o untouched until the wait below).
      wait_one();
      pin(s);
      softmax_tile(s, m_run, mn, sc, sum, pa, bk, 2 * k + 1, cs.mask + kRows, cs.bad + 1, qk_scale, sP1, 1, wq, g, t4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * wq + g + 8 * h;
        if (t4 == 0) cs.m[kRows + r] = mn[h], cs.sc[kRows + r] = sc[h];
      }
      fence_smem();
      bar_arrive<kBarP1, kConsumerThreads>();  // P_b, m_b, sc_b visible to WG0
      wait_all();
      pin(o);
      rel.template done<1, 0>(2 * k);  // S of tile b is done too: Q is free for the next range
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_run[h] = l_run[h] * sc[h] + sum[h];
        m_run[h] = mn[h];
      }
      rescale(o, sc);
      issue_pv_rs(o, pa, st.stage(1), 1);
      wait_all();
      pin(o);
      rel.template done<1, 1>(2 * k + 1);
    } else {
      // The last tile of an odd count is WG0's: only its P_a applied to these columns.
      issue_peer_pv<kBarP0>(o, m_run, l_run, sc, cs.m, cs.sc, st.full0, par0, st.abort, sP0, st.stage(0), 1, wq, g);
      wait_all();
      pin(o);
      rel.template done<1, 0>(2 * k);
    }
  }
}
#endif
}  // namespace ws

}  // namespace
}  // namespace verify_attn
