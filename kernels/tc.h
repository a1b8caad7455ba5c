// The tc kernel: the verify attention on tensor cores (bf16 operands, fp32 accumulation).
// This header holds what every path shares: the block's work (rows, splits, the gather's
// cache rows), the tree walk, the row epilogue; the files of the library (headers: a path's
// layout and device pieces; .cu: its kernels and launcher, each compiled on its own):
//   tc_mma.h, .cu      the mma.sync mainloop (sm_80 and later): tc_attn<Config>
//   tc_wgmma.h, .cu    the warpgroup-MMA mainloop (sm_90a): tc_attn_wg; and what the sm_90a
//                      kernels share: the swizzled planes, descriptors, wg::Tiles (the
//                      gather, tree mask and non-finite clean-up of a block's tiles)
//   tc_wgmma_mma.h     the wgmma instructions (Mma<n>, mma_rs256)
//   tc_wgmma_t.h, .cu  the same transposed for few query rows (sm_90a): tc_attn_wgt<NW>
//   tc_wgmma_ws.h, .cu the same block warp-specialized (sm_90a): tc_attn_ws, a cp.async
//                      producer warpgroup (mbarriers) and two consumer warpgroups on
//                      alternate tiles, so one's softmax overlaps the other's MMAs; and
//                      tc_attn_ws_deal, the same over a ragged batch's dealt tiles
//   tc_wgmma_tma.cu    tc_attn_ws's two consumers alone (sm_90a): tc_attn_tma, each refilling
//                      by TMA what it frees (a contiguous cache), and tc_attn_tma_deal
//   tc_merge.h         the log-sum-exp merge of split partials, one kernel for every path
//   tc_host.h          the host pieces the .cu files share, the paths' launchers
//   tc.cu              the plan (the path and tile chosen once, recorded in Plan::path), the
//                      launch through the path's launcher, the merge
//
// Five paths, one contract, chosen at run time (plan_tc): mma.sync m16n8k16 for sm_80 and
// every later architecture, and on compute capability 9.0 (built as sm_90a) warpgroup MMAs
// with the query rows on wgmma's M, which is 64: tc_attn_ws (a producer warpgroup, two
// consumers on alternate tiles; for a contiguous cache tc_attn_tma, the consumers alone)
// and, where every element's keys fit in two tiles, tc_attn_wg (both warpgroups in one
// phase). tc_attn_wgt, the keys on M and the rows on N
// (S^T = K Q^T, O^T = V^T P^T: no padding of groups <= 48 rows), measured slower than
// tc_attn_wg where it was meant to win, runs only when pinned. All share the rows, the
// splits, the gather, the tree mask, the NaN handling and the merge described here.
//
// In MLA every head reads the same cache row, so a block takes up to 64 query rows, the
// (token, head) pairs of one batch element in token-major order (row = i * heads + h), and
// streams the element's cache rows through shared memory once for all of them:
//   S = Q K^T   over the 576 dims of a row (latent || rope)
//   O += P V    with V the first 512 dims of the same shared-memory tile
// Per tile of N cache rows, 8 warps in a WR x WC grid: warp (wr, wc) computes the scores of
// its 64/WR rows for N/WC of the keys, and the output of the same rows for 512/WC of the
// columns, so O stays in registers (128 fp32 a thread). The row maxima of the WC warps that
// share rows are exchanged through shared memory, the probabilities too (every warp needs the
// whole tile's P of its rows for PV). P goes to the tensor cores as plain bf16 (each
// probability moves by at most 2^-9 relative; the project's tolerance allows for it).
//
// With N = 64 the scores are split over the dims as well: the two warps (wc = 2 kq + dh) of a
// pair compute the same 32 rows x 32 keys, warp dh over half of the 36 k-steps, and swap halves
// through shared memory (the P buffer, free at that point), so each ends with its own 32 x 16
// of full scores. That reads 2/3 of the Q and K bytes of the plain split (ldmatrix bandwidth
// is the wall of QK^T) and gives each warp 8 accumulator chains instead of 4.
// The k-step groups of QK^T are unrolled by 3 and the k16 steps of PV by 2 so that ldmatrix
// results of the next group are in flight during this group's mma (the kernel is latency
// bound: 2 warps a scheduler). The row maxima and P are exchanged on a named barrier per row
// group; one __syncthreads a tile remains (the buffer the next tile is loaded into).
//
// Shared memory is chosen at plan time from the device's opt-in limit:
//   227 KB (sm_90):      N = 64, 2 stages
//   163 KB (sm_80):      N = 32, 2 stages
//    99 KB (sm_86/89/120): N = 16, 1 stage
// Cache rows come through cp.async 16 B (one thread group per row, the row offset in int64,
// fetched a tile ahead) into a swizzled layout (16-byte chunk c of row r at c ^ (r & 7)
// within its 128-byte group), so ldmatrix reads are conflict free. Rows past the range are
// zero filled from a valid address.
//
// Tiles run from the top of a block's key range down. The tree mask is needed only on tiles
// that reach the tree rows [prefix, prefix + q_len) (or the end of the range); for those a
// 64-bit visibility word per token is built from the parent array by a walk that resumes
// from tile to tile (tiles descend, so every ancestor is visited once over the whole range).
//
// When batch x m-groups cannot fill the SMs the keys are split: the splits of all elements
// are dealt out by work (tiles + a fixed overhead each) from the prefix lengths on the device,
// so ragged batches stay balanced, and a second kernel merges the partials by log-sum-exp.
#pragma once
#include <cuda.h>  // CUtensorMap, a type only: the encoder is the driver's, fetched at run time (tc_host.h)
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "verify_attn.h"

namespace verify_attn {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 64;                  // query rows a block (m-group), at most
constexpr int kChunks = kKeyDim / 8;       // 72 chunks of 16 bytes a cache row
constexpr int kRowBytes = kKeyDim * 2;     // 1152
constexpr int kKSteps = kKeyDim / 16;      // 36 k-steps of QK^T
constexpr int kSplitOverheadTiles = 4;     // cost of a split beyond its tiles, in tiles
constexpr int kMaxSplits = 128;
constexpr int kMergeWarps = 4;
constexpr int kMergeParts = 4;  // tc_merge<Per>: kMergeParts / Per warps a row, each over 512 / that columns
constexpr int kMergeRowWarps = 8;   // tc_merge_rows: warps a row, the splits shared out
constexpr int kMergeWarpsWanted = 2048;  // enough warps in flight (16 an SM of 132) to cover the L2's latency

// The block's bookkeeping in shared memory, after the tiles in both paths' layouts.
struct BlockInfo {
  int work[8];      // locate()'s result for the block's slot (work[0..5])
  uint64_t bad[2];  // per tile parity: the tile's rows that held a non-finite value (bit k <-> key t0 + k)
  uint8_t pad[16];  // 64 bytes in all: the staged parents start where they always have
};
static_assert(sizeof(BlockInfo) == 64, "the parents' offset");

// Derived from the plan on the host; the same for every block.
struct TcArgs {
  int R;           // query rows an element: heads * q_len
  int group_rows;  // rows an m-group (multiple of 16, <= 64)
  int slots;       // 0: one block per (m-group, element), written directly; else partial slots
  int deal;        // dealt mode (tc_attn_ws_deal, tc_attn_tma_deal; batch > 1): S, the slots the
                   // concatenated tiles are dealt to (grid y = S, partial slots = S + batch); 0:
                   // locate()'s per-element slots
  int parent_cap;  // parent entries staged in shared memory
  int merge_parts; // warps the merge gives a row (1 or 2: columns 512 / merge_parts each; kMergeRowWarps: tc_merge_rows)
  float* ws_o;     // slots x R x 512, normalised partial outputs
  float* ws_lse;   // slots x R, log2 units
  int2* meta;      // batch: (first slot, splits) of each element
};

// tc_attn_ws's and tc_attn_tma's third argument: on a contiguous cache, kv as a [pool_rows,
// 576] bf16 tensor, boxes of 64 dims x 64 rows in the planes' 128-byte swizzle, so that a
// prefix tile is nine TMA copies (a __grid_constant__ argument: the TMA unit reads it in
// place). on 0: every tile by cp.async.
struct KvMap {
  CUtensorMap map;
  int on;
};

// Keys an element attends to: its prefix and its tree rows, never past the tensor.
__device__ __forceinline__ int element_prefix(const Params& p, int b) {
  const int n = prefix_len_of(p, b);
  return n < 0 ? 0 : n;
}
__device__ __forceinline__ int element_keys(const Params& p, int b) {
  return min(element_prefix(p, b) + p.q_len, p.kv_cols);
}
// The cache row of key t of element b, as kv_row does (indices clamped), in int64.
__device__ __forceinline__ int64_t cache_row(const Params& p, int b, int t) {
  int64_t row = int64_t(b) * p.kv_cols + t;
  if (p.kv_indices != nullptr) {
    const int64_t r = p.kv_indices[row];
    row = (r < 0 || r >= p.pool_rows) ? 0 : r;
  }
  return row;
}

// Split mode: which element and key range slot `slot` covers. Every element gets at least
// one split and the rest in proportion to its work; run by one warp, result in info[0..5]:
// element (-1: none), key begin, key end, the element's first slot, its splits, this split.
// An element's top split (its last keys: the masked tiles) counts TopExtra tiles more than it
// holds, never so many that a split is left empty: the others share them out.
template <int TopExtra>
__device__ void locate(const Params& p, const TcArgs& a, int slot, int N, int* info) {
  const int lane = threadIdx.x & 31;
  auto work = [&](int b) -> int64_t { return (element_keys(p, b) + N - 1) / N + kSplitOverheadTiles; };
  int64_t total = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32)
    if (b0 + lane < p.batch) total += work(b0 + lane);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  const int64_t extra = a.slots - p.batch;
  if (lane == 0) info[0] = -1;
  __syncwarp();
  int base = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    const int n = b < p.batch ? 1 + int(extra * work(b) / total) : 0;
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int first = base + incl - n;
    if (n > 0 && slot >= first && slot < first + n) {
      const int k = slot - first;
      const int keys = element_keys(p, b);
      const int64_t tiles = (keys + N - 1) / N;
      int64_t lo = int64_t(k) * tiles / n, hi = int64_t(k + 1) * tiles / n;
      if constexpr (TopExtra > 0) {
        const int64_t span = tiles + (n > 1 ? min(int64_t(TopExtra), (tiles - 1) / (n - 1)) : 0);
        lo = int64_t(k) * span / n;
        hi = k + 1 == n ? tiles : int64_t(k + 1) * span / n;
      }
      info[0] = b;
      info[1] = int(lo * N);
      info[2] = int(min(hi * N, int64_t(keys)));
      info[3] = first;
      info[4] = n;
      info[5] = k;
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
}

// Dealt mode (TcArgs::deal = S > 0; tc_attn_ws_deal and tc_attn_tma_deal, batch > 1, FlashMLA's dealing): the
// elements' work is concatenated, element b taking kSplitOverheadTiles virtual positions (a
// piece's fixed cost) followed by deal_tiles(b) real ones, T positions in all, and slot s
// covers positions [floor(s T / S), floor((s + 1) T / S)) (S capped at T). A piece is a slot's share of one
// element's real tiles (never empty: a slot that holds only virtual positions of an element
// has no piece of it); piece (s, b) writes partial slot s + b, so an element's pieces have
// contiguous ids and the ids stay below S + batch. tests/test_dealing.py mirrors these three
// functions line for line.
__device__ __forceinline__ int deal_tiles(const Params& p, int b, int N) {  // >= 1: every element has a piece
  return max(1, (element_keys(p, b) + N - 1) / N);
}
// The slot that holds position x (the largest s with floor(s T / S) <= x).
__device__ __forceinline__ int deal_slot_of(int64_t x, int S, int64_t T) { return int(((x + 1) * S - 1) / T); }
// Run by one warp; result in info[0..4]: the first element with a real tile at or past the
// slot's begin (p.batch: none), that element's start in the concatenation, the slot's begin
// and end, T. With blockIdx.x == 0 it writes the meta (first id, pieces) of the elements
// whose first real tile lies in the slot (here, not in deal_next: the producer warpgroup's 56
// registers do not take a 64-bit division).
__device__ void deal_locate(const Params& p, const TcArgs& a, int slot, int N, int* info) {
  const int lane = threadIdx.x & 31;
  int64_t total = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32)
    if (b0 + lane < p.batch) total += kSplitOverheadTiles + deal_tiles(p, b0 + lane, N);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
  const int T = int(total);
  // No more slots than positions (S <= T: no slot is empty, so an element's pieces lie in
  // consecutive slots and their ids s + b are consecutive); the slots past S hold nothing.
  const int S = min(a.deal, T);
  const int lo = slot < S ? int(int64_t(slot) * T / S) : T, hi = slot < S ? int(int64_t(slot + 1) * T / S) : T;
  int first = p.batch, c0 = 0, base = 0;
  for (int b0 = 0; b0 < p.batch && base < hi; b0 += 32) {
    const int b = b0 + lane;
    const int tiles = b < p.batch ? deal_tiles(p, b, N) : 0;
    const int w = b < p.batch ? kSplitOverheadTiles + tiles : 0;
    int incl = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const int start = base + incl - w + kSplitOverheadTiles;  // element b's first real tile
    if (blockIdx.x == 0 && b < p.batch && start >= lo && start < hi)
      a.meta[b] = make_int2(slot + b, deal_slot_of(start + tiles - 1, S, T) - slot + 1);
    // the element ends past lo (none in an empty slot, S > T: a piece is never empty)
    const unsigned hit = __ballot_sync(0xffffffffu, b < p.batch && base + incl > lo && lo < hi);
    const int excl = __shfl_sync(0xffffffffu, incl - w, hit ? __ffs(hit) - 1 : 0);
    if (hit && first == p.batch) {
      first = b0 + __ffs(hit) - 1;
      c0 = base + excl;
    }
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) info[0] = first, info[1] = c0, info[2] = lo, info[3] = hi, info[4] = T;
}
// The block's walk over its slot: the next element and its start (from info[0], info[1]).
struct Deal {
  int b, c;
};
// Which element and which keys a block covers.
struct Work {
  int b, key_lo, key_hi, slot;
};
// False when the block's slot is one no element needed (uniform: the whole block leaves).
template <int TopExtra = 0>
__device__ __forceinline__ bool block_work(const Params& p, const TcArgs& a, int N, int* info, int warp, Work& w) {
  grid_dependency_wait();  // the first memory access of every tc kernel comes after this
  w.key_lo = 0;
  w.slot = 0;
  if (a.slots == 0) {
    w.b = blockIdx.y;
    w.key_hi = element_keys(p, w.b);
    return true;
  }
  w.slot = blockIdx.y;
  if (warp == 0) locate<TopExtra>(p, a, w.slot, N, info);
  __syncthreads();
  w.b = info[0];
  if (w.b < 0) return false;
  w.key_lo = info[1];
  w.key_hi = info[2];
  if (threadIdx.x == 0 && blockIdx.x == 0 && info[5] == 0) a.meta[w.b] = make_int2(info[3], info[4]);
  return true;
}

// The block's next piece into w (false: no more).
__device__ __forceinline__ bool deal_next(const Params& p, const TcArgs& a, int N, const int* info, Deal& d, Work& w) {
  if (d.b >= p.batch) return false;
  const int start = d.c + kSplitOverheadTiles;  // the element's first real tile
  const int lo = info[2], hi = info[3];
  if (start >= hi) return false;
  const int keys = element_keys(p, d.b), tiles = max(1, (keys + N - 1) / N);  // deal_tiles
  const int r0 = max(lo, start) - start, r1 = min(hi, start + tiles) - start;
  w.b = d.b;
  w.key_lo = r0 * N;
  w.key_hi = min(r1 * N, keys);
  w.slot = blockIdx.y + d.b;
  d.c = start + tiles;
  ++d.b;
  return true;
}
// Dealt mode's block_work: the slot's walk located (info), d at its first element.
__device__ __forceinline__ void deal_block(const Params& p, const TcArgs& a, int N, int* info, int warp, Deal& d) {
  grid_dependency_wait();  // the first memory access of every tc kernel comes after this
  if (warp == 0) deal_locate(p, a, blockIdx.y, N, info);
  __syncthreads();
  d.b = info[0];
  d.c = info[1];
}

// One token's walk up the tree, resumed from tile to tile (tiles descend, so every ancestor
// is visited once over the whole range).
struct TreeWalk {
  int k;
  __device__ explicit TreeWalk(int start) : k(start) {}
  // The token's visibility word for keys [t0, t0 + n): bit i <-> key t0 + i.
  __device__ uint64_t word(int t0, int n, int mask_from, int P, int key_hi, int parent_cap, const int32_t* s_parent,
                           const int32_t* parent_g) {
    uint64_t word = 0;
    const int pre_hi = min(t0 + n, mask_from);
    if (pre_hi > t0) word = pre_hi - t0 >= 64 ? ~0ull : (1ull << (pre_hi - t0)) - 1;
    const int w0 = max(t0, P) - P, w1 = min(t0 + n, key_hi) - P;
    if (w1 > w0) {
      int kk = k;
      while (kk >= w0) {
        if (kk < w1) word |= 1ull << (kk + P - t0);
        const int pk = kk < parent_cap ? s_parent[kk] : __ldg(parent_g + kk);
        kk = pk < kk ? pk : -1;
      }
      k = kk;
    }
    return word;
  }
};

// A row's normaliser and log2 lse from its sum and maximum; no visible key: O = 0, lse = -inf
// (a NaN sum is not empty).
struct RowEnd {
  float inv, lse2;
};
__device__ __forceinline__ RowEnd row_end(float l, float m) {
  const bool empty = l == 0.f;
  return {empty ? 0.f : 1.f / l, empty ? -INFINITY : m + log2f(l)};
}

// Where a block writes query row rg from column col on: the output (bf16, natural-log lse)
// or, when the keys are split, the split's partial slot (fp32, log2 lse).
struct OutRow {
  uint16_t* out = nullptr;
  float* part = nullptr;
  float* lse_dst;
  __device__ OutRow(const Params& p, const TcArgs& a, int slot, int b, int rg, int col) {
    if (a.slots == 0) {
      out = p.out + (int64_t(b) * a.R + rg) * kLatent + col;
      const int i = rg / p.heads, hd = rg - i * p.heads;
      lse_dst = p.lse + (int64_t(b) * p.heads + hd) * p.q_len + i;
    } else {
      part = a.ws_o + (int64_t(slot) * a.R + rg) * kLatent + col;
      lse_dst = a.ws_lse + int64_t(slot) * a.R + rg;
    }
  }
  __device__ void put(int n, float v0, float v1) {
    if (out) *reinterpret_cast<uint32_t*>(out + n) = pack_bf16(v0, v1);
    else *reinterpret_cast<float2*>(part + n) = make_float2(v0, v1);
  }
  __device__ void lse(float lse2) { *lse_dst = out ? lse2 * kLn2 : lse2; }
};


}  // namespace
}  // namespace verify_attn
