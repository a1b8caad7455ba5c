"""What every grid benchmark shares: look a measured point up, gate on correctness.

The measuring happens once per class in ``setup_cache`` (verify_attn.suite.measure_grid),
so all implementations of a case are timed side by side in one process; the ``track_``
methods only return numbers from it. asv counts an increase as a regression for every
benchmark, so each timing series is stored the way round where lower is better: time, time
as a fraction of the baseline's time (1 / speedup), time as a multiple of the roofline time
(1 / fraction of peak) and the error; their units say so, since asv shows the numbers
as they are stored (the plots and the report verb show speedup and % of peak). The impl
parameter lists the kernels under test first (verify_attn.registry.display_order): asv's
graph pages open on a parameter's first value. The rest record what the reports read
instead of recomputing: the cost model's FLOPs and bytes, the roofline time, the SM clock,
the samples dropped for a low clock, and the launch plan (a plan change then shows next to
the timing it explains). A series that does not apply to a point (no launch plan for a
Python implementation, no SM clock on the CPU) returns NaN, which asv stores as n/a, as for a
skipped benchmark: raising from a track_ method would mark it failed.

Nothing imported here at module level imports torch: asv forks each of its ~7,500 runs of a
full suite from a server process that imported these modules, and with torch in it a fork
costs 8.8 ms instead of 1.2 on the H200's host (verify_attn/gpu.py). Each setup_cache imports verify_attn.suite (and torch)
itself, once; setup and the track_ methods read the plain data it returned.
"""

import abc
import math
import os
import pickle

from verify_attn import anchor, gpu, grid, registry

# The implementations in the order asv's pages open on (a kernel's pinned-path variants are
# Quick's alone); each grid class's impl parameter is the part of it its selection measures.
IMPLS = [i for i in registry.display_order(gpu.device()) if i not in grid.VARIANTS]


class Entries:
    """A measurement's results ({key: entry}) as asv hands them to each run: a file per entry
    in the set-up's folder (asv runs a setup_cache and the benchmarks it serves in one folder,
    its cwd), so that a run unpickles the entry it reads and not the whole measurement. The
    full grid and Chain share one set-up of ~500 entries: unpickled whole, it took ~6 ms of
    each of their ~4,200 runs on the H200's host (12 ms a run against 6 for the other classes,
    88c800a). Read like the dict it stands for: ``get(key)``."""

    def __init__(self, results: dict, folder: str):
        self.folder = os.path.abspath(folder)
        os.makedirs(self.folder, exist_ok=True)
        for key, entry in results.items():
            with open(self._path(key), "wb") as f:
                pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)

    def _path(self, key: tuple) -> str:
        return os.path.join(self.folder, "_".join(map(str, key)) + ".pickle")

    def get(self, key: tuple, default=None):
        try:
            with open(self._path(key), "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return default


def stored(measured: dict, folder: str = "entries") -> dict:
    """measured (verify_attn.suite's plain data: a measurement with "results", or parts of
    such by name) with every "results" an Entries in its own folder under folder (relative:
    the set-up's cwd)."""
    if "results" in measured:
        return {**measured, "results": Entries(measured["results"], folder)}
    return {part: stored(m, os.path.join(folder, part)) for part, m in measured.items()}


class GridBenchmark(abc.ABC):
    """Abstract, so asv does not collect it: each subclass defines its own setup_cache
    (asv keys the cache by the defining line, so an inherited one would be shared)."""

    params = [list(grid.Q_LENS), list(grid.PREFIX_LENS), grid.impls_of("full", IMPLS)]
    param_names = ["q_len", "prefix_len", "impl"]
    timeout = 1200  # setup_cache measures the whole grid, builds included
    version = "1"   # fixed: asv would otherwise hash the source and orphan the history

    @abc.abstractmethod
    def setup_cache(self):
        """Return suite.measure_grid(...) for this class's grid."""

    heads = None  # a full-grid class's head count; None: the selection's only one

    def key(self, grid, params) -> tuple:
        """The measured point of these parameters: (heads, q_len, prefix_len, impl)."""
        return (self.heads if self.heads is not None else grid["heads"][0], *params)

    part = None  # the key of this class's measurement in a setup_cache shared by classes

    def setup(self, grid, *params):
        if self.part is not None:
            grid = grid[self.part]
        self.entry = grid["results"].get(self.key(grid, params))
        if self.entry is None:
            raise NotImplementedError("not in this device's grid")
        if self.entry["skipped"]:
            raise NotImplementedError(self.entry["skipped"])
        self.untimed = grid.get("untimed", "")  # Quick: why nothing was timed (a named case failed)

    def timed(self):
        e = self.entry
        if not e["ok"]:
            raise AssertionError(f"failed the correctness check, not timed: {e['reason']}")
        if self.untimed:
            raise AssertionError(self.untimed)
        return e

    def track_time(self, grid, *params):
        """Seconds per call (CUDA events, inputs rotated past the L2 cache)."""
        e = self.timed()
        return {"samples": e["samples"], "number": e["number"]}

    track_time.unit = "seconds"

    def track_time_vs_naive(self, grid, *params):
        """Time as a fraction of the baseline's (naive's) median time in the same run: 1 / speedup,
        lower is better (0.05 is 20x faster than naive)."""
        e = self.timed()
        if e["baseline_s"] is None:  # the baseline was not measured here
            return math.nan
        return {"samples": [s / e["baseline_s"] for s in e["samples"]], "number": e["number"]}

    track_time_vs_naive.unit = "of naive's time (1/speedup, lower is better)"

    def track_time_vs_roofline(self, grid, *params):
        """Time as a multiple of the roofline time of the tree-aware cost model: 1 / fraction of
        peak, lower is better (4 is 25% of peak, 1 the roofline itself)."""
        e = self.timed()
        return {"samples": [s / e["roofline_s"] for s in e["samples"]], "number": e["number"]}

    track_time_vs_roofline.unit = "x roofline time (1/fraction of peak, lower is better)"

    def track_time_vs_anchor(self, grid, *params):
        """The drift-free series: the samples over their pairs' samples of the anchor's build
        of the same kernel (a peer's: the anchor's tc), timed in turn in the same process
        (verify_attn/anchor.py), a value per two rounds of opposite order (measure.paired_ratios).
        Stays put on any start of any machine of a GPU kind while the kernel does not change;
        lower is better, 1 the anchor's own speed."""
        ratios = self.timed()["anchor"]
        if not ratios:  # no anchor build here (no git repository, VERIFY_ATTN_ANCHOR=off)
            return math.nan
        return {"samples": ratios, "number": 1}

    track_time_vs_anchor.unit = "x anchor's time (same process; lower is better)"
    track_time_vs_anchor.version = anchor.version()

    def track_error(self, grid, *params):
        """Largest relative error against the float64 reference (recorded even when failing)."""
        return self.entry["max_rel"]

    track_error.unit = "max_rel"

    def track_flops(self, grid, *params):
        """FLOPs of one call by the tree-aware cost model (what the mask lets through)."""
        return self.entry["flops"]

    track_flops.unit = "FLOP"

    def track_bytes(self, grid, *params):
        """Fewest bytes one call must move (cost model)."""
        return self.entry["bytes"]

    track_bytes.unit = "bytes"

    def track_roofline_time(self, grid, *params):
        """The least time the machine's peaks allow for the cost model's work."""
        return self.entry["roofline_s"]

    track_roofline_time.unit = "seconds"

    def track_sm_clock(self, grid, *params):
        """Median SM clock over the samples (NVML)."""
        clock = self.timed()["sm_clock_mhz"]
        return math.nan if clock is None else clock

    track_sm_clock.unit = "MHz"

    def track_dropped_samples(self, grid, *params):
        """Samples dropped and retaken because the SM clock was low."""
        return self.timed()["dropped"]

    track_dropped_samples.unit = "samples"


# The launch plan, one series per field: (field of ops.launch_plan, unit, what it counts).
PLAN_SERIES = {
    "blocks": ("blocks", "blocks", "Thread blocks of the main kernel."),
    "splits": ("num_splits", "splits", "KV splits merged by log-sum-exp."),
    "rows_per_block": ("rows_per_block", "rows", "Query rows (token x head pairs) a block computes."),
    "keys_per_tile": ("keys_per_tile", "keys", "Cache rows a shared-memory tile."),
    "smem_bytes": ("smem_bytes", "bytes", "Shared memory a block, static + dynamic."),
    "path": ("path", "path", "The kernel path the plan chose (verify_attn.registry: tc 0 mma.sync, 1 wgmma, 2 wgmma_t, 3 wgmma_ws, 4 wgmma_tma; on compute capability 9.0 tc takes 4 for a contiguous cache and a tree of up to 65 tokens, 3 otherwise, 0 elsewhere)."),
}


def _plan_series(field: str, unit: str, doc: str):
    def track(self, grid, *params):
        plan = self.entry["plan"]  # None: not a CUDA kernel
        return math.nan if plan is None or field not in plan else plan[field]

    track.__doc__, track.unit = doc, unit
    return track


for _name, _spec in PLAN_SERIES.items():
    setattr(GridBenchmark, f"track_plan_{_name}", _plan_series(*_spec))
