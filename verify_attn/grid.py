"""The benchmark grid: every axis and every selection of it, in one place.

The asv classes, the measure and crosscheck verbs, the plots and the GPU check all read
these; adding a head count or a prefix length is one edit here. ``None`` as a selection's
implementations means every registered one; "under test" means the project's own kernels.
"""

from __future__ import annotations

import dataclasses

HEADS = (8, 16, 64)
Q_LENS = (9, 17, 33, 65)
PREFIX_LENS = (0, 2048, 16384, 65536)


@dataclasses.dataclass(frozen=True)
class Selection:
    heads: tuple[int, ...]
    q_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    impls: str = "all"  # "all" or "under_test"

    def points(self, heads: int) -> list[tuple[int, int]]:
        """(q_len, prefix_len) measured at this head count."""
        if heads not in self.heads:
            return []
        return [(q, p) for q in self.q_lens for p in self.prefix_lens]


NONE = Selection((), (), ())
# What each asv class measures, by device. The CPU grid is what 2 cores finish in minutes.
SELECTIONS = {
    "cuda": {
        "full": Selection(HEADS, Q_LENS, PREFIX_LENS),
        # The pull-request subset (asv -b Quick): the headline cases, the kernels under test.
        "quick": Selection((64,), (9,), (2048, 16384, 65536), "under_test"),
        # Cold L2 matters where the cache rows fit in the 60 MiB L2: short prefixes.
        "cold": Selection((64,), (9,), (2048, 16384)),
    },
    "cpu": {
        "full": Selection((8, 16), (9, 17), (0, 2048)),
        "quick": Selection((8,), (9,), (0, 2048), "under_test"),
        "cold": NONE,
    },
    # VERIFY_ATTN_GRID=tiny (the end-to-end tests): two points.
    "tiny": {"full": Selection((8,), (9,), (0, 2048), "under_test"), "quick": Selection((8,), (9,), (0, 2048), "under_test"),
             "cold": NONE},
}

# The history's headline: heads 64, q_len 9, three prefixes, for these implementations.
HEADLINE = {"heads": 64, "q_len": 9, "prefix_lens": (2048, 16384, 65536), "impls": ("flash",)}
# What `measure` times by default, and what the GPU check's speed step shows.
MEASURE_DEFAULT = {"heads": (64,), "q_lens": (9,), "prefix_lens": (2048, 16384, 65536)}
# Timer against profiler: (impl, heads, q_len, prefix_len).
CROSSCHECK = [("flash", 64, 9, 2048), ("flash", 64, 9, 16384), ("flash", 64, 9, 65536), ("flash", 8, 9, 65536),
              ("naive", 64, 9, 2048), ("naive", 16, 9, 16384), ("torch", 64, 9, 16384)]
