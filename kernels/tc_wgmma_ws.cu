// tc's warp-specialized sm_90a path: the kernels tc_attn_ws (a block, one key range of one
// element) and tc_attn_ws_deal (dealt mode: a block, a slot of the batch's concatenated tiles)
// and their launch (the design, the layout and the pieces: tc_wgmma_ws.h); compiled to a trap
// elsewhere.
#include "tc_host.h"
#include "tc_wgmma_ws.h"

namespace verify_attn {
namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The mbarriers initialised (thread 0; a block-wide barrier must follow).
__device__ __forceinline__ void init_stages(const ws::Stages& st) {
  using namespace ws;
  mbar_init(st.full0, 128);  // the producer's 128 threads, one arrival each a tile
  mbar_init(st.full0 + 8, 128);
  mbar_init(st.empty0, 128);  // WG0's threads, once each is done with the stage's tile
  mbar_init(st.empty0 + 8, 128);
  mbar_init(st.empty1, 128);  // WG1's
  mbar_init(st.empty1 + 8, 128);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  *st.abort = 0;
}
#endif

__global__ void __launch_bounds__(ws::kThreads, 1) tc_attn_ws(Params p, TcArgs a, const __grid_constant__ KvMap kvm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace ws;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint32_t sbase;
  uint8_t* smem = smem_aligned(smem_raw, sbase);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  Work wk;
  if (!block_work<kTopExtraTiles>(p, a, N, reinterpret_cast<int*>(smem + kOffInfo), warp, wk)) return;
  Block bk;
  bk.set_rows(p, a);
  bk.key_lo = wk.key_lo;
  bk.ntiles = wk.key_hi > wk.key_lo ? (wk.key_hi - wk.key_lo + N - 1) / N : 0;
  const int P = element_prefix(p, wk.b);
  bk.mask_from = min(P, wk.key_hi);
  const int ntiles = bk.ntiles;
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
  // full[s], empty[s] (WG0's release of stage s), empty1[s] (WG1's): + 8 s
  const uint32_t full0 = sbase + kOffFull, empty0 = sbase + kOffEmpty, empty1 = sbase + kOffEmpty1;
  const uint32_t sQ = sbase + kOffQ;
  volatile uint32_t* abort = reinterpret_cast<volatile uint32_t*>(smem + kOffAbort);
  auto stage = [&](int s) { return sbase + kOffKV + s * kTileBytes; };
  if (tid == 0) init_stages(Stages{full0, empty0, empty1, sbase + kOffKV, abort});
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
    if (pt == 0 && kvm.on) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&kvm.map)) : "memory");
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
    // With a tensor map the unmasked tiles (whole prefix tiles, every row attended) come by TMA
    // from thread 0; the masked ones (the tree rows, a partial top tile), always the first,
    // stay on cp.async, which zero-fills past the range and which the cleaning waits for.
    auto by_tma = [&](int j) { return kvm.on && !bk.tile_masked(j); };
    int64_t row[4];
    if (ntiles > 0 && !by_tma(0)) rows_of(0, row);
    int pf = 2;  // the next tile to prefetch (tiles 0 and 1 load at once)
    for (int j = 0; j < ntiles; ++j) {
      const int s = j & 1;
      if (kvm.on)
        for (; pf < ntiles && pf <= j + kPrefetchTiles; ++pf)
          if (by_tma(pf)) prefetch_tile_l2(p.kv, int64_t(wk.b) * p.kv_cols + bk.tile_t0(pf), pt);
      const uint32_t par = ((j >> 1) + 1) & 1;  // tile j - 2's release
      if (j >= 2) mbar_wait(empty0 + 8 * s, par, abort);  // WG0's: planes_of(0, s) free
      if (by_tma(j)) {
        // Q's copies complete before the first tile's arrival (a cp.async tile's arrival waits
        // for them, a plain one does not).
        if (j == 0) cp_async_wait_every();
        if (pt == 0) {
          // planes_of(0, s) now, planes_of(1, s) once WG1 released the stage too; full[s]
          // completes only when both halves landed (tma_expect posts the whole tile's bytes).
          const int row0 = wk.b * p.kv_cols + bk.tile_t0(j);  // contiguous: < 2^31 rows
          tma_expect(full0 + 8 * s);
          tma_half(&kvm.map, stage(s), full0 + 8 * s, row0, 0, s);
          if (j >= 2) mbar_wait(empty1 + 8 * s, par, abort);
          tma_half(&kvm.map, stage(s), full0 + 8 * s, row0, 1, s);
        } else {
          mbar_arrive(full0 + 8 * s);
        }
        continue;
      }
      if (j >= 2) mbar_wait(empty1 + 8 * s, par, abort);  // every plane: WG1's release too
      load_rows(stage(s), row, p.kv);
      if (j + 1 < ntiles && !by_tma(j + 1)) rows_of(j + 1, row);  // the next tile's offsets while this one lands
      if (bk.tile_masked(j)) {
        // The tile at the tree rows: wait for it, zero its non-finite values and mark their
        // keys, build its tokens' visibility words (wg::Tiles::clean and build_mask), then
        // arrive (release: those writes are visible to the consumers that wait).
        if (pt == 0) s_bad[s] = 0;
        cp_async_wait_every();
        bar_sync<kBarProd, 128>();  // every copy of the tile landed; s_bad cleared
        wg::zero_nonfinite_tile<128>(smem + kOffKV + s * kTileBytes, s_bad, s, pt);
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
      mbar_arrive(empty0);  // done with stage 0
      if (has_b) {
        // Tile b (WG1's): its factor, then P_b from stage 1's rope plane.
        issue_peer_pv<kBarP1>(o, m_run, l_run, sc, s_m + kRows, s_sc + kRows, full0 + 8, par, abort, sP1, stage(1), 0,
                              wq, g);
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
      mbar_arrive(empty1);  // done with stage 0
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_run[h] = l_run[h] * sc[h] + sum[h];
        m_run[h] = mn[h];
      }
      rescale(o, sc);
      issue_pv_rs(o, pa, stage(1), 1);
      wait_all();
      pin(o);
      mbar_arrive(empty1 + 8);  // done with stage 1
    } else {
      // The last tile of an odd count is WG0's: only its P_a applied to these columns.
      issue_peer_pv<kBarP0>(o, m_run, l_run, sc, s_m, s_sc, full0, par, abort, sP0, stage(0), 1, wq, g);
      wait_all();
      pin(o);
      mbar_arrive(empty1);  // done with stage 0
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

// Dealt mode (a.deal: batch > 1, split; tc.h, deal_locate): the block walks the elements its
// slot touches, one piece an element, each the scheme of tc_attn_ws on the piece's key range
// (O, m, l reset; its Q and parents; its partial slot s + b written). Producer and consumers
// walk the same pieces from the same info (tc_wgmma_ws.h, "Pieces").
__global__ void __launch_bounds__(ws::kThreads, 1) tc_attn_ws_deal(Params p, TcArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace ws;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint32_t sbase;
  uint8_t* smem = smem_aligned(smem_raw, sbase);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  int* info = reinterpret_cast<int*>(smem + kOffInfo);
  Work wk;
  Deal d;
  deal_block(p, a, N, info, warp, d);
  if (d.b >= p.batch) return;  // uniform: the slot holds no real tile
  Block bk;
  bk.set_rows(p, a);
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
  const Stages st{sbase + kOffFull, sbase + kOffEmpty, sbase + kOffEmpty1, sbase + kOffKV,
                  reinterpret_cast<volatile uint32_t*>(smem + kOffAbort)};
  const uint32_t sQ = sbase + kOffQ;
  if (tid == 0) {
    init_stages(st);
    volatile int* pc = reinterpret_cast<volatile int*>(smem + kOffPiece);  // the producer's walk starts at d
    pc[kPcCurB] = d.b, pc[kPcCurC] = d.c;
  }
  __syncthreads();  // the mbarriers initialised, the walk posted; the last block-wide barrier

  // Across pieces the stages keep alternating per piece (a piece's tile j on stage j & 1, its
  // pair k on use u_s + k of stage s, u_s the stage's uses by the earlier pieces), so every
  // mbarrier phase is counted over the block, not the piece.
  if (warp >= 8) {
    // ---- Producer warpgroup -------------------------------------------------------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegsProducer));
    const int pt = tid - kConsumerThreads;  // 0..127
    const int x = pt & 7, rg = pt >> 3;     // chunk x of each 128-byte plane row; rows rg + 16 i
    const int ntok = (bk.R0 + bk.rows_valid - 1) / p.heads - bk.i_lo + 1;
    int32_t* s_parent = reinterpret_cast<int32_t*>(smem + kOffParentDeal);
    // The piece, posted by thread 0 of the warpgroup and read from shared memory where used
    // (volatile: 56 registers do not hold it across the tile loop).
    volatile int* pc = reinterpret_cast<volatile int*>(smem + kOffPiece);
    auto tile_t0 = [&](int j) { return pc[kPcKeyLo] + (pc[kPcTiles] - 1 - j) * N; };
    // The cache rows of tile j (-1: past the range), in int64.
    auto rows_of = [&](int j, int64_t (&row)[4]) {
      const int b = pc[kPcB], t0 = tile_t0(j) + rg, key_hi = pc[kPcKeyHi];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = t0 + 16 * i;
        row[i] = t < key_hi ? cache_row(p, b, t) : int64_t(-1);
      }
    };
    // Bit s: the parity of stage s's uses by the earlier pieces; bit 2 + s: stage s was used.
    uint32_t ph = 0;
    for (int n = 0;; ++n) {
      if (n > 0) bar_sync<kBarProd, 128>();  // every producer thread done with the previous piece and its parents
      if (pt == 0) {
        // Its own copies of the walk and the piece (not d, wk, bk: fewer registers live here).
        Deal dc;
        Work pw;
        dc.b = pc[kPcCurB], dc.c = pc[kPcCurC];
        const bool more = deal_next(p, a, N, info, dc, pw);
        pc[kPcCurB] = dc.b, pc[kPcCurC] = dc.c;
        if (more) {
          const int ntiles = pw.key_hi > pw.key_lo ? (pw.key_hi - pw.key_lo + N - 1) / N : 0;
          const int P = element_prefix(p, pw.b), mask_from = min(P, pw.key_hi);
          pc[kPcKeyLo] = pw.key_lo, pc[kPcKeyHi] = pw.key_hi, pc[kPcTiles] = ntiles;
          pc[kPcMaskFrom] = mask_from, pc[kPcMasked] = ntiles - (mask_from - pw.key_lo) / N, pc[kPcP] = P;
        }
        pc[kPcB] = more ? pw.b : -1;
      }
      bar_sync<kBarProd, 128>();  // the piece posted
      const int b = pc[kPcB];
      if (b < 0) break;
      const int ntiles = pc[kPcTiles];
      // The piece's Q (before its parents, as the first piece's always was); after the first
      // piece only once both consumers released stage 0's previous use: that is the previous
      // piece's last pair, whose S (tile a, and tile b: WG1 waits for it before it releases
      // stage 0) read Q for the last time. The piece's tile 0 (stage 0) then waits for nothing
      // more. Its copies complete before the arrival of the piece's first tile (arrivals track
      // every earlier cp.async of the thread).
      if (ntiles > 0) {
        if (ph & 4) {  // both consumers' releases
          st.wait_released(0, (ph & 1) ^ 1);
        }
        int64_t qrow[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = rg + 16 * i;
          qrow[i] = r < bk.rows_valid ? int64_t(b) * a.R + bk.R0 + r : int64_t(-1);
        }
        load_rows(sQ, qrow, p.q, rg, x);
      }
      {
        const int32_t* parent_g = p.parent + int64_t(b) * p.q_len;
        for (int i = pt; i < a.parent_cap; i += 128) s_parent[i] = __ldg(parent_g + i);
      }
      TreeWalk walk(pt < ntok ? bk.i_lo + pt : -1);
      bar_sync<kBarProd, 128>();  // the parents staged
      int64_t row[4];
      if (ntiles > 0) rows_of(0, row);
      for (int j = 0; j < pc[kPcTiles]; ++j) {
        const int s = j & 1;
        if (j >= 2 || (j == 1 && (ph & 8))) {  // the stage's previous use released by both consumers
          st.wait_released(s, ((ph >> s) ^ (j >> 1) ^ 1) & 1);
        }
        load_rows(st.stage(s), row, p.kv, rg, x);
        if (j + 1 < pc[kPcTiles]) rows_of(j + 1, row);  // the next tile's offsets while this one lands
        if (j < pc[kPcMasked])
          clean_tile(smem, st, s, pt, ntok, s_bad, s_mask, [&] {
            return walk.word(tile_t0(j), N, pc[kPcMaskFrom], pc[kPcP], pc[kPcKeyHi], a.parent_cap, s_parent,
                             p.parent + int64_t(pc[kPcB]) * p.q_len);
          });
        else
          mbar_arrive_cp_async(st.full0 + 8 * s);
      }
      ph ^= (((ntiles + 1) >> 1) & 1) | ((ntiles >> 1) & 1) << 1;
      ph |= (ntiles >= 1 ? 4 : 0) | (ntiles >= 2 ? 8 : 0);
    }
    cp_async_wait_every();  // no copy outlives its thread
    return;
  }

  // ---- Consumer warpgroups ----------------------------------------------------------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegsConsumer));
  const int w = warp >> 2, wq = warp & 3;  // warpgroup (its tiles' parity, its O columns 256 w ..); warp in it
  const int g = lane >> 2, t4 = lane & 3;
  const ConsumerSmem cs{s_mask, s_bad, reinterpret_cast<float*>(smem + kOffM), reinterpret_cast<float*>(smem + kOffSc)};
  const float qk_scale = p.scale * kLog2e;
  const uint64_t dq = desc(sQ, 16, 1024);
  // Bit s: the parity of stage s's uses by the earlier pieces (u_s & 1); bit 2: the piece's
  // parity (which s_l buffer its row sums go to).
  uint32_t ph = 0;
  while (deal_next(p, a, N, info, d, wk)) {
    bk.key_lo = wk.key_lo;
    bk.ntiles = wk.key_hi > wk.key_lo ? (wk.key_hi - wk.key_lo + N - 1) / N : 0;
    bk.mask_from = min(element_prefix(p, wk.b), wk.key_hi);
    const int ntiles = bk.ntiles;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.f;
    consume_tiles(o, m_run, l_run, bk, ph & 3, st, cs, dq, qk_scale, w, wq, g, t4, ReleaseToProducer{st});

    // Row sums over the quad and the two warpgroups (both hold the same final maximum), in the
    // piece's s_l buffer: the other warpgroup may still read the previous piece's after the
    // barrier while this one posts (it cannot pass the next piece's barrier before that).
    float* s_l = reinterpret_cast<float*>(smem + (ph & 4 ? kOffL1 : kOffL));
    post_row_sums(s_l, l_run, w, wq, g, t4);
    bar_sync<kBarEnd, kConsumerThreads>();
    // The piece's element and slot, from what outlives the loop above (not wk: registers).
    const int b = d.b - 1;
    store_rows<true>(p, a, int(blockIdx.y) + b, b, bk.R0, bk.rows_valid, s_l, m_run, o, st.abort, w, wq, g, t4);
    ph ^= (((ntiles + 1) >> 1) & 1) | ((ntiles >> 1) & 1) << 1 | 4;
  }
#else
  __trap();  // launched only where the library holds sm_90a code (plan_tc checks the device)
#endif
}

}  // namespace

int tc_launch_wgmma_ws(const Params& p, const Plan& plan, void* workspace, cudaStream_t stream) {
  // Dealt mode (layout_of: batch > 1, split) runs the pieces' kernel; one range a block the
  // other (a loop over pieces measured 2-9% slower at batch 1, where a block has one).
  // (The dealing kernel's producer, at 56 registers, spilled with the TMA branch: cp.async alone.)
  if (layout_of(p, plan).deal) return launch_kernel<tc_attn_ws_deal>(ws::kBaseBytesDeal, p, plan, workspace, stream);
  KvMap kvm = {};
  kvm.on = encode_kv_map(p, &kvm.map);
  return launch_kernel<tc_attn_ws>(ws::kBaseBytes, p, plan, workspace, stream, kvm);
}

}  // namespace verify_attn
