"""Cross-check the timer against the profiler's kernel time (CUPTI, through torch.profiler).

For a few cases and implementations: the timer's median per call, and the sum of the GPU
kernel durations per call that the profiler records over the same back-to-back calls.
The two should agree within 5% for kernels of 20 us or more: what is left between them is
the gap between back-to-back launches. The torch composite is shown for reference only: in
eager mode it is a string of small kernels whose launch gaps the profiler does not count.
"""

from __future__ import annotations

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from verify_attn import cases, grid, ops, registry
from verify_attn.candidate import Candidate, prepare
from verify_attn.measure import input_sets
from verify_attn.timer import Timer

from .cli import need_gpu, parser


def profiled_kernel_s(calls, reps: int = 20) -> float:
    """Sum of device kernel time per call, over reps calls (median of 3 profiles)."""
    totals = []
    for _ in range(3):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for k in range(reps):
                calls[k % len(calls)]()
            torch.cuda.synchronize()
        us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        totals.append(us / 1e6 / reps)
    return statistics.median(totals)


def main(argv=None) -> int:
    parser("crosscheck", __doc__).parse_args(argv)
    need_gpu()
    ops.load()
    kernels = [n for n, i in registry.IMPLS.items() if i.cuda_sources]
    timer = Timer("cuda", samples=15)
    print(f"{'impl':6s} {'case':16s} {'timer us':>9s} {'profiler us':>11s} {'diff':>7s}")
    worst = 0.0
    for impl, heads, q_len, prefix in grid.CROSSCHECK:
        case = cases.grid_case(heads, q_len, prefix)
        calls = [prepare(Candidate(impl), s) for s in input_sets(case, "cuda", 0)]
        timed = timer.time(calls).median
        prof = profiled_kernel_s(calls)
        diff = (timed - prof) / prof
        if prof >= 20e-6 and impl in kernels:
            worst = max(worst, abs(diff))
        print(f"{impl:6s} {case.name:16s} {timed * 1e6:9.1f} {prof * 1e6:11.1f} {100 * diff:6.1f}%", flush=True)
    print(f"largest difference for {', '.join(kernels)} at 20 us or more: {100 * worst:.1f}%")
    return 0 if worst <= 0.05 else 1

