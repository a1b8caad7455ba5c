// tc's warp-specialized sm_90a path: a cp.async producer warpgroup and two consumer
// warpgroups that take alternate tiles (ping-pong), compiled to a trap elsewhere.
// What tc runs on compute capability 9.0 (path 3) but where every element's keys fit in two
// tiles (kernels/tc.cu says why, with the H200's measurements).
#pragma once
#include "tc_wgmma.h"

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
using wg::fence;
using wg::fence_smem;
using wg::Mma;
using wg::pin;
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

// O[64 x 256] (+)= A[64 x 16] V[16 x 256], A from registers (the m16n8k16 A fragment of
// each warp's 16 rows: a[0] row g keys 2 t4.., a[1] row g + 8, a[2] row g keys 2 t4 + 8..,
// a[3] row g + 8 keys 2 t4 + 8; CUTLASS cute/atom/mma_traits_sm90_gmma.hpp ALayout_64x16),
// B through a descriptor; TB: B's transpose bit. CUTLASS cute/arch/mma_sm90_gmma.hpp
// MMA_64x256x16_F32BF16BF16_RS has the same operand order.
template <int TB>
__device__ __forceinline__ void mma_rs256(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, %134;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1), "n"(TB));
}

// What a consumer knows of the block (the same for both warpgroups).
struct Block {
  int R0, rows_valid, i_lo, heads, key_lo, ntiles, mask_from;
  __device__ int tile_t0(int j) const { return key_lo + (ntiles - 1 - j) * N; }
  __device__ bool tile_masked(int j) const { return tile_t0(j) + N > mask_from; }
};

// Row h of this thread's part of a tile's scores (s[4 i + 2 h + e], key 8 i + 2 t4 + e): to
// log2 units, non-finite scores NaN; on a masked tile (the one or two at the tree rows) keys
// with a non-finite cache value NaN and keys the row cannot see -inf. Returns the maximum
// (max.NaN). Two instances, so that the unmasked tiles run no mask test.
template <bool kMasked>
__device__ __forceinline__ float scale_row(float (&s)[32], int h, float qk_scale, uint64_t word, uint64_t bad, int t4) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v = s[4 * i + 2 * h + e] * qk_scale;
      if (!(fabsf(v) < INFINITY)) v = __int_as_float(0x7fffffff);
      if (kMasked) {
        const int key = 8 * i + 2 * t4 + e;
        if ((bad >> key) & 1) v = __int_as_float(0x7fffffff);
        if (!((word >> key) & 1)) v = -INFINITY;
      }
      s[4 * i + 2 * h + e] = v;
      mx = nan_max(mx, v);
    }
  return mx;
}

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
    if (masked) {
      const int r = min(16 * wq + g + 8 * h, bk.rows_valid - 1);
      mx = scale_row<true>(s, h, qk_scale, s_mask[(bk.R0 + r) / bk.heads - bk.i_lo], bad, t4);
    } else {
      mx = scale_row<false>(s, h, qk_scale, ~0ull, 0, t4);
    }
    mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mn[h] = nan_max(m_prev[h], mx);
    mu[h] = mn[h] == -INFINITY ? 0.f : mn[h];
    sc[h] = ex2(m_prev[h] - mu[h]);
    sum[h] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float p0 = ex2(s[4 * i + 2 * h] - mu[h]);
      const float p1 = ex2(s[4 * i + 2 * h + 1] - mu[h]);
      sum[h] += p0 + p1;
      pa[4 * (i >> 1) + 2 * (i & 1) + h] = pack_bf16(p0, p1);
    }
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

// S = Q K^T of a whole tile: 64 rows x 64 keys, 36 k-steps (issued and committed, not waited).
__device__ __forceinline__ void issue_qk(float (&s)[32], uint64_t dq, uint32_t sK) {
  const uint64_t dk = desc(sK, 16, 1024);
  fence();
#pragma unroll
  for (int kc = 0; kc < 9; ++kc)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t off = (kc * wg::kPlane + kk * 32) >> 4;
      Mma<64>::run<0, 0>(s, dq + off, dk + off, kc | kk);
    }
  commit();
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
// O *= sc per row (skipped when no factor of the warp differs from 1: the maxima settle early).
__device__ __forceinline__ void rescale(float (&o)[128], const float (&sc)[2]) {
  if (__any_sync(0xffffffffu, sc[0] != 1.f || sc[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] *= sc[(i >> 1) & 1];
  }
}
#endif
}  // namespace ws

__global__ void __launch_bounds__(ws::kThreads, 1) tc_attn_ws(Params p, TcArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace ws;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (sbase - sraw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  Work wk;
  if (!block_work(p, a, N, reinterpret_cast<int*>(smem + kOffInfo), warp, wk)) return;
  Block bk;
  bk.R0 = blockIdx.x * a.group_rows;
  bk.rows_valid = min(a.group_rows, a.R - bk.R0);
  bk.heads = p.heads;
  bk.i_lo = bk.R0 / p.heads;
  bk.key_lo = wk.key_lo;
  bk.ntiles = wk.key_hi > wk.key_lo ? (wk.key_hi - wk.key_lo + N - 1) / N : 0;
  const int P = element_prefix(p, wk.b);
  bk.mask_from = min(P, wk.key_hi);
  const int ntiles = bk.ntiles;
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
  const uint32_t full0 = sbase + kOffFull, empty0 = sbase + kOffEmpty;  // stage s: + 8 s
  const uint32_t sQ = sbase + kOffQ;
  volatile uint32_t* abort = reinterpret_cast<volatile uint32_t*>(smem + kOffAbort);
  auto stage = [&](int s) { return sbase + kOffKV + s * kTileBytes; };
  if (tid == 0) {
    mbar_init(full0, 128);       // the producer's 128 threads, one arrival each a tile
    mbar_init(full0 + 8, 128);
    mbar_init(empty0, kConsumerThreads);  // every consumer thread, once it is done with the tile
    mbar_init(empty0 + 8, kConsumerThreads);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    *abort = 0;
  }
  __syncthreads();  // the mbarriers initialised; the last block-wide barrier

  if (warp >= 8) {
    // ---- Producer warpgroup -------------------------------------------------------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegsProducer));
    const int pt = tid - kConsumerThreads;  // 0..127
    const int x = pt & 7, rg = pt >> 3;     // chunk x of each 128-byte plane row; rows rg + 16 i
    const int ntok = (bk.R0 + bk.rows_valid - 1) / p.heads - bk.i_lo + 1;
    const int32_t* parent_g = p.parent + int64_t(wk.b) * p.q_len;
    int32_t* s_parent = reinterpret_cast<int32_t*>(smem + kOffParent);
    for (int i = pt; i < a.parent_cap; i += 128) s_parent[i] = __ldg(parent_g + i);
    TreeWalk walk(pt < ntok ? bk.i_lo + pt : -1);
    // Row rg + 16 i of a 64-row plane set at dst: 9 x 16 bytes (its chunk x of each plane),
    // from src (a valid address; 0 bytes read and zero filled when !ok).
    auto load_rows = [&](uint32_t dst, const int64_t (&row)[4], const uint16_t* base) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = rg + 16 * i;
        const bool ok = row[i] >= 0;
        const uint16_t* src = base + (ok ? row[i] : 0) * kKeyDim + x * 8;
        const uint32_t d = dst + r * 128 + (((x ^ r) & 7) << 4);
#pragma unroll
        for (int kc = 0; kc < 9; ++kc) cp_async16(d + kc * kPlane, src + kc * 64, ok ? 16 : 0);
      }
    };
    // The cache rows of tile j (-1: past the range), in int64.
    auto rows_of = [&](int j, int64_t (&row)[4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = bk.tile_t0(j) + rg + 16 * i;
        row[i] = t < wk.key_hi ? cache_row(p, wk.b, t) : int64_t(-1);
      }
    };
    if (ntiles > 0) {
      int64_t qrow[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = rg + 16 * i;
        qrow[i] = r < bk.rows_valid ? int64_t(wk.b) * a.R + bk.R0 + r : int64_t(-1);
      }
      load_rows(sQ, qrow, p.q);  // completes before any tile's arrival (arrivals track every earlier cp.async)
    }
    bar_sync<kBarProd, 128>();  // the parents staged
    int64_t row[4];
    if (ntiles > 0) rows_of(0, row);
    for (int j = 0; j < ntiles; ++j) {
      const int s = j & 1;
      if (j >= 2) mbar_wait(empty0 + 8 * s, ((j >> 1) + 1) & 1, abort);  // tile j - 2 released by both consumers
      load_rows(stage(s), row, p.kv);
      if (j + 1 < ntiles) rows_of(j + 1, row);  // the next tile's offsets while this one lands
      if (bk.tile_masked(j)) {
        // The tile at the tree rows: wait for it, zero its non-finite values and mark their
        // keys, build its tokens' visibility words (wg::Tiles::clean and build_mask), then
        // arrive (release: those writes are visible to the consumers that wait).
        if (pt == 0) s_bad[s] = 0;
        cp_async_wait_every();
        bar_sync<kBarProd, 128>();  // every copy of the tile landed; s_bad cleared
        uint4* rows = reinterpret_cast<uint4*>(smem + kOffKV + s * kTileBytes);
        for (int c = pt; c < N * kChunks; c += 128) {
          uint4 v = rows[c];
          const bool bad = zero_nonfinite(v.x) | zero_nonfinite(v.y) | zero_nonfinite(v.z) | zero_nonfinite(v.w);
          if (bad) {
            rows[c] = v;
            atomicOr(reinterpret_cast<unsigned long long*>(&s_bad[s]), 1ull << ((c >> 3) & (N - 1)));
          }
        }
        if (pt < ntok)
          s_mask[s * kRows + pt] = walk.word(bk.tile_t0(j), N, bk.mask_from, P, wk.key_hi, a.parent_cap, s_parent, parent_g);
        fence_smem();  // the zeroed values, for wgmma's reads
        mbar_arrive(full0 + 8 * s);
      } else {
        mbar_arrive_cp_async(full0 + 8 * s);
      }
    }
    cp_async_wait_every();  // no copy outlives its thread
    return;
  }

  // ---- Consumer warpgroups ----------------------------------------------------------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegsConsumer));
  const int w = warp >> 2, wq = warp & 3;  // warpgroup (its tiles' parity, its O columns 256 w ..); warp in it
  const int g = lane >> 2, t4 = lane & 3;
  float* s_m = reinterpret_cast<float*>(smem + kOffM);
  float* s_sc = reinterpret_cast<float*>(smem + kOffSc);
  float* s_l = reinterpret_cast<float*>(smem + kOffL);
  const float qk_scale = p.scale * kLog2e;
  const uint64_t dq = desc(sQ, 16, 1024);
  const uint32_t sP0 = stage(0) + 8 * kPlane, sP1 = stage(1) + 8 * kPlane;  // P over each stage's rope plane
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;

  for (int k = 0; 2 * k < ntiles; ++k) {
    const uint32_t par = k & 1;  // tiles 2k, 2k + 1 are use k of stages 0, 1
    const bool has_b = 2 * k + 1 < ntiles;
    float s[32], mn[2], sc[2], sum[2];
    uint32_t pa[16];
    if (w == 0) {
      // Tile a: S, softmax from the chain's maximum, P posted, PV from registers.
      mbar_wait(full0, par, abort);
      fence_smem();
      issue_qk(s, dq, stage(0));
      wait_all();
      pin(s);
      if (has_b) bar_arrive<kBarS0, kConsumerThreads>();  // the tensor cores are WG1's for S of tile b
      softmax_tile(s, m_run, mn, sc, sum, pa, bk, 2 * k, s_mask, s_bad, qk_scale, sP0, 0, wq, g, t4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * wq + g + 8 * h;
        if (t4 == 0) s_m[r] = mn[h], s_sc[r] = sc[h];
        l_run[h] = l_run[h] * sc[h] + sum[h];
        m_run[h] = mn[h];
      }
      fence_smem();
      bar_arrive<kBarP0, kConsumerThreads>();  // P_a, m_a, sc_a visible to WG1
      rescale(o, sc);
      issue_pv_rs(o, pa, stage(0), 0);
      wait_all();
      pin(o);
      mbar_arrive(empty0);  // done with stage 0
      if (has_b) {
        // Tile b (WG1's): its factor, then P_b from stage 1's rope plane.
        bar_sync<kBarP1, kConsumerThreads>();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = 16 * wq + g + 8 * h;
          sc[h] = s_sc[kRows + r];
          m_run[h] = s_m[kRows + r];
          l_run[h] *= sc[h];
        }
        rescale(o, sc);
        mbar_wait(full0 + 8, par, abort);
        fence_smem();
        issue_pv_ss(o, sP1, stage(1), 0);
        wait_all();
        pin(o);
        mbar_arrive(empty0 + 8);  // done with stage 1
      }
    } else if (has_b) {
      // S of tile b goes to the tensor cores during WG0's softmax of tile a: once S of tile a
      // is done, so that the two do not share the tensor cores and delay WG0's softmax (the
      // head of the chain).
      bar_sync<kBarS0, kConsumerThreads>();
      mbar_wait(full0 + 8, par, abort);
      fence_smem();
      issue_qk(s, dq, stage(1));
      // Tile a (WG0's): its factor, then P_a from stage 0's rope plane.
      bar_sync<kBarP0, kConsumerThreads>();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * wq + g + 8 * h;
        sc[h] = s_sc[r];
        m_run[h] = s_m[r];
        l_run[h] *= sc[h];
      }
      rescale(o, sc);
      mbar_wait(full0, par, abort);
      fence_smem();
      issue_pv_ss(o, sP0, stage(0), 1);
      // Tile b: softmax from m_a while PV of tile a runs (o untouched until the wait below).
      wait_one();
      pin(s);
      softmax_tile(s, m_run, mn, sc, sum, pa, bk, 2 * k + 1, s_mask + kRows, s_bad + 1, qk_scale, sP1, 1, wq, g, t4);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * wq + g + 8 * h;
        if (t4 == 0) s_m[kRows + r] = mn[h], s_sc[kRows + r] = sc[h];
      }
      fence_smem();
      bar_arrive<kBarP1, kConsumerThreads>();  // P_b, m_b, sc_b visible to WG0
      wait_all();
      pin(o);
      mbar_arrive(empty0);  // done with stage 0
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_run[h] = l_run[h] * sc[h] + sum[h];
        m_run[h] = mn[h];
      }
      rescale(o, sc);
      issue_pv_rs(o, pa, stage(1), 1);
      wait_all();
      pin(o);
      mbar_arrive(empty0 + 8);  // done with stage 1
    } else {
      // The last tile of an odd count is WG0's: only its P_a applied to these columns.
      bar_sync<kBarP0, kConsumerThreads>();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * wq + g + 8 * h;
        sc[h] = s_sc[r];
        m_run[h] = s_m[r];
        l_run[h] *= sc[h];
      }
      rescale(o, sc);
      mbar_wait(full0, par, abort);
      fence_smem();
      issue_pv_ss(o, sP0, stage(0), 1);
      wait_all();
      pin(o);
      mbar_arrive(empty0);  // done with stage 0
    }
  }

  // Row sums over the quad and the two warpgroups (both hold the same final maximum).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t4 == 0) s_l[w * kRows + 16 * wq + g + 8 * h] = l;
  }
  bar_sync<kBarEnd, kConsumerThreads>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * wq + g + 8 * h;
    if (r >= bk.rows_valid) continue;
    RowEnd end = row_end(s_l[r] + s_l[kRows + r], m_run[h]);
    if (*abort) end.inv = end.lse2 = __int_as_float(0x7fffffff);  // a wait timed out: never a plausible result
    OutRow dst(p, a, wk.slot, wk.b, bk.R0 + r, 256 * w + 2 * t4);
#pragma unroll
    for (int i = 0; i < 32; ++i) dst.put(8 * i, o[4 * i + 2 * h] * end.inv, o[4 * i + 2 * h + 1] * end.inv);
    if (w == 0 && t4 == 0) dst.lse(end.lse2);
  }
#else
  __trap();  // launched only where the library holds sm_90a code (plan_tc checks the device)
#endif
}

}  // namespace
}  // namespace verify_attn
