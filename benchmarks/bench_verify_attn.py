"""MLA verify attention across prefix lengths, query counts and implementations.

One class per head count (each measures its grid once, in setup_cache); Quick is the
pull-request subset (asv -b Quick), ColdL2 flushes the L2 cache before every call.
"""

from verify_attn import suite

from .common import GridBenchmark


class Heads8(GridBenchmark):
    """8 heads: memory-bound even on tensor cores."""

    def setup_cache(self):
        return suite.measure_grid(8)


class Heads16(GridBenchmark):
    """16 heads."""

    def setup_cache(self):
        return suite.measure_grid(16)


class Heads64(GridBenchmark):
    """64 heads (DeepSeek-V3 on one GPU): compute-bound at q_len 9 and up."""

    def setup_cache(self):
        return suite.measure_grid(64)


class Quick(GridBenchmark):
    """Pull-request subset: heads 64, q_len 9, prefix 2048 to 65536, naive and flash
    (on the CPU: heads 8, prefix 0 and 2048)."""

    def setup_cache(self):
        return suite.measure_grid(None, "quick")


class ColdL2(GridBenchmark):
    """Heads 64, q_len 9, short prefixes, L2 flushed before every call (GPU only)."""

    def setup_cache(self):
        return suite.measure_grid(None, "cold")
