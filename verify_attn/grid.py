"""The benchmark grid: every axis and every selection of it, in one place.

The asv classes, the measure and crosscheck verbs, the plots and the GPU check all read
these; adding a head count or a prefix length is one edit here. ``None`` as a selection's
implementations means every registered one; "under test" means the project's own kernels.
"""

from __future__ import annotations

import dataclasses

from . import registry

HEADS = (8, 16, 64)
Q_LENS = (9, 17, 33, 65)
PREFIX_LENS = (0, 2048, 16384, 65536)


@dataclasses.dataclass(frozen=True)
class Selection:
    """Points of batch 1, one prefix length each, contiguous cache: every combination of
    heads, q_lens and prefix_lens, plus the extra points."""

    heads: tuple[int, ...]
    q_lens: tuple[int, ...]
    prefix_lens: tuple[int, ...]
    impls: str = "all"              # "all" or "under_test"
    exclude: tuple[str, ...] = ()   # implementations left out of this selection
    tree: str = "random"
    pad_to: int = 1                 # kv rows per element rounded up to a multiple of this
    extra: tuple[tuple[int, int, int], ...] = ()  # (heads, q_len, prefix_len) beyond the product

    def points(self) -> list[tuple[int, int, int]]:
        """(heads, q_len, prefix_len) measured."""
        product = [(h, q, p) for h in self.heads for q in self.q_lens for p in self.prefix_lens]
        return product + [pt for pt in self.extra if pt not in product]


@dataclasses.dataclass(frozen=True)
class Serving:
    """Serving steps: batches of ragged prefixes (1K to 64K, spread over the batch), random
    trees in a paged pool with shuffled rows, or chain trees in a contiguous cache padded to
    FlashMLA's pages (verify_attn.cases.serving_case)."""

    batches: tuple[int, ...]
    heads: tuple[int, ...]
    q_lens: tuple[int, ...]
    impls: str = "all"
    exclude: tuple[str, ...] = ()
    tree: str = "random"
    paged: bool = True
    pad_to: int = 1

    def points(self) -> list[tuple[int, int, int]]:
        return [(b, h, q) for b in self.batches for h in self.heads for q in self.q_lens]


NONE = Selection((), (), ())
# Pinned paths gated on every named case (Quick's gate, ab's) but not timed at Quick's points:
# tc takes wgmma only where every element's keys fit in two tiles, which the full grid's
# prefix-0 points time as tc itself; at Quick's long prefixes it would time a path tc never runs.
# tc_mma_mid and tc_mma_small: the configurations smaller parts run, checked on every named case
# wherever the suite runs (a break confined to them fails the gate); timed on a bigger part they
# would stand for no GPU.
GATED_ONLY = ("tc_wgmma", "tc_mma_mid", "tc_mma_small")
# A kernel's pinned-path variants (tc_mma) are gated and timed in Quick, where the paired PR
# check and the history watch them; the grids time each kernel's own path only.
VARIANTS = tuple(n for n, i in registry.IMPLS.items() if i.variant_of)
# Implementations that take chain trees only (FlashMLA): left out of the random-tree
# selections, where every point would skip them (asv would still run each as n/a).
CHAIN_ONLY = tuple(n for n, i in registry.IMPLS.items() if i.trees == "chain")
# The chain tree (a causal mask, which FlashMLA also takes) at the shapes FlashMLA is
# compared on; kv rows padded to its 64-token pages. Naive adds nothing here.
CHAIN = Selection(HEADS, (9, 65), (2048, 16384, 65536), exclude=("naive", *VARIANTS), tree="chain", pad_to=64)
# Naive stays at batch 1: at batch 32 it would take seconds a call.
SERVING = Serving((8, 32), (16, 64), (9, 33), exclude=("naive", *VARIANTS, *CHAIN_ONLY))
# The same steps as chain trees in a contiguous cache padded to 64-token pages, the form FlashMLA
# reads: tc against FlashMLA on ragged batches (the others are timed on SERVING's trees).
SERVING_CHAIN = dataclasses.replace(SERVING, exclude=tuple(n for n in registry.names() if n not in ("tc", "flashmla")),
                                    tree="chain", paged=False, pad_to=64)
NO_SERVING = Serving((), (), ())
# What each asv class measures, by device. The CPU grid is what 2 cores finish in minutes.
SELECTIONS = {
    "cuda": {
        "full": Selection(HEADS, Q_LENS, PREFIX_LENS, exclude=(*VARIANTS, *CHAIN_ONLY)),
        # The pull-request subset (asv -b Quick), the kernels under test at every head count:
        # heads 64 at the headline prefixes (launch-bound at 2K, split-heavy at 64K); heads 16
        # and 8, where a block holds fewer heads and more tree tokens (rows = heads x q_len)
        # and the keys are split the most, at the longest prefix; heads 16 also with a bigger
        # tree (q_len 33) at a mid prefix. On the H200 `asv run -b Quick` of one commit took
        # 36 s, the named-case gate 2 s and these 6 points 8 s of it (naive's 64K calls most).
        "quick": Selection((64,), (9,), (2048, 16384, 65536), "under_test", GATED_ONLY,
                           extra=((16, 9, 65536), (16, 33, 16384), (8, 9, 65536))),
        # Cold L2 matters where the cache rows fit in the 60 MiB L2: short prefixes.
        "cold": Selection((64,), (9,), (2048, 16384), exclude=(*VARIANTS, *CHAIN_ONLY)),
        "chain": CHAIN,
        "serving": SERVING,
        "serving_chain": SERVING_CHAIN,
    },
    "cpu": {
        "full": Selection((8, 16), (9, 17), (0, 2048), exclude=(*VARIANTS, *CHAIN_ONLY)),
        "quick": Selection((8,), (9,), (0, 2048), "under_test", GATED_ONLY),
        "cold": NONE,
        "chain": Selection((8,), (9,), (2048,), exclude=("naive", *VARIANTS), tree="chain", pad_to=64),
        "serving": NO_SERVING,  # ragged prefixes up to 64K: seconds a call on 2 cores
        "serving_chain": NO_SERVING,
    },
    # VERIFY_ATTN_GRID=tiny (the end-to-end tests): two points.
    "tiny": {"full": Selection((8,), (9,), (0, 2048), "under_test"), "quick": Selection((8,), (9,), (0, 2048), "under_test", GATED_ONLY),
             "cold": NONE, "chain": NONE, "serving": NO_SERVING,
             "serving_chain": NO_SERVING},
}

# The baseline is not run where a call computes more scores than this (heads x q_len x keys):
# naive takes 0.2-0.9 s a call at the five full-grid points past it (heads 16 q_len 65 and
# heads 64 q_len 17-65 at prefix 65,536, heads 64 q_len 65 at 16,384; effa37c's H200 run):
# ten calls each with its anchor twin, about 41 s of a full run (from those medians); the
# other 43 points keep the speedups over it.
BASELINE_MAX_SCORES = 60_000_000


def not_run(impl: str, heads: int, q_len: int, prefix_len: int) -> str:
    """Why the grid leaves an implementation out at one point, or ""."""
    scores = heads * q_len * (prefix_len + q_len)
    if registry.get(impl).baseline and scores > BASELINE_MAX_SCORES:
        return (f"{impl} is not run above {BASELINE_MAX_SCORES:,} scores a call (heads x q_len x keys: "
                f"{scores:,} here; verify_attn.grid.BASELINE_MAX_SCORES)")
    return ""


# The asv classes' parameter values: every value any device's selection uses (asv runs every
# combination of a class's values as a process of its own, so none that no point has).
CHAIN_PARAMS = (HEADS, CHAIN.q_lens, CHAIN.prefix_lens)
COLD_PARAMS = tuple(tuple(sorted({pt[k] for table in SELECTIONS.values() for pt in table["cold"].points()}))
                    for k in (1, 2))  # q_lens, prefix_lens (heads 64 only)
QUICK_PARAMS = tuple(tuple(sorted({pt[k] for table in SELECTIONS.values() for pt in table["quick"].points()}))
                     for k in range(3))  # heads, q_lens, prefix_lens
SERVING_PARAMS = (SERVING.batches, SERVING.heads, SERVING.q_lens)
SERVING_CHAIN_PARAMS = (SERVING_CHAIN.batches, SERVING_CHAIN.heads, SERVING_CHAIN.q_lens)


def impls_of(variant: str, ordered) -> list[str]:
    """Of these implementations (in their order), those that the GPU's or the CPU's selection
    of the variant measures: the impl parameter of the variant's asv class."""
    def measured(sel) -> set[str]:
        chosen = registry.under_test() if sel.impls == "under_test" else registry.names()
        return set(chosen) - set(sel.exclude) if sel.points() else set()

    wanted = set().union(*(measured(SELECTIONS[device][variant]) for device in ("cuda", "cpu")))
    return [i for i in ordered if i in wanted]
# The history's headline: heads 64, q_len 9, three prefixes, for these implementations.
HEADLINE = {"heads": 64, "q_len": 9, "prefix_lens": (2048, 16384, 65536), "impls": ("flash", "tc")}
# What `measure` times by default, and what the GPU check's speed step shows.
MEASURE_DEFAULT = {"heads": (64,), "q_lens": (9,), "prefix_lens": (2048, 16384, 65536)}
# Timer against profiler: (impl, heads, q_len, prefix_len).
CROSSCHECK = [("flash", 64, 9, 2048), ("flash", 64, 9, 16384), ("flash", 64, 9, 65536), ("flash", 8, 9, 65536),
              ("naive", 64, 9, 2048), ("naive", 16, 9, 16384), ("torch", 64, 9, 16384)]
