// Path 4 (tc_wgmma_tma.cu, whose comment has the design: two consumer warpgroups that refill by
// TMA what they free) is made of these: the refill by the last reader, a key range's set-up and
// its start.
#pragma once
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
  const uint16_t* kv;  // the cache, for the L2 prefetch of tile j + 2 + kPrefetchTiles
  template <int W, int S>
  __device__ __forceinline__ void done(int j) const {
    if (issuer && j + 2 < ntiles) load_half<W, S>(map, st.stage(S), st.full0 + 8 * S, row_lo + bk.tile_t0(j + 2));
    if (W == 0 && issuer && j + 2 + kPrefetchTiles < ntiles)
      prefetch_tile_l2(kv, int64_t(row_lo) + bk.tile_t0(j + 2 + kPrefetchTiles));
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
// OffParent: where the kernel's staged parents start.
template <int OffParent = kOffParent>
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
    for (int j = 2; j < ntiles && j <= 1 + kPrefetchTiles; ++j) prefetch_tile_l2(p.kv, row0_of(j));
  }
  const int32_t* parent_g = p.parent + int64_t(wk.b) * p.q_len;
  int32_t* s_parent = reinterpret_cast<int32_t*>(smem + OffParent);
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
}  // namespace
}  // namespace verify_attn
