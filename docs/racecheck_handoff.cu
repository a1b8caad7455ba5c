// Does compute-sanitizer's racecheck honour named barriers between warpgroups? Seven handoffs,
// each correct by the PTX ISA (bar.arrive / bar.sync: the arriving threads' earlier shared
// writes are visible to the threads that wait on the barrier):
//   0: WG0 writes, bar.arrive(1, 256); WG1 bar.sync(1, 256), reads (tc_attn_ws's P, m, sc post)
//   1: 384 threads, the third warpgroup exits at once; WG0 and WG1 write, bar.sync(3, 256),
//      read each other's (tc_attn_ws's row sums)
//   2: as 1 with 256 threads (no warpgroup exited): the control
//   3, 4: as 0 and 1 with the barrier id and count in registers (kernel arguments), as
//      tc_attn_ws had them before its barriers took immediates
//   5, 6: as 0 and 1 (384 threads) after a producer warpgroup's cp.async into shared memory,
//      completed on an mbarrier (cp.async.mbarrier.arrive.noinc) that both other warpgroups
//      wait on (mbarrier.try_wait.parity), as tc_attn_ws's stages are
//
//   7: tc_attn_ws's ping-pong over rounds, 256 threads: WG0 writes a, bar.arrive(1); WG1
//      bar.sync(1), reads a, writes b, bar.arrive(2); WG0 bar.sync(2), reads b; the next
//      round's writes come after the other warpgroup's arrive, so each read is ordered before
//      the next write (write after read) only by the reader's bar.arrive: what racecheck
//      reported on tc_attn_ws (its m and sc of tile b, tc_wgmma_ws.h:507 read, :547 write)
//   8: as 7 with 384 threads, the third warpgroup alive (it waits on an mbarrier the others
//      arrive at when done)
//   9: as 1 with the third warpgroup alive the same way (tc_attn_ws's row sums, :590 / :597)
//  10: as 8 with every post a bar.sync on both sides (the 2026-12-05 test build of tc_attn_ws,
//      which racecheck still reports at its s_m post and read)
//  11: as 10 with setmaxnreg as tc_attn_ws has it (the third warpgroup down to 56 registers,
//      the other two up to 224)
//  12: as 10 with fence.proxy.async.shared::cta after each write, before its post (wgmma
//      reads P through the async proxy, so tc_attn_ws fences before every post)
//  13: as 10 with a stage handshake each round: the consumers wait on a full mbarrier that the
//      third warpgroup arrives at, and arrive at an empty one it waits on (tc_attn_ws's stages)
//  14: 11, 12 and 13 at once (what tc_attn_ws has together)
//
//   nvcc -O2 -lineinfo -arch=sm_90a -o handoff docs/racecheck_handoff.cu
//   compute-sanitizer --tool racecheck ./handoff        # every mode; ./handoff M: mode M alone
// H200, compute-sanitizer 2025.3.1, 2026-12-02: every mode's output right. Modes 0-6 and 9:
// no hazard. Modes 7 and 8: "30 hazards displayed (30 errors, 0 warnings)", every one a read
// of one round (the `acc +=` lines) against the other warpgroup's write of the next (`s[t] =`,
// `staged[t - 128] =`):
// write after read ordered only by the reader's bar.arrive. The PTX ISA orders it (a
// barrier's arrive performs the thread's prior memory accesses, reads included, relative to
// every thread of the barrier when it completes), so racecheck does not model an arrive's
// ordering of earlier reads: tc_attn_ws's :507/:547 reports are this pattern.
// Modes 10-14 (written 2026-12-05; run on an H100 2026-12-06, compute-sanitizer 2025.3): every one
// reads 0 hazards, its output right, so setmaxnreg, the async-proxy fence and the mbarrier
// handshake (alone or together) are not what racecheck loses in tc_attn_ws's test build.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
__device__ bool try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.b32 %0, 1, 0, p;\n}\n"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  return done != 0;
}
// The block's mbarrier for count arrivals, initialised by thread 0 and seen by every thread.
__device__ uint32_t init_full(unsigned long long* full, uint32_t count) {
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(full));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  return bar;
}
__device__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// A round's post: bar.arrive (modes 7, 8) or bar.sync (10-14), fenced for the async proxy in 12 and 14.
template <int Id>
__device__ void post(int mode) {
  if (mode == 12 || mode == 14) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  if (mode >= 10) asm volatile("bar.sync %0, 256;\n" ::"n"(Id) : "memory");
  else asm volatile("bar.arrive %0, 256;\n" ::"n"(Id) : "memory");
}
__global__ void __launch_bounds__(384, 1) handoff(int mode, float* out, int id1, int id3, int n, const float* src) {
  __shared__ float s[256];
  __shared__ __align__(16) float staged[512];
  __shared__ __align__(8) unsigned long long full, stage_full, stage_empty;
  const int t = threadIdx.x, w = t / 128;
  if (mode >= 7) {
    const uint32_t bar = init_full(&full, 256);
    const uint32_t sfull = init_full(&stage_full, 128), sempty = init_full(&stage_empty, 256);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (mode == 11 || mode == 14) {
      if (w == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
      else asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    }
#endif
    if (w == 2) {  // modes 13, 14: the stages' producer; then alive until both others are done
      for (int k = 0; mode >= 13 && k < 8; ++k) {
        mbar_arrive(sfull);  // stage k full
        while (!try_wait(sempty, k & 1)) {
        }
      }
      while (!try_wait(bar, 0)) {
      }
      return;
    }
    float acc = 0.f;
    if (mode == 9) {
      s[t] = t * 2.5f;
      asm volatile("bar.sync 3, 256;\n" ::: "memory");
      acc = s[t ^ 128];
    } else {
      for (int k = 0; k < 8; ++k) {
        if (mode >= 13) {
          while (!try_wait(sfull, k & 1)) {
          }
        }
        if (w == 0) {
          if (k > 0) asm volatile("bar.sync 2, 256;\n" ::: "memory");  // b of round k - 1 posted
          if (k > 0) acc += staged[t];                                  // read b of round k - 1
          s[t] = t * 1.5f + k;                                          // write a of round k
          post<1>(mode);
          if (mode >= 13) mbar_arrive(sempty);  // stage k released
        } else {
          asm volatile("bar.sync 1, 256;\n" ::: "memory");             // a of round k posted
          acc += s[t - 128];                                            // read a of round k
          staged[t - 128] = (t - 128) * 0.5f + k;                       // write b of round k
          if (mode >= 13) mbar_arrive(sempty);  // before the post: a bar.sync post waits for WG0's next round
          post<2>(mode);
        }
      }
      if (w == 0) {
        asm volatile("bar.sync 2, 256;\n" ::: "memory");
        acc += staged[t];
      }
    }
    out[t] = acc;
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
    return;
  }
  if (mode >= 5) {
    const uint32_t bar = init_full(&full, 128);
    if (w == 2) {
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&staged[4 * (t - 256)]));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + 4 * (t - 256)) : "memory");
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      return;
    }
    while (!try_wait(bar, 0)) {
    }
    const float v = staged[t];
    if (mode == 5) {
      if (w == 0) {
        s[t] = t * 1.5f + v;
        asm volatile("bar.arrive 1, 256;\n" ::: "memory");
      } else {
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        out[t] = s[t - 128];
      }
    } else {
      s[t] = t * 2.5f + v;
      asm volatile("bar.sync 3, 256;\n" ::: "memory");
      out[t] = s[t ^ 128];
    }
    return;
  }
  if (w == 2) return;
  if (mode == 3) {
    if (w == 0) {
      s[t] = t * 1.5f;
      asm volatile("bar.arrive %0, %1;\n" ::"r"(id1), "r"(n) : "memory");
    } else {
      asm volatile("bar.sync %0, %1;\n" ::"r"(id1), "r"(n) : "memory");
      out[t] = s[t - 128];
    }
  } else if (mode == 4) {
    s[t] = t * 2.5f;
    asm volatile("bar.sync %0, %1;\n" ::"r"(id3), "r"(n) : "memory");
    out[t] = s[t ^ 128];
  } else if (mode == 0) {
    if (w == 0) {
      s[t] = t * 1.5f;
      asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    } else {
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      out[t] = s[t - 128];
    }
  } else {
    s[t] = t * 2.5f;
    asm volatile("bar.sync 3, 256;\n" ::: "memory");
    out[t] = s[t ^ 128];
  }
}
int main(int argc, char** argv) {
  float *out, *src;
  cudaMalloc(&out, 256 * sizeof(float));
  cudaMalloc(&src, 512 * sizeof(float));
  cudaMemset(src, 0, 512 * sizeof(float));  // staged values 0: the wanted outputs below stand
  const int threads[15] = {256, 384, 256, 256, 384, 384, 384, 256, 384, 384, 384, 384, 384, 384, 384};
  const int first = argc > 1 ? atoi(argv[1]) : 0, last = argc > 1 ? first : 14;
  for (int mode = first; mode <= last; ++mode) {
    handoff<<<1, threads[mode]>>>(mode, out, 1, 3, 256, src);
    float h[256];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    const bool arrive = mode == 0 || mode == 3 || mode == 5;
    const bool rounds = mode >= 7 && mode != 9;
    const int tt = arrive || rounds ? 200 : 10;
    float want = arrive ? (tt - 128) * 1.5f : (tt ^ 128) * 2.5f;
    if (rounds) {  // WG1's thread tt read a of rounds 0..7: sum of (tt - 128) * 1.5 + k
      want = 0.f;
      for (int k = 0; k < 8; ++k) want += (tt - 128) * 1.5f + k;
    }
    printf("mode %d (%d threads): out[%d] = %g, want %g: %s\n", mode, threads[mode], tt, h[tt], want,
           h[tt] == want ? "ok" : "WRONG");
    cudaDeviceSynchronize();
  }
  return 0;
}
