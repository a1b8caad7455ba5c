"""Measure a case: correctness gate, side-by-side timing, the cost model and the launch plan.

For each case every implementation is first checked against the float64 reference on
poisoned outputs (verify_attn.candidate); one that fails is not timed. The rest are timed side
by side in this process (samples alternate, verify_attn.timer), on input sets rotated so the
data outgrows the L2 cache, and the speedup over the baseline is the ratio of the two medians.
With the anchor's build loaded (verify_attn.anchor), each is also timed in turn with its
yardstick there, which makes its drift-free series. An implementation that cannot run the
case (no backend on this device, a chain-only kernel on a random tree) is skipped with the
reason.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import accuracy, candidate, cases, ops, registry
from .anchor import yardstick
from .candidate import outcomes, prepare
from .cost import Cost, cost_of
from .machine import Peaks
from .timer import Timer, Timing


@dataclasses.dataclass
class Result:
    impl: str
    case: str
    cost: Cost
    error: accuracy.Error | None = None  # None when skipped
    skipped: str = ""                    # why the implementation did not run the case
    timing: Timing | None = None         # None when skipped or the correctness gate failed
    baseline_s: float | None = None      # the baseline's median in the same run, for the speedup
    plan: dict | None = None             # the CUDA launch plan (ops.launch_plan)
    anchor: list[float] | None = None    # the samples over the yardstick's, two rounds a value (paired_ratios)
    anchor_of: str = ""                  # which op of the anchor's build the yardstick is

    @property
    def speedup(self) -> float | None:
        if self.timing is None or self.baseline_s is None:
            return None
        return self.baseline_s / self.timing.median

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


def measure_case(case: cases.Case, impls: list[str], timer: Timer, seed: int = 0, timed: bool = True,
                 anchor_ns: str | None = None) -> dict[str, Result]:
    """Check every implementation on the case, then time those that pass (timed=False: check
    only). With anchor_ns (verify_attn.anchor), each one is timed in turn with its yardstick
    in that build, itself checked first, and its samples are also kept as ratios to it."""
    ops.load()
    sets = input_sets(case, timer.device, seed) if timed else [cases.make_inputs(case, timer.device, seed)]
    first = sets[0]
    cost = cost_of(first)
    results = {impl: Result(impl, case.name, cost) for impl in impls}
    passing = {}
    ref = candidate.ReferenceOf(first)
    for o in outcomes(first, candidate.of(impls), ref):
        r = results[o.candidate.impl]
        r.skipped, r.error = o.skipped, o.error
        if not o.skipped:
            r.plan = candidate.plan(o.candidate, first)
            if timed and o.error.ok:
                passing[o.candidate] = [prepare(o.candidate, s) for s in sets]
    yardsticks = {}
    if anchor_ns and passing:
        wanted = {yardstick(c.impl, anchor_ns) for c in passing} - {None}
        for o in outcomes(first, [candidate.Candidate(i, anchor_ns) for i in sorted(wanted)], ref):
            if o.error is not None and o.error.ok:
                yardsticks[o.candidate.impl] = o.candidate
                passing[o.candidate] = [prepare(o.candidate, s) for s in sets]
    # Each kernel next to its yardstick, the order reversed every other round: a pair's two
    # samples follow each other, each first half the time.
    order, ties = [], {}
    for c in passing:
        if c.ns == anchor_ns:
            continue
        stick = yardsticks.get(yardstick(c.impl, anchor_ns)) if anchor_ns else None
        order += [c] + ([stick] if stick is not None and stick not in order else [])
        if stick is not None:
            ties[c.name] = stick.name
    order += [c for c in passing if c not in order]
    timings = timer.time_many({c.name: passing[c] for c in order}, reverse_odd_rounds=True, ties=ties)
    base = timings.get(registry.baseline())
    for impl, r in results.items():
        r.timing = timings.get(impl)
        if r.timing is None:
            continue
        r.baseline_s = base.median if base else None
        stick = yardsticks.get(yardstick(impl, anchor_ns) if anchor_ns else None)
        if stick is not None:
            r.anchor_of = stick.name
            r.anchor = paired_ratios(r.timing.samples, timings[stick.name].samples)
    return results


def paired_ratios(samples: list[float], stick: list[float]) -> list[float]:
    """The drift-free samples: per two rounds the geometric mean of the two rounds' ratios of
    a kernel's sample over its yardstick's. The timer reverses the order every other round, so
    the kernel runs first in one round and second in the other, and on the H200 the second of
    two back-to-back samples reads 1-2.6% slower than the first (tc beside its anchor twin, 6
    processes, 2026-12-02): single ratios fall into two groups, and the median of 15 (8 of one
    order, 7 of the other) jumps between them from process to process. An odd count (7
    samples of a call over 20 ms) keeps one ratio a round."""
    ratios = [s / a for s, a in zip(samples, stick)]
    if len(ratios) % 2:
        return ratios
    return [math.sqrt(ratios[k] * ratios[k + 1]) for k in range(0, len(ratios), 2)]
