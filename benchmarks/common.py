"""What every grid benchmark shares: look a measured point up, gate on correctness.

The measuring happens once per class in ``setup_cache`` (verify_attn.suite.measure_grid),
so all implementations of a case are timed side by side in one process; the ``track_``
methods only return numbers from it. asv counts an increase as a regression for every
benchmark, so each series is stored the way round where lower is better: time, time over
naive's time (the inverse of the speedup), time over the roofline time (the inverse of the
fraction of peak) and the error.
"""

import abc

from verify_attn import suite


class GridBenchmark(abc.ABC):
    """Abstract, so asv does not collect it: each subclass defines its own setup_cache
    (asv keys the cache by the defining line, so an inherited one would be shared)."""

    params = [list(suite.Q_LENS), list(suite.PREFIX_LENS), list(suite.IMPLS)]
    param_names = ["q_len", "prefix_len", "impl"]
    timeout = 1200  # setup_cache measures the whole grid, builds included
    version = "1"   # fixed: asv would otherwise hash the source and orphan the history

    @abc.abstractmethod
    def setup_cache(self):
        """Return suite.measure_grid(...) for this class's grid."""

    def setup(self, grid, q_len, prefix_len, impl):
        self.entry = grid["results"].get((grid["heads"], q_len, prefix_len, impl))
        if self.entry is None:
            raise NotImplementedError("not in this device's grid")

    def timed(self):
        e = self.entry
        if not e["ok"]:
            raise AssertionError(f"failed the correctness check, not timed: {e['reason']}")
        return e

    def track_time(self, grid, q_len, prefix_len, impl):
        """Seconds per call (CUDA events, inputs rotated past the L2 cache)."""
        e = self.timed()
        return {"samples": e["samples"], "number": e["number"]}

    track_time.unit = "seconds"

    def track_time_vs_naive(self, grid, q_len, prefix_len, impl):
        """Time over naive's median time in the same run: 1 / speedup."""
        e = self.timed()
        if e["naive_s"] is None:
            raise NotImplementedError("naive not measured here")
        return {"samples": [s / e["naive_s"] for s in e["samples"]], "number": e["number"]}

    track_time_vs_naive.unit = "x naive time"

    def track_time_vs_roofline(self, grid, q_len, prefix_len, impl):
        """Time over the roofline time of the tree-aware cost model: 1 / fraction of peak."""
        e = self.timed()
        return {"samples": [s / e["roofline_s"] for s in e["samples"]], "number": e["number"]}

    track_time_vs_roofline.unit = "x roofline time"

    def track_error(self, grid, q_len, prefix_len, impl):
        """Largest relative error against the float64 reference (recorded even when failing)."""
        return self.entry["max_rel"]

    track_error.unit = "max_rel"
