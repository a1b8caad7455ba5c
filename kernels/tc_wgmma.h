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
// D[64x32] (+)= A[64x16] B[16x32], both K-major in shared memory (the scores).
__device__ __forceinline__ void wgmma_n32(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}
// D[64x256] (+)= A[64x16] (K-major) B[16x256] (N-major: V rows as stored), the output.
__device__ __forceinline__ void wgmma_n256_vt(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
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
      : "l"(da), "l"(db), "r"(accumulate));
}
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
  int* info = reinterpret_cast<int*>(smem + kOffInfo);
  int32_t* s_parent = reinterpret_cast<int32_t*>(smem + kOffParent);
  uint64_t* s_mask = reinterpret_cast<uint64_t*>(smem + kOffMask);
  uint64_t* s_bad = reinterpret_cast<uint64_t*>(smem + kOffInfo + offsetof(BlockInfo, bad));
  float* s_max = reinterpret_cast<float*>(smem + kOffMax);
  const uint32_t sQ = sbase + kOffQ, sP = sbase + kOffP;
  auto kv_buf = [&](int s) -> uint32_t { return sbase + kOffKV + s * kTileBytes; };

  Work wk;
  if (!block_work(p, a, N, info, warp, wk)) return;
  const int b = wk.b, key_lo = wk.key_lo, key_hi = wk.key_hi;
  const int R = a.R, R0 = blockIdx.x * a.group_rows;
  const int P = element_prefix(p, b);
  const int rows_valid = min(a.group_rows, R - R0);
  const int i_lo = R0 / p.heads;
  const int ntok = (R0 + rows_valid - 1) / p.heads - i_lo + 1;
  const int ntiles = key_hi > key_lo ? (key_hi - key_lo + N - 1) / N : 0;
  const int mask_from = min(P, key_hi);
  const int32_t* parent_g = p.parent + int64_t(b) * p.q_len;
  auto tile_t0 = [&](int j) { return key_lo + (ntiles - 1 - j) * N; };
  auto tile_masked = [&](int j) { return tile_t0(j) + N > mask_from; };
  const int lr = tid >> 2;  // the row this thread loads, 18 of its 72 chunks
  auto row_for = [&](int j) -> int64_t {
    const int t = tile_t0(j) + lr;
    return t < key_hi ? cache_row(p, b, t) : int64_t(-1);
  };
  // src: the row, or for a row out of range the tensor's first row (a valid address, 0 bytes
  // read, zero filled); either way chunk c is at src + 8 c, an immediate offset.
  auto load_row = [&](uint32_t dst, int rows, const uint16_t* src, bool ok) {
    const int bytes = ok ? 16 : 0;
#pragma unroll
    for (int k = 0; k < kChunks / 4; ++k) {
      const int c = (tid & 3) + 4 * k;
      cp_async16(dst + at(rows, lr, c), src + c * 8, bytes);
    }
  };
  TreeWalk walk(tid < ntok ? i_lo + tid : -1);
  auto build_mask = [&](int j) {
    if (tid == 0) s_bad[j & 1] = 0;
    if (tid < ntok)
      s_mask[(j & 1) * kRows + tid] =
          walk.word(tile_t0(j), N, mask_from, P, key_hi, a.parent_cap, s_parent, parent_g);
  };

  for (int i = tid; i < a.parent_cap; i += kThreads) s_parent[i] = __ldg(parent_g + i);
  {
    const bool ok = lr < rows_valid;
    load_row(sQ, kRows, ok ? p.q + (int64_t(b) * R + R0 + lr) * kKeyDim : p.q, ok);
  }
  if (ntiles > 0) {
    const int64_t row = row_for(0);
    load_row(kv_buf(0), N, p.kv + (row >= 0 ? row : 0) * kKeyDim, row >= 0);
  }
  cp_async_commit();
  int64_t row_next = ntiles > 1 ? row_for(1) : int64_t(-1);
  __syncthreads();  // parents visible
  if (ntiles > 0 && tile_masked(0)) build_mask(0);

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
    const uint32_t sK = kv_buf(buf);
    const bool masked = tile_masked(j);
    if (masked) {  // as in tc_attn: non-finite values zeroed, their keys marked
      uint4* rows = reinterpret_cast<uint4*>(smem + kOffKV + buf * kTileBytes);
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
        wgmma_n32(s, dq + off, dk + off, kc | kk);
      }
    commit();
    // The next tile's gather goes out while the tensor cores work (before QK^T, the stalls of
    // a full cp.async queue would hold the MMAs back).
    if (j + 1 < ntiles) {
      load_row(kv_buf(buf ^ 1), N, p.kv + (row_next >= 0 ? row_next : 0) * kKeyDim, row_next >= 0);
      cp_async_commit();
      if (j + 2 < ntiles) row_next = row_for(j + 2);
      if (tile_masked(j + 1)) build_mask(j + 1);
    }
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
    for (int kk = 0; kk < 4; ++kk) wgmma_n256_vt(o, dp + ((kk * 32) >> 4), dv + ((kk * 16 * 128) >> 4), 1);
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
    OutRow dst(p, a, wk.slot, b, rg, 256 * w + 2 * t4);
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
