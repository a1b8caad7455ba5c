"""MLA verify attention across prefix lengths, query counts and implementations.

A class per head count of verify_attn.grid.HEADS (HeadsN), all served by one measurement of
the full grid; Quick is the pull-request subset (asv -b Quick), ColdL2 flushes the L2 cache
before every call, Chain is the chain tree (where FlashMLA runs too), Serving the batches
of ragged paged trees a server verifies. What each measures on each device:
verify_attn.grid.SELECTIONS.
"""

from verify_attn import grid, registry, suite

from .common import GridBenchmark


class _FullGrid(GridBenchmark):
    """The full grid, every head count in one setup_cache (asv keys the cache by the defining
    line, so the HeadsN classes below share this one measurement)."""

    def setup_cache(self):
        return suite.measure_grid(grid.HEADS)


for _heads in grid.HEADS:
    globals()[f"Heads{_heads}"] = type(f"Heads{_heads}", (_FullGrid,), {
        "__doc__": f"{_heads} heads.", "__module__": __name__, "heads": _heads})


class Quick(GridBenchmark):
    """Pull-request subset: the headline cases, the kernels under test."""

    def setup_cache(self):
        return suite.measure_grid(None, "quick")


class ColdL2(GridBenchmark):
    """Heads 64, q_len 9, short prefixes, L2 flushed before every call (GPU only)."""

    def setup_cache(self):
        return suite.measure_grid(None, "cold")


class Chain(GridBenchmark):
    """Batch 1, a chain tree (a causal mask), kv rows padded to 64-token pages."""

    params = [list(grid.CHAIN_PARAMS[0]), list(grid.CHAIN_PARAMS[1]), list(grid.CHAIN_PARAMS[2]),
              list(registry.names())]
    param_names = ["heads", "q_len", "prefix_len", "impl"]

    def key(self, grid, params):
        return params

    def setup_cache(self):
        return suite.measure_grid(None, "chain")


class Serving(GridBenchmark):
    """Batches of random trees, ragged prefixes from 1K to 64K, a paged pool with shuffled rows."""

    params = [list(grid.SERVING_PARAMS[0]), list(grid.SERVING_PARAMS[1]), list(grid.SERVING_PARAMS[2]),
              list(registry.names())]
    param_names = ["batch", "heads", "q_len", "impl"]

    def key(self, grid, params):
        return params

    def setup_cache(self):
        return suite.measure_serving()
