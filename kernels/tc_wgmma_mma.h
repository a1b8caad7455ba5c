// The wgmma instructions of tc's sm_90a kernels, one inline-PTX form each: Mma<n>::run (A and
// B from shared memory) and mma_rs256 (A from registers). Empty where sm_90a is not compiled.
#pragma once
#include "tc.h"

// The accumulator operands of an m64nNk16 wgmma, K = N / 2 fp32 a thread: "+f"(d[i]) ..
// "+f"(d[i + K - 1]), and the register list "%0,..,%(K - 1)", each built from the shorter.
#define VA_WG_D4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define VA_WG_D8(d, i) VA_WG_D4(d, i), VA_WG_D4(d, i + 4)
#define VA_WG_D16(d, i) VA_WG_D8(d, i), VA_WG_D8(d, i + 8)
#define VA_WG_D32(d, i) VA_WG_D16(d, i), VA_WG_D16(d, i + 16)
#define VA_WG_D64(d, i) VA_WG_D32(d, i), VA_WG_D32(d, i + 32)
#define VA_WG_D128(d) VA_WG_D64(d, 0), VA_WG_D64(d, 64)
#define VA_WG_R4 "%0,%1,%2,%3"
#define VA_WG_R8 VA_WG_R4 ",%4,%5,%6,%7"
#define VA_WG_R12 VA_WG_R8 ",%8,%9,%10,%11"
#define VA_WG_R16 VA_WG_R12 ",%12,%13,%14,%15"
#define VA_WG_R24 VA_WG_R16 ",%16,%17,%18,%19,%20,%21,%22,%23"
#define VA_WG_R32 VA_WG_R24 ",%24,%25,%26,%27,%28,%29,%30,%31"
#define VA_WG_R128                                  \
  VA_WG_R32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55" \
  ",%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"              \
  ",%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103"          \
  ",%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
// Mma<n>: K accumulators (their register list R, operands D), then da, db, accumulate, TA, TB
// as operands K .. K + 4 (their numbers A, B, P, X, Y).
#define VA_WG_SS(n, R, A, B, P, X, Y, ...)                                                               \
  template <>                                                                                             \
  struct Mma<n> {                                                                                         \
    template <int TA, int TB>                                                                             \
    static __device__ __forceinline__ void run(float (&d)[n / 2], uint64_t da, uint64_t db, int accumulate) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P ", 0;\n"                                        \
                   "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 {" R "}, %" #A ", %" #B         \
                   ", p, 1, 1, %" #X ", %" #Y ";\n}\n"                                                       \
                   : __VA_ARGS__                                                                          \
                   : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));                                \
    }                                                                                                     \
  };

namespace verify_attn {
namespace {
namespace wg {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// D[64 x n] (+)= A[64 x 16] B[16 x n], both from shared memory through descriptors: the
// accumulator is n / 2 fp32 a thread; TA, TB = 0: the operand is K-major, 1: MN-major (the
// transposed layout, which wgmma takes for 16-bit types from descriptors only; CUTLASS
// cute/arch/mma_sm90_gmma.hpp passes GMMA::Major K = 0, MN = 1 the same way). Accumulator
// layout (CUTLASS cute/atom/mma_traits_sm90_gmma.hpp, CLayout_64xN): warp q of the warpgroup
// holds rows 16 q .. 16 q + 15; d[4 i + 2 h + e] is row 16 q + (lane >> 2) + 8 h,
// column 8 i + 2 (lane & 3) + e. One specialisation per n the kernels use.
template <int Ncols>
struct Mma;
VA_WG_SS(8, VA_WG_R4, 4, 5, 6, 7, 8, VA_WG_D4(d, 0))
VA_WG_SS(16, VA_WG_R8, 8, 9, 10, 11, 12, VA_WG_D8(d, 0))
VA_WG_SS(24, VA_WG_R12, 12, 13, 14, 15, 16, VA_WG_D8(d, 0), VA_WG_D4(d, 8))
VA_WG_SS(32, VA_WG_R16, 16, 17, 18, 19, 20, VA_WG_D16(d, 0))
VA_WG_SS(48, VA_WG_R24, 24, 25, 26, 27, 28, VA_WG_D16(d, 0), VA_WG_D8(d, 16))
VA_WG_SS(64, VA_WG_R32, 32, 33, 34, 35, 36, VA_WG_D32(d, 0))
VA_WG_SS(256, VA_WG_R128, 128, 129, 130, 131, 132, VA_WG_D128(d))

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
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" VA_WG_R128 "}, {%128,%129,%130,%131}, %132, p, 1, 1, %134;\n"
      "}\n"
      : VA_WG_D128(d)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1), "n"(TB));
}
#endif
}  // namespace wg
}  // namespace
}  // namespace verify_attn

#undef VA_WG_SS
#undef VA_WG_R128
#undef VA_WG_R32
#undef VA_WG_R24
#undef VA_WG_R16
#undef VA_WG_R12
#undef VA_WG_R8
#undef VA_WG_R4
#undef VA_WG_D128
#undef VA_WG_D64
#undef VA_WG_D32
#undef VA_WG_D16
#undef VA_WG_D8
#undef VA_WG_D4
