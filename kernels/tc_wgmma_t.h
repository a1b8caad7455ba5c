// tc's sm_90a path for few query rows: the MMAs transposed (keys on wgmma's M), the kernel:
// tc_wgmma_t.cu.
#pragma once
#include "tc_wgmma.h"

namespace verify_attn {
namespace {

// ---------------------------------------------------------------------------------------
// Why: wgmma's M is 64, so tc_attn_wg pads a group to 64 query rows; with few rows (heads 8
// or 16, short trees: 72 or 144 rows an element) a quarter to a half of every MMA is padding.
// Here the keys take M and the query rows N, which steps by 8:
//   S^T = K Q^T      A = the 64-key tile (K-major), B = Q (K-major)
//   O^T += V^T P^T   A = V^T, the same tile's latent planes read MN-major (transposed),
//                    B = P^T (K-major: a row of 64 keys a query row)
// A group holds NR = 2 NW <= 64 query rows (token-major, as the other paths): at most 64
// because the shared memory holds Q for 64 rows beside two 64-key stages (below). 72 rows
// become 2 x 48 (tc_attn_wg: 2 x 64), 144 rows 3 x 48 (3 x 64).
//
// Warps: two warpgroups, as tc_attn_wg. Warpgroup w computes S^T for all 64 keys of the tile
// and its NW query rows (columns w NW ..) over the 576 dims, takes those columns' softmax,
// writes their P^T; then O^T for its 256 latent dims (4 M-blocks of 64, planes 4 w ..
// 4 w + 3) and all NR columns: 4 NR/2 = 2 NR fp32 a thread (128 at NR = 64), no spills.
// A column's maximum runs over keys spread over the lanes (lane >> 2, 3 shuffles) and the 4
// warps of its warpgroup (shared memory); each column's rescale factor goes through shared
// memory to the other warpgroup, whose O^T holds that column too.
// Barriers a tile: 3 __syncthreads (tile landed / previous tile done; column maxima posted
// and every S^T read of the tile done; P^T and the factors visible), a 4th on the one or two
// tiles at the tree rows (the non-finite clean-up). The second is a full barrier because
// P^T is written over the tile's rope plane (dims 512..575), which only S^T reads.
//
// Shared memory (from the 1024-aligned base; 1024 bytes of slack for the alignment):
//   Q     73,728  9 planes x 64 rows x 128 B (only NR rows used)
//   KV   147,456  2 stages x 9 planes x 64 keys x 128 B; P^T lives in the rope plane of the
//                 tile being computed; at the end the output is staged over both stages
//   red    1,024  [2 warpgroups][4 warps][32 columns] maxima, at the end the row sums
//   corr/inv/lse 768  [64] each
//   mask   1,024  [2 parities][64 tokens] visibility words; BlockInfo 64
//   = 224,064 + 1,024 slack = 225,088 B; the staged parents take what is left of 232,448.
//
// The rest is tc_attn_wg's (wg::Tiles): the splits, the cp.async gather of tile j + 1 during
// tile j, the tree mask of the tail tiles, non-finite cache values zeroed on those tiles and
// their keys NaN for every row that sees them, non-finite scores NaN, a row with no visible
// key O = 0 and lse = -inf, P rounded to bf16, row sums from the unrounded probabilities.
namespace wgt {
constexpr int N = wg::N;             // 64 keys a tile: wgmma's M
constexpr int kStage = kLatent + 4;  // floats a staged output row: 516 keeps the stores conflict free
struct Smem {
  uint8_t q[wg::kTileBytes];      // the group's query rows, 9 planes of 64 rows
  uint8_t kv[2][wg::kTileBytes];  // cache tiles, 9 planes each
  float red[2][4][32];            // per warpgroup and warp: column maxima of its 16 keys; at the end row sums
  float corr[kRows];              // this tile's rescale factor of each column, from its warpgroup
  float inv[kRows];               // at the end: 1 / row sum of each column
  float lse[kRows];               // at the end: log2 lse of each column
  uint64_t mask[2][kRows];        // per tile parity: visibility word of each token
  BlockInfo info;
};
constexpr int kOffQ = offsetof(Smem, q);
constexpr int kOffKV = offsetof(Smem, kv);
constexpr int kOffRed = offsetof(Smem, red);
constexpr int kOffCorr = offsetof(Smem, corr);
constexpr int kOffInv = offsetof(Smem, inv);
constexpr int kOffLse = offsetof(Smem, lse);
constexpr int kOffParent = sizeof(Smem);
constexpr int kBaseBytes = wg::kSlack + kOffParent;
static_assert(kOffQ == wg::kOffQ && kOffKV == wg::kOffKV, "the planes where wg::Tiles puts them");
static_assert(kOffKV % 1024 == 0 && wg::kTileBytes % 1024 == 0, "wgmma's 128-byte swizzle: 1024-byte aligned planes");
static_assert(kRows * kStage * 4 <= int(sizeof(Smem::kv)), "the output staging fits over the KV stages");
static_assert(kBaseBytes == 225088 && kBaseBytes <= 232448, "the sm_90 opt-in limit (the comment above)");
}  // namespace wgt

}  // namespace
}  // namespace verify_attn
