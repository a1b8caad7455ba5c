// tc's sm_90a path: warpgroup MMAs (wgmma), compiled to a trap elsewhere.
#pragma once
#include "tc.h"

namespace verify_attn {
namespace {

// ---------------------------------------------------------------------------------------
// The sm_90a path: the same block and tile (64 query rows, 64 keys, 2 stages, cp.async
// gather) on warpgroup MMAs, which read both operands from shared memory once per warpgroup
// instead of once per warp through ldmatrix (the wall of the mma.sync path). Tiles are stored
// chunk-major, the layout wgmma's 128-byte swizzle expects: plane c8 holds dims 64 c8 ..
// 64 c8 + 63 of every row, 128 bytes a row, 16-byte chunk x of row r at x ^ (r & 7), planes
// and the buffers 1024-byte aligned. The same planes are the K-major B of S = Q K^T and the
// N-major B of O += P V (V = the first 8 planes). Warpgroup w computes S for keys 32 w ..
// 32 w + 31 over all 576 dims and O for columns 256 w .. 256 w + 255 (128 fp32 a thread);
// the two exchange row maxima and write P (bf16, K-major, swizzled) to shared memory for PV.
namespace wg {
constexpr int N = 64;
constexpr int kPlane = N * 128;                 // one 64-dim plane of a 64-row tile
constexpr int kTileBytes = 9 * kPlane;          // 73,728
// Shared memory from the 1024-aligned base; the staged parents follow it.
struct Smem {
  uint8_t q[kTileBytes];      // the block's query rows, 9 planes
  uint8_t kv[2][kTileBytes];  // cache tiles, 9 planes each
  uint8_t p[kPlane];          // P: 64 rows x 64 keys bf16, one plane
  float max[2][kRows];        // each warpgroup's row maxima, at the end the row sums
  uint64_t mask[2][kRows];    // per tile parity: visibility word of each token
  BlockInfo info;
};
constexpr int kOffQ = offsetof(Smem, q);
constexpr int kOffKV = offsetof(Smem, kv);
constexpr int kOffP = offsetof(Smem, p);
constexpr int kOffMax = offsetof(Smem, max);
constexpr int kOffMask = offsetof(Smem, mask);
constexpr int kOffInfo = offsetof(Smem, info);
constexpr int kOffParent = sizeof(Smem);
static_assert(kOffKV % 1024 == 0 && kOffP % 1024 == 0 && kTileBytes % 1024 == 0, "wgmma's 128-byte swizzle: 1024-byte aligned planes");
constexpr int kSlack = 1024;                    // the dynamic base is aligned up to 1024 at run time
constexpr int kBaseBytes = kSlack + kOffParent;
static_assert(kRows == 64 && kThreads == 256, "two warpgroups, 64 rows");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Byte offset of 16-byte chunk c (0..71) of row r in a chunk-major swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t at(int rows, int r, int c) {
  return (c >> 3) * (rows * 128) + r * 128 + (((c ^ r) & 7) << 4);
}
// The shared-memory matrix descriptor: 128-byte swizzle, byte offsets LBO and SBO.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | uint64_t((lbo & 0x3FFFF) >> 4) << 16 |
         uint64_t((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Generic-proxy writes to shared memory (cp.async, st.shared) made visible to wgmma's reads.
__device__ __forceinline__ void fence_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator reads above the wait.
template <int K>
__device__ __forceinline__ void pin(float (&d)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// D[64 x n] (+)= A[64 x 16] B[16 x n], both from shared memory through descriptors: the
// accumulator is n / 2 fp32 a thread; TA, TB = 0: the operand is K-major, 1: MN-major (the
// transposed layout, which wgmma takes for 16-bit types from descriptors only; CUTLASS
// cute/arch/mma_sm90_gmma.hpp passes GMMA::Major K = 0, MN = 1 the same way). Accumulator
// layout (CUTLASS cute/atom/mma_traits_sm90_gmma.hpp, CLayout_64xN): warp q of the warpgroup
// holds rows 16 q .. 16 q + 15; d[4 i + 2 h + e] is row 16 q + (lane >> 2) + 8 h,
// column 8 i + 2 (lane & 3) + e. One specialisation per n the kernels use.
template <int Ncols>
struct Mma;
template <>
struct Mma<8> {
  template <int TA, int TB>
  static __device__ __forceinline__ void run(float (&d)[4], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, %7, %8;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
};
template <>
struct Mma<16> {
  template <int TA, int TB>
  static __device__ __forceinline__ void run(float (&d)[8], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, %11, %12;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
};
template <>
struct Mma<24> {
  template <int TA, int TB>
  static __device__ __forceinline__ void run(float (&d)[12], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %14, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, %12, %13, p, 1, 1, %15, %16;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
};
template <>
struct Mma<32> {
  template <int TA, int TB>
  static __device__ __forceinline__ void run(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
};
template <>
struct Mma<48> {
  template <int TA, int TB>
  static __device__ __forceinline__ void run(float (&d)[24], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n48k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23}, %24, %25, p, 1, 1, %27, %28;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
};
template <>
struct Mma<64> {
  template <int TA, int TB>
  static __device__ __forceinline__ void run(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
};
template <>
struct Mma<256> {
  template <int TA, int TB>
  static __device__ __forceinline__ void run(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, %131, %132;\n}\n"
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
        : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
  }
};

// The block's keys and their gather, shared by the sm_90a kernels (tc_attn_wg, tc_attn_wgt):
// the work (block_work), the group's query rows loaded once, tiles of N keys walked from the
// top of the range down, each gathered by cp.async into the chunk-major planes above (one row
// a 4-thread group, the row offset in int64 fetched a tile ahead; rows past the range zero
// filled from a valid address), the tree mask of the tiles at the tree rows, and the
// non-finite clean-up of those tiles. S: the kernel's shared memory (members q, kv, mask, info;
// the staged parents follow it); the Q and KV planes are 64 rows each in both kernels.
template <class S>
struct Tiles {
  const Params& p;
  const TcArgs& a;
  uint8_t* smem;
  uint32_t sbase;
  int tid, lr;  // lr: the row this thread loads, 18 of its 72 chunks
  Work wk;
  int R0, P, rows_valid, i_lo, ntok, ntiles, mask_from;
  const int32_t* parent_g;
  int32_t* s_parent;
  uint64_t* s_mask;  // [2][kRows]: per tile parity, the visibility word of each token
  uint64_t* s_bad;   // [2]: per tile parity, the tile's rows that held a non-finite value
  TreeWalk walk;
  int64_t row_next;

  static constexpr int kOffQ = offsetof(S, q), kOffKV = offsetof(S, kv), kOffMask = offsetof(S, mask),
                       kOffInfo = offsetof(S, info), kOffParent = sizeof(S);
  __device__ Tiles(const Params& p_, const TcArgs& a_, uint8_t* smem_, uint32_t sbase_, int tid_)
      : p(p_), a(a_), smem(smem_), sbase(sbase_), tid(tid_), walk(-1) {}
  __device__ uint32_t kv_buf(int s) const { return sbase + kOffKV + s * kTileBytes; }
  __device__ int tile_t0(int j) const { return wk.key_lo + (ntiles - 1 - j) * N; }
  __device__ bool tile_masked(int j) const { return tile_t0(j) + N > mask_from; }
  __device__ int64_t row_for(int j) const {
    const int t = tile_t0(j) + lr;
    return t < wk.key_hi ? cache_row(p, wk.b, t) : int64_t(-1);
  }
  // src: the row, or for a row out of range the tensor's first row (a valid address, 0 bytes
  // read, zero filled); either way chunk c is at src + 8 c, an immediate offset.
  __device__ void load_row(uint32_t dst, int rows, const uint16_t* src, bool ok) const {
    const int bytes = ok ? 16 : 0;
#pragma unroll
    for (int k = 0; k < kChunks / 4; ++k) {
      const int c = (tid & 3) + 4 * k;
      cp_async16(dst + at(rows, lr, c), src + c * 8, bytes);
    }
  }
  __device__ void build_mask(int j) {
    if (tid == 0) s_bad[j & 1] = 0;
    if (tid < ntok)
      s_mask[(j & 1) * kRows + tid] =
          walk.word(tile_t0(j), N, mask_from, P, wk.key_hi, a.parent_cap, s_parent, parent_g);
  }
  // The block's work; false: the block has none (uniform, the caller returns).
  __device__ bool begin(int warp) {
    int* info = reinterpret_cast<int*>(smem + kOffInfo);
    if (!block_work(p, a, N, info, warp, wk)) return false;
    lr = tid >> 2;
    s_parent = reinterpret_cast<int32_t*>(smem + kOffParent);
    s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
    s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
    R0 = blockIdx.x * a.group_rows;
    P = element_prefix(p, wk.b);
    rows_valid = min(a.group_rows, a.R - R0);
    i_lo = R0 / p.heads;
    ntok = (R0 + rows_valid - 1) / p.heads - i_lo + 1;
    ntiles = wk.key_hi > wk.key_lo ? (wk.key_hi - wk.key_lo + N - 1) / N : 0;
    mask_from = min(P, wk.key_hi);
    parent_g = p.parent + int64_t(wk.b) * p.q_len;
    return true;
  }
  // Parents staged, the query rows and tile 0 in flight, tile 0's mask; ends on a barrier.
  __device__ void start() {
    walk = TreeWalk(tid < ntok ? i_lo + tid : -1);
    for (int i = tid; i < a.parent_cap; i += kThreads) s_parent[i] = __ldg(parent_g + i);
    {
      const bool ok = lr < rows_valid;
      load_row(sbase + kOffQ, kRows, ok ? p.q + (int64_t(wk.b) * a.R + R0 + lr) * kKeyDim : p.q, ok);
    }
    if (ntiles > 0) {
      const int64_t row = row_for(0);
      load_row(kv_buf(0), N, p.kv + (row >= 0 ? row : 0) * kKeyDim, row >= 0);
    }
    cp_async_commit();
    row_next = ntiles > 1 ? row_for(1) : int64_t(-1);
    __syncthreads();  // parents visible
    if (ntiles > 0 && tile_masked(0)) build_mask(0);
  }
  // During tile j: tile j + 1's gather goes out, tile j + 2's row offset is fetched.
  __device__ void next(int j) {
    if (j + 1 < ntiles) {
      load_row(kv_buf((j & 1) ^ 1), N, p.kv + (row_next >= 0 ? row_next : 0) * kKeyDim, row_next >= 0);
      cp_async_commit();
      if (j + 2 < ntiles) row_next = row_for(j + 2);
      if (tile_masked(j + 1)) build_mask(j + 1);
    }
  }
  // On a masked tile j, after the barrier that saw it land: non-finite values zeroed (a key a
  // row cannot see must not reach its output through 0 * inf), their keys marked in s_bad
  // (a row that sees one gets NaN); ends on a barrier. The same contract as tc_attn.
  __device__ void clean(int j) {
    uint4* rows = reinterpret_cast<uint4*>(smem + kOffKV + (j & 1) * kTileBytes);
    for (int c = tid; c < N * kChunks; c += kThreads) {
      uint4 v = rows[c];
      const bool bad = zero_nonfinite(v.x) | zero_nonfinite(v.y) | zero_nonfinite(v.z) | zero_nonfinite(v.w);
      if (bad) {
        rows[c] = v;
        atomicOr(reinterpret_cast<unsigned long long*>(&s_bad[j & 1]), 1ull << ((c >> 3) & (N - 1)));
      }
    }
    fence_smem();
    __syncthreads();
  }
};
#endif
}  // namespace wg

__global__ void __launch_bounds__(kThreads, 1) tc_attn_wg(Params p, TcArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace wg;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uint32_t sraw = smem_u32(smem_raw);
  const uint32_t sbase = (sraw + 1023) & ~1023u;
  uint8_t* smem = smem_raw + (sbase - sraw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int w = warp >> 2, wq = warp & 3;  // warpgroup; warp within it (rows 16 wq ..)
  const int g = lane >> 2, t4 = lane & 3;
  float* s_max = reinterpret_cast<float*>(smem + kOffMax);
  const uint32_t sQ = sbase + kOffQ, sP = sbase + kOffP;

  Tiles<Smem> t(p, a, smem, sbase, tid);
  if (!t.begin(warp)) return;
  const int b = t.wk.b, R0 = t.R0, rows_valid = t.rows_valid, i_lo = t.i_lo, ntiles = t.ntiles;
  uint64_t* s_mask = t.s_mask;
  uint64_t* s_bad = t.s_bad;
  t.start();

  const float qk_scale = p.scale * kLog2e;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const uint64_t dq = desc(sQ, 16, 1024), dp = desc(sP, 16, 1024);

  for (int j = 0; j < ntiles; ++j) {
    const int buf = j & 1;
    cp_async_wait_all();
    fence_smem();
    __syncthreads();  // tile j landed everywhere; everyone is done with tile j - 1
    const uint32_t sK = t.kv_buf(buf);
    const bool masked = t.tile_masked(j);
    if (masked) t.clean(j);

    // S = Q K^T: this warpgroup's 32 keys, 36 k-steps. Descriptors advance by adding the
    // offset (in 16-byte units) to the address field: no carry below 256 KB.
    const uint64_t dk = desc(sK + w * 32 * 128, 16, 1024);
    float s[16];
    fence();
#pragma unroll
    for (int kc = 0; kc < 9; ++kc)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t off = (kc * kPlane + kk * 32) >> 4;
        Mma<32>::run<0, 0>(s, dq + off, dk + off, kc | kk);
      }
    commit();
    // The next tile's gather goes out while the tensor cores work (before QK^T, the stalls of
    // a full cp.async queue would hold the MMAs back).
    t.next(j);
    wait_all();
    pin(s);

    // Scale to log2 units, mask, row maxima (accumulator layout: s[4 i + e] is row
    // 16 wq + g + 8 (e >> 1), key 32 w + 8 i + 2 t4 + (e & 1)).
    const uint64_t bad = masked ? s_bad[j & 1] : 0;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint64_t word = ~0ull;
      if (masked) {
        const int r = min(16 * wq + g + 8 * h, rows_valid - 1);
        word = s_mask[(j & 1) * kRows + (R0 + r) / p.heads - i_lo];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float v = s[4 * i + 2 * h + e] * qk_scale;
          if (!(fabsf(v) < INFINITY)) v = __int_as_float(0x7fffffff);
          if (masked) {  // the one or two tiles at the tree rows
            const int key = 32 * w + 8 * i + 2 * t4 + e;
            if ((bad >> key) & 1) v = __int_as_float(0x7fffffff);
            if (!((word >> key) & 1)) v = -INFINITY;
          }
          s[4 * i + 2 * h + e] = v;
          mx[h] = nan_max(mx[h], v);
        }
      mx[h] = nan_max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = nan_max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (t4 == 0) s_max[w * kRows + 16 * wq + g + 8 * h] = mx[h];
    }
    __syncthreads();  // both warpgroups' maxima visible

    float corr[2], mu[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = 16 * wq + g + 8 * h;
      const float mn = nan_max(m_run[h], nan_max(s_max[r], s_max[kRows + r]));
      mu[h] = mn == -INFINITY ? 0.f : mn;
      corr[h] = ex2(m_run[h] - mu[h]);
      m_run[h] = mn;
      l_run[h] *= corr[h];
    }
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {  // the maxima settle early
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= corr[(i >> 1) & 1];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float p0 = ex2(s[4 * i + 2 * h] - mu[h]);
        const float p1 = ex2(s[4 * i + 2 * h + 1] - mu[h]);
        l_run[h] += p0 + p1;
        const int r = 16 * wq + g + 8 * h;
        st_shared_b32(sP + r * 128 + ((((4 * w + i) ^ r) & 7) << 4) + t4 * 4, pack_bf16(p0, p1));
      }
    fence_smem();
    __syncthreads();  // P visible to both warpgroups

    // O += P V: this warpgroup's 256 columns (planes 4 w .. 4 w + 3), 4 k-steps of 16 keys.
    const uint64_t dv = desc(sK + 4 * w * kPlane, kPlane, 1024);
    fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) Mma<256>::run<0, 1>(o, dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4), 1);
    commit();
    wait_all();
    pin(o);
  }
  cp_async_wait_all();

  // Row sums over the quad and the two warpgroups.
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t4 == 0) s_max[w * kRows + 16 * wq + g + 8 * h] = l;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * wq + g + 8 * h;
    if (r >= rows_valid) continue;
    const RowEnd end = row_end(s_max[r] + s_max[kRows + r], m_run[h]);
    const int rg = R0 + r;
    OutRow dst(p, a, t.wk.slot, b, rg, 256 * w + 2 * t4);
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
