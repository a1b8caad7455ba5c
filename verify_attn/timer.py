"""One GPU (and CPU) timer for the benchmarks and every script (docs/timing.md).

GPU samples are CUDA events around ``number`` back-to-back calls. Before each sample the
GPU is held in a spin kernel long enough for the host to enqueue all the calls, so the
events time the calls and not the host's launch rate (nvbench's blocking kernel). Calls
rotate over several input sets whose data is larger than the L2 cache, so a large case is
not timed from cache; the cold variant also overwrites the L2 before every single call.
The SM clock is read after every sample (NVML, through nvidia-ml-py): samples taken under
75% of the highest clock seen are dropped and taken again, and the median clock is
recorded. Where the clock cannot be read on a GPU, the timer warns once and records that
its samples were not screened.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
from typing import Callable, Sequence

import torch

CLOCK_FLOOR = 0.75


@dataclasses.dataclass
class Timing:
    samples: list[float]          # seconds per call, one per sample
    number: int                   # calls per sample
    sm_clock_mhz: float | None    # median SM clock over the samples (GPU with NVML)
    dropped: int = 0              # samples dropped for a low clock
    clock_screened: bool = False  # whether the SM clock was read, so low-clock samples were screened

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def asv(self) -> dict:
        """The form an asv track_ benchmark returns to be stored with statistics."""
        return {"samples": list(self.samples), "number": self.number}


def _sm_clock() -> float | None:
    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # no NVML (nvidia-ml-py) or not an NVIDIA device
        return None


_warned = False


def _warn_unscreened(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"verify_attn.timer: the SM clock cannot be read ({reason}); samples taken at a low "
                      "clock are not screened out", RuntimeWarning, stacklevel=3)


class _Flusher:
    """Overwrites a buffer twice the size of the L2 cache."""

    def __init__(self, device):
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        self.buf = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device=device)

    def __call__(self):
        self.buf.fill_(1)


class Timer:
    """Times lists of calls. ``calls`` rotate: call k of a sample runs calls[k % len(calls)]."""

    def __init__(self, device: str, samples: int = 15, min_sample_s: float = 2e-3, warmup_s: float = 0.025,
                 cold: bool = False, max_dropped: int = 20, slow_call_s: float = math.inf, slow_samples: int = 0,
                 long_call_s: float = math.inf, long_samples: int = 0):
        self.device = device
        self.samples = samples
        self.slow_call_s = slow_call_s    # a variant whose call takes longer gets slow_samples samples
        self.slow_samples = slow_samples
        self.long_call_s = long_call_s    # and one whose call takes longer still, long_samples
        self.long_samples = long_samples
        self.min_sample_s = min_sample_s
        self.warmup_s = warmup_s
        self.cold = cold
        self.max_dropped = max_dropped
        self.cuda = device == "cuda"
        self._flush = _Flusher(torch.cuda.current_device()) if (self.cuda and cold) else None
        self._max_clock = 0.0
        self.screens_clock = self.cuda and _sm_clock() is not None
        if self.cuda and not self.screens_clock:
            _warn_unscreened("no NVML: pip install nvidia-ml-py")

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def call_s(self, call: Callable) -> float:
        """One call's wall time, the device synchronized after it."""
        t0 = time.perf_counter()
        call()
        self._sync()
        return time.perf_counter() - t0

    def _calibrate(self, calls: Sequence[Callable]) -> tuple[int, float, float]:
        """Warm up; return calls per sample, the host's enqueue time per call and the time per call.
        A call slower than slow_call_s (a first call may carry one-time costs, so a second one
        confirms it and gives both times) is not run again over every input set: each of its
        samples is one call after a spin. Those two more passes (2 to 7 calls of 0.03-0.9 s each,
        naive at long prefixes) came to about 27 s of effa37c's 401 s full suite run (computed
        from its recorded medians and input-set counts)."""
        for _ in range(2):
            t0 = time.perf_counter()
            calls[0]()
            host = time.perf_counter() - t0
            self._sync()
            first = time.perf_counter() - t0
            if first <= self.slow_call_s:
                break
        else:
            return 1, host, first
        n = 1
        while n < len(calls) or time.perf_counter() - t0 < self.warmup_s:
            calls[n % len(calls)]()
            n += 1
            if n % len(calls) == 0:
                self._sync()
        self._sync()
        per_call = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for k in range(len(calls)):
            calls[k]()
        host = (time.perf_counter() - t0) / len(calls)
        self._sync()
        if self.cold:
            return 1, host, per_call
        return max(1, min(10_000, math.ceil(self.min_sample_s / per_call))), host, per_call

    def _sample(self, calls, number: int, start: int, host_s: float) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            for k in range(number):
                calls[(start + k) % len(calls)]()
            return (time.perf_counter() - t0) / number
        if self._flush is not None:
            self._flush()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # Spin the GPU while the host enqueues: 2x the host time at 2 GHz, capped at 0.2 s.
        torch.cuda._sleep(int(min(0.2, 2.0 * host_s * number + 20e-6) * 2e9))
        begin.record()
        for k in range(number):
            calls[(start + k) % len(calls)]()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / 1e3 / number

    def samples_for(self, per_call: float) -> int:
        """How many samples a variant whose call takes per_call seconds gets."""
        if per_call > self.long_call_s and self.long_samples:
            return self.long_samples
        if per_call > self.slow_call_s and self.slow_samples:
            return min(self.samples, self.slow_samples)
        return self.samples

    def time(self, calls: Sequence[Callable]) -> Timing:
        return self.time_many({"_": calls})["_"]

    def time_many(self, variants: dict[str, Sequence[Callable]], reverse_odd_rounds: bool = False,
                  ties: dict[str, str] | None = None) -> dict[str, Timing]:
        """Time several variants side by side: their samples alternate, so drift in clocks or
        temperature over the run touches every variant alike. reverse_odd_rounds: every other
        round runs the variants in reverse order, so two neighbours each follow the other
        equally often (a pair's ratio then carries no order effect: what the previous call
        left in the caches, the clock after a long call). ties: pairs of variants that take the
        same number of samples, the larger of their two (a kernel and its yardstick, whose
        samples pair one to one, on either side of a sample-count limit)."""
        plan = {name: self._calibrate(calls) for name, calls in variants.items()}
        results = {name: Timing([], number, None, clock_screened=self.screens_clock) for name, (number, _, _) in plan.items()}
        want = {name: self.samples_for(per_call) for name, (_, _, per_call) in plan.items()}
        for a, b in (ties or {}).items():
            if a in want and b in want:
                want[a] = want[b] = max(want[a], want[b])
        clocks = {name: [] for name in variants}
        offset, rounds = 0, 0
        while any(len(r.samples) < want[name] for name, r in results.items()):
            order = list(variants.items())
            if reverse_odd_rounds and rounds % 2:
                order.reverse()
            rounds += 1
            for name, calls in order:
                res = results[name]
                if len(res.samples) >= want[name]:
                    continue
                number, host, _ = plan[name]
                value = self._sample(calls, number, offset, host)
                offset += number
                clock = _sm_clock() if self.cuda else None
                if clock is not None:
                    self._max_clock = max(self._max_clock, clock)
                    if clock < CLOCK_FLOOR * self._max_clock and res.dropped < self.max_dropped:
                        res.dropped += 1
                        continue
                    clocks[name].append(clock)
                res.samples.append(value)
        for name, res in results.items():
            res.sm_clock_mhz = statistics.median(clocks[name]) if clocks[name] else None
        return results
