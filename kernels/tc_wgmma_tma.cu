// tc's sm_90a path without a copy warpgroup (path 4, wgmma_tma): the kernel tc_attn_tma and its
// launch; compiled to a trap elsewhere.
//
// Why: beside FlashMLA under Nsight Compute, tc_attn_ws's tensor pipes were 10-15 points less
// busy per tile with 12 warps an SM where FlashMLA has 8, and every refill went through the
// producer's wake-up on an `empty` mbarrier (docs/flashmla_mainloop.md). Here the two consumer
// warpgroups of tc_attn_ws (the pair schedule, the softmax, P over the rope plane, the named
// barriers: tc_wgmma_ws.h) run alone, 256 threads, and each loads what it frees:
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
//   As in FlashMLA, the issuing thread's own wgmma wait stands for its warpgroup's: a
//   warpgroup's wgmma runs as one operation.
//
//   The start. Q by cp.async from all 256 threads first (tc-early measured tiles issued
//   before Q 1-4% slower), then thread 0 issues the first two tiles that are not masked, whole.
//   The masked tiles (those at the tree rows, and a partial top tile: always the first ones of
//   the range) are gathered by cp.async with zero fill past the range, cleaned of non-finite
//   values and given their visibility words by all 256 threads before the loop (tc_attn_ws's
//   producer steps, tc_attn_wg's contract), and their phase of full[s] is completed by two
//   plain arrivals. plan_tc takes this path only where at most two tiles are masked (q_len
//   <= 65: an interval of 65 keys meets two 64-key tiles at most), on one element with a
//   contiguous cache (every other tile by TMA); a third masked tile raises the abort flag
//   (every row NaN) rather than read an uncleaned tile.
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
}  // namespace tma
#endif

__global__ void __launch_bounds__(ws::kConsumerThreads, 1) tc_attn_tma(Params p, TcArgs a, const __grid_constant__ KvMap kvm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace ws;
  using tma::load_half;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint32_t sbase;
  uint8_t* smem = smem_aligned(smem_raw, sbase);
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
  int nmasked = 0;  // the masked tiles are the first ones
  while (nmasked < 2 && nmasked < ntiles && bk.tile_masked(nmasked)) ++nmasked;
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
  const uint32_t full0 = sbase + kOffFull, sQ = sbase + kOffQ;  // full[s]: + 8 s
  volatile uint32_t* abort = reinterpret_cast<volatile uint32_t*>(smem + kOffAbort);
  auto stage = [&](int s) { return sbase + kOffKV + s * kTileBytes; };
  auto row0_of = [&](int j) { return wk.b * p.kv_cols + bk.tile_t0(j); };  // contiguous: < 2^31 rows
  const CUtensorMap* map = &kvm.map;

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
  if (tid == 0) {
    mbar_init(full0, 2);  // a tile's two halves, each arrive.expect_tx by its issuer
    mbar_init(full0 + 8, 2);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    *abort = ntiles > 2 && bk.tile_masked(2);  // plan_tc's bound broken: NaN rows, not an uncleaned tile
    s_bad[0] = s_bad[1] = 0;
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
  }
  if (ntiles > 0) {
    const bool ok = lr < bk.rows_valid;
    load_row(sQ, ok ? p.q + (int64_t(wk.b) * a.R + bk.R0 + lr) * kKeyDim : p.q, ok);
  }
  __syncthreads();  // the mbarriers initialised
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
      uint4* rows = reinterpret_cast<uint4*>(smem + kOffKV + j * kTileBytes);
      for (int c = tid; c < N * kChunks; c += kConsumerThreads) {
        uint4 v = rows[c];
        const bool bad = zero_nonfinite(v.x) | zero_nonfinite(v.y) | zero_nonfinite(v.z) | zero_nonfinite(v.w);
        if (bad) {
          rows[c] = v;
          atomicOr(reinterpret_cast<unsigned long long*>(&s_bad[j]), 1ull << ((c >> 3) & (N - 1)));
        }
      }
      if (tid < ntok)
        s_mask[j * kRows + tid] = walk.word(bk.tile_t0(j), N, bk.mask_from, P, wk.key_hi, a.parent_cap, s_parent, parent_g);
    }
    fence_smem();     // the zeroed values, for wgmma's reads
    __syncthreads();  // cleaned and masked
    if (tid == 0)
      for (int j = 0; j < nmasked; ++j) mbar_arrive(full0 + 8 * j), mbar_arrive(full0 + 8 * j);
  }

  // ---- The pairs: tc_attn_ws's consumers, each refilling what it frees ----------------------
  const int w = warp >> 2, wq = warp & 3;  // warpgroup (its tiles' parity, its O columns 256 w ..); warp in it
  const int g = lane >> 2, t4 = lane & 3;
  const bool issuer = (tid & 127) == 0;    // thread 0 of its warpgroup
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
    const bool next_a = 2 * k + 2 < ntiles, next_b = 2 * k + 3 < ntiles;
    float s[32], mn[2], sc[2], sum[2];
    uint32_t pa[16];
    if (w == 0) {
      // Tile a: S, softmax from the chain's maximum, P posted, PV from registers.
      mbar_wait(full0, par, abort);
      fence_smem();
      issue_qk<64>(s, dq, desc(stage(0), 16, 1024));  // S of the whole tile
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
      if (issuer && next_a) load_half<0, 0>(map, stage(0), full0, row0_of(2 * k + 2));  // V_a[:, 0:256] read
      if (has_b) {
        // Tile b (WG1's): its factor, then P_b from stage 1's rope plane.
        issue_peer_pv<kBarP1>(o, m_run, l_run, sc, s_m + kRows, s_sc + kRows, full0 + 8, par, abort, sP1, stage(1), 0,
                              wq, g);
        wait_all();
        pin(o);
        if (issuer && next_b) load_half<0, 1>(map, stage(1), full0 + 8, row0_of(2 * k + 3));  // V_b[:, 0:256], P_b read
      }
    } else if (has_b) {
      // S of tile b once S of tile a is done (tc_attn_ws: the two do not share the tensor cores).
      bar_sync<kBarS0, kConsumerThreads>();
      mbar_wait(full0 + 8, par, abort);
      fence_smem();
      issue_qk<64>(s, dq, desc(stage(1), 16, 1024));
      // Tile a (WG0's): its factor, then P_a from stage 0's rope plane.
      issue_peer_pv<kBarP0>(o, m_run, l_run, sc, s_m, s_sc, full0, par, abort, sP0, stage(0), 1, wq, g);
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
      if (issuer && next_a) load_half<1, 0>(map, stage(0), full0, row0_of(2 * k + 2));  // V_a[:, 256:512], P_a read
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_run[h] = l_run[h] * sc[h] + sum[h];
        m_run[h] = mn[h];
      }
      rescale(o, sc);
      issue_pv_rs(o, pa, stage(1), 1);
      wait_all();
      pin(o);
      if (issuer && next_b) load_half<1, 1>(map, stage(1), full0 + 8, row0_of(2 * k + 3));  // V_b[:, 256:512] read
    } else {
      // The last tile of an odd count is WG0's: only its P_a applied to these columns.
      issue_peer_pv<kBarP0>(o, m_run, l_run, sc, s_m, s_sc, full0, par, abort, sP0, stage(0), 1, wq, g);
      wait_all();
      pin(o);
    }
  }

  // Row sums over the quad and the two warpgroups (both hold the same final maximum).
  post_row_sums(s_l, l_run, w, wq, g, t4);
  bar_sync<kBarEnd, kConsumerThreads>();
  store_rows<true>(p, a, wk.slot, wk.b, bk.R0, bk.rows_valid, s_l, m_run, o, abort, w, wq, g, t4);  // abort: a wait timed out
#else
  __trap();  // launched only where the library holds sm_90a code (plan_tc checks the device)
#endif
}

}  // namespace

int tc_launch_wgmma_tma(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  KvMap kvm = {};
  kvm.on = encode_kv_map(p, &kvm.map);
  if (!kvm.on) return int(cudaErrorNotSupported);  // plan_tc takes this path only where the map encodes
  return launch_kernel<tc_attn_tma>(ws::kBaseBytes, p, plan, workspace, stream, kvm);
}

}  // namespace verify_attn
