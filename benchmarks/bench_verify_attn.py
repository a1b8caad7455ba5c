"""MLA verify attention across prefix lengths, query counts and implementations.

A class per head count of verify_attn.grid.HEADS (HeadsN), all served by one measurement of
the full grid; Quick is the pull-request subset (asv -b Quick), ColdL2 flushes the L2 cache
before every call. What each measures on each device: verify_attn.grid.SELECTIONS.
"""

from verify_attn import grid, suite

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
