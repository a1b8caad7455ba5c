"""Measure cases: correctness gate, side-by-side timing, and what follows from the cost model.

For each case every implementation is first checked against the float64 reference on
poisoned outputs; one that fails is not timed. The rest are timed side by side in this
process (samples alternate, verify_attn.timer), on input sets rotated so the data outgrows
the L2 cache, and the speedup over ``naive`` is the ratio of the two medians.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import accuracy, cases, ops
from .check import run_check
from .cost import Cost, cost_of
from .machine import Peaks
from .reference import reference
from .timer import Timer, Timing


@dataclasses.dataclass
class Result:
    impl: str
    case: str
    error: accuracy.Error
    cost: Cost
    timing: Timing | None = None  # None when the correctness gate failed
    naive_s: float | None = None   # naive's median in the same run, for the speedup

    @property
    def speedup(self) -> float | None:
        if self.timing is None or self.naive_s is None:
            return None
        return self.naive_s / self.timing.median

    def peak_fraction(self, peaks: Peaks) -> float:
        return self.cost.roofline_s(peaks.flops, peaks.bytes_per_s) / self.timing.median

    def tflops(self) -> float:
        return self.cost.flops / self.timing.median / 1e12

    def gbps(self) -> float:
        return self.cost.bytes / self.timing.median / 1e9


def input_sets(case: cases.Case, device: str, seed: int) -> list[cases.Inputs]:
    """Enough input sets to hold twice the L2 cache (one on the CPU), at most 64."""
    first = cases.make_inputs(case, device, seed)
    if device != "cuda":
        return [first]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    size = sum(t.numel() * t.element_size() for t in (first.q, first.kv))
    count = min(64, max(1, math.ceil(2 * l2 / size)))
    return [first] + [cases.make_inputs(case, device, seed + k) for k in range(1, count)]


def prepare(impl: str, inputs: cases.Inputs):
    """A no-argument call that runs impl on inputs with no host sync (outputs preallocated)."""
    out, lse = accuracy.poisoned_outputs(inputs.q)
    args = (inputs.q, inputs.kv, inputs.kv_indices, inputs.parent, inputs.prefix_lens, inputs.scale, out, lse)
    if impl == "torch":  # prefix lengths on the host, as an engine has them: no sync per call
        host = args[:4] + (inputs.prefix_lens.tolist(),) + args[5:]
        return lambda: ops.torch_composite(*host)
    op = getattr(torch.ops.verify_attn, impl)
    return lambda: op(*args)


def measure_case(case: cases.Case, impls: list[str], timer: Timer, seed: int = 0) -> dict[str, Result]:
    ops.load()
    sets = input_sets(case, timer.device, seed)
    first = sets[0]
    ref = reference(first.q, first.kv, first.parent, first.prefix_lens, first.scale, first.kv_indices)
    cost = cost_of(first)
    results = {}
    for impl in impls:
        try:
            err = run_check(impl, first, ref)
        except (RuntimeError, ValueError) as exc:
            err = accuracy.Error(math.nan, math.nan, math.nan, False, str(exc).splitlines()[0])
        results[impl] = Result(impl, case.name, err, cost)
    del ref
    passing = {impl: [prepare(impl, s) for s in sets] for impl, r in results.items() if r.error.ok}
    timings = timer.time_many(passing)
    naive = timings.get("naive")
    for impl, timing in timings.items():
        results[impl].timing = timing
        results[impl].naive_s = naive.median if naive else None
    return results


def main(argv=None) -> int:
    """Print a table: python -m verify_attn.measure --heads 64 --q-len 9 --prefix-len 2048 65536"""
    import argparse

    from .machine import peaks

    parser = argparse.ArgumentParser(prog="python -m verify_attn.measure", description=main.__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--impl", nargs="+", default=list(ops.IMPLS), choices=ops.IMPLS)
    parser.add_argument("--heads", nargs="+", type=int, default=[64])
    parser.add_argument("--q-len", nargs="+", type=int, default=[9])
    parser.add_argument("--prefix-len", nargs="+", type=int, default=[2048, 16384, 65536])
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--cold", action="store_true", help="flush the L2 cache before every call")
    args = parser.parse_args(argv)
    peak = peaks(args.device)
    timer = Timer(args.device, samples=args.samples, cold=args.cold)
    print(f"# {peak.device}: peaks {peak.flops / 1e12:.0f} TFLOP/s, {peak.bytes_per_s / 1e9:.0f} GB/s ({peak.source}); "
          f"median of {args.samples} samples, impls alternating")
    print(f"{'case':18s} {'impl':6s} {'ms':>9s} {'x naive':>8s} {'TFLOP/s':>8s} {'GB/s':>7s} {'%peak':>6s} "
          f"{'MHz':>5s} {'max_rel':>8s}")
    failed = 0
    for heads in args.heads:
        for q_len in args.q_len:
            for prefix in args.prefix_len:
                case = cases.grid_case(heads, q_len, prefix)
                for impl, r in measure_case(case, args.impl, timer).items():
                    if r.timing is None:
                        failed += 1
                        print(f"{case.name:18s} {impl:6s} FAILED CHECK: {r.error.reason}")
                        continue
                    speed = f"{r.speedup:.2f}" if r.speedup else "-"
                    clock = f"{r.timing.sm_clock_mhz:.0f}" if r.timing.sm_clock_mhz else "-"
                    print(f"{case.name:18s} {impl:6s} {r.timing.median * 1e3:9.4f} {speed:>8s} {r.tflops():8.2f} "
                          f"{r.gbps():7.0f} {100 * r.peak_fraction(peak):6.2f} {clock:>5s} {r.error.max_rel:8.2g}",
                          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
