"""The hardware's account of Quick's points, per commit: Nsight Compute's counters for the
kernels under test (verify_attn.profile), recorded beside Quick's times.

Descriptive series: drawn, never judged (benchmarks/accepted.json; the regressions page judges
bench_verify_attn's drift-free times and errors only). GPU only, and only where ncu runs: on
the CPU, or when ncu is absent or fails, every point is n/a (NotImplementedError in setup) and
the reason is one line of the run's output. A metric this ncu does not offer leaves its series
n/a (NaN) and is named in one line.
"""

import math

from verify_attn import gpu, grid, profile

# On a GPU, Quick's points as its selection takes them. Without one nothing is profiled and
# every combination is n/a, yet asv runs each as a job of its own (54 a series with the GPU's
# points, 1,134 for the 21 series; 1,080 jobs of 20 series took 28.8 s of a 2-core CPU box's
# full run): there the CPU's two Quick points, 6 a series. Only GPU
# machines record into results/, so the shared benchmarks.json keeps the GPU's parameters.
POINTS = grid.SELECTIONS["cuda" if gpu.device() == "cuda" else "cpu"]["quick"].points()


class Profile:
    params = [*(sorted({pt[k] for pt in POINTS}) for k in range(3)), list(profile.impls())]
    param_names = ["heads", "q_len", "prefix_len", "impl"]
    timeout = 900  # above the profile's own limits (two ncu runs of 200 s at most, the exports)
    version = "1"

    def setup_cache(self):
        return profile.recorded()

    def setup(self, result, heads, q_len, prefix_len, impl):
        if result.get("error"):
            raise NotImplementedError(result["error"])
        key = (heads, q_len, prefix_len, impl)
        self.call = result["points"].get(key)
        if self.call is None:
            raise NotImplementedError(result["skipped"].get(key, "not a profiled Quick point on this device"))


# One series per figure of a profiled call: (key of verify_attn.profile.summarise, scale, unit, what).
SERIES = {
    "gpu_time": ("duration_s", 1.0, "seconds", "Sum of the call's kernel durations under ncu (its clocks locked)."),
    "kernels": ("kernels", None, "kernels", "Kernel launches of one call (tc: attention, plus the merge when split)."),
    "dram_gbps": ("dram_bytes_per_s", 1e-9, "GB/s", "Achieved DRAM bandwidth: the call's DRAM bytes over its kernel time."),
    "dram_pct": ("dram_pct", 1.0, "% of peak", "DRAM throughput, % of its peak (duration-weighted over the kernels)."),
    "tensor_pipe_pct": ("tensor_pipe_pct", 1.0, "% of peak",
                        "Busiest tensor pipe (wgmma's gmma or mma.sync's hmma), % of its peak cycles active."),
    "issue_pct": ("issue_pct", 1.0, "% of peak", "Issue slots busy, % of peak (duration-weighted)."),
    "occupancy_pct": ("occupancy_pct", 1.0, "% of peak", "Achieved occupancy: active warps, % of the SM's maximum."),
    "sm_clock": ("sm_clock_hz", 1e-6, "MHz", "The SM clock during the call, as ncu set it for its replay."),
    "registers": ("registers", 1.0, "registers", "Registers a thread of the main (longest) kernel."),
    "dynamic_smem_bytes": ("dynamic_smem_bytes", 1.0, "bytes", "Dynamic shared memory a block of the main kernel."),
    "sm_tail": ("sm_tail", 1.0, "x the mean SM",
                "The SM tail: the main kernel's busiest SM's active cycles over the mean SM's (1 is an even "
                "spread; above it, the tail in which the other SMs idle)."),
}


def _series(key: str, scale, unit: str, doc: str):
    def track(self, result, *params):
        # asv runs the checkout's benchmarks against the measured commit's verify_attn: a figure
        # that commit's profile does not produce (a backfill of an older one) is n/a, not a failure.
        value = self.call.get(key)
        if scale is None:  # a list: its length
            return math.nan if value is None else len(value)
        return math.nan if value is None or math.isnan(value) else value * scale

    track.__doc__, track.unit = doc, unit
    return track


def _stall(reason: str):
    def track(self, result, *params):
        value = self.call["stalls"].get(reason, math.nan)
        return math.nan if value is None or math.isnan(value) else value

    track.__doc__ = (f"Warps stalled on {reason.replace('_', ' ')} per issue-active cycle (ncu's WarpStateStats, "
                     "duration-weighted over the call's kernels).")
    track.unit = "warps per issue"
    return track


for _name, _spec in SERIES.items():
    setattr(Profile, f"track_{_name}", _series(*_spec))
for _reason in profile.STALLS:
    setattr(Profile, f"track_stall_{_reason}", _stall(_reason))
