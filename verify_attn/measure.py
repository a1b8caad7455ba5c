"""Measure a case: correctness gate, side-by-side timing, the cost model and the launch plan.

For each case every implementation is first checked against the float64 reference on
poisoned outputs; one that fails is not timed. The rest are timed side by side in this
process (samples alternate, verify_attn.timer), on input sets rotated so the data outgrows
the L2 cache, and the speedup over the baseline is the ratio of the two medians. An
implementation that cannot run the case (no backend on this device, a chain-only kernel on
a random tree) is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from . import accuracy, cases, ops, registry
from .cost import Cost, cost_of
from .machine import Peaks
from .reference import reference
from .shapes import is_chain
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


def op_args(inputs: cases.Inputs, out, lse) -> tuple:
    return (inputs.q, inputs.kv, inputs.kv_indices, inputs.parent, inputs.prefix_lens, inputs.scale, out, lse)


def prepare(impl: str, inputs: cases.Inputs):
    """A no-argument call that runs impl on inputs with no host sync (outputs preallocated)."""
    args = op_args(inputs, *accuracy.poisoned_outputs(inputs.q))
    entry = registry.get(impl)
    if entry.runner:  # prefix lengths on the host, as an engine has them: no sync per call
        fn = entry.function()
        host = args[:4] + (inputs.prefix_lens.tolist(),) + args[5:]
        return lambda: fn(*host)
    op = getattr(torch.ops.verify_attn, impl)
    return lambda: op(*args)


def skip_reason(impl: str, case: cases.Case, inputs: cases.Inputs) -> str | None:
    entry = registry.get(impl)
    chain = all(is_chain(p) for p in inputs.parent.tolist())
    paged = inputs.kv_indices is not None
    return ops.unsupported(impl, inputs.q.device.type) or entry.rejects(chain, paged, 0 if paged else inputs.kv.shape[1])


def measure_case(case: cases.Case, impls: list[str], timer: Timer, seed: int = 0, timed: bool = True
                 ) -> dict[str, Result]:
    """Check every implementation on the case, then time those that pass (timed=False: check only)."""
    ops.load()
    sets = input_sets(case, timer.device, seed) if timed else [cases.make_inputs(case, timer.device, seed)]
    first = sets[0]
    cost = cost_of(first)
    results = {impl: Result(impl, case.name, cost) for impl in impls}
    runnable = []
    for impl in impls:
        reason = skip_reason(impl, case, first)
        if reason:
            results[impl].skipped = reason
        else:
            runnable.append(impl)
    if runnable:
        ref = reference(first.q, first.kv, first.parent, first.prefix_lens, first.scale, first.kv_indices)
        for impl in runnable:
            results[impl].error = accuracy.run_check(impl, first, ref)
            results[impl].plan = ops.launch_plan(impl, op_args(first, *accuracy.poisoned_outputs(first.q)))
        del ref
    passing = {impl: [prepare(impl, s) for s in sets] for impl in runnable if timed and results[impl].error.ok}
    timings = timer.time_many(passing)
    base = timings.get(registry.baseline())
    for impl, timing in timings.items():
        results[impl].timing = timing
        results[impl].baseline_s = base.median if base else None
    return results
