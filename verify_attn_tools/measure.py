"""A timing table without asv: implementations side by side, speedup, TFLOP/s, % of peak.

Medians of the samples, implementations alternating in one process, inputs rotated past
twice the L2 (verify_attn.timer). Defaults: the headline cases of verify_attn.grid on a GPU,
the CPU Quick selection's on the CPU (the GPU's would take a quarter of an hour there).
A kernel's other paths are implementations of their own (tc_mma: tc's portable path, timed
beside tc on an H100/H200 with --impl tc tc_mma).
"""

from __future__ import annotations

import sys

import torch

from verify_attn import cases, grid, registry
from verify_attn.machine import peaks
from verify_attn.measure import measure_case
from verify_attn.shapes import MAX_KV_LEN, MAX_Q_LEN
from verify_attn.timer import Timer


from .cli import Refusal, bounded, need_gpu, parser

MAX_BATCH_HEADS = 65535  # the op's limit on batch x heads (kernels/binding.cpp)


def defaults(device: str) -> dict:
    """The cases timed by default: the GPU's headline, or on the CPU the CPU Quick selection's
    points (naive takes 3 s a call at the GPU's 16,384 on 2 cores)."""
    if device == "cuda":
        return grid.MEASURE_DEFAULT
    cpu = grid.SELECTIONS["cpu"]["quick"]
    return {"heads": cpu.heads, "q_lens": cpu.q_lens, "prefix_lens": cpu.prefix_lens}


def default_help(axis: str) -> str:
    gpu, cpu = (" ".join(map(str, defaults(d)[axis])) for d in ("cuda", "cpu"))
    return f"default: {gpu} on a GPU, {cpu} on the CPU"


def arguments(argv):
    p = parser("measure", __doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--impl", nargs="+", action="extend", choices=registry.names(), help="default: every implementation")
    p.add_argument("--heads", nargs="+", type=bounded(1, MAX_BATCH_HEADS), help=default_help("heads"))
    p.add_argument("--q-len", nargs="+", type=bounded(1, MAX_Q_LEN), help=default_help("q_lens"))
    p.add_argument("--prefix-len", nargs="+", type=bounded(0, MAX_KV_LEN - 1), help=default_help("prefix_lens"))
    p.add_argument("--batch", type=bounded(1, MAX_BATCH_HEADS), default=1)
    p.add_argument("--tree", default="random", choices=cases.TREES)
    p.add_argument("--pad-to", type=bounded(1, MAX_KV_LEN), default=None,
                   help="kv rows per element rounded up to a multiple of this (default: 64 for a chain, as the "
                        "Chain benchmarks, so that FlashMLA's 64-token pages can read it; else 1)")
    p.add_argument("--samples", type=bounded(1), default=15)
    p.add_argument("--cold", action="store_true", help="flush the L2 cache before every call")
    args = p.parse_args(argv)
    d = defaults(args.device)
    args.impl = args.impl or list(registry.names())
    args.heads = args.heads or list(d["heads"])
    args.q_len = args.q_len or list(d["q_lens"])
    args.prefix_len = args.prefix_len or list(d["prefix_lens"])
    args.pad_to = args.pad_to or (grid.CHAIN.pad_to if args.tree == "chain" else 1)
    # The op's limits on combinations, checked before anything is built.
    if args.batch * max(args.heads) > MAX_BATCH_HEADS:
        p.error(f"--batch x --heads = {args.batch * max(args.heads)} exceeds the op's maximum of {MAX_BATCH_HEADS}")
    kv_cols = -(-(max(args.prefix_len) + max(args.q_len)) // args.pad_to) * args.pad_to
    if kv_cols > MAX_KV_LEN:
        p.error(f"--prefix-len + --q-len (rounded up to --pad-to) = {kv_cols} exceeds the op's maximum of {MAX_KV_LEN}")
    return args


def main(argv=None) -> int:
    args = arguments(argv)
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
    failed = timed = 0
    skips = {}  # why, in the order first seen
    points = [(h, q, pf) for h in args.heads for q in args.q_len for pf in args.prefix_len]
    for k, (heads, q_len, prefix) in enumerate(points, 1):
        case = cases.grid_case(heads, q_len, prefix, args.batch, args.tree, args.pad_to)
        print(f"# case {k} of {len(points)}: {case.name}", file=sys.stderr, flush=True)
        for impl, r in measure_case(case, args.impl, timer).items():
            if r.skipped:
                skips.setdefault(r.skipped)
                print(f"{case.name:22s} {impl:{width}s} skipped: {r.skipped}")
                continue
            if r.timing is None:
                failed += 1
                print(f"{case.name:22s} {impl:{width}s} FAILED CHECK: {r.error.reason}")
                continue
            timed += 1
            speed = f"{r.speedup:.2f}" if r.speedup else "-"
            clock = f"{r.timing.sm_clock_mhz:.0f}" if r.timing.sm_clock_mhz else "-"
            plan = (f"{registry.get(impl).path_name(r.plan['path'])} blocks={r.plan['blocks']} "
                    f"splits={r.plan['num_splits']} rows/block={r.plan['rows_per_block']}" if r.plan else "")
            print(f"{case.name:22s} {impl:{width}s} {r.timing.median * 1e3:9.4f} {speed:>8s} {r.tflops():8.2f} "
                  f"{r.gbps():7.0f} {100 * r.peak_fraction(peak):6.2f} {clock:>5s} {r.error.max_rel:8.2g}  {plan}",
                  flush=True)
    if not failed and not timed:
        sys.stdout.flush()
        raise Refusal(f"nothing timed: every implementation was skipped on {args.device} ({'; '.join(skips)})")
    return 1 if failed else 0
