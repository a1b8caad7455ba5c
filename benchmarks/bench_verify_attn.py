"""MLA verify attention across prefix lengths, query counts and implementations.

A class per head count of verify_attn.grid.HEADS (HeadsN) and Chain (the chain tree, where
FlashMLA runs too), all served by one measurement (the full grid, then the chain tree);
Quick is the pull-request subset (asv -b Quick: Quick and QuickCases), ColdL2 flushes the L2
cache before every call, Serving the batches of ragged paged trees a server verifies and
ServingChain the same batches as chain trees, where FlashMLA runs too. What each measures on
each device: verify_attn.grid.SELECTIONS.
"""

from verify_attn import cases, gpu, grid, prebuild, registry

from .common import IMPLS, GridBenchmark, stored


class _FullGrid(GridBenchmark):
    """The full grid, every head count, and the chain tree in one setup_cache (asv keys the
    cache by the defining line, so the HeadsN classes and Chain share this one measurement).
    The full grid goes first: FlashMLA, which only Chain and ServingChain time, builds beside it
    (verify_attn.prebuild) instead of holding the first class asv sets up."""

    part = "full"

    def setup_cache(self):
        from verify_attn import suite

        prebuild.start(suite.needs("full") + suite.needs("chain"))
        with suite.repeat_workers() as workers:  # loading while the grid is measured
            measured = {"full": suite.measure_grid(grid.HEADS), "chain": suite.measure_grid(None, "chain")}
            suite.repeat_short(measured, workers)  # the short calls again in those processes
        return stored(measured)


for _heads in grid.HEADS:
    globals()[f"Heads{_heads}"] = type(f"Heads{_heads}", (_FullGrid,), {
        "__doc__": f"{_heads} heads.", "__module__": __name__, "heads": _heads})


class _QuickSubset:
    """One measurement for Quick and QuickCases (asv keys the cache by the defining line):
    every named case first, then the timed points, timed only if every named case passed."""

    timeout = 1200
    version = "1"

    def setup_cache(self):
        from verify_attn import suite

        return stored(suite.measure_quick())


# The named-case gate's kernels: those under test with their pinned-path variants (tc_mma,
# tc_wgmma); Quick times them but the gated-only ones (verify_attn.grid.GATED_ONLY).
UNDER_TEST = [i for i in registry.display_order(gpu.device()) if registry.get(i).under_test]


class Quick(_QuickSubset, GridBenchmark):
    """Pull-request subset: the kernels under test at every head count (verify_attn.grid), not
    timed if any named case fails (QuickCases)."""

    params = [*map(list, grid.QUICK_PARAMS), grid.impls_of("quick", UNDER_TEST)]
    param_names = ["heads", "q_len", "prefix_len", "impl"]
    version = "2"  # every head count (version 1: heads 64 only, no heads parameter)

    def key(self, grid, params):
        return params


class QuickCases(_QuickSubset):
    """The gate before Quick's timings: every named case (verify_attn.cases; on the CPU those
    not marked large) against the float64 reference."""

    params = [list(cases.CASES), UNDER_TEST]
    param_names = ["case", "impl"]

    def setup(self, grid, case, impl):
        self.outcome = grid["named"].get((case, impl))
        if self.outcome is None:
            raise NotImplementedError("not checked on this device")
        if self.outcome["skipped"]:
            raise NotImplementedError(self.outcome["skipped"])

    def track_error(self, grid, case, impl):
        """Largest relative error against the float64 reference; a case beyond the tolerance
        (verify_attn/accuracy.py) fails, and then nothing of Quick is timed."""
        o = self.outcome
        if not o["ok"]:
            raise AssertionError(f"{impl} fails {case}: {o['reason']} (max_rel {o['max_rel']:.3g})")
        return o["max_rel"]

    track_error.unit = "max_rel"


class ColdL2(GridBenchmark):
    """Heads 64, q_len 9, short prefixes, L2 flushed before every call (GPU only)."""

    params = [*map(list, grid.COLD_PARAMS), grid.impls_of("cold", IMPLS)]

    def setup_cache(self):
        from verify_attn import suite

        return stored(suite.measure_grid(None, "cold"))


class Chain(_FullGrid):
    """Batch 1, a chain tree (a causal mask), kv rows padded to 64-token pages (measured in
    the full grid's setup_cache, after it)."""

    part = "chain"
    params = [*map(list, grid.CHAIN_PARAMS), grid.impls_of("chain", IMPLS)]
    param_names = ["heads", "q_len", "prefix_len", "impl"]

    def key(self, grid, params):
        return params


class Serving(GridBenchmark):
    """Batches of random trees, ragged prefixes from 1K to 64K, a paged pool with shuffled rows."""

    params = [*map(list, grid.SERVING_PARAMS), grid.impls_of("serving", IMPLS)]
    param_names = ["batch", "heads", "q_len", "impl"]

    def key(self, grid, params):
        return params

    def setup_cache(self):
        from verify_attn import suite

        return stored(suite.measure_serving())


class ServingChain(GridBenchmark):
    """The serving batches as chain trees in a contiguous cache padded to 64-token pages: tc
    against FlashMLA on ragged prefixes (GPU only)."""

    params = [*map(list, grid.SERVING_CHAIN_PARAMS), grid.impls_of("serving_chain", IMPLS)]
    param_names = ["batch", "heads", "q_len", "impl"]

    def key(self, grid, params):
        return params

    def setup_cache(self):
        from verify_attn import suite

        return stored(suite.measure_serving("serving_chain"))
