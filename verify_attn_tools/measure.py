"""A timing table without asv: implementations side by side, speedup, TFLOP/s, % of peak.

Medians of the samples, implementations alternating in one process, inputs rotated past
twice the L2 (verify_attn.timer). Defaults: the headline cases of verify_attn.grid.
A kernel's other paths are implementations of their own (tc_mma: tc's portable path, timed
beside tc on an H100/H200 with --impl tc tc_mma).
"""

from __future__ import annotations

import torch

from verify_attn import cases, grid, registry
from verify_attn.machine import peaks
from verify_attn.measure import measure_case
from verify_attn.timer import Timer


from .cli import need_gpu, parser


def main(argv=None) -> int:
    d = grid.MEASURE_DEFAULT
    p = parser("measure", __doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--impl", nargs="+", default=list(registry.names()), choices=registry.names())
    p.add_argument("--heads", nargs="+", type=int, default=list(d["heads"]))
    p.add_argument("--q-len", nargs="+", type=int, default=list(d["q_lens"]))
    p.add_argument("--prefix-len", nargs="+", type=int, default=list(d["prefix_lens"]))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tree", default="random", choices=cases.TREES)
    p.add_argument("--pad-to", type=int, default=None,
                   help="kv rows per element rounded up to a multiple of this (default: 64 for a chain, as the "
                        "Chain benchmarks, so that FlashMLA's 64-token pages can read it; else 1)")
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--cold", action="store_true", help="flush the L2 cache before every call")
    args = p.parse_args(argv)
    if args.device == "cuda":
        need_gpu("--device cuda")
    peak = peaks(args.device)
    timer = Timer(args.device, samples=args.samples, cold=args.cold)
    base = registry.baseline()
    print(f"# {peak.device}: peaks {peak.flops / 1e12:.0f} TFLOP/s, {peak.bytes_per_s / 1e9:.0f} GB/s ({peak.source}); "
          f"median of {args.samples} samples, impls alternating; x{base} = {base} time / time")
    width = max(8, *(len(i) for i in args.impl))
    print(f"{'case':22s} {'impl':{width}s} {'ms':>9s} {'x' + base:>8s} {'TFLOP/s':>8s} {'GB/s':>7s} {'%peak':>6s} "
          f"{'MHz':>5s} {'max_rel':>8s}  plan")
    failed = 0
    for heads in args.heads:
        for q_len in args.q_len:
            for prefix in args.prefix_len:
                pad = args.pad_to or (grid.CHAIN.pad_to if args.tree == "chain" else 1)
                case = cases.grid_case(heads, q_len, prefix, args.batch, args.tree, pad)
                measured = measure_case(case, args.impl, timer)
                for impl, r in measured.items():
                    if r.skipped:
                        print(f"{case.name:22s} {impl:{width}s} skipped: {r.skipped}")
                        continue
                    if r.timing is None:
                        failed += 1
                        print(f"{case.name:22s} {impl:{width}s} FAILED CHECK: {r.error.reason}")
                        continue
                    speed = f"{r.speedup:.2f}" if r.speedup else "-"
                    clock = f"{r.timing.sm_clock_mhz:.0f}" if r.timing.sm_clock_mhz else "-"
                    plan = (f"{registry.get(impl).path_name(r.plan['path'])} blocks={r.plan['blocks']} "
                            f"splits={r.plan['num_splits']} rows/block={r.plan['rows_per_block']}" if r.plan else "")
                    print(f"{case.name:22s} {impl:{width}s} {r.timing.median * 1e3:9.4f} {speed:>8s} {r.tflops():8.2f} "
                          f"{r.gbps():7.0f} {100 * r.peak_fraction(peak):6.2f} {clock:>5s} {r.error.max_rel:8.2g}  {plan}",
                          flush=True)
    return 1 if failed else 0
